/*
 * log.h: logging for the daemons, stages and tools.
 *
 * Messages go to stderr (or syslog) under a tag shaped as Postfix's,
 * <syslog name>/<service>[pid] ([pepsi] SYSLOG_NAME, "pepsi" by default;
 * the service from the program, log_service_of), so that log tools made
 * for Postfix's logs (pflogsumm) read Pepsi's; never to stdout, which is
 * the worker protocol in a stage.  fatal and fatalx never return; the
 * *warn/fatal forms append strerror(errno).  Before log_init the tag is
 * "pepsi".
 */
#ifndef PEPSI_LOG_H
#define PEPSI_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

void log_init(const char *progname, bool use_syslog);
/* The syslog name before "/" in every tag; false when name is no such name (letters, digits, ".", "_", "-"). */
bool log_set_syslog_name(const char *name);
bool log_syslog_name_valid(const char *name);
/*
 * The service a program logs as, Postfix's names where Postfix has the
 * same role (pepsi-ingress: smtpd; the SMTP relays: smtp; relay-to-lmtp:
 * lmtp; relay-to-maildir: local), else the program's name without
 * "pepsi-stage-" or "pepsi-" (route, bounce, dispatch, queue...).
 */
const char *log_service_of(const char *program);
/*
 * Where messages go once the configuration is read (log_config.c): syslog
 * (facility mail) or stderr, and as text or one JSON object per line.
 */
void log_set_destination(bool use_syslog);
void log_set_json(bool json);
/*
 * A line with fields of its own (a delivery's to=, status=, ...): as text,
 * text is the line; as JSON, fields (the members of a JSON object, without
 * its braces, already encoded) join the usual time, program, pid, level
 * and message.
 */
void log_structured(int priority, const char *fields, const char *text);
/*
 * The same under another service's tag: a line that belongs to another
 * role than the process's (a delivery by a stage fused into a route
 * worker's pass is smtp's, lmtp's or local's; the queue's line when a
 * message enters it is qmgr's).  fields may be NULL.
 */
void		log_as(const char *service, int priority, const char *fields, const char *text);
void		log_setverbose(int verbosity);
int			log_getverbose(void);
const char *log_progname(void);

void fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
void fatalx(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warnx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
