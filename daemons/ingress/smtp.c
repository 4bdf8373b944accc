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
 * (smtp_content.c reads the content; this file holds the commands).
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

#include "base/base64.h"
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

static void
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
static bool
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

/*
 * Commands
 */

static bool
smtp_helo_valid(const char *arg)
{
	size_t len = strlen(arg);

	if (len == 0 || len > SMTP_HELO_MAX || !smtp_utf8_valid(arg, len))
		return false;
	for (const char *p = arg; *p; p++)
	{
		unsigned char c = (unsigned char) *p;

		if (!isalnum(c) && !strchr("-._:[]", c) && c < 0x80)
			return false;
	}
	return true;
}

static void
smtp_cmd_helo(struct smtp_session *s, char *arg, bool esmtp)
{
	const struct smtp_policy *p = s->policy;

	if (!smtp_helo_valid(arg))
	{
		smtp_error(s, "501 5.5.4 Syntax: %s domain", esmtp ? "EHLO" : "HELO");
		return;
	}
	smtp_reset_transaction(s);
	free(s->helo);
	s->helo = xstrdup(arg);
	s->esmtp = esmtp;
	s->state = SMTP_STATE_IDLE;
	if (!esmtp)
	{
		smtp_reply(s, "250 %s", p->hostname);
		return;
	}
	smtp_reply(s, "250-%s", p->hostname);
	smtp_reply(s, "250-PIPELINING");
	smtp_reply(s, "250-SIZE %zu", p->max_size);
	smtp_reply(s, "250-8BITMIME");
	smtp_reply(s, "250-BINARYMIME");
	smtp_reply(s, "250-CHUNKING");
	smtp_reply(s, "250-SMTPUTF8");
	smtp_reply(s, "250-DSN");
	if (p->starttls && !s->tls)
		smtp_reply(s, "250-STARTTLS");
	/* RFC 8689 2: offered only where it can be used, on a TLS session. */
	if (s->tls)
		smtp_reply(s, "250-REQUIRETLS");
	if (p->auth && s->tls && s->auth_account == NULL)
		smtp_reply(s, "250-AUTH PLAIN LOGIN");
	smtp_reply(s, "250 ENHANCEDSTATUSCODES");
}

static bool
smtp_mail_params(struct smtp_session *s, char *params)
{
	char *key;
	char *value;
	bool  seen_size = false,
		 seen_body = false,
		 seen_auth = false;

	while ((key = smtp_next_param(&params, &value)) != NULL)
	{
		if (!s->esmtp)
		{
			smtp_error(s, "555 5.5.4 Parameters need EHLO");
			return false;
		}
		if (strcasecmp(key, "SIZE") == 0 && value && !seen_size)
		{
			char			  *end;
			unsigned long long size;

			seen_size = true;
			if (!isdigit((unsigned char) value[0]) || strlen(value) > 20)
				goto syntax;
			size = strtoull(value, &end, 10);
			if (*end)
				goto syntax;
			if (size > s->policy->max_size)
			{
				smtp_error(s, "552 5.3.4 Message size exceeds fixed maximum message size");
				return false;
			}
		}
		else if (strcasecmp(key, "BODY") == 0 && value && !seen_body)
		{
			seen_body = true;
			if (strcasecmp(value, "7BIT") == 0)
				s->body = SMTP_BODY_7BIT;
			else if (strcasecmp(value, "8BITMIME") == 0)
				s->body = SMTP_BODY_8BITMIME;
			else if (strcasecmp(value, "BINARYMIME") == 0)
				s->body = SMTP_BODY_BINARYMIME;
			else
				goto syntax;
		}
		else if (strcasecmp(key, "SMTPUTF8") == 0 && value == NULL && !s->smtputf8)
			s->smtputf8 = true;
		else if (strcasecmp(key, "REQUIRETLS") == 0 && value == NULL && !s->requiretls)
		{
			/* RFC 8689 4.1: the sender's demand means nothing on a session in clear. */
			if (!s->tls)
			{
				smtp_error(s, "530 5.7.10 REQUIRETLS needs a TLS session: issue STARTTLS first");
				return false;
			}
			s->requiretls = true;
		}
		else if (strcasecmp(key, "RET") == 0 && value && s->ret == NULL)
		{
			if (strcasecmp(value, "FULL") != 0 && strcasecmp(value, "HDRS") != 0)
				goto syntax;
			s->ret = xstrdup(toupper((unsigned char) value[0]) == 'F' ? "FULL" : "HDRS");
		}
		else if (strcasecmp(key, "ENVID") == 0 && value && s->envid == NULL)
		{
			if (strlen(value) > SMTP_ENVID_MAX || !smtp_xtext_decode(value, false) || !*value)
				goto syntax;
			s->envid = xstrdup(value);
		}
		else if (strcasecmp(key, "AUTH") == 0 && value && !seen_auth)
			seen_auth = true; /* RFC 4954 5: accepted; we vouch only for our own AUTH */
		else if (strcasecmp(key, "SIZE") == 0 || strcasecmp(key, "BODY") == 0
				 || strcasecmp(key, "SMTPUTF8") == 0 || strcasecmp(key, "REQUIRETLS") == 0
				 || strcasecmp(key, "RET") == 0
				 || strcasecmp(key, "ENVID") == 0 || strcasecmp(key, "AUTH") == 0)
			goto syntax;
		else
		{
			smtp_error(s, "555 5.5.4 Unsupported parameter %.64s", key);
			return false;
		}
	}
	return true;

syntax:
	smtp_error(s, "501 5.5.4 Invalid parameter %.64s", key);
	return false;
}

