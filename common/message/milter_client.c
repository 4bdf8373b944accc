/*
 * milter_client.c: the conversation with one milter (see milter_client.h).
 *
 * The steps of a message are pipelined: every command up to end of
 * message is written before the first reply is read, and the replies are
 * then read in order, each checked against the step it answers.  A
 * filter reads one command at a time (libmilter does), so it sees what
 * Postfix would send; what changes is one round trip per message instead
 * of one per step.  The first reply that is not "continue" decides as it
 * would have when it came, the commands after it are left unanswered and
 * the connection is closed.  A filter that may SKIP the rest of a body of
 * several chunks gets the chunks one by one, so that none is sent after
 * it said it wants no more.
 *
 * Anything unexpected (a timeout, a malformed or oversize packet, a reply
 * out of order, an action the filter did not negotiate, a closed socket)
 * makes the filter unavailable for this message: the connection is closed
 * and opened again for the next, and the caller's default decides.
 * Nothing here ever turns a failure into an accept.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "message/milter_client.h"

/* What one filter may ask at one end of message: the edits are held in memory. */
#define FILTER_MAX_EDITS 10000
#define FILTER_MAX_EDIT_BYTES (256 << 20)

/* Written out once this much is waiting, so a large message is never held whole. */
#define FILTER_SEND_THRESHOLD (256 * 1024)

enum filter_state
{
	FILTER_CLOSED, /* no connection: open and negotiate before use */
	FILTER_READY,  /* negotiated, no message started on it */
	FILTER_USED	   /* a message went through: QUIT_NC before the next, */
				   /* unless it came from the same client (session_key): then it is the next transaction */
};

struct milter_client
{
	char				 *name; /* the address as configured */
	struct milter_address address;
	enum filter_state	  state;
	int					  fd;
	struct buf			  in;	   /* bytes read, not yet framed */
	uint32_t			  actions; /* what the filter negotiated */
	uint32_t			  protocol;
	char				 *macros[MILTER_MACRO_STAGES]; /* the filter's lists, or NULL */
	char				 *session_key;				   /* the client of the last message, when FILTER_USED */
};

const char *
milter_verdict_name(enum milter_verdict verdict)
{
	switch (verdict)
	{
		case MILTER_VERDICT_ACCEPT:
			return "accept";
		case MILTER_VERDICT_REJECT:
			return "reject";
		case MILTER_VERDICT_TEMPFAIL:
			return "tempfail";
		case MILTER_VERDICT_DISCARD:
			return "discard";
		case MILTER_VERDICT_UNAVAILABLE:
			return "unavailable";
	}
	return "?";
}

struct milter_client *
milter_client_new(const char *address_text, char *err, size_t errlen)
{
	struct milter_client *f = xcalloc(1, sizeof(*f));

	if (!milter_parse_address(address_text, &f->address, err, errlen))
	{
		free(f);
		return NULL;
	}
	f->name = xstrdup(address_text);
	f->fd = -1;
	return f;
}

static void
filter_close(struct milter_client *f)
{
	if (f->fd >= 0)
		close(f->fd);
	f->fd = -1;
	f->state = FILTER_CLOSED;
	free(f->session_key);
	f->session_key = NULL;
	buf_reset(&f->in);
	for (int i = 0; i < MILTER_MACRO_STAGES; i++)
	{
		free(f->macros[i]);
		f->macros[i] = NULL;
	}
}

void
milter_client_free(struct milter_client *f)
{
	if (f == NULL)
		return;
	if (f->fd >= 0)
	{
		struct buf quit = BUF_INIT;

		/* A courtesy: the filter may log a clean end.  Never waited on. */
		milter_encode(&quit, MILTER_CMD_QUIT, NULL, 0);
		if (write(f->fd, quit.data, quit.len) < 0)
			log_debug("milter %s: QUIT not sent: %s", f->name, strerror(errno));
		buf_free(&quit);
	}
	filter_close(f);
	buf_free(&f->in);
	milter_address_free(&f->address);
	free(f->name);
	free(f);
}

const char *
milter_client_name(const struct milter_client *f)
{
	return f->name;
}

uint32_t
milter_client_protocol(const struct milter_client *f)
{
	return f->protocol;
}

