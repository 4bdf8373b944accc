/*
 * session_account.c: what an authenticated session may send
 * (sender_login.h): its MAIL FROM and its From: addresses must be its
 * account's (553 5.7.1 otherwise), and its recipients are counted against
 * the account's hourly limits in the database (450 4.7.1 past them).  The
 * account's addresses in the database are asked once per session, at its
 * first MAIL; with the database down the limits let mail through and the
 * sql source knows no address (the file's still count).  Also the answer
 * to AUTH once a worker thread has checked the password (auth_worker.c):
 * at once when it is right, after the failure's delay when it is not.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth_throttle.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "db_query.h"
#include "message/header.h"
#include "sender_login.h"
#include "session_internal.h"

static void
session_account_resume(struct session *s)
{
	smtp_screen_done(&s->smtp);
	if (s->smtp.event == SMTP_EVENT_CLOSE)
		s->closing = true;
	if (session_flush(s) && session_read(s))
		session_update(s);
}

static void
session_logins_answered(void *arg, const PGresult *res)
{
	struct session *s = arg;

	s->login_query = NULL;
	s->logins_loaded = true;
	if (res == NULL)
		log_warnx("%s: the addresses of %s could not be read from the database", s->ip,
				  s->smtp.auth_account);
	for (int i = 0; res && i < PQntuples(res); i++)
	{
		s->logins = xrealloc(s->logins, (s->nlogins + 1) * sizeof(*s->logins));
		s->logins[s->nlogins++] = xstrdup(PQgetvalue(res, i, 0));
	}
	session_account_resume(s);
}

enum smtp_screen_verdict
session_mail_gate(const struct smtp_session *smtp, const char *address, char *reply, size_t size)
{
	struct session *s = smtp->host;

	if (sender_login_uses_sql() && !s->logins_loaded)
	{
		const char *values[1] = {smtp->auth_account};

		s->login_query = db_query_send("SELECT a FROM pepsi.sender_login_addresses($1) a", 1,
									   values, session_logins_answered, s);
		return SMTP_SCREEN_WAIT;
	}
	if (sender_login_allows(smtp->auth_account, address, s->logins, s->nlogins))
		return SMTP_SCREEN_PASS;
	log_info("%s: sender <%s> refused: not owned by %s (SENDER_LOGIN_MAPS)", s->ip, address,
			 smtp->auth_account);
	snprintf(reply, size, "553 5.7.1 <%.256s>: Sender address rejected: not owned by user %.128s",
			 address, smtp->auth_account);
	return SMTP_SCREEN_REFUSE;
}

/* The From: addresses of the message: each must be the account's.  The refusal, or NULL. */
const char *
session_from_refusal(struct session *s)
{
	const char *data = s->smtp.message.data;
	const char *end;
	char	   *from;
	char	  **list = NULL;
	size_t		count = 0;
	const char *refusal = NULL;

	if (!sender_login_enabled() || s->smtp.auth_account == NULL || data == NULL)
		return NULL;
	end = memmem(data, s->smtp.message.len, "\r\n\r\n", 4);
	from = header_get(data, end ? (size_t) (end - data) + 2 : s->smtp.message.len, "From");
	if (from)
		header_addresses(from, &list, &count);
	for (size_t i = 0; i < count; i++)
	{
		if (refusal == NULL && !sender_login_allows(s->smtp.auth_account, list[i], s->logins, s->nlogins))
		{
			log_info("%s: From: <%s> refused: not owned by %s (SENDER_LOGIN_MAPS)", s->ip, list[i],
					 s->smtp.auth_account);
			refusal = "553 5.7.1 From: address not owned by the authenticated user";
		}
		free(list[i]);
	}
	free(list);
	free(from);
	return refusal;
}

static void
session_quota_answered(void *arg, const PGresult *res)
{
	struct session *s = arg;

	s->quota_query = NULL;
	s->quota_answered = true;
	s->quota_pass = res == NULL || PQntuples(res) != 1 || strcmp(PQgetvalue(res, 0, 0), "f") != 0;
	if (res == NULL)
		log_warnx("%s: send limits: the database did not answer: <%s> let through", s->ip,
				  s->quota_address);
	session_account_resume(s);
}

