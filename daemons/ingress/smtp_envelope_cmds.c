/*
 * smtp_envelope_cmds.c: the envelope's commands, HELO/EHLO, MAIL FROM with
 * its parameters (SIZE, BODY, SMTPUTF8, REQUIRETLS, RET, ENVID, AUTH) and
 * RCPT TO with NOTIFY and ORCPT, each checked against the host's policy
 * (relay control, SRS, recipient limits).  Dispatched from smtp.c.
 */
#include "smtp.h"
#include "smtp_internal.h"
#include "smtp_syntax.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "message/message.h"

static void smtp_hold(struct smtp_session *s, bool mail, const char *arg);

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
	if (p->helo_accepted)
		p->helo_accepted(s);
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

/* The sender's gate (policy->mail_gate, an authenticated session's); false when refused or held. */
static bool
smtp_mail_gate_allows(struct smtp_session *s, const char *address, const char *original)
{
	char reply[512];

	if (s->policy->mail_gate == NULL || s->auth_account == NULL || address[0] == '\0')
		return true;
	switch (s->policy->mail_gate(s, address, reply, sizeof(reply)))
	{
		case SMTP_SCREEN_PASS:
			return true;
		case SMTP_SCREEN_REFUSE:
			smtp_error(s, "%s", reply);
			return false;
		case SMTP_SCREEN_WAIT:
			smtp_hold(s, true, original);
			return false;
	}
	return false;
}

/* The filters have the MAIL or RCPT (SMTP_EVENT_MILTER): smtp_milter_done answers it. */
static void
smtp_milter_hold(struct smtp_session *s, bool mail, const char *address, char *notify, char *orcpt)
{
	s->milter_held_mail = mail;
	s->milter_held_address = xstrdup(address);
	s->milter_held_notify = notify;
	s->milter_held_orcpt = orcpt;
	s->milter_resume = s->state;
	s->state = SMTP_STATE_WAIT;
	s->event = SMTP_EVENT_MILTER;
}

static void
smtp_mail_taken(struct smtp_session *s, const char *path)
{
	s->mail_from = xstrdup(path);
	s->state = SMTP_STATE_MAIL;
	if (s->policy->mail_accepted)
		s->policy->mail_accepted(s);
	smtp_reply(s, "250 2.1.0 Sender ok");
}

static void
smtp_rcpt_taken(struct smtp_session *s, const char *path, char *notify, char *orcpt)
{
	struct smtp_recipient *r;

	s->rcpt = xrealloc(s->rcpt, (s->nrcpt + 1) * sizeof(*s->rcpt));
	r = &s->rcpt[s->nrcpt++];
	r->address = xstrdup(path);
	r->notify = notify;
	r->orcpt = orcpt;
	s->state = SMTP_STATE_RCPT;
	smtp_reply(s, "250 2.1.5 Recipient ok");
}

void
smtp_milter_done(struct smtp_session *s, const char *refusal)
{
	char *address = s->milter_held_address;
	char *notify = s->milter_held_notify;
	char *orcpt = s->milter_held_orcpt;

	s->milter_held_address = s->milter_held_notify = s->milter_held_orcpt = NULL;
	s->event = SMTP_EVENT_NONE;
	s->state = s->milter_resume;
	if (refusal && strncmp(refusal, "421", 3) == 0)
	{
		/* Postfix's smtpd: a filter's 421 ends the session */
		smtp_close(s, refusal);
		free(notify);
		free(orcpt);
	}
	else if (refusal)
	{
		if (s->milter_held_mail)
			smtp_reset_transaction(s);
		smtp_reply(s, "%s", refusal);
		free(notify);
		free(orcpt);
	}
	else if (s->milter_held_mail)
		smtp_mail_taken(s, address);
	else
		smtp_rcpt_taken(s, address, notify, orcpt);
	free(address);
}

static void
smtp_mail(struct smtp_session *s, char *arg, const char *original)
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
	if (!smtp_mail_gate_allows(s, path, original))
	{
		if (s->state != SMTP_STATE_WAIT)
			smtp_reset_transaction(s);
		return;
	}
	if (s->policy->milter_envelope && s->policy->milter_envelope(s, true, path))
	{
		smtp_milter_hold(s, true, path, NULL, NULL);
		return;
	}
	smtp_mail_taken(s, path);
}