void
milter_session_init(struct milter_session *s, struct milter_client *c,
					const struct milter_timeouts *timeouts, const struct milter_session_calls *calls)
{
	*s = (struct milter_session){.client = c, .timeouts = timeouts, .calls = calls};
}

void
milter_session_free(struct milter_session *s)
{
	free(s->reply);
	s->reply = NULL;
	free(s->pending);
	s->pending = NULL;
	buf_free(&s->out);
	buf_free(&s->edits);
}

static long long
filter_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool __attribute__((format(printf, 2, 3)))
session_fail(struct milter_session *s, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(s->err, sizeof(s->err), fmt, ap);
	va_end(ap);
	return false;
}
/* Wait for the socket (POLLIN or POLLOUT) until deadline (monotonic ms). */
static bool
filter_wait(struct milter_session *s, short events, long long deadline, const char *what)
{
	for (;;)
	{
		struct pollfd p = {.fd = s->client->fd, .events = events};
		long long	  left = deadline - filter_now_ms();
		int			  n;

		if (left <= 0)
			return session_fail(s, "no answer within the timeout %s", what);
		n = poll(&p, 1, (int) (left > 60000 ? 60000 : left));
		if (n > 0)
			return true;
		if (n < 0 && errno != EINTR)
			return session_fail(s, "poll: %s", strerror(errno));
	}
}

