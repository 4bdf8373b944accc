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
#include <time.h>
#include <unistd.h>

static const char *log_name = "pepsi";
static bool		   log_to_syslog;
static bool		   log_as_json;
static int		   log_verbosity;

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
log_set_destination(bool use_syslog)
{
	if (use_syslog && !log_to_syslog)
		openlog(log_name, LOG_PID | LOG_NDELAY, LOG_MAIL);
	log_to_syslog = use_syslog;
}

void
log_set_json(bool json)
{
	log_as_json = json;
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

static const char *
log_level_name(int priority)
{
	switch (priority)
	{
		case LOG_CRIT:
			return "fatal";
		case LOG_WARNING:
			return "warning";
		case LOG_DEBUG:
			return "debug";
		default:
			return "info";
	}
}

/* s as the contents of a JSON string (without the quotes). */
static void
log_json_escape(char *out, size_t outlen, const char *s)
{
	size_t n = 0;

	for (; *s && n + 7 < outlen; s++)
	{
		unsigned char c = (unsigned char) *s;

		if (c == '"' || c == '\\')
		{
			out[n++] = '\\';
			out[n++] = (char) c;
		}
		else if (c < 0x20 || c == 0x7f)
			n += (size_t) snprintf(out + n, outlen - n, "\\u%04x", c);
		else
			out[n++] = (char) c;
	}
	out[n] = '\0';
}

/* One line to where the logs go: syslog adds time and pid itself. */
static void
log_write(int priority, const char *fields, const char *message)
{
	char line[8192];

	if (log_as_json)
	{
		char			escaped[4096];
		char			when[40];
		struct timespec now;
		struct tm		tm;

		clock_gettime(CLOCK_REALTIME, &now);
		gmtime_r(&now.tv_sec, &tm);
		strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
		log_json_escape(escaped, sizeof(escaped), message);
		snprintf(line, sizeof(line),
				 "{\"time\":\"%s.%03ldZ\",\"program\":\"%s\",\"pid\":%d,\"level\":\"%s\","
				 "\"message\":\"%s\"%s%s}",
				 when, now.tv_nsec / 1000000, log_name, (int) getpid(),
				 log_level_name(priority), escaped, fields && *fields ? "," : "", fields ? fields : "");
		message = line;
	}
	if (log_to_syslog)
		syslog(priority, "%s", message);
	else if (log_as_json)
		fprintf(stderr, "%s\n", message);
	else
		fprintf(stderr, "%s[%d]: %s\n", log_name, (int) getpid(), message);
}

static void
log_emit(int priority, const char *fmt, va_list ap, int saved_errno)
{
	char message[2048];

	vsnprintf(message, sizeof(message), fmt, ap);
	if (saved_errno)
	{
		size_t n = strlen(message);

		snprintf(message + n, sizeof(message) - n, ": %s", strerror(saved_errno));
	}
	log_write(priority, NULL, message);
}

void
log_structured(int priority, const char *fields, const char *text)
{
	log_write(priority, fields, text);
}

void
fatal(const char *fmt, ...)
{
	int		saved_errno = errno;
	va_list ap;

	va_start(ap, fmt);
	log_emit(LOG_CRIT, fmt, ap, saved_errno ? saved_errno : EIO);
	va_end(ap);
	exit(1);
}

void
fatalx(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_emit(LOG_CRIT, fmt, ap, 0);
	va_end(ap);
	exit(1);
}

void
log_warn(const char *fmt, ...)
{
	int		saved_errno = errno;
	va_list ap;

	va_start(ap, fmt);
	log_emit(LOG_WARNING, fmt, ap, saved_errno);
	va_end(ap);
}

void
log_warnx(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_emit(LOG_WARNING, fmt, ap, 0);
	va_end(ap);
}

void
log_info(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	log_emit(LOG_INFO, fmt, ap, 0);
	va_end(ap);
}

void
log_debug(const char *fmt, ...)
{
	va_list ap;

	if (log_verbosity < 1)
		return;
	va_start(ap, fmt);
	log_emit(LOG_DEBUG, fmt, ap, 0);
	va_end(ap);
}