static void
smtp_cmd_mail(struct smtp_session *s, char *arg)
{
	char path[SMTP_PATH_MAX + 2];

	if (s->state == SMTP_STATE_HELO)
	{
		smtp_error(s, "503 5.5.1 Send HELO/EHLO first");
		return;
	}
	if (s->state != SMTP_STATE_IDLE)
	{
		smtp_error(s, "503 5.5.1 Nested MAIL command");
		return;
	}
	if (s->policy->auth_required && s->auth_account == NULL)
	{
		if (!s->tls && s->policy->starttls)
			smtp_error(s, "530 5.7.0 Must issue a STARTTLS command first");
		else
			smtp_error(s, "530 5.7.0 Authentication required");
		return;
	}
	if (strncasecmp(arg, "FROM:", 5) != 0 || !smtp_parse_path((arg += 5, &arg), path, sizeof(path))
		|| (*arg && *arg != ' '))
	{
		smtp_error(s, "501 5.5.4 Syntax: MAIL FROM:<address>");
		return;
	}
	if (!smtp_mail_params(s, arg))
	{
		smtp_reset_transaction(s);
		return;
	}
	if (path[0] && !smtp_mailbox_valid(path, s->smtputf8))
	{
		if (!s->smtputf8 && message_has_8bit(path, strlen(path)) && smtp_mailbox_valid(path, true))
			smtp_error(s, "553 5.6.7 Non-ASCII address requires SMTPUTF8");
		else
			smtp_error(s, "553 5.1.7 Bad sender address syntax");
		smtp_reset_transaction(s);
		return;
	}
	s->mail_from = xstrdup(path);
	s->state = SMTP_STATE_MAIL;
	if (s->policy->mail_accepted)
		s->policy->mail_accepted(s);
	smtp_reply(s, "250 2.1.0 Sender ok");
}

/* NOTIFY=NEVER or a list of SUCCESS, FAILURE, DELAY, upper-cased. */
static bool
smtp_notify_valid(char *value)
{
	bool					 seen[3] = {false, false, false};
	static const char *const words[3] = {"SUCCESS", "FAILURE", "DELAY"};
	char					*copy = xstrdup(value);
	char					*save = NULL;
	bool					 ok = true;
	int						 count = 0;

	for (char *p = value; *p; p++)
		*p = (char) toupper((unsigned char) *p);
	if (strcmp(value, "NEVER") == 0)
	{
		free(copy);
		return true;
	}
	for (char *w = strtok_r(copy, ",", &save); w && ok; w = strtok_r(NULL, ",", &save))
	{
		int i;

		for (i = 0; i < 3 && strcasecmp(w, words[i]) != 0; i++)
			;
		ok = i < 3 && !seen[i];
		if (ok)
			seen[i] = true, count++;
	}
	free(copy);
	return ok && count > 0 && value[0] != ',' && value[strlen(value) - 1] != ','
		   && strstr(value, ",,") == NULL;
}

