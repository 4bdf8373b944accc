/*
 * log.h: logging for the daemons, stages and tools.
 *
 * Messages go to stderr (or syslog) with the program's name; never to
 * stdout, which is the worker protocol in a stage.  fatal and fatalx never
 * return; the *warn/fatal forms append strerror(errno).  Before log_init
 * the program name is "pepsi".
 */
#ifndef PEPSI_LOG_H
#define PEPSI_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

void log_init(const char *progname, bool use_syslog);
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
void		log_structured(int priority, const char *fields, const char *text);
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
