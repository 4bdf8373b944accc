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
 * config_load for a program that may run set-id: then (privilege_running_setid)
 * only a file root alone can change is read (privilege_path_trusted), so
 * that no caller hands the program a configuration of its own.  NULL with
 * err as config_load.
 */
struct pepsi_config *privilege_config_load(const char *path, char *err, size_t errlen);

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
 * it is a path, else, when PROGRAM is one of the set-id programs Pepsi
 * installs (PEPSI_SETID_PROGRAMS, the Makefile's list), a file of that
 * name beside self_exe (a multi-call binary) or in the bin/ that links to
 * it (self_exe's ../../bin, as make install lays them out).  A privileged
 * stage must run as that file, never inside another program, which lacks
 * its bit; any other set-id file found there is not Pepsi's to run.  NULL
 * (none) or a path to free.
 */
char *privilege_setid_program(const char *program, const char *self_exe);
/* Is path a regular, executable file with a set-user-id or set-group-id bit? */
bool privilege_setid_file(const char *path);
/* Is name (a program name, no path) one of the set-id programs Pepsi installs? */
bool privilege_is_setid_program(const char *name);

/*
 * A set-id program's first step: was it started set-user-id or
 * set-group-id (the kernel's AT_SECURE)?  Then its extra group is put
 * aside as the saved group id, the effective one becoming the caller's
 * again: nothing the caller names is opened with it.  Only
 * privilege_exec_setid raises it again, in the child that executes the
 * program's own helper.  Returns whether the process runs set-id.
 */
bool privilege_setid_start(void);
/* Was this process started set-id (privilege_setid_start's answer)? */
bool privilege_running_setid(void);
/*
 * Raise (true) or lower (false) the saved extra group as the effective
 * one, around the execution of the program's own helper; nothing when
 * not set-id.  False with err when it cannot.
 */
bool privilege_exec_group(bool raise, char *err, size_t errlen);

/*
 * Is path a file only trusted (or root) can change: every directory from
 * / owned by root or trusted and writable by no one else (or root's and
 * sticky, as /tmp), the file likewise, and no symbolic link anywhere?
 * The caller of a set-id program chooses which such file it reads, never
 * what it says.  False with a sentence naming the path in why.
 */
bool privilege_path_trusted(const char *path, uid_t trusted, char *why, size_t whylen);

/*
 * A set-id helper's start-up hygiene: no environment, no inherited
 * descriptor but the three standard ones (0 and 1 must be open: they are
 * the protocol; 2 is /dev/null when closed), umask 077, every signal's
 * default action, and resource limits that are the program's, not the
 * caller's (no core file; the caller's lowered file size, CPU, memory and
 * descriptor limits raised back).  _exit(2) when stdin or stdout is closed.
 */
void privilege_sanitize_process(void);

/*
 * A fresh environment for a program run on a user's behalf: nothing of
 * ours, only what names = value pairs (NULL-terminated, alternating) say.
 * Returns a NULL-terminated array for execve; free with privilege_env_free.
 */
char **privilege_clean_env(const char *const *pairs);
void   privilege_env_free(char **env);

#endif
