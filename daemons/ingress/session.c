/*
 * session.c: one SMTP connection: the socket (plain or TLS), its idle
 * timer, and the events of the protocol machine (smtp.c) answered: TLS
 * started, a password checked, a message handed to admit.c.
 *
 * An idle session owns no buffer: input is read into one shared buffer
 * and only an unfinished line is kept; replies are freed once written.
 * That keeps a thousand idle sessions to a few hundred kilobytes.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>

#include "admit.h"
#include "auth_throttle.h"
#include "auth_worker.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "delivery/maillog.h"
#include "envelope.h"
#include "ingress.h"
#include "message/queue_id.h"
#include "session_internal.h"
#include "smtp/client_key.h"
#include "smtp/reject_log.h"

#define SESSION_READ_SIZE 65536
#define SESSION_OUT_HIGH_WATER 65536 /* stop reading a client that does not read */
#define SESSION_CLIENT_BUCKETS 1024

static struct session *session_list;
static struct client  *client_buckets[SESSION_CLIENT_BUCKETS];
static char			   session_read_buffer[SESSION_READ_SIZE];


/*
 * Clients
 */

static struct client *
client_get(const char *ip)
{
	unsigned	   h = 5381;
	struct client *c;

	for (const char *p = ip; *p; p++)
		h = h * 33 + (unsigned char) *p;
	h %= SESSION_CLIENT_BUCKETS;
	for (c = client_buckets[h]; c; c = c->next)
		if (strcmp(c->ip, ip) == 0)
			return c;
	c = xcalloc(1, sizeof(*c));
	snprintf(c->ip, sizeof(c->ip), "%s", ip);
	c->next = client_buckets[h];
	client_buckets[h] = c;
	return c;
}

static void
client_put(struct client *c)
{
	unsigned		h = 5381;
	struct client **p;

	if (--c->sessions > 0)
		return;
	for (const char *q = c->ip; *q; q++)
		h = h * 33 + (unsigned char) *q;
	h %= SESSION_CLIENT_BUCKETS;
	for (p = &client_buckets[h]; *p != c; p = &(*p)->next)
		;
	*p = c->next;
	free(c);
}

/*
 * Closing
 */

static void
session_close(struct session *s)
{
	ev_io_stop(ingress.loop, &s->io);
	ev_timer_stop(ingress.loop, &s->timer);
	ev_timer_stop(ingress.loop, &s->guard);
	if (s->admission)
		admit_detach(s->admission);
	admit_forget(s);
	auth_worker_cancel(s->auth_job);
	milter_gate_close(s->milters);
	free(s->quarantine);
	free(s->quarantine_filter);
	ev_timer_stop(ingress.loop, &s->auth_delay);
	verify_free(s->verify, &s->smtp.message);
	session_screen_stop(s);
	session_account_stop(s);
	if (s->ssl)
	{
		SSL_set_quiet_shutdown(s->ssl, 1);
		SSL_free(s->ssl);
	}
	close(s->fd);
	smtp_free(&s->smtp);
	buf_free(&s->in);
	client_put(s->client);
	s->listener->sessions--;
	ingress.sessions--;
	if (s->prev)
		s->prev->next = s->next;
	else
		session_list = s->next;
	if (s->next)
		s->next->prev = s->prev;
	free(s);
	if (ingress.stopping && ingress.sessions == 0 && admit_pending() == 0)
		ev_break(ingress.loop, EVBREAK_ALL);
}

/*
 * Output
 */

static void
session_tls_log(struct session *s, const char *what)
{
	unsigned long e = ERR_get_error();
	char		  reason[256] = "";

	if (e)
		ERR_error_string_n(e, reason, sizeof(reason));
	log_info("%s: %s%s%s", s->ip, what, e ? ": " : "", reason);
	ERR_clear_error();
}

/* Write the replies; false if the session had to be closed. */
bool
session_flush(struct session *s)
{
	struct buf *out = &s->smtp.out;

	while (out->len > 0)
	{
		ssize_t n;

		if (s->io_state == SESSION_IO_TLS)
		{
			int rc;

			ERR_clear_error();
			rc = SSL_write(s->ssl, out->data, (int) out->len);
			if (rc <= 0)
			{
				int e = SSL_get_error(s->ssl, rc);

				s->tls_events = e == SSL_ERROR_WANT_READ	? EV_READ
								: e == SSL_ERROR_WANT_WRITE ? EV_WRITE
															: 0;
				if (s->tls_events)
					return true;
				session_tls_log(s, "TLS write failed");
				session_close(s);
				return false;
			}
			n = rc;
		}
		else
		{
			n = write(s->fd, out->data, out->len);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				return true;
			if (n < 0)
			{
				session_close(s);
				return false;
			}
		}
		buf_consume(out, (size_t) n);
	}
	s->tls_events = 0;
	buf_free(out);
	return true;
}

