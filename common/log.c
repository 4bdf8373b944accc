/*
 * log.c: see log.h.  Modelled on OpenSMTPD's log.c: one place decides
 * where messages go, and the fatal paths say which program died and why.
 */
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

static const char *log_name = "pepsi";
static bool log_to_syslog;
static int	log_verbosity;

void
log_init(const char *progname, bool use_syslog)
{
	const char *slash = strrchr(progname, '/');

	log_name = slash ? slash + 1 : progname;
	log_to_syslog = use_syslog;
	if (use_syslog)
		openlog(log_name, LOG_PID | LOG_NDELAY, LOG_MAIL);
}

void
log_setverbose(int verbosity)
{
	log_verbosity = verbosity;
}

int
log_getverbose(void)
{
	return log_verbosity;
}

const char *
log_progname(void)
{
	return log_name;
}

static void
log_emit(int priority, const char *fmt, va_list ap, int saved_errno)
{
	char		message[2048];

	vsnprintf(message, sizeof(message), fmt, ap);
	if (log_to_syslog)
	{
		if (saved_errno)
			syslog(priority, "%s: %s", message, strerror(saved_errno));
		else
			syslog(priority, "%s", message);
		return;
	}
	if (saved_errno)
		fprintf(stderr, "%s[%d]: %s: %s\n", log_name, (int) getpid(), message, strerror(saved_errno));
	else
		fprintf(stderr, "%s[%d]: %s\n", log_name, (int) getpid(), message);
}

void
fatal(const char *fmt, ...)
{
	int			saved_errno = errno;
	va_list		ap;

	va_start(ap, fmt);
	log_emit(LOG_CRIT, fmt, ap, saved_errno ? saved_errno : EIO);
	va_end(ap);
	exit(1);
}

void
fatalx(const char *fmt, ...)
{
	va_list		ap;

	va_start(ap, fmt);
	log_emit(LOG_CRIT, fmt, ap, 0);
	va_end(ap);
	exit(1);
}

void
log_warn(const char *fmt, ...)
{
	int			saved_errno = errno;
	va_list		ap;

	va_start(ap, fmt);
	log_emit(LOG_WARNING, fmt, ap, saved_errno);
	va_end(ap);
}

void
log_warnx(const char *fmt, ...)
{
	va_list		ap;

	va_start(ap, fmt);
	log_emit(LOG_WARNING, fmt, ap, 0);
	va_end(ap);
}

void
log_info(const char *fmt, ...)
{
	va_list		ap;

	va_start(ap, fmt);
	log_emit(LOG_INFO, fmt, ap, 0);
	va_end(ap);
}

void
log_debug(const char *fmt, ...)
{
	va_list		ap;

	if (log_verbosity < 1)
		return;
	va_start(ap, fmt);
	log_emit(LOG_DEBUG, fmt, ap, 0);
	va_end(ap);
}