/*
 * Has the transaction this recipient already?  The domain is compared
 * without case (RFC 5321 2.4), the local part exactly: only its owner
 * knows whether case matters there.
 */
static bool
smtp_rcpt_duplicate(const struct smtp_session *s, const char *address)
{
	const char *at = strrchr(address, '@');
	size_t		local = at ? (size_t) (at - address) : strlen(address);

	for (size_t i = 0; i < s->nrcpt; i++)
	{
		const char *other = s->rcpt[i].address;

		if (strncmp(other, address, local) == 0
			&& (other[local] == '@' || other[local] == '\0')
			&& strcasecmp(other + local, address + local) == 0)
			return true;
	}
	return false;
}

/* The host's relay control and recipient validation; replies and returns false on refusal. */
static bool
smtp_rcpt_allowed(struct smtp_session *s, const char *address)
{
	switch (s->policy->rcpt_check(s, address))
	{
		case SMTP_RCPT_ACCEPT:
			return true;
		case SMTP_RCPT_RELAY_DENIED:
			smtp_error(s, "554 5.7.1 <%.256s>: Relay access denied (authenticate, or send "
						  "only to domains this server receives mail for)",
					   address);
			return false;
		case SMTP_RCPT_UNKNOWN_USER:
			smtp_error(s, "550 5.1.1 <%.256s>: Recipient address rejected: no such user here",
					   address);
			return false;
		case SMTP_RCPT_UNVERIFIED:
			/* Our trouble, not the client's: not counted as its error. */
			smtp_reply(s, "451 4.3.0 <%.256s>: Recipient cannot be verified now, try again later",
					   address);
			return false;
	}
	return false;
}

/* Does the SRS verdict let the recipient through?  Replies and returns false if not. */
static bool
smtp_srs_allowed(struct smtp_session *s, enum smtp_srs_verdict verdict, const char *address)
{
	switch (verdict)
	{
		case SMTP_SRS_NONE:
		case SMTP_SRS_REVERSED:
			return true;
		case SMTP_SRS_NOT_BOUNCE:
			smtp_error(s, "550 5.7.1 <%.256s>: Recipient address rejected: an SRS address takes "
						  "only bounces (MAIL FROM:<>)",
					   address);
			return false;
		case SMTP_SRS_INVALID:
			smtp_error(s, "550 5.1.1 <%.256s>: Recipient address rejected: invalid or expired SRS "
						  "address",
					   address);
			return false;
		case SMTP_SRS_TOO_MANY:
			smtp_close(s, "421 4.7.0 Too many invalid SRS addresses, closing connection");
			return false;
		case SMTP_SRS_THROTTLED:
			/* Not the client's error now: a bounce it holds may be good, later. */
			smtp_reply(s, "450 4.7.1 <%.256s>: Too many invalid SRS addresses from your address, "
						  "try again later",
					   address);
			return false;
	}
	return false;
}