static bool
filter_connect(struct milter_session *s)
{
	struct milter_client *f = s->client;
	long long			  deadline = filter_now_ms() + s->timeouts->connect_ms;
	struct addrinfo		  hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
	struct addrinfo		 *list = NULL;
	int					  rc;

	if (f->address.family == MILTER_ADDRESS_UNIX)
	{
		struct sockaddr_un sun = {.sun_family = AF_UNIX};

		if (strlen(f->address.path) >= sizeof(sun.sun_path))
			return session_fail(s, "socket path too long");
		strcpy(sun.sun_path, f->address.path);
		f->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (f->fd < 0)
			return session_fail(s, "socket: %s", strerror(errno));
		rc = connect(f->fd, (struct sockaddr *) &sun, sizeof(sun));
	}
	else
	{
		int gai = getaddrinfo(f->address.host, f->address.port, &hints, &list);

		if (gai != 0)
			return session_fail(s, "cannot resolve %s: %s", f->address.host, gai_strerror(gai));
		f->fd = socket(list->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (f->fd < 0)
		{
			freeaddrinfo(list);
			return session_fail(s, "socket: %s", strerror(errno));
		}
		/* Commands and replies are small and strictly alternate: no Nagle wait. */
		setsockopt(f->fd, IPPROTO_TCP, TCP_NODELAY, &(int){1}, sizeof(int));
		rc = connect(f->fd, list->ai_addr, list->ai_addrlen);
		freeaddrinfo(list);
	}
	if (rc != 0 && errno != EINPROGRESS)
		return session_fail(s, "cannot connect: %s", strerror(errno));
	if (rc != 0)
	{
		int		  so_error = 0;
		socklen_t len = sizeof(so_error);

		if (!filter_wait(s, POLLOUT, deadline, "to connect"))
			return false;
		if (getsockopt(f->fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0 || so_error != 0)
			return session_fail(s, "cannot connect: %s", strerror(so_error ? so_error : errno));
	}
	return true;
}

static bool
filter_send(struct milter_session *s)
{
	long long deadline = filter_now_ms() + s->timeouts->command_ms;
	size_t	  done = 0;

	while (done < s->out.len)
	{
		ssize_t n = send(s->client->fd, s->out.data + done, s->out.len - done, MSG_NOSIGNAL);

		if (n > 0)
		{
			done += (size_t) n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		{
			if (!filter_wait(s, POLLOUT, deadline, "to take a command"))
				return false;
			continue;
		}
		if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
			return session_fail(s, "the filter closed the connection (%s)", strerror(errno));
		return session_fail(s, "cannot send: %s", n < 0 ? strerror(errno) : "connection closed");
	}
	buf_reset(&s->out);
	return true;
}

/*
 * The next packet, checked: its reply in *r (strings pointing into the
 * input buffer, valid until the next read).  PROGRESS restarts the clock.
 */
static bool
filter_read_reply(struct milter_session *s, long timeout_ms, struct milter_reply *r, size_t *consumed)
{
	struct milter_client *f = s->client;
	long long			  deadline = filter_now_ms() + timeout_ms;

	for (;;)
	{
		char					 command;
		const char				*payload;
		size_t					 payload_len;
		enum milter_frame_result fr;
		char					 buffer[16384];
		ssize_t					 n;

		if (*consumed)
		{
			buf_consume(&f->in, *consumed);
			*consumed = 0;
		}
		fr = milter_frame(f->in.data, f->in.len, MILTER_MAX_PACKET, &command, &payload, &payload_len,
						  consumed, s->err, sizeof(s->err));
		if (fr == MILTER_FRAME_ERROR)
			return false;
		if (fr == MILTER_FRAME_OK)
		{
			if (!milter_parse_reply(command, payload, payload_len, r, s->err, sizeof(s->err)))
				return false;
			s->replies++;
			if (r->command == MILTER_REPLY_PROGRESS)
			{
				deadline = filter_now_ms() + timeout_ms;
				continue;
			}
			return true;
		}
		if (!filter_wait(s, POLLIN, deadline, "for a reply"))
			return false;
		n = recv(f->fd, buffer, sizeof(buffer), 0);
		if (n == 0)
			return session_fail(s, "the filter closed the connection");
		if (n < 0)
		{
			if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
				continue;
			/* a filter that closes with commands unread resets the connection */
			if (errno == ECONNRESET)
				return session_fail(s, "the filter closed the connection (%s)", strerror(errno));
			return session_fail(s, "cannot read: %s", strerror(errno));
		}
		buf_append(&f->in, buffer, (size_t) n);
	}
}

static bool
filter_negotiate(struct milter_session *s)
{
	struct milter_client *f = s->client;
	struct milter_reply	  r;
	size_t				  consumed = 0;

	milter_encode_optneg(&s->out, MILTER_ACTIONS_ALL, MILTER_PROTO_OFFERED);
	if (!filter_send(s) || !filter_read_reply(s, s->timeouts->command_ms, &r, &consumed))
		return false;
	if (r.command != MILTER_REPLY_OPTNEG)
		return session_fail(s, "the filter answered the negotiation with %s", milter_reply_name(r.command));
	if (r.version < 2 || r.version > MILTER_VERSION)
		return session_fail(s, "the filter speaks protocol version %u (2 to %d are understood)",
							r.version, MILTER_VERSION);
	if (r.actions & ~MILTER_ACTIONS_ALL)
		return session_fail(s, "the filter asks for actions 0x%x beyond those offered", r.actions);
	if (r.protocol & ~MILTER_PROTO_OFFERED)
		return session_fail(s, "the filter asks for protocol steps 0x%x beyond those offered",
							r.protocol & ~MILTER_PROTO_OFFERED);
	f->actions = r.actions;
	f->protocol = r.protocol;
	for (int i = 0; i < MILTER_MACRO_STAGES; i++)
		if (r.macros[i])
			f->macros[i] = xstrdup(r.macros[i]);
	buf_consume(&f->in, consumed);
	f->state = FILTER_READY;
	return true;
}


/* Postfix's default macro lists, per stage (milter_*_macros). */
static const char *const default_macros[MILTER_MACRO_STAGES] = {
	[MILTER_MACROS_CONNECT] = "j {daemon_name} v _ {client_addr} {client_name}",
	[MILTER_MACROS_HELO] = "{tls_version} {cipher} {cipher_bits}",
	[MILTER_MACROS_MAIL] = "i {auth_type} {auth_authen} {mail_addr}",
	[MILTER_MACROS_RCPT] = "{rcpt_addr}",
	[MILTER_MACROS_DATA] = "i",
	[MILTER_MACROS_EOM] = "i",
	[MILTER_MACROS_EOH] = "i",
};

/* The MACRO packet before a command: the filter's list for the stage, or Postfix's. */
static void
session_macros(struct milter_session *s, enum milter_macro_stage stage, char command, const char *rcpt)
{
	const char *list = s->client->macros[stage] ? s->client->macros[stage] : default_macros[stage];
	char	   *copy = xstrdup(list);
	const char *names[32];
	const char *values[32];
	char	   *owned[32];
	size_t		n = 0;
	char	   *save = NULL;

	for (char *word = strtok_r(copy, " ,", &save); word && n < 32; word = strtok_r(NULL, " ,", &save))
	{
		size_t		wlen = strlen(word);
		char	   *bare = (word[0] == '{' && wlen > 2 && word[wlen - 1] == '}')
							   ? xstrndup(word + 1, wlen - 2)
							   : xstrdup(word);
		char		scratch[512];
		const char *value = s->calls->macro_value(s->calls->arg, bare, rcpt, scratch, sizeof(scratch));

		free(bare);
		if (value == NULL)
			continue;
		owned[n] = xstrdup(value);
		names[n] = word;
		values[n] = owned[n];
		n++;
	}
	/* A long name goes over the wire in braces, as Postfix and Sendmail send it. */
	{
		char *braced[32];

		for (size_t i = 0; i < n; i++)
		{
			braced[i] = strlen(names[i]) > 1 && names[i][0] != '{' ? xasprintf("{%s}", names[i])
																   : xstrdup(names[i]);
			names[i] = braced[i];
		}
		if (n)
			milter_encode_macros(&s->out, command, names, values, n);
		for (size_t i = 0; i < n; i++)
		{
			free(braced[i]);
			free(owned[i]);
		}
	}
	free(copy);
}

static void
session_set_reply(struct milter_session *s, const char *text)
{
	free(s->reply);
	s->reply = xstrdup(text);
}

/*
 * A step is in s->out: unless the filter negotiated no reply for it
 * (no_reply), its reply is awaited, after the replies before it
 * (session_drain).  Nothing is read here; what is waiting is written out
 * once it is large.
 */
static enum milter_step
session_step(struct milter_session *s, const char *step, bool no_reply, bool body, ssize_t rcpt)
{
	if (!no_reply)
	{
		if (s->npending == s->pending_cap)
		{
			s->pending_cap = s->pending_cap ? 2 * s->pending_cap : 32;
			s->pending = xrealloc(s->pending, s->pending_cap * sizeof(*s->pending));
		}
		s->pending[s->npending++] = (struct milter_pending_step){.step = step, .body = body, .rcpt = rcpt};
	}
	if (s->out.len >= FILTER_SEND_THRESHOLD && !filter_send(s))
		return MILTER_STEP_ERROR;
	return MILTER_STEP_CONTINUE;
}

/*
 * What one reply before end of message means for the step it answers.
 * A refusal at RCPT refuses that recipient only (the caller hears of
 * it); any other reply but continue decides the message
 * (MILTER_STEP_DONE, *verdict).
 */
static enum milter_step
session_step_reply(struct milter_session *s, const struct milter_pending_step *ps,
				   const struct milter_reply *r, enum milter_verdict *verdict)
{
	enum milter_verdict v;

	switch (r->command)
	{
		case MILTER_REPLY_CONTINUE:
			return MILTER_STEP_CONTINUE;
		case MILTER_REPLY_ACCEPT:
			v = MILTER_VERDICT_ACCEPT;
			break;
		case MILTER_REPLY_REJECT:
			session_set_reply(s, "550 5.7.1 Command rejected");
			v = MILTER_VERDICT_REJECT;
			break;
		case MILTER_REPLY_TEMPFAIL:
			session_set_reply(s, "451 4.7.1 Service unavailable - try again later");
			v = MILTER_VERDICT_TEMPFAIL;
			break;
		case MILTER_REPLY_REPLYCODE:
			session_set_reply(s, r->text);
			v = r->code >= 500 ? MILTER_VERDICT_REJECT : MILTER_VERDICT_TEMPFAIL;
			break;
		case MILTER_REPLY_DISCARD:
			v = MILTER_VERDICT_DISCARD;
			break;
		case MILTER_REPLY_SKIP:
			if (!ps->body || !(s->client->protocol & MILTER_PROTO_SKIP))
			{
				session_fail(s, "the filter answered %s with SKIP", ps->step);
				return MILTER_STEP_ERROR;
			}
			return MILTER_STEP_SKIP;
		default:
			session_fail(s, "the filter answered %s with %s, out of order", ps->step,
						 milter_reply_name(r->command));
			return MILTER_STEP_ERROR;
	}
	if (ps->rcpt >= 0 && v != MILTER_VERDICT_ACCEPT && v != MILTER_VERDICT_DISCARD)
	{
		char *reply = s->reply;

		s->reply = NULL;
		s->calls->rcpt_refused(s->calls->arg, (size_t) ps->rcpt, v, reply);
		return MILTER_STEP_CONTINUE;
	}
	if (ps->rcpt >= 0 && v == MILTER_VERDICT_ACCEPT)
		return MILTER_STEP_CONTINUE; /* accept at RCPT: this recipient is accepted */
	/* Sendmail: a discard at RCPT drops the whole message */
	*verdict = v;
	return MILTER_STEP_DONE;
}

/*
 * Write what is waiting, then read the reply of every step awaiting one,
 * in order.  MILTER_STEP_CONTINUE when each let the message go on,
 * MILTER_STEP_SKIP when the last was a body chunk's SKIP,
 * MILTER_STEP_DONE (*verdict) at the first that decided, or
 * MILTER_STEP_ERROR.
 */
static enum milter_step
session_drain(struct milter_session *s, enum milter_verdict *verdict)
{
	enum milter_step outcome = MILTER_STEP_CONTINUE;

	if (s->out.len && !filter_send(s))
		return MILTER_STEP_ERROR;
	for (size_t i = 0; i < s->npending; i++)
	{
		struct milter_reply r;
		size_t				consumed = 0;

		if (!filter_read_reply(s, s->timeouts->command_ms, &r, &consumed))
			return MILTER_STEP_ERROR;
		outcome = session_step_reply(s, &s->pending[i], &r, verdict);
		buf_consume(&s->client->in, consumed);
		if (outcome == MILTER_STEP_ERROR || outcome == MILTER_STEP_DONE)
		{
			/* what is left are the steps written after the decision, unanswered */
			memmove(s->pending, s->pending + i + 1, (s->npending - i - 1) * sizeof(*s->pending));
			s->npending -= i + 1;
			return outcome;
		}
	}
	s->npending = 0;
	return outcome;
}

enum milter_step
milter_session_replies(struct milter_session *s, enum milter_verdict *verdict)
{
	return session_drain(s, verdict);
}

enum milter_step
milter_session_connect(struct milter_session *s, const char *hostname, const char *ip, unsigned port)
{
	uint32_t p = s->client->protocol;

	if ((p & MILTER_PROTO_NOCONNECT) || s->same_client)
		return MILTER_STEP_CONTINUE;
	session_macros(s, MILTER_MACROS_CONNECT, MILTER_CMD_CONNECT, NULL);
	milter_encode_connect(&s->out, hostname, ip, port);
	return session_step(s, "CONNECT", p & MILTER_PROTO_NR_CONN, false, -1);
}

enum milter_step
milter_session_helo(struct milter_session *s, const char *helo)
{
	uint32_t	p = s->client->protocol;
	const char *strings[1] = {helo};

	if ((p & MILTER_PROTO_NOHELO) || s->same_client)
		return MILTER_STEP_CONTINUE;
	session_macros(s, MILTER_MACROS_HELO, MILTER_CMD_HELO, NULL);
	milter_encode_strings(&s->out, MILTER_CMD_HELO, strings, 1);
	return session_step(s, "HELO", p & MILTER_PROTO_NR_HELO, false, -1);
}

enum milter_step
milter_session_mail(struct milter_session *s, const char *mail_from, const char *const *esmtp,
					size_t nesmtp)
{
	uint32_t	 p = s->client->protocol;
	const char **strings;
	char		*mail;

	if (p & MILTER_PROTO_NOMAIL)
		return MILTER_STEP_CONTINUE;
	strings = xcalloc(nesmtp + 1, sizeof(*strings));
	mail = xasprintf("<%s>", mail_from);
	strings[0] = mail;
	for (size_t i = 0; i < nesmtp; i++)
		strings[i + 1] = esmtp[i];
	session_macros(s, MILTER_MACROS_MAIL, MILTER_CMD_MAIL, NULL);
	milter_encode_strings(&s->out, MILTER_CMD_MAIL, strings, nesmtp + 1);
	free(mail);
	free(strings);
	return session_step(s, "MAIL", p & MILTER_PROTO_NR_MAIL, false, -1);
}

enum milter_step
milter_session_rcpt(struct milter_session *s, const char *address, size_t rcpt)
{
	uint32_t	p = s->client->protocol;
	const char *strings[1];
	char	   *bracketed;

	if (p & MILTER_PROTO_NORCPT)
		return MILTER_STEP_CONTINUE;
	bracketed = xasprintf("<%s>", address);
	strings[0] = bracketed;
	session_macros(s, MILTER_MACROS_RCPT, MILTER_CMD_RCPT, address);
	milter_encode_strings(&s->out, MILTER_CMD_RCPT, strings, 1);
	free(bracketed);
	/* its reply, read with the others, refuses this recipient or lets it be */
	return session_step(s, "RCPT", p & MILTER_PROTO_NR_RCPT, false, (ssize_t) rcpt);
}

/* A step with no payload (DATA, end of headers): skipped, or sent after its macros. */
static enum milter_step
session_empty_step(struct milter_session *s, uint32_t skip, enum milter_macro_stage macros, char command,
				   const char *step, uint32_t no_reply)
{
	uint32_t p = s->client->protocol;

	if (p & skip)
		return MILTER_STEP_CONTINUE;
	session_macros(s, macros, command, NULL);
	milter_encode(&s->out, command, NULL, 0);
	return session_step(s, step, p & no_reply, false, -1);
}

enum milter_step
milter_session_data(struct milter_session *s)
{
	return session_empty_step(s, MILTER_PROTO_NODATA, MILTER_MACROS_DATA, MILTER_CMD_DATA, "DATA",
							  MILTER_PROTO_NR_DATA);
}

enum milter_step
milter_session_header(struct milter_session *s, const char *name, const char *value)
{
	uint32_t	p = s->client->protocol;
	const char *strings[2] = {name, value};

	if (p & MILTER_PROTO_NOHDRS)
		return MILTER_STEP_CONTINUE;
	milter_encode_strings(&s->out, MILTER_CMD_HEADER, strings, 2);
	return session_step(s, "HEADER", p & MILTER_PROTO_NR_HDR, false, -1);
}

enum milter_step
milter_session_end_of_headers(struct milter_session *s)
{
	return session_empty_step(s, MILTER_PROTO_NOEOH, MILTER_MACROS_EOH, MILTER_CMD_EOH, "end of headers",
							  MILTER_PROTO_NR_EOH);
}

enum milter_step
milter_session_body(struct milter_session *s, const char *body, size_t body_len,
					enum milter_verdict *verdict)
{
	uint32_t		 p = s->client->protocol;
	bool			 stepwise;
	enum milter_step o;

	if (p & MILTER_PROTO_NOBODY)
		return MILTER_STEP_CONTINUE;
	/*
	 * A filter that may SKIP the rest of a body of several chunks is asked
	 * chunk by chunk (after the replies so far), so that no chunk follows
	 * its SKIP; otherwise the chunks are pipelined with the rest.
	 */
	stepwise = (p & MILTER_PROTO_SKIP) && !(p & MILTER_PROTO_NR_BODY) && body_len > MILTER_CHUNK_SIZE;
	for (size_t at = 0; at < body_len; at += MILTER_CHUNK_SIZE)
	{
		size_t len = body_len - at < MILTER_CHUNK_SIZE ? body_len - at : MILTER_CHUNK_SIZE;

		milter_encode(&s->out, MILTER_CMD_BODY, body + at, len);
		if ((o = session_step(s, "BODY", p & MILTER_PROTO_NR_BODY, true, -1)) != MILTER_STEP_CONTINUE)
			return o;
		if (!stepwise)
			continue;
		o = session_drain(s, verdict);
		if (o == MILTER_STEP_SKIP)
			break;
		if (o != MILTER_STEP_CONTINUE)
			return o;
	}
	return MILTER_STEP_CONTINUE;
}

enum milter_step
milter_session_end_of_message(struct milter_session *s, enum milter_verdict *verdict)
{
	session_macros(s, MILTER_MACROS_EOM, MILTER_CMD_EOM, NULL);
	milter_encode(&s->out, MILTER_CMD_EOM, NULL, 0);
	return session_drain(s, verdict);
}

/* An end-of-message edit: is it one the filter negotiated? */
static bool
session_edit_allowed(struct milter_session *s, char command)
{
	uint32_t need = 0;

	switch (command)
	{
		case MILTER_REPLY_ADDHEADER:
			need = MILTER_ACTION_ADDHDRS;
			break;
		case MILTER_REPLY_INSHEADER:
			need = MILTER_ACTION_ADDHDRS;
			break;
		case MILTER_REPLY_CHGHEADER:
			need = MILTER_ACTION_CHGHDRS;
			break;
		case MILTER_REPLY_REPLBODY:
			need = MILTER_ACTION_CHGBODY;
			break;
		case MILTER_REPLY_ADDRCPT:
			need = MILTER_ACTION_ADDRCPT;
			break;
		case MILTER_REPLY_ADDRCPT_PAR:
			need = MILTER_ACTION_ADDRCPT_PAR;
			break;
		case MILTER_REPLY_DELRCPT:
			need = MILTER_ACTION_DELRCPT;
			break;
		case MILTER_REPLY_CHGFROM:
			need = MILTER_ACTION_CHGFROM;
			break;
		case MILTER_REPLY_QUARANTINE:
			need = MILTER_ACTION_QUARANTINE;
			break;
		default:
			return false;
	}
	return (s->client->actions & need) != 0;
}

/*
 * An edit before the final reply (r, the packet of consumed bytes at the
 * head of the input): checked and kept as command, length, payload.
 * False with s->err when the filter may not send it or sent too many.
 */
static bool
session_keep_edit(struct milter_session *s, const struct milter_reply *r, size_t consumed)
{
	size_t len;

	if (!session_edit_allowed(s, r->command))
	{
		const char *name = milter_reply_name(r->command);

		if (r->command == MILTER_REPLY_SKIP || r->command == MILTER_REPLY_OPTNEG
			|| r->command == MILTER_REPLY_SHUTDOWN || r->command == MILTER_REPLY_CONN_FAIL)
			return session_fail(s, "the filter answered end of message with %s", name);
		return session_fail(s, "the filter sent %s without negotiating the action", name);
	}
	len = consumed - 5;
	if (s->nedits >= FILTER_MAX_EDITS || s->edits.len + len > FILTER_MAX_EDIT_BYTES)
		return session_fail(s, "the filter sent more than %d edits or %d MB of them", FILTER_MAX_EDITS,
							FILTER_MAX_EDIT_BYTES >> 20);
	buf_append_char(&s->edits, r->command);
	buf_append(&s->edits, &len, sizeof(len));
	buf_append(&s->edits, s->client->in.data + 5, len);
	s->nedits++;
	return true;
}

enum milter_step
milter_session_final_reply(struct milter_session *s, enum milter_verdict *verdict)
{
	for (;;)
	{
		struct milter_reply r;
		size_t				consumed = 0;
		bool				kept;

		if (!filter_read_reply(s, s->timeouts->final_ms, &r, &consumed))
			return MILTER_STEP_ERROR;
		switch (r.command)
		{
			case MILTER_REPLY_CONTINUE:
				/*
				 * Only here does libmilter stay at end of message, where
				 * QUIT_NC may follow: after any other final reply it
				 * ignores QUIT_NC and CONNECT, so that connection is closed.
				 */
				s->completed = true;
				/* FALLTHROUGH */
			case MILTER_REPLY_ACCEPT:
				*verdict = MILTER_VERDICT_ACCEPT;
				break;
			case MILTER_REPLY_REJECT:
				session_set_reply(s, "550 5.7.1 Command rejected");
				*verdict = MILTER_VERDICT_REJECT;
				break;
			case MILTER_REPLY_TEMPFAIL:
				session_set_reply(s, "451 4.7.1 Service unavailable - try again later");
				*verdict = MILTER_VERDICT_TEMPFAIL;
				break;
			case MILTER_REPLY_REPLYCODE:
				session_set_reply(s, r.text);
				*verdict = r.code >= 500 ? MILTER_VERDICT_REJECT : MILTER_VERDICT_TEMPFAIL;
				break;
			case MILTER_REPLY_DISCARD:
				*verdict = MILTER_VERDICT_DISCARD;
				break;
			default:
				/* kept until the final reply */
				kept = session_keep_edit(s, &r, consumed);
				buf_consume(&s->client->in, consumed);
				if (!kept)
					return MILTER_STEP_ERROR;
				continue;
		}
		buf_consume(&s->client->in, consumed);
		return MILTER_STEP_DONE;
	}
}

bool
milter_session_next_edit(const struct milter_session *s, size_t *at, struct milter_reply *edit)
{
	char   command;
	size_t len;
	char   err[256];

	if (*at >= s->edits.len)
		return false;
	command = s->edits.data[*at];
	memcpy(&len, s->edits.data + *at + 1, sizeof(len));
	if (!milter_parse_reply(command, s->edits.data + *at + 1 + sizeof(len), len, edit, err, sizeof(err)))
		fatalx("milter: an edit checked once failed its second check: %s", err);
	*at += 1 + sizeof(len) + len;
	return true;
}

enum milter_step
milter_session_begin(struct milter_session *s, const char *client_key)
{
	struct milter_client *f = s->client;

	if (f->state == FILTER_CLOSED && !(filter_connect(s) && filter_negotiate(s)))
		return MILTER_STEP_ERROR;
	/*
	 * The next message from the same client is the next transaction of
	 * its session, as Postfix sends a client's messages: MAIL follows the
	 * previous end of message.  Another client is another connection.
	 */
	s->same_client = f->state == FILTER_USED && f->session_key && strcmp(f->session_key, client_key) == 0;
	if (f->state == FILTER_USED && !s->same_client)
		milter_encode(&s->out, MILTER_CMD_QUIT_NEW_CONNECTION, NULL, 0);
	f->state = FILTER_USED;
	free(f->session_key);
	f->session_key = xstrdup(client_key);
	return MILTER_STEP_CONTINUE;
}

void
milter_session_next_transaction(struct milter_session *s, bool tell_filter)
{
	if (tell_filter)
		milter_encode(&s->out, MILTER_CMD_ABORT, NULL, 0);
	free(s->reply);
	s->reply = NULL;
	buf_reset(&s->edits);
	s->nedits = 0;
	s->completed = false;
	s->npending = 0;
}

void
milter_session_end(struct milter_session *s, enum milter_step outcome)
{
	if (outcome == MILTER_STEP_DONE && !s->completed)
	{
		milter_encode(&s->out, MILTER_CMD_QUIT, NULL, 0);
		if (!filter_send(s))
			log_debug("milter %s: ABORT not sent: %s", s->client->name, s->err);
		filter_close(s->client);
	}
}

static enum milter_step
session_attempt(struct milter_session *s, const char *client_key, milter_session_walk walk, void *arg,
				enum milter_verdict *verdict)
{
	enum milter_step o = milter_session_begin(s, client_key);

	if (o != MILTER_STEP_CONTINUE)
		return o;
	o = walk(s, arg, verdict);
	milter_session_end(s, o);
	return o;
}

enum milter_verdict
milter_session_run(struct milter_session *s, const char *client_key, milter_session_walk walk,
				   void *arg, char **reply)
{
	struct milter_client *f = s->client;
	enum milter_verdict	  verdict = MILTER_VERDICT_UNAVAILABLE;
	bool				  reused = f->state == FILTER_USED;
	enum milter_step	  o;

	*reply = NULL;
	o = session_attempt(s, client_key, walk, arg, &verdict);
	if (o == MILTER_STEP_ERROR && reused && s->replies == 0)
	{
		/* A kept connection the filter closed while idle: once more, afresh. */
		log_debug("milter %s: the kept connection failed (%s); connecting again", f->name, s->err);
		filter_close(f);
		buf_reset(&s->out);
		s->npending = 0;
		s->err[0] = '\0';
		o = session_attempt(s, client_key, walk, arg, &verdict);
	}
	if (o != MILTER_STEP_DONE)
	{
		verdict = MILTER_VERDICT_UNAVAILABLE;
		*reply = xstrdup(s->err[0] ? s->err : "the filter failed");
		filter_close(f);
	}
	else if (s->reply)
	{
		*reply = s->reply;
		s->reply = NULL;
	}
	return verdict;
}