/*
 * TLS
 */

static bool
session_handshake(struct session *s)
{
	int rc;

	ERR_clear_error();
	rc = SSL_accept(s->ssl);
	if (rc <= 0)
	{
		int e = SSL_get_error(s->ssl, rc);

		if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
		{
			s->tls_events = e == SSL_ERROR_WANT_READ ? EV_READ : EV_WRITE;
			return session_update(s);
		}
		session_tls_log(s, "TLS handshake failed");
		session_close(s);
		return false;
	}
	{
		struct smtp_tls_info info;
		const SSL_CIPHER	*cipher = SSL_get_current_cipher(s->ssl);

		memset(&info, 0, sizeof(info));
		snprintf(info.version, sizeof(info.version), "%s", SSL_get_version(s->ssl));
		snprintf(info.cipher, sizeof(info.cipher), "%s", SSL_CIPHER_get_name(cipher));
		info.bits = SSL_CIPHER_get_bits(cipher, NULL);
		s->io_state = SESSION_IO_TLS;
		s->tls_events = 0;
		smtp_tls_started(&s->smtp, &info);
		log_debug("%s: TLS %s %s", s->ip, info.version, info.cipher);
	}
	if (s->listener->mode == LISTENER_SMTPS)
		smtp_greet(&s->smtp);
	if (!session_flush(s))
		return false;
	/* The client may have sent EHLO with its last handshake flight. */
	if (!session_read(s))
		return false;
	return session_update(s);
}

static bool
session_start_tls(struct session *s)
{
	s->starttls_pending = false;
	s->ssl = SSL_new(s->listener->tls);
	if (s->ssl == NULL || SSL_set_fd(s->ssl, s->fd) != 1)
	{
		session_tls_log(s, "cannot start TLS");
		session_close(s);
		return false;
	}
	s->io_state = SESSION_IO_HANDSHAKE;
	return session_handshake(s);
}

/*
 * The protocol's events
 */

/*
 * A refusal in the line Postfix's smtpd writes for it (common/smtp/reject_log.h):
 * a recipient's (RCPT, NOQUEUE), or the message's once its content was read
 * (END-OF-MESSAGE, under its queue id: a DMARC or SPF policy, a loop).
 */
static void
session_log_reject(const struct session *s, const char *command, const char *reply, const char *rcpt)
{
	struct reject_log line = {
		.command = command,
		.queue_id = strcmp(command, "RCPT") != 0 ? s->queue_id : NULL,
		.client_name = s->client_name,
		.client_ip = s->ip,
		.reply = reply,
		.mail_from = s->smtp.mail_from,
		.rcpt_to = rcpt,
		.esmtp = s->smtp.esmtp,
		.helo = s->smtp.helo,
	};

	reject_log(&line);
}

/*
 * The message is in the queue: the lines Postfix's smtpd and qmgr write
 * for it (client=, then from=, size=, nrcpt=), which log tools count as
 * received, written only now that it is committed.
 */
static void
session_log_received(const struct session *s, long long row_id)
{
	struct buf line = BUF_INIT;

	buf_printf(&line, "%s: client=%s[%s]", s->queue_id,
			   s->client_name[0] ? s->client_name : "unknown", s->ip);
	if (s->smtp.auth_account)
		buf_printf(&line, ", sasl_username=%s", s->smtp.auth_account);
	log_info("%s", line.data);
	buf_free(&line);
	maillog_queued(s->queue_id, s->smtp.mail_from, s->smtp.message_size, s->smtp.nrcpt, row_id);
}

