/*
 * log_config.h: where the logs go and in what form, from the
 * configuration ([pepsi] LOG and LOG_FORMAT), for every program once it
 * has read its file (log.h holds the writing itself).
 */
#ifndef PEPSI_LOG_CONFIG_H
#define PEPSI_LOG_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"

/*
 * LOG = auto (the default): stderr when it is a terminal or systemd's
 * journal reads it (JOURNAL_STREAM; the units set SyslogFacility=mail),
 * else syslog with facility mail, where a postmaster's mail log is.
 * LOG = stderr or syslog chooses; the environment's PEPSI_LOG does too,
 * above the file (the test suites and make run set PEPSI_LOG=stderr).
 * LOG_FORMAT = text (the default) or json (one object per line, for log
 * shippers).  False with err naming the option on a bad value.
 */
bool log_configure(const struct pepsi_config *cfg, char *err, size_t errlen);

#endif