static void
smtp_cmd_rcpt(struct smtp_session *s, char *arg)
{
	char				   path[SMTP_PATH_MAX + 2];
	char				  *notify = NULL;
	char				  *orcpt = NULL;
	char				  *key;
	char				  *value;
	struct smtp_recipient *r;
	enum smtp_srs_verdict  srs;

	if (s->state != SMTP_STATE_MAIL && s->state != SMTP_STATE_RCPT)
	{
		smtp_error(s, "503 5.5.1 Need MAIL before RCPT");
		return;
	}
	if (strncasecmp(arg, "TO:", 3) != 0 || !smtp_parse_path((arg += 3, &arg), path, sizeof(path))
		|| (*arg && *arg != ' '))
	{
		smtp_error(s, "501 5.5.4 Syntax: RCPT TO:<address>");
		return;
	}
	while ((key = smtp_next_param(&arg, &value)) != NULL)
	{
		if (!s->esmtp)
		{
			smtp_error(s, "555 5.5.4 Parameters need EHLO");
			goto out;
		}
		if (strcasecmp(key, "NOTIFY") == 0 && value && notify == NULL)
		{
			if (!smtp_notify_valid(value))
			{
				smtp_error(s, "501 5.5.4 Invalid NOTIFY parameter");
				goto out;
			}
			notify = xstrdup(value);
		}
		else if (strcasecmp(key, "ORCPT") == 0 && value && orcpt == NULL)
		{
			char *semicolon = strchr(value, ';');

			if (semicolon == NULL || semicolon == value || strlen(value) > 500
				|| !smtp_xtext_decode(semicolon + 1, s->smtputf8) || semicolon[1] == '\0')
			{
				smtp_error(s, "501 5.5.4 Invalid ORCPT parameter");
				goto out;
			}
			*semicolon = '\0';
			for (char *p = value; *p; p++)
				if (!isalnum((unsigned char) *p) && *p != '-')
				{
					smtp_error(s, "501 5.5.4 Invalid ORCPT address type");
					goto out;
				}
			orcpt = xasprintf("%s;%s", value, semicolon + 1);
			for (char *p = orcpt; *p != ';'; p++)
				*p = (char) tolower((unsigned char) *p);
		}
		else if (strcasecmp(key, "NOTIFY") == 0 || strcasecmp(key, "ORCPT") == 0)
		{
			smtp_error(s, "501 5.5.4 Invalid parameter %.64s", key);
			goto out;
		}
		else
		{
			smtp_error(s, "555 5.5.4 Unsupported parameter %.64s", key);
			goto out;
		}
	}
	if (strcasecmp(path, "postmaster") != 0 && !smtp_mailbox_valid(path, s->smtputf8))
	{
		if (!s->smtputf8 && message_has_8bit(path, strlen(path)) && smtp_mailbox_valid(path, true))
			smtp_error(s, "553 5.6.7 Non-ASCII address requires SMTPUTF8");
		else
			smtp_error(s, "501 5.1.3 Bad recipient address syntax");
		goto out;
	}
	srs = s->policy->srs_reverse ? s->policy->srs_reverse(s, path, sizeof(path)) : SMTP_SRS_NONE;
	if (!smtp_srs_allowed(s, srs, path))
		goto out;
	if (smtp_rcpt_duplicate(s, path))
	{
		/* Stored once: a list that names someone twice delivers once. */
		smtp_reply(s, "250 2.1.5 Recipient ok (duplicate, delivered once)");
		goto out;
	}
	if (srs == SMTP_SRS_NONE && s->policy->rcpt_check && !smtp_rcpt_allowed(s, path))
		goto out;
	if (s->nrcpt >= s->policy->max_recipients)
	{
		/* RFC 5321 4.5.3.1.10: 452, and not counted as an error. */
		smtp_reply(s, "452 4.5.3 Too many recipients");
		goto out;
	}
	s->rcpt = xrealloc(s->rcpt, (s->nrcpt + 1) * sizeof(*s->rcpt));
	r = &s->rcpt[s->nrcpt++];
	r->address = xstrdup(path);
	r->notify = notify;
	r->orcpt = orcpt;
	s->state = SMTP_STATE_RCPT;
	smtp_reply(s, "250 2.1.5 Recipient ok");
	return;

out:
	free(notify);
	free(orcpt);
}

/* Can a message be sent now?  Replies and returns false if not. */
static bool
smtp_content_allowed(struct smtp_session *s)
{
	if (s->state == SMTP_STATE_MAIL)
		smtp_error(s, "554 5.5.1 No valid recipients");
	else if (s->state != SMTP_STATE_RCPT)
		smtp_error(s, "503 5.5.1 Need RCPT before content");
	else
		return true;
	return false;
}

static void
smtp_cmd_data(struct smtp_session *s, char *arg)
{
	if (*arg)
	{
		smtp_error(s, "501 5.5.4 Syntax: DATA");
		return;
	}
	if (!smtp_content_allowed(s))
		return;
	if (s->chunking || s->body == SMTP_BODY_BINARYMIME)
	{
		smtp_error(s, "503 5.5.1 %s", s->chunking ? "DATA after BDAT" : "BINARYMIME needs BDAT");
		return;
	}
	if (smtp_memory_exhausted(s))
	{
		smtp_reply(s, SMTP_MEMORY_REPLY);
		return;
	}
	s->state = SMTP_STATE_DATA;
	s->scan = SMTP_SCAN_LINE_START;
	s->line_length = 0;
	smtp_reply(s, "354 End data with <CR><LF>.<CR><LF>");
}