static void
session_admitted(void *arg, bool ok, long long id)
{
	struct session *s = arg;

	s->admission = NULL;
	if (ok)
	{
		ingress.messages_total++;
		session_log_received(s, id);
	}
	else
		log_warnx("%s: from=<%s> not queued: the database did not take it", s->queue_id,
				  s->smtp.mail_from);
	smtp_admit_done(&s->smtp, ok, s->queue_id);
	if (ingress.stopping)
	{
		smtp_close(&s->smtp, "421 4.3.2 Service shutting down");
		s->closing = true;
	}
	ev_timer_again(ingress.loop, &s->timer);
	/* Pipelined commands waited behind the reply: go on with them. */
	if (session_flush(s) && session_read(s))
		session_update(s);
}

/*
 * The mail log's "received" row: what the "queued as" line says, and where
 * the message came from (pepsi-queue log shows it first in a history).
 */
static char *
session_log_detail(const struct session *s)
{
	json_t *detail = json_pack("{s:s, s:I, s:I, s:s, s:s, s:b}", "from", s->smtp.mail_from,
							   "nrcpt", (json_int_t) s->smtp.nrcpt, "size",
							   (json_int_t) s->smtp.message_size, "client", s->ip, "listener",
							   s->listener->name, "tls", s->smtp.tls);
	char   *text;

	if (detail == NULL)
		return NULL;
	if (s->smtp.helo)
		json_object_set_new(detail, "helo", json_string(s->smtp.helo));
	if (s->smtp.auth_account)
		json_object_set_new(detail, "auth", json_string(s->smtp.auth_account));
	text = json_dumps(detail, JSON_COMPACT);
	json_decref(detail);
	return text;
}

/*
 * A milter's quarantine: state.milter says so as pepsi-stage-milter's
 * does (so the stage, after the queue, lets the released row go on
 * unfiltered), and pepsi.workqueue_add stores such a row held.
 */
static void
session_quarantine_state(struct session *s, struct envelope *e)
{
	json_t *state = json_loads(e->state, 0, NULL);

	if (state == NULL)
		fatalx("%s: the envelope's state is not JSON", s->queue_id);
	json_object_set_new(state, "milter",
						json_pack("{s:s, s:s, s:s, s:s}", "verdict", "quarantine", "quarantine",
								  s->quarantine, "filter", s->quarantine_filter ? s->quarantine_filter : "",
								  "where", "ingress"));
	free(e->state);
	e->state = json_dumps(state, JSON_COMPACT);
	json_decref(state);
	log_info("%s: milter-hold: END-OF-MESSAGE from %s[%s]: %s (by %s); from=<%s>", s->queue_id,
			 s->client_name[0] ? s->client_name : "unknown", s->ip, s->quarantine,
			 s->quarantine_filter ? s->quarantine_filter : "?", s->smtp.mail_from);
	free(s->quarantine);
	free(s->quarantine_filter);
	s->quarantine = s->quarantine_filter = NULL;
}

/* Store the transaction (or refuse it); the findings of verify.c, if any, go with it. */
static void
session_store(struct session *s)
{
	struct envelope		   e;
	struct envelope_origin origin;
	struct verify_findings findings = {0};
	const char			  *refusal;

	/* The message's name from here on, before its row exists (common/message/queue_id.h). */
	if (!s->queue_id_made)
		queue_id_make(ingress.queue_id_host, s->queue_id);
	s->queue_id_made = false;
	origin.client_ip = s->ip;
	origin.listener = s->listener->name;
	origin.hostname = ingress.hostname;
	origin.authserv_id = ingress.authserv_id;
	origin.queue_id = s->queue_id;
	origin.max_hops = ingress.max_hops;
	origin.trusted_network = s->trusted;
	origin.now = time(NULL);
	if (s->verify)
		verify_findings(s->verify, &findings);
	origin.client_name = findings.client_name;
	snprintf(s->client_name, sizeof(s->client_name), "%s", findings.client_name ? findings.client_name : "");
	origin.auth = findings.auth;
	origin.iprev = findings.iprev;
	if (findings.refusal)
	{
		session_log_reject(s, "END-OF-MESSAGE", findings.refusal, s->smtp.nrcpt ? s->smtp.rcpt[0].address : NULL);
		smtp_admit_refused(&s->smtp, findings.refusal);
		return;
	}
	if ((refusal = envelope_build(&s->smtp, &origin, &e)) != NULL || !admit_available())
	{
		if (refusal == NULL)
		{
			log_warnx("%s: %s: no database connection, message refused for now", s->queue_id, s->ip);
			envelope_free(&e);
			smtp_admit_done(&s->smtp, false, NULL);
		}
		else
		{
			/* A loop is the operator's to fix: say who keeps sending it. */
			session_log_reject(s, "END-OF-MESSAGE", refusal, s->smtp.nrcpt ? s->smtp.rcpt[0].address : NULL);
			smtp_admit_refused(&s->smtp, refusal);
		}
		return;
	}
	if (s->quarantine)
		session_quarantine_state(s, &e);
	if (ingress.mail_log)
		e.log_detail = session_log_detail(s);
	/* The envelope has the content now: one copy in memory, not two. */
	smtp_message_handed_over(&s->smtp);
	/* The database has it now: the client's silence is not its fault. */
	ev_timer_stop(ingress.loop, &s->timer);
	s->admission = admit_submit(&e, session_admitted, s);
}