void
smtp_cmd_mail(struct smtp_session *s, char *arg)
{
	/* Parsing cuts arg up: a sender held for the host is given again whole. */
	char *original = s->policy->mail_gate ? xstrdup(arg) : NULL;

	smtp_mail(s, arg, original ? original : arg);
	free(original);
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
		case SMTP_RCPT_OVER_QUOTA:
			smtp_reply(s, "452 4.2.2 <%.256s>: Mailbox full, try again later", address);
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

/* The MAIL or RCPT waits for the host: given again by smtp_screen_done. */
static void
smtp_hold(struct smtp_session *s, bool mail, const char *arg)
{
	free(s->screen_held);
	s->screen_held = xstrdup(arg);
	s->screen_held_mail = mail;
	s->screen_resume = s->state;
	s->state = SMTP_STATE_WAIT;
	s->event = SMTP_EVENT_SCREEN;
}

/*
 * The host's connection-level verdict (policy->screen), until it passes:
 * false when the recipient is refused, or held until the verdict is in.
 */
static bool
smtp_screen_allows(struct smtp_session *s, const char *arg)
{
	char reply[512];

	if (s->policy->screen == NULL || s->screen_passed)
		return true;
	switch (s->policy->screen(s, reply, sizeof(reply)))
	{
		case SMTP_SCREEN_PASS:
			s->screen_passed = true;
			return true;
		case SMTP_SCREEN_REFUSE:
			smtp_reply(s, "%s", reply);
			return false;
		case SMTP_SCREEN_WAIT:
			smtp_hold(s, false, arg);
			return false;
	}
	return false;
}

/* The recipient's gate (policy->rcpt_gate); false when refused or held. */
static bool
smtp_rcpt_gate_allows(struct smtp_session *s, const char *address, const char *original)
{
	char reply[512];

	if (s->policy->rcpt_gate == NULL)
		return true;
	switch (s->policy->rcpt_gate(s, address, reply, sizeof(reply)))
	{
		case SMTP_SCREEN_PASS:
			return true;
		case SMTP_SCREEN_REFUSE:
			smtp_reply(s, "%s", reply);
			return false;
		case SMTP_SCREEN_WAIT:
			smtp_hold(s, false, original);
			return false;
	}
	return false;
}

void
smtp_screen_done(struct smtp_session *s)
{
	char *arg = s->screen_held;

	s->screen_held = NULL;
	s->event = SMTP_EVENT_NONE;
	s->state = s->screen_resume;
	if (arg && s->screen_held_mail)
		smtp_cmd_mail(s, arg);
	else if (arg)
		smtp_cmd_rcpt(s, arg);
	free(arg);
}

static void
smtp_rcpt(struct smtp_session *s, char *arg, const char *original)
{
	char				  path[SMTP_PATH_MAX + 2];
	char				 *notify = NULL;
	char				 *orcpt = NULL;
	char				 *key;
	char				 *value;
	enum smtp_srs_verdict srs;

	if (s->state != SMTP_STATE_MAIL && s->state != SMTP_STATE_RCPT)
	{
		smtp_error(s, "503 5.5.1 Need MAIL before RCPT");
		return;
	}
	if (!smtp_screen_allows(s, arg))
		return;
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
	if (!smtp_rcpt_gate_allows(s, path, original))
		goto out;
	if (s->nrcpt >= s->policy->max_recipients)
	{
		/* RFC 5321 4.5.3.1.10: 452, and not counted as an error. */
		smtp_reply(s, "452 4.5.3 Too many recipients");
		goto out;
	}
	if (s->policy->milter_envelope && s->policy->milter_envelope(s, false, path))
	{
		smtp_milter_hold(s, false, path, notify, orcpt);
		return;
	}
	smtp_rcpt_taken(s, path, notify, orcpt);
	return;

out:
	free(notify);
	free(orcpt);
}

void
smtp_cmd_rcpt(struct smtp_session *s, char *arg)
{
	/* Parsing cuts arg up: a recipient held for the host is given again whole. */
	char *original = s->policy->rcpt_gate ? xstrdup(arg) : NULL;

	smtp_rcpt(s, arg, original ? original : arg);
	free(original);
}


void
smtp_cmd_helo_plain(struct smtp_session *s, char *arg)
{
	smtp_cmd_helo(s, arg, false);
}

void
smtp_cmd_ehlo(struct smtp_session *s, char *arg)
{
	smtp_cmd_helo(s, arg, true);
}