static void
smtp_cmd_bdat(struct smtp_session *s, char *arg)
{
	char			  *end;
	unsigned long long size;

	if (!isdigit((unsigned char) arg[0]) || (size = strtoull(arg, &end, 10)) > SIZE_MAX / 2
		|| (*end && strcasecmp(end, " LAST") != 0))
	{
		/* Without a size the chunk cannot be skipped; the session may be lost. */
		smtp_error(s, "501 5.5.4 Syntax: BDAT size [LAST]");
		return;
	}
	s->bdat_remaining = (size_t) size;
	s->bdat_last = *end != '\0';
	s->bdat_reply = NULL;
	/* The octets follow whatever we answer, so they are always read. */
	if (!s->esmtp)
		s->bdat_reply = "503 5.5.1 BDAT needs EHLO";
	else if (s->state == SMTP_STATE_MAIL)
		s->bdat_reply = "554 5.5.1 No valid recipients";
	else if (s->state != SMTP_STATE_RCPT)
		s->bdat_reply = "503 5.5.1 Need RCPT before BDAT";
	else if (s->chunk_failed)
		s->bdat_reply = "554 5.5.0 An earlier chunk of this message was refused";
	else if (s->message_size + s->bdat_remaining > s->policy->max_size)
		s->bdat_reply = "552 5.3.4 Message size exceeds fixed maximum message size";
	else if (!s->chunking && smtp_memory_exhausted(s))
		s->bdat_reply = SMTP_MEMORY_REPLY;
	if (s->state == SMTP_STATE_RCPT)
	{
		s->chunking = true;
		if (s->bdat_reply)
			s->chunk_failed = true;
	}
	if (s->bdat_reply)
		smtp_message_release(s);
	s->state = SMTP_STATE_BDAT;
	if (s->bdat_remaining == 0)
		smtp_input_bdat(s, "", 0); /* no octets to wait for */
}

static void
smtp_cmd_rset(struct smtp_session *s, char *arg)
{
	smtp_reset_transaction(s);
	smtp_reply(s, "250 2.0.0 Ok");
}

static void
smtp_cmd_starttls(struct smtp_session *s, char *arg)
{
	if (*arg)
		smtp_error(s, "501 5.5.4 Syntax: STARTTLS");
	else if (!s->policy->starttls || s->tls)
		smtp_error(s, "503 5.5.1 TLS not available");
	else if (s->state != SMTP_STATE_IDLE && s->state != SMTP_STATE_HELO)
		smtp_error(s, "503 5.5.1 STARTTLS in a transaction");
	else
	{
		smtp_reply(s, "220 2.0.0 Ready to start TLS");
		s->state = SMTP_STATE_WAIT;
		s->event = SMTP_EVENT_STARTTLS;
	}
}

/* The decoded "authzid \0 authcid \0 password" of AUTH PLAIN. */
static void
smtp_auth_plain(struct smtp_session *s, const char *response)
{
	char  decoded[1024];
	long  n = base64_decode(response, strlen(response), (unsigned char *) decoded, sizeof(decoded) - 1, BASE64_STRICT);
	char *user;
	char *password;

	if (n < 0)
	{
		s->state = SMTP_STATE_IDLE;
		smtp_error(s, "501 5.5.2 Cannot decode the response");
		return;
	}
	decoded[n] = '\0';
	user = memchr(decoded, '\0', (size_t) n);
	password = user ? memchr(user + 1, '\0', (size_t) (decoded + n - user - 1)) : NULL;
	if (password == NULL || user[1] == '\0'
		|| (decoded[0] != '\0' && strcmp(decoded, user + 1) != 0))
	{
		explicit_bzero(decoded, sizeof(decoded));
		s->state = SMTP_STATE_IDLE;
		smtp_error(s, "535 5.7.8 Authentication credentials invalid");
		return;
	}
	smtp_wipe(&s->auth_user);
	smtp_wipe(&s->auth_password);
	s->auth_user = xstrdup(user + 1);
	s->auth_password = xstrndup(password + 1, (size_t) (decoded + n - password - 1));
	explicit_bzero(decoded, sizeof(decoded));
	s->state = SMTP_STATE_WAIT;
	s->event = SMTP_EVENT_AUTH;
}