/* verify.c has every verdict: store, and go on with the session as session_admitted does. */
static void
session_verified(void *arg)
{
	struct session *s = arg;

	session_store(s);
	if (s->smtp.event != SMTP_EVENT_NONE)
		return; /* the database has it now */
	if (session_flush(s) && session_read(s))
		session_update(s);
}

/* The filters let it through: authenticate it where the listener says so, and store it. */
void
session_admit_content(struct session *s)
{
	if (s->verify == NULL)
	{
		session_store(s);
		return;
	}
	verify_message(s->verify, &s->smtp, session_verified, s);
}

/* The content is in: the listener's milters first, then authentication and the queue. */
static void
session_admit(struct session *s)
{
	const char *refusal = session_from_refusal(s);

	if (refusal)
	{
		smtp_admit_refused(&s->smtp, refusal);
		return;
	}
	if (s->milters || s->listener->milters.count > 0)
	{
		session_milter_start(s);
		return;
	}
	session_admit_content(s);
}

void
session_mail_accepted(const struct smtp_session *smtp)
{
	struct session *s = smtp->host;

	/* An authenticated user's mail is ours too: not checked (unless the listener says so). */
	if (s->verify && smtp->auth_account && !s->listener->verify.trusted_too)
	{
		verify_free(s->verify, &s->smtp.message);
		s->verify = NULL;
	}
	verify_mail(s->verify, smtp->helo, smtp->mail_from);
}

/* Feed input to the protocol; returns how much of it was used. */
static size_t
session_process(struct session *s, const char *data, size_t len)
{
	size_t used = 0;

	for (;;)
	{
		s->smtp.rate_elapsed += ev_now(ingress.loop) - s->last_command;
		s->last_command = ev_now(ingress.loop);
		used += smtp_input(&s->smtp, data + used, len - used);
		switch (s->smtp.event)
		{
			case SMTP_EVENT_NONE:
				return used;
			case SMTP_EVENT_AUTH:
				if (auth_throttle_blocked(ingress.auth_throttle, s->client->ip, ev_now(ingress.loop)))
				{
					log_info("%s: AUTH refused: too many failed authentications from %s", s->ip,
							 s->client->ip);
					smtp_auth_refused(&s->smtp, "454 4.7.0 Too many failed authentications from your"
												" address, try again later");
					continue;
				}
				/* Hashing takes milliseconds: a thread does it, the session waits. */
				s->auth_job = auth_worker_submit(ingress.loop, ingress.credentials, s->smtp.auth_user,
												 s->smtp.auth_password, session_auth_checked, s);
				return used;
			case SMTP_EVENT_MESSAGE:
				session_admit(s);
				if (s->smtp.event == SMTP_EVENT_NONE && s->smtp.state != SMTP_STATE_CLOSED)
					continue;
				return used;
			case SMTP_EVENT_STARTTLS:
				/* RFC 3207 5: nothing sent before the handshake may count. */
				s->starttls_pending = true;
				return len;
			case SMTP_EVENT_CLOSE:
				s->closing = true;
				return len;
			case SMTP_EVENT_SCREEN:
				session_screen_wait(s);
				return used;
			case SMTP_EVENT_MILTER:
				return used; /* the filters' answer resumes the session */
		}
	}
}

static void
session_input(struct session *s, const char *data, size_t len)
{
	if (session_screen_early_talk(s))
		return;
	if (s->in.len == 0)
	{
		size_t used = session_process(s, data, len);

		if (used < len)
			buf_append(&s->in, data + used, len - used);
	}
	else
	{
		size_t used;

		buf_append(&s->in, data, len);
		used = session_process(s, s->in.data, s->in.len);
		buf_consume(&s->in, used);
	}
	if (s->in.len == 0)
		buf_free(&s->in);
}

