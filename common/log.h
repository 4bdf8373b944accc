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

void		log_init(const char *progname, bool use_syslog);
void		log_setverbose(int verbosity);
int			log_getverbose(void);
const char *log_progname(void);

void		fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
void		fatalx(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
void		log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void		log_warnx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void		log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void		log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