/* A response line of AUTH (the initial one, or a continuation). */
void
smtp_auth_response(struct smtp_session *s, const char *line)
{
	char decoded[1024];
	long n;

	if (strcmp(line, "*") == 0)
	{
		s->auth_step = SMTP_AUTH_NONE;
		s->state = SMTP_STATE_IDLE;
		smtp_error(s, "501 5.7.0 Authentication cancelled");
		return;
	}
	if (s->auth_step == SMTP_AUTH_PLAIN)
	{
		s->auth_step = SMTP_AUTH_NONE;
		smtp_auth_plain(s, strcmp(line, "=") == 0 ? "" : line);
		return;
	}
	n = base64_decode(line, strlen(line), (unsigned char *) decoded, sizeof(decoded) - 1, BASE64_STRICT);
	if (n < 0 || memchr(decoded, '\0', (size_t) n) != NULL)
	{
		explicit_bzero(decoded, sizeof(decoded));
		s->auth_step = SMTP_AUTH_NONE;
		s->state = SMTP_STATE_IDLE;
		smtp_error(s, "501 5.5.2 Cannot decode the response");
		return;
	}
	decoded[n] = '\0';
	if (s->auth_step == SMTP_AUTH_LOGIN_USER)
	{
		smtp_wipe(&s->auth_user);
		s->auth_user = xstrdup(decoded);
		s->auth_step = SMTP_AUTH_LOGIN_PASSWORD;
		s->state = SMTP_STATE_AUTH;
		smtp_reply(s, "334 UGFzc3dvcmQ6");
	}
	else
	{
		smtp_wipe(&s->auth_password);
		s->auth_password = xstrdup(decoded);
		s->auth_step = SMTP_AUTH_NONE;
		s->state = SMTP_STATE_WAIT;
		s->event = SMTP_EVENT_AUTH;
	}
	explicit_bzero(decoded, sizeof(decoded));
}

static void
smtp_cmd_auth(struct smtp_session *s, char *arg)
{
	char *initial = strchr(arg, ' ');

	if (initial)
		*initial++ = '\0';
	if (!s->policy->auth)
		smtp_error(s, "502 5.5.1 AUTH not available");
	else if (!s->tls)
		smtp_error(s, "538 5.7.11 Encryption required for requested authentication mechanism");
	else if (s->state == SMTP_STATE_HELO || !s->esmtp)
		smtp_error(s, "503 5.5.1 Send EHLO first");
	else if (s->auth_account)
		smtp_error(s, "503 5.5.1 Already authenticated");
	else if (s->state != SMTP_STATE_IDLE)
		smtp_error(s, "503 5.5.1 AUTH in a transaction");
	else if (strcasecmp(arg, "PLAIN") == 0)
	{
		s->auth_step = SMTP_AUTH_PLAIN;
		if (initial)
			smtp_auth_response(s, initial);
		else
		{
			s->state = SMTP_STATE_AUTH;
			smtp_reply(s, "334 ");
		}
	}
	else if (strcasecmp(arg, "LOGIN") == 0)
	{
		s->auth_step = SMTP_AUTH_LOGIN_USER;
		if (initial)
			smtp_auth_response(s, initial);
		else
		{
			s->state = SMTP_STATE_AUTH;
			smtp_reply(s, "334 VXNlcm5hbWU6");
		}
	}
	else
		smtp_error(s, "504 5.5.4 Unrecognized authentication type");
}

static void
smtp_cmd_noop(struct smtp_session *s, char *arg)
{
	smtp_reply(s, "250 2.0.0 Ok");
}

static void
smtp_cmd_vrfy(struct smtp_session *s, char *arg)
{
	smtp_reply(s, "252 2.5.0 Cannot VRFY user, but will accept message and attempt delivery");
}

static void
smtp_cmd_help(struct smtp_session *s, char *arg)
{
	smtp_reply(s, "214 2.0.0 See RFC 5321");
}

static void
smtp_cmd_quit(struct smtp_session *s, char *arg)
{
	smtp_close(s, "221 2.0.0 Bye");
}

static void
smtp_cmd_helo_plain(struct smtp_session *s, char *arg)
{
	smtp_cmd_helo(s, arg, false);
}

static void
smtp_cmd_ehlo(struct smtp_session *s, char *arg)
{
	smtp_cmd_helo(s, arg, true);
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
