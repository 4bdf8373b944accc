/*
 * filter.c: one filter of pepsi-stage-milter, as Postfix's milter8 client
 * talks to it: a connection kept open across messages (each message is a
 * connection of its own to the filter, separated by QUIT_NC), negotiated
 * once, and one function that walks a message through the protocol steps
 * the filter asked for.
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
 * and opened again for the next, and the stage's DEFAULT_ACTION decides.
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
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "milter_stage.h"

/* What one filter may ask at one end of message: the edits are held in memory. */
#define FILTER_MAX_EDITS 10000
#define FILTER_MAX_EDIT_BYTES (256 << 20)

enum filter_state
{
	FILTER_CLOSED, /* no connection: open and negotiate before use */
	FILTER_READY,  /* negotiated, no message started on it */
	FILTER_USED	   /* a message went through: QUIT_NC before the next, */
				   /* unless it came from the same client (session_key): then it is the next transaction */
};

struct milter_filter
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

/* One conversation about one message. */
struct filter_session
{
	struct milter_filter			 *f;
	struct milter_message			 *m;
	const struct milter_macro_source *source;
	const struct milter_timeouts	 *timeouts;
	struct buf						  out;
	char							  err[512];
	/* the end-of-message edits, kept until the final reply says they stand */
	struct buf edits;
	size_t	   nedits;
	char	  *reply;		/* reject/tempfail text */
	size_t	   replies;		/* read so far */
	bool	   completed;	/* through end of message: the connection can take another */
	bool	   same_client; /* CONNECT and HELO were for this client already */
	/* the steps written and not yet answered, oldest first */
	struct pending_step *pending;
	size_t				 npending;
	size_t				 pending_cap;
};

/* A step whose reply is still to be read: what it was, for the checks and the messages. */
struct pending_step
{
	const char *step;
	bool		body;
	ssize_t		rcpt; /* the recipient's index for RCPT, else -1 */
};

/* Written out once this much is waiting, so a large message is never held whole. */
#define FILTER_SEND_THRESHOLD (256 * 1024)

