/*
 * session_milter.c: a session's steps told to its listener's MILTERS
 * (Postfix's smtpd_milters): CONNECT and HELO as they happen, each MAIL
 * and RCPT held until the filters answered it, and the transaction
 * before it is stored.  The conversation runs off the event loop
 * (milter_gate.h); its answers come back here, and are answered in the
 * session (a refusal, a temporary failure, a discard) or applied to what
 * is stored (header and body changes, sender and recipient changes,
 * quarantine: the row stored held).
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "ingress.h"
#include "message/queue_id.h"
#include "session_internal.h"
#include "smtp/reject_log.h"

/* The recipients a milter left: the kept ones keep their NOTIFY and ORCPT, the added have none. */
static void
session_milter_recipients(struct session *s, struct milter_gate_result *r)
{
	struct smtp_recipient *kept = xcalloc(r->nrcpt + 1, sizeof(*kept));

	for (size_t i = 0; i < r->nrcpt; i++)
	{
		for (size_t j = 0; j < s->smtp.nrcpt && kept[i].address == NULL; j++)
			if (s->smtp.rcpt[j].address && strcasecmp(s->smtp.rcpt[j].address, r->rcpt[i]) == 0)
			{
				kept[i] = s->smtp.rcpt[j];
				s->smtp.rcpt[j] = (struct smtp_recipient){0};
			}
		if (kept[i].address == NULL)
			kept[i].address = xstrdup(r->rcpt[i]);
	}
	for (size_t j = 0; j < s->smtp.nrcpt; j++)
	{
		free(s->smtp.rcpt[j].address);
		free(s->smtp.rcpt[j].notify);
		free(s->smtp.rcpt[j].orcpt);
	}
	free(s->smtp.rcpt);
	s->smtp.rcpt = kept;
	s->smtp.nrcpt = r->nrcpt;
}

/* The milters' edits, applied to the transaction before it is stored. */
static void
session_milter_apply(struct session *s, struct milter_gate_result *r)
{
	if (r->content_changed)
	{
		size_t *in_flight = s->smtp.policy->memory_in_flight;

		buf_free(&s->smtp.message);
		s->smtp.message = r->content;
		r->content = (struct buf) BUF_INIT;
		if (in_flight)
		{
			*in_flight -= s->smtp.memory_counted;
			*in_flight += s->smtp.message.len;
			s->smtp.memory_counted = s->smtp.message.len;
		}
	}
	if (r->mail_from)
	{
		free(s->smtp.mail_from);
		s->smtp.mail_from = r->mail_from;
		r->mail_from = NULL;
	}
	if (r->rcpt)
		session_milter_recipients(s, r);
	if (r->quarantine)
	{
		free(s->quarantine);
		free(s->quarantine_filter);
		s->quarantine = r->quarantine;
		s->quarantine_filter = r->filter;
		r->quarantine = r->filter = NULL;
	}
	if (r->log)
		log_info("%s: milter: %s", s->queue_id, r->log);
}

/* A refusal or a discard, in the line Postfix's smtpd writes for a milter's. */
static void
session_milter_log(const struct session *s, const char *command, const char *action, const char *reply,
				   const char *mail_from, const char *rcpt)
{
	struct reject_log line = {
		.command = command,
		.queue_id = s->queue_id_made ? s->queue_id : NULL,
		.client_name = s->client_name,
		.client_ip = s->ip,
		.reply = reply,
		.mail_from = mail_from,
		.rcpt_to = rcpt,
		.esmtp = s->smtp.esmtp,
		.helo = s->smtp.helo,
		.action = action,
	};

	reject_log(&line);
}

