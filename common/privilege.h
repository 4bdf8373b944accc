/*
 * privilege.h: how a daemon started as root becomes its configured user
 * once its sockets are bound (pepsi-ingress, pepsi-httpd), in OpenSMTPD's
 * fixed order: chdir("/"), setgroups, setresgid, setresuid, each checked.
 */
#ifndef PEPSI_PRIVILEGE_H
#define PEPSI_PRIVILEGE_H

#include "config.h"

/*
 * Become [section] USER (and GROUP, else the user's primary group).
 * Fatal when USER is unset and we are root (a daemon never runs as root),
 * when the user or group does not exist, or when a non-root process is
 * asked to become someone else; a process already running as USER (make
 * run, the tests) keeps running as it is.
 */
void privilege_drop(const struct pepsi_config *cfg, const char *section);

#endif