static bool
session_reading(const struct session *s)
{
	return s->io_state != SESSION_IO_HANDSHAKE && !s->closing && !s->starttls_pending
		   && s->smtp.state != SMTP_STATE_WAIT && s->smtp.state != SMTP_STATE_CLOSED
		   && s->smtp.out.len < SESSION_OUT_HIGH_WATER;
}

/*
 * Slow clients.  The idle timeout alone lets a client hold a session
 * forever by sending a byte now and then (slowloris): a session has an
 * absolute deadline, and message content must come at MIN_DATA_RATE on
 * average once it has had a grace period to start.
 */
#define SESSION_GUARD_INTERVAL 1.0
#define SESSION_DATA_GRACE 10.0

static bool
session_in_content(const struct session *s)
{
	return s->smtp.state == SMTP_STATE_DATA || s->smtp.state == SMTP_STATE_BDAT
		   || (s->smtp.state == SMTP_STATE_RCPT && s->smtp.chunking);
}

/* Content octets read, for MIN_DATA_RATE (commands are the idle timer's). */
static void
session_count_content(struct session *s, size_t n)
{
	if (!session_in_content(s))
	{
		s->content_started = 0;
		return;
	}
	if (s->content_started == 0)
	{
		s->content_started = ev_now(ingress.loop);
		s->content_octets = 0;
	}
	s->content_octets += n;
}

static void
session_cut(struct session *s, const char *why, const char *reply)
{
	log_info("%s: %s", s->ip, why);
	smtp_close(&s->smtp, reply);
	s->closing = true;
	ev_timer_again(ingress.loop, &s->timer); /* the last chance to read the 421 */
	if (session_flush(s))
		session_update(s);
}

static void
session_on_guard(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct session		  *s = w->data;
	const struct listener *l = s->listener;
	ev_tstamp			   now = ev_now(loop);
	char				   reply[300];

	/* A message being stored is ours to finish, not the client's delay. */
	if (s->closing || s->admission)
		return;
	if (l->session_deadline > 0 && now - s->started > l->session_deadline)
	{
		snprintf(reply, sizeof(reply), "421 4.4.2 %s Error: session too long, closing",
				 ingress.hostname);
		session_cut(s, "session deadline exceeded", reply);
		return;
	}
	if (!session_in_content(s))
		s->content_started = 0;
	else if (s->content_started == 0)
	{
		s->content_started = now; /* DATA was the last thing read */
		s->content_octets = 0;
	}
	else if (l->min_data_rate > 0 && now - s->content_started > SESSION_DATA_GRACE
			 && s->content_octets < l->min_data_rate * (now - s->content_started))
	{
		snprintf(reply, sizeof(reply), "421 4.4.2 %s Error: message content too slow "
									   "(under %.0f octets per second), closing",
				 ingress.hostname, l->min_data_rate);
		session_cut(s, "message content too slow", reply);
	}
}

/* Read what is there; false if the session was closed. */
bool
session_read(struct session *s)
{
	/* Input left over from before an event goes first. */
	if (s->in.len > 0 && session_reading(s))
	{
		size_t used = session_process(s, s->in.data, s->in.len);

		buf_consume(&s->in, used);
		if (s->in.len == 0)
			buf_free(&s->in);
	}
	while (session_reading(s))
	{
		ssize_t n;

		if (s->io_state == SESSION_IO_TLS)
		{
			int rc;

			ERR_clear_error();
			rc = SSL_read(s->ssl, session_read_buffer, SESSION_READ_SIZE);
			if (rc <= 0)
			{
				int e = SSL_get_error(s->ssl, rc);

				if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
				{
					s->tls_events = e == SSL_ERROR_WANT_READ ? 0 : EV_WRITE;
					break;
				}
				if (e != SSL_ERROR_ZERO_RETURN)
					session_tls_log(s, "TLS read failed");
				session_close(s);
				return false;
			}
			n = rc;
		}
		else
		{
			n = read(s->fd, session_read_buffer, SESSION_READ_SIZE);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				break;
			if (n <= 0)
			{
				/* A client gone mid-DATA leaves nothing behind: nothing was stored. */
				if (s->smtp.state == SMTP_STATE_DATA || s->smtp.state == SMTP_STATE_BDAT)
					log_info("%s: disconnected during message content", s->ip);
				session_close(s);
				return false;
			}
		}
		ev_timer_again(ingress.loop, &s->timer);
		session_count_content(s, (size_t) n);
		session_input(s, session_read_buffer, (size_t) n);
		if (s->io_state == SESSION_IO_PLAIN && (size_t) n < SESSION_READ_SIZE)
			break; /* the socket is drained */
		/*
		 * Nothing buffered in OpenSSL: what is left, if anything, is in the
		 * socket, and its watcher (level-triggered) wakes us for it.  Asking
		 * again would cost a read() that fails with EAGAIN per command.
		 */
		if (s->io_state == SESSION_IO_TLS && !SSL_has_pending(s->ssl))
			break;
	}
	if (!session_flush(s))
		return false;
	if (s->starttls_pending && s->smtp.out.len == 0)
		return session_start_tls(s);
	return true;
}

