/*
 * log.c: see log.h.  Modelled on OpenSMTPD's log.c: one place decides
 * where messages go, and the fatal paths say which program died and why.
 * Syslog is written here rather than through syslog(3), whose one ident
 * per process cannot tag a line with another service (log_as).
 */
#include "base/log.h"

#include <ctype.h>
#include <errno.h>
#include <paths.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#define LOG_SYSLOG_NAME_MAX 64

static const char *log_name = "pepsi";
static const char *log_service = NULL; /* NULL before log_init: the tag is the syslog name alone */
static char		   log_syslog_name[LOG_SYSLOG_NAME_MAX + 1] = "pepsi";
static bool		   log_to_syslog;
static bool		   log_as_json;
static int		   log_verbosity;
/* The syslog socket (threads may log: auth workers), connected before any privilege drop. */
static pthread_mutex_t log_syslog_lock = PTHREAD_MUTEX_INITIALIZER;
static int			   log_syslog_fd = -1;
static int			   log_syslog_type = SOCK_DGRAM;

const char *
log_service_of(const char *program)
{
	static const struct
	{
		const char *program;
		const char *service;
	} postfix_roles[] = {
		{"pepsi-ingress", "smtpd"},
		{"pepsi-stage-relay-to-internet", "smtp"},
		{"pepsi-stage-relay-to-smarthost", "smtp"},
		{"pepsi-stage-relay-to-lmtp", "lmtp"},
		{"pepsi-stage-relay-to-maildir", "local"},
	};
	const char *slash = strrchr(program, '/');

	if (slash)
		program = slash + 1;
	for (size_t i = 0; i < sizeof(postfix_roles) / sizeof(postfix_roles[0]); i++)
		if (strcmp(program, postfix_roles[i].program) == 0)
			return postfix_roles[i].service;
	if (strncmp(program, "pepsi-stage-", 12) == 0 && program[12])
		return program + 12;
	if (strncmp(program, "pepsi-", 6) == 0 && program[6])
		return program + 6;
	return program;
}

bool
log_syslog_name_valid(const char *name)
{
	size_t n = 0;

	for (; name[n]; n++)
		if (!isalnum((unsigned char) name[n]) && name[n] != '.' && name[n] != '_' && name[n] != '-')
			return false;
	return n > 0 && n <= LOG_SYSLOG_NAME_MAX;
}

bool
log_set_syslog_name(const char *name)
{
	if (!log_syslog_name_valid(name))
		return false;
	snprintf(log_syslog_name, sizeof(log_syslog_name), "%s", name);
	return true;
}

/* Caller holds log_syslog_lock. */
static void
log_syslog_connect(void)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};

	if (log_syslog_fd >= 0)
		return;
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", _PATH_LOG);
	for (int attempt = 0; attempt < 2; attempt++)
	{
		log_syslog_fd = socket(AF_UNIX, log_syslog_type | SOCK_CLOEXEC, 0);
		if (log_syslog_fd < 0)
			return;
		if (connect(log_syslog_fd, (struct sockaddr *) &addr, sizeof(addr)) == 0)
			return;
		close(log_syslog_fd);
		log_syslog_fd = -1;
		if (errno != EPROTOTYPE)
			return;
		/* a syslog daemon listening on a stream socket */
		log_syslog_type = log_syslog_type == SOCK_DGRAM ? SOCK_STREAM : SOCK_DGRAM;
	}
}

static void
log_syslog_open(void)
{
	pthread_mutex_lock(&log_syslog_lock);
	log_syslog_connect();
	pthread_mutex_unlock(&log_syslog_lock);
}

void
log_init(const char *progname, bool use_syslog)
{
	const char *slash = strrchr(progname, '/');

	log_name = slash ? slash + 1 : progname;
	log_service = log_service_of(log_name);
	log_to_syslog = use_syslog;
	if (use_syslog)
		log_syslog_open();
}

void
log_set_destination(bool use_syslog)
{
	if (use_syslog)
		log_syslog_open();
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

/* One RFC 3164 packet to the syslog daemon, with facility mail; dropped when none listens. */
static void
log_syslog(int priority, const char *tag, const char *message)
{
	char	  packet[8400];
	char	  when[32];
	time_t	  now = time(NULL);
	struct tm tm;
	int		  n;

	localtime_r(&now, &tm);
	strftime(when, sizeof(when), "%b %e %H:%M:%S", &tm);
	n = snprintf(packet, sizeof(packet), "<%d>%s %s[%d]: %s", LOG_MAIL | priority, when, tag,
				 (int) getpid(), message);
	if (n < 0)
		return;
	if ((size_t) n >= sizeof(packet) - 1)
		n = (int) sizeof(packet) - 2;
	pthread_mutex_lock(&log_syslog_lock);
	for (int attempt = 0; attempt < 2; attempt++)
	{
		log_syslog_connect();
		if (log_syslog_fd < 0)
			break;
		/* a stream socket needs the end of the message marked; NUL, as syslog(3) does */
		if (send(log_syslog_fd, packet, (size_t) n + (log_syslog_type == SOCK_STREAM), MSG_NOSIGNAL) >= 0)
			break;
		close(log_syslog_fd);
		log_syslog_fd = -1;
	}
	pthread_mutex_unlock(&log_syslog_lock);
}

/* One line to where the logs go, tagged <syslog name>/<service>. */
static void
log_write(const char *service, int priority, const char *fields, const char *message)
{
	char line[8192];
	char tag[LOG_SYSLOG_NAME_MAX + 64];

	if (service)
		snprintf(tag, sizeof(tag), "%s/%s", log_syslog_name, service);
	else
		snprintf(tag, sizeof(tag), "%s", log_syslog_name);

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
				 "{\"time\":\"%s.%03ldZ\",\"program\":\"%s\",\"tag\":\"%s\",\"pid\":%d,"
				 "\"level\":\"%s\",\"message\":\"%s\"%s%s}",
				 when, now.tv_nsec / 1000000, log_name, tag, (int) getpid(),
				 log_level_name(priority), escaped, fields && *fields ? "," : "", fields ? fields : "");
		message = line;
	}
	if (log_to_syslog)
		log_syslog(priority, tag, message);
	else if (log_as_json)
		fprintf(stderr, "%s\n", message);
	else
		fprintf(stderr, "%s[%d]: %s\n", tag, (int) getpid(), message);
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
	log_write(log_service, priority, NULL, message);
}

void
log_structured(int priority, const char *fields, const char *text)
{
	log_write(log_service, priority, fields, text);
}

void
log_as(const char *service, int priority, const char *fields, const char *text)
{
	log_write(service, priority, fields, text);
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
