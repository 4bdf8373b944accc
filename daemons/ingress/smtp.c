/*
 * smtp.c: see smtp.h.  RFC 5321 with the extensions pepsi-ingress offers:
 * PIPELINING (2920), SIZE (1870), 8BITMIME (6152), SMTPUTF8 (6531),
 * ENHANCEDSTATUSCODES (2034, 3463), DSN (3461), CHUNKING and BINARYMIME
 * (3030), STARTTLS (3207), REQUIRETLS (8689, under TLS only) and AUTH
 * PLAIN/LOGIN (4954).
 *
 * Content ends only at CRLF "." CRLF.  Bare CR, bare LF and NUL taint a
 * message instead of ending a line, so no other line end a sender and a
 * relay might read differently (the SMTP smuggling advisories) can end it;
 * a tainted message is refused whole once its real end arrives
 * (smtp_content.c reads the content).  This file holds the session's
 * life, its replies and the command dispatch; the verbs' handlers are in
 * smtp_envelope_cmds.c (HELO, EHLO, MAIL, RCPT) and smtp_session_cmds.c
 * (DATA, BDAT, RSET, STARTTLS, AUTH and the rest).
 */
#include "smtp.h"
#include "smtp_internal.h"
#include "smtp_syntax.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "message/message.h"

/* Refusals sent since start, by code: [0] is 400. */
static unsigned long long smtp_refusals[200];

void
smtp_count_refusal(const char *reply)
{
	if ((reply[0] == '4' || reply[0] == '5') && isdigit((unsigned char) reply[1])
		&& isdigit((unsigned char) reply[2]) && reply[3] != '-')
		smtp_refusals[(reply[0] - '4') * 100 + (reply[1] - '0') * 10 + (reply[2] - '0')]++;
}

char *
smtp_refusals_json(void)
{
	struct buf json = BUF_INIT;

	buf_append_char(&json, '{');
	for (int i = 0; i < 200; i++)
		if (smtp_refusals[i] > 0)
			buf_printf(&json, "%s\"%d\":%llu", json.len > 1 ? "," : "", 400 + i, smtp_refusals[i]);
	buf_append_char(&json, '}');
	return json.data;
}

void
smtp_reply(struct smtp_session *s, const char *fmt, ...)
{
	char	line[1024];
	va_list ap;
	int		n;

	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t) n >= sizeof(line))
		n = sizeof(line) - 1;
	buf_append(&s->out, line, (size_t) n);
	buf_append(&s->out, "\r\n", 2);
	smtp_count_refusal(line);
}