/* Watch for what the session waits for, or close it; false if closed. */
bool
session_update(struct session *s)
{
	int events = 0;

	if (s->closing && s->smtp.out.len == 0)
	{
		session_close(s);
		return false;
	}
	if (s->io_state == SESSION_IO_HANDSHAKE)
		events = s->tls_events;
	else
	{
		if (s->smtp.out.len > 0)
			events |= s->tls_events ? s->tls_events : EV_WRITE;
		if (session_reading(s))
			events |= s->tls_events == EV_WRITE ? EV_WRITE : EV_READ;
	}
	if ((s->io.events & (EV_READ | EV_WRITE)) != events)
	{
		ev_io_stop(ingress.loop, &s->io);
		ev_io_set(&s->io, s->fd, events);
		if (events)
			ev_io_start(ingress.loop, &s->io);
	}
	return true;
}

static void
session_on_io(struct ev_loop *loop, ev_io *w, int revents)
{
	struct session *s = w->data;

	if (s->io_state == SESSION_IO_HANDSHAKE)
	{
		session_handshake(s);
		return;
	}
	if (s->smtp.out.len > 0 && !session_flush(s))
		return;
	if (s->starttls_pending && s->smtp.out.len == 0)
	{
		session_start_tls(s);
		return;
	}
	if (!session_read(s))
		return;
	session_update(s);
}

static void
session_on_timeout(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct session *s = w->data;

	if (s->closing || s->io_state == SESSION_IO_HANDSHAKE)
	{
		session_close(s);
		return;
	}
	log_info("%s: idle timeout", s->ip);
	{
		char reply[300];

		snprintf(reply, sizeof(reply), "421 4.4.2 %s Error: timeout exceeded", ingress.hostname);
		smtp_close(&s->smtp, reply);
	}
	s->closing = true;
	ev_timer_again(ingress.loop, &s->timer); /* the last chance to read the 421 */
	if (session_flush(s))
		session_update(s);
}

/*
 * Accepting
 */

static void
session_refuse(int fd, const char *reply)
{
	ssize_t n = write(fd, reply, strlen(reply));

	(void) n;
	smtp_count_refusal(reply);
	close(fd);
}

static void
session_client_ip(const struct sockaddr *addr, char *ip, size_t iplen)
{
	if (addr->sa_family == AF_INET6)
	{
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *) addr;

		/* An IPv4 client of a dual-stack socket is an IPv4 client. */
		if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr))
			inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], ip, (socklen_t) iplen);
		else
			inet_ntop(AF_INET6, &in6->sin6_addr, ip, (socklen_t) iplen);
	}
	else
		inet_ntop(AF_INET, &((const struct sockaddr_in *) addr)->sin_addr, ip, (socklen_t) iplen);
}

const char *
session_client_of(const struct smtp_session *smtp)
{
	const struct session *s = smtp->host;

	return s->client->ip;
}