struct milter_filter *
milter_filter_new(const char *address_text, char *err, size_t errlen)
{
	struct milter_filter *f = xcalloc(1, sizeof(*f));

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
filter_close(struct milter_filter *f)
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
milter_filter_free(struct milter_filter *f)
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
milter_filter_name(const struct milter_filter *f)
{
	return f->name;
}

static long long
filter_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool __attribute__((format(printf, 2, 3)))
session_fail(struct filter_session *s, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(s->err, sizeof(s->err), fmt, ap);
	va_end(ap);
	return false;
}

/* Wait for the socket (POLLIN or POLLOUT) until deadline (monotonic ms). */
static bool
filter_wait(struct filter_session *s, short events, long long deadline, const char *what)
{
	for (;;)
	{
		struct pollfd p = {.fd = s->f->fd, .events = events};
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
filter_connect(struct filter_session *s)
{
	struct milter_filter *f = s->f;
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
filter_send(struct filter_session *s)
{
	long long deadline = filter_now_ms() + s->timeouts->command_ms;
	size_t	  done = 0;

	while (done < s->out.len)
	{
		ssize_t n = send(s->f->fd, s->out.data + done, s->out.len - done, MSG_NOSIGNAL);

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
filter_read_reply(struct filter_session *s, long timeout_ms, struct milter_reply *r, size_t *consumed)
{
	struct milter_filter *f = s->f;
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
filter_negotiate(struct filter_session *s)
{
	struct milter_filter *f = s->f;
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

/* A string of state.origin, or NULL. */
static const char *
origin_string(const struct milter_macro_source *source, const char *key)
{
	return source->origin ? json_string_value(json_object_get(source->origin, key)) : NULL;
}

static const char *
origin_tls_string(const struct milter_macro_source *source, const char *key, char *scratch, size_t len)
{
	json_t *tls = source->origin ? json_object_get(source->origin, "tls") : NULL;
	json_t *value = json_is_object(tls) ? json_object_get(tls, key) : NULL;

	if (json_is_integer(value))
	{
		snprintf(scratch, len, "%lld", (long long) json_integer_value(value));
		return scratch;
	}
	return json_string_value(value);
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

/* A macro's value, or NULL when this message has none. */
static const char *
session_macro_value(struct filter_session *s, const char *name, const char *rcpt, char *scratch,
					size_t len)
{
	const struct milter_macro_source *src = s->source;
	const char						 *ip = origin_string(src, "client_ip");

	if (strcmp(name, "j") == 0)
		return src->hostname;
	if (strcmp(name, "i") == 0)
		return src->queue_id;
	if (strcmp(name, "v") == 0)
		return "Pepsi";
	if (strcmp(name, "daemon_name") == 0)
		return origin_string(src, "listener");
	if (strcmp(name, "client_addr") == 0)
		return ip;
	if (strcmp(name, "client_name") == 0)
		return ip ? "unknown" : NULL;
	if (strcmp(name, "_") == 0)
	{
		if (ip == NULL)
			return NULL;
		snprintf(scratch, len, "unknown [%s]", ip);
		return scratch;
	}
	if (strcmp(name, "auth_authen") == 0)
		return origin_string(src, "auth");
	if (strcmp(name, "auth_type") == 0)
		return origin_string(src, "auth") ? "PLAIN" : NULL;
	if (strcmp(name, "tls_version") == 0)
		return origin_tls_string(src, "version", scratch, len);
	if (strcmp(name, "cipher") == 0)
		return origin_tls_string(src, "cipher", scratch, len);
	if (strcmp(name, "cipher_bits") == 0)
		return origin_tls_string(src, "bits", scratch, len);
	if (strcmp(name, "mail_addr") == 0)
		return s->m->mail_from;
	if (strcmp(name, "rcpt_addr") == 0)
		return rcpt;
	return NULL;
}

/* The MACRO packet before a command: the filter's list for the stage, or Postfix's. */
static void
session_macros(struct filter_session *s, enum milter_macro_stage stage, char command, const char *rcpt)
{
	const char *list = s->f->macros[stage] ? s->f->macros[stage] : default_macros[stage];
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
		const char *value = session_macro_value(s, bare, rcpt, scratch, sizeof(scratch));

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

enum step_outcome
{
	STEP_CONTINUE, /* go on to the next step */
	STEP_SKIP,	   /* BODY only: no more body chunks */
	STEP_DONE,	   /* the verdict is known: stop talking about this message */
	STEP_ERROR	   /* unavailable: s->err says why */
};

static void
session_set_reply(struct filter_session *s, const char *text)
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
static enum step_outcome
session_step(struct filter_session *s, const char *step, bool no_reply, bool body, ssize_t rcpt)
{
	if (!no_reply)
	{
		if (s->npending == s->pending_cap)
		{
			s->pending_cap = s->pending_cap ? 2 * s->pending_cap : 32;
			s->pending = xrealloc(s->pending, s->pending_cap * sizeof(*s->pending));
		}
		s->pending[s->npending++] = (struct pending_step){.step = step, .body = body, .rcpt = rcpt};
	}
	if (s->out.len >= FILTER_SEND_THRESHOLD && !filter_send(s))
		return STEP_ERROR;
	return STEP_CONTINUE;
}

/*
 * What one reply before end of message means for the step it answers.
 * A refusal at RCPT refuses that recipient only (its fate is set here);
 * any other reply but continue decides the message (STEP_DONE, *verdict).
 */
static enum step_outcome
session_step_reply(struct filter_session *s, const struct pending_step *ps,
				   const struct milter_reply *r, enum milter_verdict *verdict)
{
	enum milter_verdict v;

	switch (r->command)
	{
		case MILTER_REPLY_CONTINUE:
			return STEP_CONTINUE;
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
			if (!ps->body || !(s->f->protocol & MILTER_PROTO_SKIP))
			{
				session_fail(s, "the filter answered %s with SKIP", ps->step);
				return STEP_ERROR;
			}
			return STEP_SKIP;
		default:
			session_fail(s, "the filter answered %s with %s, out of order", ps->step,
						 milter_reply_name(r->command));
			return STEP_ERROR;
	}
	if (ps->rcpt >= 0 && v != MILTER_VERDICT_ACCEPT && v != MILTER_VERDICT_DISCARD)
	{
		struct milter_rcpt *rcpt = &s->m->rcpt[ps->rcpt];

		rcpt->fate = v == MILTER_VERDICT_REJECT ? MILTER_RCPT_REJECTED : MILTER_RCPT_TEMPFAILED;
		rcpt->reply = s->reply;
		s->reply = NULL;
		rcpt->filter = xstrdup(s->f->name);
		return STEP_CONTINUE;
	}
	if (ps->rcpt >= 0 && v == MILTER_VERDICT_ACCEPT)
		return STEP_CONTINUE; /* accept at RCPT: this recipient is accepted */
	/* Sendmail: a discard at RCPT drops the whole message */
	*verdict = v;
	return STEP_DONE;
}

/*
 * Write what is waiting, then read the reply of every step awaiting one,
 * in order.  STEP_CONTINUE when each let the message go on, STEP_SKIP
 * when the last was a body chunk's SKIP, STEP_DONE (*verdict) at the
 * first that decided, or STEP_ERROR.
 */
static enum step_outcome
session_drain(struct filter_session *s, enum milter_verdict *verdict)
{
	enum step_outcome outcome = STEP_CONTINUE;

	if (s->out.len && !filter_send(s))
		return STEP_ERROR;
	for (size_t i = 0; i < s->npending; i++)
	{
		struct milter_reply r;
		size_t				consumed = 0;

		if (!filter_read_reply(s, s->timeouts->command_ms, &r, &consumed))
			return STEP_ERROR;
		outcome = session_step_reply(s, &s->pending[i], &r, verdict);
		buf_consume(&s->f->in, consumed);
		if (outcome == STEP_ERROR || outcome == STEP_DONE)
			return outcome;
	}
	s->npending = 0;
	return outcome;
}

/* An end-of-message edit: is it one the filter negotiated? */
static bool
session_edit_allowed(struct filter_session *s, char command)
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
	return (s->f->actions & need) != 0;
}

/* Apply the kept edits, in the order the filter sent them. */
static void
session_apply_edits(struct filter_session *s)
{
	bool   leadspc = (s->f->protocol & MILTER_PROTO_HDR_LEADSPC) != 0;
	bool   first_chunk = true;
	size_t at = 0;

	for (size_t i = 0; i < s->nedits; i++)
	{
		char				command = s->edits.data[at];
		size_t				len;
		struct milter_reply r;
		char				err[256];

		memcpy(&len, s->edits.data + at + 1, sizeof(len));
		if (!milter_parse_reply(command, s->edits.data + at + 1 + sizeof(len), len, &r, err, sizeof(err)))
			fatalx("milter: an edit checked once failed its second check: %s", err);
		at += 1 + sizeof(len) + len;
		switch (command)
		{
			case MILTER_REPLY_ADDHEADER:
				milter_message_add_header(s->m, r.name, r.value, leadspc);
				break;
			case MILTER_REPLY_INSHEADER:
				milter_message_insert_header(s->m, r.index, r.name, r.value, leadspc);
				break;
			case MILTER_REPLY_CHGHEADER:
				milter_message_change_header(s->m, r.index, r.name, r.value, leadspc);
				break;
			case MILTER_REPLY_REPLBODY:
				milter_message_body_chunk(s->m, r.data, r.data_len, first_chunk);
				first_chunk = false;
				break;
			case MILTER_REPLY_ADDRCPT:
			case MILTER_REPLY_ADDRCPT_PAR:
				milter_message_add_rcpt(s->m, r.text);
				break;
			case MILTER_REPLY_DELRCPT:
				milter_message_delete_rcpt(s->m, r.text);
				break;
			case MILTER_REPLY_CHGFROM:
				milter_message_change_from(s->m, r.text);
				break;
			case MILTER_REPLY_QUARANTINE:
				free(s->m->quarantine);
				s->m->quarantine = xstrdup(r.text);
				break;
		}
	}
}

/* End of message: edits until the final reply (under the final timeout). */
static enum step_outcome
session_end_of_message(struct filter_session *s, enum milter_verdict *verdict)
{
	enum step_outcome o;
	size_t			  accepted = 0;

	session_macros(s, MILTER_MACROS_EOM, MILTER_CMD_EOM, NULL);
	milter_encode(&s->out, MILTER_CMD_EOM, NULL, 0);
	o = session_drain(s, verdict);
	if (o == STEP_ERROR || o == STEP_DONE)
		return o;
	for (size_t i = 0; i < s->m->nrcpt; i++)
		accepted += s->m->rcpt[i].fate == MILTER_RCPT_ACCEPTED;
	if (accepted == 0)
	{
		/*
		 * The filter refused every recipient: the message goes on as far
		 * as it is concerned, its end-of-message replies unread (the
		 * connection is closed, as after any verdict but continue).
		 */
		*verdict = MILTER_VERDICT_ACCEPT;
		return STEP_DONE;
	}
	for (;;)
	{
		struct milter_reply r;
		size_t				consumed = 0;
		size_t				len;

		if (!filter_read_reply(s, s->timeouts->final_ms, &r, &consumed))
			return STEP_ERROR;
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
				session_apply_edits(s);
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
				if (!session_edit_allowed(s, r.command))
				{
					const char *name = milter_reply_name(r.command);

					buf_consume(&s->f->in, consumed);
					if (r.command == MILTER_REPLY_SKIP || r.command == MILTER_REPLY_OPTNEG
						|| r.command == MILTER_REPLY_SHUTDOWN || r.command == MILTER_REPLY_CONN_FAIL)
						session_fail(s, "the filter answered end of message with %s", name);
					else
						session_fail(s, "the filter sent %s without negotiating the action", name);
					return STEP_ERROR;
				}
				/* kept as command, length, payload until the final reply */
				len = consumed - 5;
				if (s->nedits >= FILTER_MAX_EDITS || s->edits.len + len > FILTER_MAX_EDIT_BYTES)
				{
					buf_consume(&s->f->in, consumed);
					session_fail(s, "the filter sent more than %d edits or %d MB of them",
								 FILTER_MAX_EDITS, FILTER_MAX_EDIT_BYTES >> 20);
					return STEP_ERROR;
				}
				buf_append_char(&s->edits, r.command);
				buf_append(&s->edits, &len, sizeof(len));
				buf_append(&s->edits, s->f->in.data + 5, len);
				s->nedits++;
				buf_consume(&s->f->in, consumed);
				continue;
		}
		buf_consume(&s->f->in, consumed);
		return STEP_DONE;
	}
}

static enum step_outcome
session_headers_and_body(struct filter_session *s, enum milter_verdict *verdict)
{
	uint32_t		  p = s->f->protocol;
	bool			  leadspc = (p & MILTER_PROTO_HDR_LEADSPC) != 0;
	bool			  stepwise;
	enum step_outcome o;

	if (!(p & MILTER_PROTO_NODATA))
	{
		session_macros(s, MILTER_MACROS_DATA, MILTER_CMD_DATA, NULL);
		milter_encode(&s->out, MILTER_CMD_DATA, NULL, 0);
		if ((o = session_step(s, "DATA", p & MILTER_PROTO_NR_DATA, false, -1)) != STEP_CONTINUE)
			return o;
	}
	if (!(p & MILTER_PROTO_NOHDRS))
		for (size_t i = 0; i < s->m->nheaders; i++)
		{
			const struct milter_header *h = &s->m->headers[i];
			char					   *value;
			const char				   *strings[2];

			if (h->name == NULL)
				continue;
			value = milter_header_for_filter(h->value, leadspc);
			strings[0] = h->name;
			strings[1] = value;
			milter_encode_strings(&s->out, MILTER_CMD_HEADER, strings, 2);
			free(value);
			if ((o = session_step(s, "HEADER", p & MILTER_PROTO_NR_HDR, false, -1)) != STEP_CONTINUE)
				return o;
		}
	if (!(p & MILTER_PROTO_NOEOH))
	{
		session_macros(s, MILTER_MACROS_EOH, MILTER_CMD_EOH, NULL);
		milter_encode(&s->out, MILTER_CMD_EOH, NULL, 0);
		if ((o = session_step(s, "end of headers", p & MILTER_PROTO_NR_EOH, false, -1)) != STEP_CONTINUE)
			return o;
	}
	/*
	 * A filter that may SKIP the rest of a body of several chunks is asked
	 * chunk by chunk (after the replies so far), so that no chunk follows
	 * its SKIP; otherwise the chunks are pipelined with the rest.
	 */
	stepwise = (p & MILTER_PROTO_SKIP) && !(p & MILTER_PROTO_NR_BODY) && s->m->body.len > MILTER_CHUNK_SIZE;
	if (!(p & MILTER_PROTO_NOBODY))
		for (size_t at = 0; at < s->m->body.len; at += MILTER_CHUNK_SIZE)
		{
			size_t len = s->m->body.len - at < MILTER_CHUNK_SIZE ? s->m->body.len - at : MILTER_CHUNK_SIZE;

			milter_encode(&s->out, MILTER_CMD_BODY, s->m->body.data + at, len);
			if ((o = session_step(s, "BODY", p & MILTER_PROTO_NR_BODY, true, -1)) != STEP_CONTINUE)
				return o;
			if (!stepwise)
				continue;
			o = session_drain(s, verdict);
			if (o == STEP_SKIP)
				break;
			if (o != STEP_CONTINUE)
				return o;
		}
	return session_end_of_message(s, verdict);
}

/* The SMTP-level steps, then the content.  STEP_DONE with *verdict set, or STEP_ERROR. */
static enum step_outcome
session_run(struct filter_session *s, enum milter_verdict *verdict)
{
	uint32_t		  p = s->f->protocol;
	const char		 *ip = origin_string(s->source, "client_ip");
	const char		 *helo = origin_string(s->source, "helo");
	enum step_outcome o;
	size_t			  accepted = 0;
	char			 *mail;

	if (!(p & MILTER_PROTO_NOCONNECT) && !s->same_client)
	{
		char *hostname = ip ? xasprintf("[%s]", ip) : xstrdup("localhost");

		session_macros(s, MILTER_MACROS_CONNECT, MILTER_CMD_CONNECT, NULL);
		milter_encode_connect(&s->out, hostname, ip, 0);
		free(hostname);
		if ((o = session_step(s, "CONNECT", p & MILTER_PROTO_NR_CONN, false, -1)) != STEP_CONTINUE)
			return o;
	}
	if (!(p & MILTER_PROTO_NOHELO) && !s->same_client)
	{
		const char *strings[1] = {helo ? helo : s->source->hostname};

		session_macros(s, MILTER_MACROS_HELO, MILTER_CMD_HELO, NULL);
		milter_encode_strings(&s->out, MILTER_CMD_HELO, strings, 1);
		if ((o = session_step(s, "HELO", p & MILTER_PROTO_NR_HELO, false, -1)) != STEP_CONTINUE)
			return o;
	}
	if (!(p & MILTER_PROTO_NOMAIL))
	{
		const char *strings[2];
		size_t		n = 1;
		const char *body = origin_string(s->source, "body");

		mail = xasprintf("<%s>", s->m->mail_from);
		strings[0] = mail;
		if (body && strcasecmp(body, "8BITMIME") == 0)
			strings[n++] = "BODY=8BITMIME";
		session_macros(s, MILTER_MACROS_MAIL, MILTER_CMD_MAIL, NULL);
		milter_encode_strings(&s->out, MILTER_CMD_MAIL, strings, n);
		free(mail);
		if ((o = session_step(s, "MAIL", p & MILTER_PROTO_NR_MAIL, false, -1)) != STEP_CONTINUE)
			return o;
	}
	for (size_t i = 0; i < s->m->nrcpt; i++)
	{
		struct milter_rcpt *rcpt = &s->m->rcpt[i];
		const char		   *strings[1];
		char			   *address;

		if (rcpt->fate != MILTER_RCPT_ACCEPTED)
			continue; /* an earlier filter refused it */
		accepted++;
		if (p & MILTER_PROTO_NORCPT)
			continue;
		address = xasprintf("<%s>", rcpt->address);
		strings[0] = address;
		session_macros(s, MILTER_MACROS_RCPT, MILTER_CMD_RCPT, rcpt->address);
		milter_encode_strings(&s->out, MILTER_CMD_RCPT, strings, 1);
		free(address);
		/* its reply, read with the others, refuses this recipient or lets it be */
		if ((o = session_step(s, "RCPT", p & MILTER_PROTO_NR_RCPT, false, (ssize_t) i)) != STEP_CONTINUE)
			return o;
	}
	if (accepted == 0)
	{
		/* Nothing left to show it: the message goes on as far as this filter is concerned. */
		*verdict = MILTER_VERDICT_ACCEPT;
		return STEP_DONE;
	}
	return session_headers_and_body(s, verdict);
}

/* What CONNECT and HELO said about the client: its address, name, listener, account, TLS. */
static char *
session_client_key(const struct milter_macro_source *source)
{
	json_t *key;
	char   *text;

	if (source->origin == NULL)
		return xstrdup("local");
	key = json_pack("[s?,s?,s?,s?,O?]", origin_string(source, "client_ip"),
					origin_string(source, "helo"), origin_string(source, "listener"),
					origin_string(source, "auth"), json_object_get(source->origin, "tls"));
	text = key ? json_dumps(key, JSON_COMPACT) : NULL;
	json_decref(key);
	return text ? text : xstrdup("?");
}

/*
 * One attempt.  Only a filter that saw the message to its end and let it
 * continue can take the next one on the same connection (libmilter goes
 * to QUIT_NC from end of message only); after any other verdict the
 * connection is closed politely and opened again for the next message.
 */
static enum step_outcome
filter_attempt(struct filter_session *s, enum milter_verdict *verdict)
{
	struct milter_filter *f = s->f;

	char			 *key = session_client_key(s->source);
	enum step_outcome o;

	if (f->state == FILTER_CLOSED && !(filter_connect(s) && filter_negotiate(s)))
	{
		free(key);
		return STEP_ERROR;
	}
	/*
	 * The next message from the same client is the next transaction of
	 * its session, as Postfix sends a client's messages: MAIL follows the
	 * previous end of message.  Another client is another connection.
	 */
	s->same_client = f->state == FILTER_USED && f->session_key && strcmp(f->session_key, key) == 0;
	if (f->state == FILTER_USED && !s->same_client)
		milter_encode(&s->out, MILTER_CMD_QUIT_NEW_CONNECTION, NULL, 0);
	f->state = FILTER_USED;
	free(f->session_key);
	f->session_key = key;
	o = session_run(s, verdict);
	if (o == STEP_DONE && !s->completed)
	{
		milter_encode(&s->out, MILTER_CMD_QUIT, NULL, 0);
		if (!filter_send(s))
			log_debug("milter %s: ABORT not sent: %s", f->name, s->err);
		filter_close(f);
	}
	return o;
}

enum milter_verdict
milter_filter_run(struct milter_filter *f, struct milter_message *m,
				  const struct milter_macro_source *macros, const struct milter_timeouts *timeouts,
				  char **reply)
{
	struct filter_session s = {.f = f, .m = m, .source = macros, .timeouts = timeouts};
	enum milter_verdict	  verdict = MILTER_VERDICT_UNAVAILABLE;
	bool				  reused = f->state == FILTER_USED;
	enum step_outcome	  o;

	*reply = NULL;
	o = filter_attempt(&s, &verdict);
	if (o == STEP_ERROR && reused && s.replies == 0)
	{
		/* A kept connection the filter closed while idle: once more, afresh. */
		log_debug("milter %s: the kept connection failed (%s); connecting again", f->name, s.err);
		filter_close(f);
		buf_reset(&s.out);
		s.npending = 0;
		s.err[0] = '\0';
		o = filter_attempt(&s, &verdict);
	}
	if (o != STEP_DONE)
	{
		verdict = MILTER_VERDICT_UNAVAILABLE;
		*reply = xstrdup(s.err[0] ? s.err : "the filter failed");
		filter_close(f);
	}
	else if (s.reply)
	{
		*reply = s.reply;
		s.reply = NULL;
	}
	free(s.reply);
	free(s.pending);
	buf_free(&s.out);
	buf_free(&s.edits);
	return verdict;
}