/* SEND_LIMIT_*: the recipient counted against the account's hour. */
static enum smtp_screen_verdict
session_send_limit(struct session *s, const char *address, char *reply, size_t size)
{
	char messages[32],
		recipients[32];
	const char *values[4];

	if (s->quota_answered && s->quota_address && strcmp(s->quota_address, address) == 0)
	{
		s->quota_answered = false;
		if (s->quota_pass)
			return SMTP_SCREEN_PASS;
		log_info("%s: <%s> refused: %s is past its send limits (SEND_LIMIT_MESSAGES %ld, "
				 "SEND_LIMIT_RECIPIENTS %ld an hour)",
				 s->ip, address, s->smtp.auth_account, sender_login_limit_messages(),
				 sender_login_limit_recipients());
		snprintf(reply, size,
				 "450 4.7.1 <%.256s>: Recipient address rejected: too much mail from %.128s this "
				 "hour, try again later",
				 address, s->smtp.auth_account);
		return SMTP_SCREEN_REFUSE;
	}
	snprintf(messages, sizeof(messages), "%ld", sender_login_limit_messages());
	snprintf(recipients, sizeof(recipients), "%ld", sender_login_limit_recipients());
	values[0] = s->smtp.auth_account;
	values[1] = s->smtp.nrcpt == 0 ? "t" : "f";
	values[2] = messages;
	values[3] = recipients;
	free(s->quota_address);
	s->quota_address = xstrdup(address);
	s->quota_query = db_query_send("SELECT pepsi.send_count_take($1, $2::boolean, $3::integer, "
								   "$4::integer)",
								   4, values, session_quota_answered, s);
	return SMTP_SCREEN_WAIT;
}

enum smtp_screen_verdict
session_rcpt_gate(const struct smtp_session *smtp, const char *address, char *reply, size_t size)
{
	struct session *s = smtp->host;

	if (smtp->auth_account)
	{
		if (sender_login_limit_messages() > 0 || sender_login_limit_recipients() > 0)
			return session_send_limit(s, address, reply, size);
		return SMTP_SCREEN_PASS;
	}
	if (s->listener->greylist)
		return session_greylist(smtp, address, reply, size);
	return SMTP_SCREEN_PASS;
}

void
session_account_stop(struct session *s)
{
	db_query_cancel(s->login_query);
	s->login_query = NULL;
	db_query_cancel(s->quota_query);
	s->quota_query = NULL;
	free(s->quota_address);
	s->quota_address = NULL;
	for (size_t i = 0; i < s->nlogins; i++)
		free(s->logins[i]);
	free(s->logins);
	s->logins = NULL;
	s->nlogins = 0;
}

/* Answer a failed AUTH once its delay has passed. */
void
session_auth_answer_failure(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct session *s = w->data;
	if (s->auth_close)
	{
		smtp_auth_refused(&s->smtp, NULL);
		smtp_close(&s->smtp, "421 4.7.0 Too many failed authentications, closing connection");
		s->closing = true;
	}
	else
		smtp_auth_done(&s->smtp, false);
	ev_timer_again(ingress.loop, &s->timer);
	if (session_flush(s) && session_read(s))
		session_update(s);
}

/* A worker thread has checked the password (auth_worker.c). */
void
session_auth_checked(void *arg, bool ok)
{
	struct session *s = arg;
	bool			close = false;
	double			delay;

	s->auth_job = NULL;
	if (ok)
	{
		smtp_auth_done(&s->smtp, true);
		log_info("%s: authenticated as %s", s->ip, s->smtp.auth_account);
		ev_timer_again(ingress.loop, &s->timer);
		/* Pipelined commands waited behind the reply: go on with them. */
		if (session_flush(s) && session_read(s))
			session_update(s);
		return;
	}
	delay = auth_throttle_failed(ingress.auth_throttle, s->client->ip, ev_now(ingress.loop), &close);
	log_info("%s: authentication failed (%u from %s%s)", s->ip,
			 auth_throttle_failures(ingress.auth_throttle, s->client->ip, ev_now(ingress.loop)),
			 s->client->ip, close ? ": closing, and refusing its AUTH for a while" : "");
	s->auth_close = close;
	ev_timer_set(&s->auth_delay, delay, 0.0);
	ev_timer_start(ingress.loop, &s->auth_delay);
}