enum smtp_rcpt_verdict
session_rcpt_check(const struct smtp_session *smtp, const char *address)
{
	const struct session *s = smtp->host;
	struct relay_request  request = {
		 .local_domains = ingress.local_domains,
		 .resolver = ingress.local_recipients,
		 .trusted_client = s->trusted,
		 .authenticated = smtp->auth_account != NULL,
	 };
	enum smtp_rcpt_verdict verdict = relay_control_rcpt(&request, address);
	char				   reply[700];

	verdict = list_rcpt_check(address, verdict);
	if (verdict == SMTP_RCPT_ACCEPT && quota_gate_full(address))
		verdict = SMTP_RCPT_OVER_QUOTA;

	/* (The replies smtp.c sends for these verdicts.) */
	if (verdict == SMTP_RCPT_RELAY_DENIED)
		snprintf(reply, sizeof(reply), "554 5.7.1 <%.256s>: Relay access denied (authenticate, or send only to "
									   "domains this server receives mail for)",
				 address);
	else if (verdict == SMTP_RCPT_UNKNOWN_USER)
		snprintf(reply, sizeof(reply), "550 5.1.1 <%.256s>: Recipient address rejected: no such user here", address);
	else if (verdict == SMTP_RCPT_OVER_QUOTA)
		snprintf(reply, sizeof(reply), "452 4.2.2 <%.256s>: Mailbox full, try again later", address);
	if (verdict == SMTP_RCPT_RELAY_DENIED || verdict == SMTP_RCPT_UNKNOWN_USER || verdict == SMTP_RCPT_OVER_QUOTA)
		session_log_reject(s, "RCPT", reply, address);
	return verdict;
}

void
session_accept(struct listener *l, int fd, const struct sockaddr *addr)
{
	char			ip[INET6_ADDRSTRLEN];
	char			key[CLIENT_KEY_SIZE];
	struct client  *client;
	struct session *s;

	session_client_ip(addr, ip, sizeof(ip));
	if (l->max_sessions && l->sessions >= l->max_sessions)
	{
		log_info("%s: refused, %zu sessions on listener %s", ip, l->sessions, l->name);
		session_refuse(fd, "421 4.7.0 Too many sessions, try again later\r\n");
		return;
	}
	client_key(addr, key, sizeof(key));
	client = client_get(key);
	if (l->max_sessions_per_client && client->sessions >= l->max_sessions_per_client)
	{
		log_info("%s: refused, %zu sessions from this client", ip, client->sessions);
		if (client->sessions == 0)
			client_put((client->sessions++, client));
		session_refuse(fd, "421 4.7.0 Too many sessions from your address, try again later\r\n");
		return;
	}
	client->sessions++;
	l->sessions++;
	ingress.sessions++;
	ingress.sessions_total++;

	s = xcalloc(1, sizeof(*s));
	s->listener = l;
	s->client = client;
	snprintf(s->ip, sizeof(s->ip), "%s", ip);
	s->fd = fd;
	smtp_init(&s->smtp, &l->policy);
	s->smtp.host = s;
	s->trusted = trusted_networks_contain(&l->trusted, addr);
	/* Our own mail waits for no DNS (as Postfix's permit_mynetworks before the policy service). */
	if (!s->trusted || l->verify.trusted_too)
		s->verify = verify_session_start(&l->verify, ip, ingress.hostname);
	ev_io_init(&s->io, session_on_io, fd, 0);
	s->io.data = s;
	s->started = ev_now(ingress.loop);
	ev_timer_init(&s->guard, session_on_guard, SESSION_GUARD_INTERVAL, SESSION_GUARD_INTERVAL);
	s->guard.data = s;
	if (l->session_deadline > 0 || l->min_data_rate > 0)
		ev_timer_start(ingress.loop, &s->guard);
	ev_init(&s->auth_delay, session_auth_answer_failure);
	s->auth_delay.data = s;
	ev_init(&s->timer, session_on_timeout);
	s->timer.repeat = l->idle_timeout;
	s->timer.data = s;
	ev_timer_again(ingress.loop, &s->timer);
	s->last_command = ev_now(ingress.loop);
	s->next = session_list;
	if (session_list)
		session_list->prev = s;
	session_list = s;

	session_screen_start(s, addr);
	session_milter_open(s);
	if (l->mode == LISTENER_SMTPS)
	{
		session_start_tls(s);
		return;
	}
	if (!s->greet_pending)
		smtp_greet(&s->smtp);
	if (session_flush(s))
		session_update(s);
}

void
session_shutdown_all(void)
{
	struct session *s = session_list;

	while (s)
	{
		struct session *next = s->next;

		if (s->smtp.state != SMTP_STATE_WAIT || s->admission == NULL)
		{
			smtp_close(&s->smtp, "421 4.3.2 Service shutting down");
			s->closing = true;
			if (session_flush(s))
				session_update(s);
		}
		s = next;
	}
}
