/*
 * privilege.h: giving up root, the one way every program does it, in
 * OpenSMTPD's fixed order (chdir, setgroups, setresgid, setresuid), each
 * step checked and the result verified.
 *
 * Two kinds of caller: a daemon started as root becomes its configured
 * user once it holds what only root may open (pepsi-ingress, pepsi-httpd,
 * pepsi-dispatch: privilege_drop, privilege_config.c); a setuid-root
 * helper (helpers/) checks that its caller is of the group it serves and
 * becomes the user whose files it touches before it opens any of them
 * (privilege_become).
 * This file itself links nothing but libc and log.c, so that the helpers
 * can use it without the configuration loader.
 */
#ifndef PEPSI_PRIVILEGE_H
#define PEPSI_PRIVILEGE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct pepsi_config;

/*
 * Become [section] USER (and GROUP, else the user's primary group).
 * Fatal when USER is unset and we are root, or names root (a daemon never
 * runs as root), when the user or group does not exist, or when a
 * non-root process is asked to become someone else; a process already
 * running as USER (make run, the tests) keeps running as it is.
 */
void privilege_drop(const struct pepsi_config *cfg, const char *section);

/*
 * Become uid:gid for good, with the user's supplementary groups (user
 * may be NULL: gid alone), working directory dir ("/" when NULL).  False
 * with err set when a step fails or root could be regained; the process
 * must then stop.  A process that is not root and already is uid:gid
 * only changes directory; any other non-root process fails.
 */
bool privilege_become(const char *user, uid_t uid, gid_t gid, const char *dir,
					  char *err, size_t errlen);

/*
 * Is the real user of this process root, or is it (by its real, effective
 * or supplementary groups) of group gid?  A setuid helper asks this of the
 * group its own file belongs to (privilege_own_group), so that mode 4750
 * and the check inside agree.
 */
bool privilege_caller_in_group(gid_t gid);
/* The group of this process's executable file; false with err when unknown. */
bool privilege_own_group(gid_t *gid, char *err, size_t errlen);

/*
 * The set-id file that runs PROGRAM, if there is one: PROGRAM itself when
 * it is a path, else a file of that name beside self_exe (a multi-call
 * binary) or in the bin/ that links to it (self_exe's ../../bin, as make
 * install lays them out).  A privileged stage must run as that file,
 * never inside another program, which lacks its bit.  NULL (none) or a
 * path to free.
 */
char *privilege_setid_program(const char *program, const char *self_exe);

/*
 * A fresh environment for a program run on a user's behalf: nothing of
 * ours, only what names = value pairs (NULL-terminated, alternating) say.
 * Returns a NULL-terminated array for execve; free with privilege_env_free.
 */
char **privilege_clean_env(const char *const *pairs);
void   privilege_env_free(char **env);

#endif