/* An error reply the client caused: counted, and too many end the session. */
void
smtp_error(struct smtp_session *s, const char *fmt, ...)
{
	char	line[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	smtp_reply(s, "%s", line);
	if (++s->errors >= s->policy->max_errors && s->state != SMTP_STATE_CLOSED)
		smtp_close(s, "421 4.7.0 Too many errors, closing connection");
}

void
smtp_close(struct smtp_session *s, const char *reply)
{
	if (s->state == SMTP_STATE_CLOSED)
		return;
	if (reply)
		smtp_reply(s, "%s", reply);
	s->state = SMTP_STATE_CLOSED;
	s->event = SMTP_EVENT_CLOSE;
}

void
smtp_wipe(char **secret)
{
	if (*secret)
	{
		explicit_bzero(*secret, strlen(*secret));
		free(*secret);
		*secret = NULL;
	}
}

/* Drop the content kept so far, and its share of the memory in flight. */
void
smtp_message_release(struct smtp_session *s)
{
	buf_free(&s->message);
	if (s->policy->memory_in_flight)
		*s->policy->memory_in_flight -= s->memory_counted;
	s->memory_counted = 0;
}

void
smtp_message_handed_over(struct smtp_session *s)
{
	buf_free(&s->message);
}

/* Is the memory for messages in flight used up? */
bool
smtp_memory_exhausted(const struct smtp_session *s)
{
	return s->policy->memory_in_flight
		   && *s->policy->memory_in_flight >= s->policy->memory_limit;
}

/* Forget the transaction (RSET, after DATA, after STARTTLS). */
void
smtp_reset_transaction(struct smtp_session *s)
{
	free(s->mail_from);
	s->mail_from = NULL;
	free(s->ret);
	s->ret = NULL;
	free(s->envid);
	s->envid = NULL;
	for (size_t i = 0; i < s->nrcpt; i++)
	{
		free(s->rcpt[i].address);
		free(s->rcpt[i].notify);
		free(s->rcpt[i].orcpt);
	}
	free(s->rcpt);
	s->rcpt = NULL;
	s->nrcpt = 0;
	s->smtputf8 = false;
	s->requiretls = false;
	s->body = SMTP_BODY_7BIT;
	s->chunking = false;
	s->chunk_failed = false;
	smtp_message_release(s);
	s->message_size = 0;
	s->taint = SMTP_TAINT_NONE;
	s->scan = SMTP_SCAN_LINE_START;
	s->line_length = 0;
	s->header_done = false;
	s->header_in_line = false;
	s->header_fields = 0;
	s->header_size = 0;
	s->bdat_remaining = 0;
	s->bdat_last = false;
	s->bdat_reply = NULL;
	if (s->state == SMTP_STATE_MAIL || s->state == SMTP_STATE_RCPT)
		s->state = SMTP_STATE_IDLE;
}

void
smtp_init(struct smtp_session *s, const struct smtp_policy *policy)
{
	memset(s, 0, sizeof(*s));
	s->policy = policy;
	s->state = SMTP_STATE_HELO;
	s->rate_tokens = policy->command_rate * 10.0;
}

void
smtp_free(struct smtp_session *s)
{
	smtp_reset_transaction(s);
	free(s->helo);
	free(s->screen_held);
	free(s->milter_held_address);
	free(s->milter_held_notify);
	free(s->milter_held_orcpt);
	free(s->auth_account);
	smtp_wipe(&s->auth_user);
	smtp_wipe(&s->auth_password);
	buf_free(&s->out);
}

void
smtp_greet(struct smtp_session *s)
{
	smtp_reply(s, "220 %s ESMTP Pepsi", s->policy->hostname);
}

const char *
smtp_body_name(enum smtp_body body)
{
	switch (body)
	{
		case SMTP_BODY_8BITMIME:
			return "8BITMIME";
		case SMTP_BODY_BINARYMIME:
			return "BINARYMIME";
		default:
			return "7BIT";
	}
}

const char *
smtp_protocol_name(const struct smtp_session *s)
{
	static const char *const names[2][2][2] = {
		{{"ESMTP", "ESMTPA"}, {"ESMTPS", "ESMTPSA"}},
		{{"UTF8SMTP", "UTF8SMTPA"}, {"UTF8SMTPS", "UTF8SMTPSA"}},
	};

	if (!s->esmtp)
		return "SMTP";
	return names[s->smtputf8][s->tls][s->auth_account != NULL];
}

static const struct
{
	const char *name;
	void (*handler)(struct smtp_session *s, char *arg);
} smtp_commands[] = {
	{"EHLO", smtp_cmd_ehlo},
	{"HELO", smtp_cmd_helo_plain},
	{"MAIL", smtp_cmd_mail},
	{"RCPT", smtp_cmd_rcpt},
	{"DATA", smtp_cmd_data},
	{"BDAT", smtp_cmd_bdat},
	{"RSET", smtp_cmd_rset},
	{"NOOP", smtp_cmd_noop},
	{"QUIT", smtp_cmd_quit},
	{"STARTTLS", smtp_cmd_starttls},
	{"AUTH", smtp_cmd_auth},
	{"VRFY", smtp_cmd_vrfy},
	{"HELP", smtp_cmd_help},
};

/* The token bucket of COMMAND_RATE: ten seconds' worth of burst. */
static bool
smtp_rate_allows(struct smtp_session *s)
{
	double				rate = s->policy->command_rate;
	static const double burst_seconds = 10;

	if (rate <= 0)
		return true;
	if (s->rate_elapsed > 0)
	{
		s->rate_tokens += rate * s->rate_elapsed;
		if (s->rate_tokens > rate * burst_seconds)
			s->rate_tokens = rate * burst_seconds;
		s->rate_elapsed = 0;
	}
	if (s->rate_tokens < 1)
		return false;
	s->rate_tokens -= 1;
	return true;
}

void
smtp_dispatch_command(struct smtp_session *s, char *line, size_t len)
{
	char  *arg;
	size_t verb;

	for (size_t i = 0; i < len; i++)
		if (line[i] == '\0' || line[i] == '\r')
		{
			smtp_error(s, "500 5.5.2 %s in command", line[i] ? "Bare CR" : "NUL");
			return;
		}
	if (!smtp_rate_allows(s))
	{
		smtp_close(s, "421 4.7.0 Too many commands, slow down");
		return;
	}
	verb = strcspn(line, " ");
	arg = line + verb;
	if (*arg)
		*arg++ = '\0';
	for (size_t i = 0; i < sizeof(smtp_commands) / sizeof(smtp_commands[0]); i++)
		if (strcasecmp(line, smtp_commands[i].name) == 0)
		{
			smtp_commands[i].handler(s, arg);
			return;
		}
	if (strcasecmp(line, "EXPN") == 0 || strcasecmp(line, "TURN") == 0
		|| strcasecmp(line, "ETRN") == 0)
		smtp_error(s, "502 5.5.1 Command not implemented");
	else
		smtp_error(s, "500 5.5.2 Command unrecognized");
}

/*
 * The host's answers
 */

void
smtp_tls_started(struct smtp_session *s, const struct smtp_tls_info *info)
{
	/* RFC 3207 4.2: forget everything learnt before TLS. */
	smtp_reset_transaction(s);
	free(s->helo);
	s->helo = NULL;
	s->esmtp = false;
	s->tls = true;
	s->tls_info = *info;
	s->state = SMTP_STATE_HELO;
	s->event = SMTP_EVENT_NONE;
}

void
smtp_auth_done(struct smtp_session *s, bool ok)
{
	s->event = SMTP_EVENT_NONE;
	s->state = SMTP_STATE_IDLE;
	if (ok)
	{
		s->auth_account = s->auth_user;
		s->auth_user = NULL;
		smtp_reply(s, "235 2.7.0 Authentication successful");
	}
	else
		smtp_error(s, "535 5.7.8 Authentication credentials invalid");
	smtp_wipe(&s->auth_user);
	smtp_wipe(&s->auth_password);
}

void
smtp_auth_refused(struct smtp_session *s, const char *reply)
{
	s->event = SMTP_EVENT_NONE;
	s->state = SMTP_STATE_IDLE;
	smtp_wipe(&s->auth_user);
	smtp_wipe(&s->auth_password);
	if (reply)
		smtp_error(s, "%s", reply);
}

void
smtp_admit_done(struct smtp_session *s, bool ok, const char *queue_id)
{
	s->event = SMTP_EVENT_NONE;
	s->state = SMTP_STATE_IDLE;
	if (ok)
		smtp_reply(s, "250 2.0.0 Ok: queued as %s", queue_id);
	else
		smtp_reply(s, "451 4.3.0 Queue temporarily unavailable, try again later");
	smtp_reset_transaction(s);
}

void
smtp_admit_refused(struct smtp_session *s, const char *reply)
{
	s->event = SMTP_EVENT_NONE;
	s->state = SMTP_STATE_IDLE;
	smtp_reset_transaction(s);
	smtp_error(s, "%s", reply);
}
