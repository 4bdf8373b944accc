/*
 * smtp_session_cmds.c: the commands around the envelope: DATA and BDAT
 * (their content is read by smtp_content.c), RSET, STARTTLS, AUTH PLAIN
 * and LOGIN, and NOOP, VRFY, HELP and QUIT.  Dispatched from smtp.c.
 */
#include "smtp.h"
#include "smtp_internal.h"
#include "smtp_syntax.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/base64.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "message/message.h"

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

void
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

void
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

void
smtp_cmd_rset(struct smtp_session *s, char *arg)
{
	smtp_reset_transaction(s);
	smtp_reply(s, "250 2.0.0 Ok");
}

void
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

void
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

void
smtp_cmd_noop(struct smtp_session *s, char *arg)
{
	smtp_reply(s, "250 2.0.0 Ok");
}

void
smtp_cmd_vrfy(struct smtp_session *s, char *arg)
{
	smtp_reply(s, "252 2.5.0 Cannot VRFY user, but will accept message and attempt delivery");
}

void
smtp_cmd_help(struct smtp_session *s, char *arg)
{
	smtp_reply(s, "214 2.0.0 See RFC 5321");
}

void
smtp_cmd_quit(struct smtp_session *s, char *arg)
{
	smtp_close(s, "221 2.0.0 Bye");
}