/* The listener's MILTERS decided on the message: answer in the session, or go on to store. */
static void
session_milter_done(struct session *s, struct milter_gate_result *r)
{
	const char *rcpt = s->smtp.nrcpt ? s->smtp.rcpt[0].address : NULL;

	ev_timer_again(ingress.loop, &s->timer);
	switch (r->outcome)
	{
		case MILTER_GATE_REFUSE:
			session_milter_log(s, "END-OF-MESSAGE", "milter-reject", r->reply, s->smtp.mail_from, rcpt);
			s->queue_id_made = false;
			smtp_admit_refused(&s->smtp, r->reply);
			break;
		case MILTER_GATE_DISCARD:
			session_milter_log(s, "END-OF-MESSAGE", "milter-discard", "milter triggers DISCARD action",
							   s->smtp.mail_from, rcpt);
			s->queue_id_made = false;
			smtp_admit_done(&s->smtp, true, s->queue_id);
			break;
		case MILTER_GATE_STORE:
			session_milter_apply(s, r);
			if (s->smtp.nrcpt == 0)
			{
				/* Every recipient deleted: nothing to deliver, as a discard. */
				session_milter_log(s, "END-OF-MESSAGE", "milter-discard", "the milters deleted every recipient",
								   s->smtp.mail_from, NULL);
				s->queue_id_made = false;
				smtp_admit_done(&s->smtp, true, s->queue_id);
				break;
			}
			session_admit_content(s);
			break;
	}
	if (s->smtp.event != SMTP_EVENT_NONE)
		return; /* verification or the database has it now */
	if (session_flush(s) && session_read(s))
		session_update(s);
}

/* The filters answered the held MAIL or RCPT. */
static void
session_milter_envelope_done(struct session *s, struct milter_gate_result *r)
{
	bool		mail = s->smtp.milter_held_mail;
	const char *address = s->smtp.milter_held_address;

	if (s->smtp.event != SMTP_EVENT_MILTER)
		return; /* cannot happen: nothing was held */
	if (r->outcome == MILTER_GATE_REFUSE)
		session_milter_log(s, mail ? "MAIL" : "RCPT", "milter-reject", r->reply,
						   mail ? address : s->smtp.mail_from, mail ? NULL : address);
	smtp_milter_done(&s->smtp, r->outcome == MILTER_GATE_REFUSE ? r->reply : NULL);
	if (s->smtp.event == SMTP_EVENT_CLOSE)
		s->closing = true;
	if (session_flush(s) && session_read(s))
		session_update(s);
}

static void
session_milter_answer(void *arg, struct milter_gate_result *r)
{
	struct session *s = arg;

	if (s->milter_message)
	{
		s->milter_message = false;
		session_milter_done(s, r);
	}
	else
		session_milter_envelope_done(s, r);
}

/* The conversation with the listener's filters, CONNECT sent; false when it has none. */
static bool
session_milter_ensure(struct session *s)
{
	struct milter_gate_client client = {.ip = s->ip, .listener = s->listener->name, .hostname = ingress.hostname};

	if (s->milters == NULL && s->listener->milters.count > 0)
		s->milters = milter_gate_open(&s->listener->milters, &client, session_milter_answer, s);
	return s->milters != NULL;
}

void
session_milter_open(struct session *s)
{
	session_milter_ensure(s);
}

void
session_milter_helo(const struct smtp_session *smtp)
{
	struct session *s = smtp->host;

	if (session_milter_ensure(s))
		milter_gate_helo(s->milters, smtp);
}

bool
session_milter_envelope(const struct smtp_session *smtp, bool mail, const char *address)
{
	struct session *s = smtp->host;

	if (!session_milter_ensure(s))
		return false;
	milter_gate_envelope(s->milters, smtp, address, mail);
	return true;
}

/* The listener's MILTERS have the transaction now; session_milter_done answers. */
void
session_milter_start(struct session *s)
{
	/* The message's name from here on: the milters' i macro, then its row's. */
	queue_id_make(ingress.queue_id_host, s->queue_id);
	s->queue_id_made = true;
	if (!session_milter_ensure(s))
	{
		session_admit_content(s); /* cannot happen: the session asks only with filters */
		return;
	}
	/* The filters have it now: the client's silence is not its fault (bounded by their timeouts). */
	ev_timer_stop(ingress.loop, &s->timer);
	s->milter_message = true;
	milter_gate_message(s->milters, &s->smtp, s->queue_id);
}
