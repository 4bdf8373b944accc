/*
 * smtp_transaction.c: one SMTP or LMTP transaction on a session that
 * smtp_client.c has opened (READY): MAIL, RCPT and DATA or BDAT,
 * pipelined when the server allows, with the payload converted as the
 * server's extensions require, and each reply mapped to the outcome of
 * the message and of each recipient.  Apart from the session (connect,
 * EHLO, STARTTLS, AUTH, reuse), which does not look at messages.
 */
#include "smtp/smtp_client.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/xalloc.h"
#include "message/message.h"
#include "message/mime_downgrade.h"
#include "smtp/smtp_client_internal.h"

void
smtp_xtext_encode(const char *in, struct buf *out)
{
	for (const unsigned char *p = (const unsigned char *) in; *p; p++)
	{
		if (*p < 33 || *p > 126 || *p == '+' || *p == '=')
			buf_printf(out, "+%02X", *p);
		else
			buf_append_char(out, (char) *p);
	}
}

void
smtp_dot_stuff(const char *raw, size_t len, struct buf *out)
{
	/*
	 * Line by line, each copied whole: the message is as long as it is
	 * (a relay sends every octet of every message through here).  A line
	 * ends at a CRLF, a bare LF or a bare CR (the last two sent as CRLF:
	 * the wire has one line end, and a bare CR is what SMTP smuggling
	 * hides a second message behind), or at the end of the message.
	 */
	buf_reserve(out, len + len / 64 + 8);
	for (size_t pos = 0; pos < len;)
	{
		const char *lf = memchr(raw + pos, '\n', len - pos);
		size_t		text_end = lf ? (size_t) (lf - raw) : len;
		size_t		next = lf ? text_end + 1 : len;
		const char *cr;

		if (lf && text_end > pos && raw[text_end - 1] == '\r')
			text_end--;
		cr = memchr(raw + pos, '\r', text_end - pos);
		if (cr)
		{
			text_end = (size_t) (cr - raw);
			next = text_end + 1;
		}
		if (raw[pos] == '.')
			buf_append_char(out, '.');
		buf_append(out, raw + pos, text_end - pos);
		buf_append(out, "\r\n", 2);
		pos = next;
	}
	buf_append(out, ".\r\n", 3);
}

static void
smtp_reply_copy(struct smtp_reply *to, const struct smtp_reply *from)
{
	smtp_reply_reset(to);
	to->code = from->code;
	memcpy(to->enhanced, from->enhanced, sizeof(to->enhanced));
	buf_append(&to->text, from->text.data ? from->text.data : "", from->text.len);
}

static bool
smtp_is_ascii(const char *s)
{
	return !message_has_8bit(s, strlen(s));
}

/*
 * What goes over the wire after DATA or BDAT: the message itself, or a
 * converted copy (owned), and the BODY= it is declared with.
 */
struct smtp_payload
{
	const char *data;
	size_t		len;
	const char *body; /* "7BIT", "8BITMIME" or "BINARYMIME" */
	bool		bdat;
	bool		downgraded;
	struct buf	owned;
};

/* Build "MAIL FROM:<...> params" into line. */
static void
smtp_mail_command(struct smtp_client *c, const struct smtp_envelope *env,
				  const struct smtp_payload *payload, bool utf8, struct buf *line)
{
	buf_printf(line, "MAIL FROM:<%s>", env->mail_from);
	if (c->has_size)
		buf_printf(line, " SIZE=%zu", payload->len);
	if (strcmp(payload->body, "7BIT") != 0)
		buf_printf(line, " BODY=%s", payload->body);
	if (utf8)
		buf_append_str(line, " SMTPUTF8");
	if (env->requiretls)
		buf_append_str(line, " REQUIRETLS");
	if (c->has_dsn)
	{
		if (env->ret && (strcasecmp(env->ret, "FULL") == 0 || strcasecmp(env->ret, "HDRS") == 0))
			buf_printf(line, " RET=%s", strcasecmp(env->ret, "FULL") == 0 ? "FULL" : "HDRS");
		if (env->envid && *env->envid)
		{
			buf_append_str(line, " ENVID=");
			smtp_xtext_encode(env->envid, line);
		}
	}
	buf_append(line, "\r\n", 2);
}

static void
smtp_rcpt_command(struct smtp_client *c, const struct smtp_envelope *env, size_t i, struct buf *line)
{
	buf_printf(line, "RCPT TO:<%s>", env->rcpt[i]);
	if (c->has_dsn)
	{
		const char *notify = env->notify ? env->notify[i] : NULL;
		const char *orcpt = env->orcpt ? env->orcpt[i] : NULL;
		const char *semi = orcpt ? strchr(orcpt, ';') : NULL;

		if (notify && *notify)
			buf_printf(line, " NOTIFY=%s", notify);
		if (semi && semi > orcpt && semi[1])
		{
			buf_printf(line, " ORCPT=%.*s;", (int) (semi - orcpt), orcpt);
			smtp_xtext_encode(semi + 1, line);
		}
	}
	buf_append(line, "\r\n", 2);
}

static void
smtp_result_set(struct smtp_result *res, enum smtp_outcome outcome, enum smtp_phase phase,
				const struct smtp_reply *reply)
{
	res->outcome = outcome;
	res->phase = phase;
	if (reply && reply != &res->reply)
		smtp_reply_copy(&res->reply, reply);
}

static enum smtp_outcome
smtp_class(const struct smtp_reply *r)
{
	return r->code / 100 == 5 ? SMTP_PERMANENT : SMTP_TEMPORARY;
}

/* A refusal decided here, before MAIL FROM: true, with res set. */
static bool
smtp_refuse(struct smtp_result *res, const char *enhanced, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static bool
smtp_refuse(struct smtp_result *res, const char *enhanced, const char *fmt, ...)
{
	va_list ap;

	res->outcome = SMTP_PERMANENT;
	res->phase = SMTP_PHASE_MAIL;
	/* The reply left from EHLO is not the reason. */
	smtp_reply_reset(&res->reply);
	va_start(ap, fmt);
	vsnprintf(res->error, sizeof(res->error), fmt, ap);
	va_end(ap);
	snprintf(res->reply.enhanced, sizeof(res->reply.enhanced), "%s", enhanced);
	return true;
}

/* The header section of raw (up to its empty line). */
static size_t
smtp_headers_length(const char *raw, size_t len)
{
	const char *end = memmem(raw, len, "\r\n\r\n", 4);

	return end ? (size_t) (end - raw) + 2 : len;
}

/*
 * Does the message need SMTPUTF8?  A non-ASCII address does; so do
 * non-ASCII header fields of a message that came in as SMTPUTF8.  An
 * SMTPUTF8 message that turned out all ASCII goes without it (RFC 6531
 * 3.7.2 lets it).
 */
static bool
smtp_needs_utf8(const struct smtp_envelope *env, const char *raw, size_t len)
{
	if (!smtp_is_ascii(env->mail_from))
		return true;
	for (size_t i = 0; i < env->nrcpt; i++)
		if (!smtp_is_ascii(env->rcpt[i]))
			return true;
	return env->smtputf8 && message_has_8bit(raw, smtp_headers_length(raw, len));
}

/*
 * BDAT sends the octets as they are, so a text message's bare LF (a local
 * submission's) becomes CRLF here, as smtp_dot_stuff does for DATA.
 */
static void
smtp_bdat_line_ends(struct smtp_payload *p)
{
	const char *lf = p->bdat ? memchr(p->data, '\n', p->len) : NULL;
	struct buf	copy = BUF_INIT;

	while (lf && lf > p->data && lf[-1] == '\r')
		lf = memchr(lf + 1, '\n', p->len - (size_t) (lf + 1 - p->data));
	if (lf == NULL)
		return;
	buf_reserve(&copy, p->len + p->len / 32 + 2);
	for (size_t i = 0; i < p->len; i++)
	{
		if (p->data[i] == '\n' && (i == 0 || p->data[i - 1] != '\r'))
			buf_append_char(&copy, '\r');
		buf_append_char(&copy, p->data[i]);
	}
	buf_free(&p->owned);
	p->owned = copy;
	p->data = copy.data;
	p->len = copy.len;
}

/*
 * Decide how the message goes to this server: BDAT when it offers
 * CHUNKING; binary content only with BINARYMIME, else converted; 8-bit
 * content only with 8BITMIME (or SMTPUTF8), else converted.  true when
 * refused (res set).
 */
static bool
smtp_prepare_payload(struct smtp_client *c, const char *raw, size_t len, bool utf8,
					 struct smtp_payload *p, struct smtp_result *res)
{
	bool					   binary = mime_has_binary(raw, len);
	bool					   eight = message_has_8bit(raw, len);
	enum mime_downgrade_target target = MIME_TO_8BIT;
	char					   why[256] = "";

	p->data = raw;
	p->len = len;
	p->bdat = c->has_chunking;
	p->body = binary ? "BINARYMIME" : eight ? "8BITMIME"
											: "7BIT";
	if (binary && c->has_chunking && c->has_binarymime)
		return false;
	if (!binary && (!eight || c->has_8bitmime || utf8))
	{
		smtp_bdat_line_ends(p);
		return false;
	}
	if (!c->has_8bitmime && !utf8)
		target = MIME_TO_7BIT;
	switch (mime_downgrade(raw, len, target, &p->owned, why, sizeof(why)))
	{
		case MIME_DOWNGRADE_UNCHANGED:
			break;
		case MIME_DOWNGRADE_DONE:
			p->data = p->owned.data;
			p->len = p->owned.len;
			p->downgraded = true;
			break;
		case MIME_DOWNGRADE_IMPOSSIBLE:
			/*
			 * DATA cannot carry a bare CR or a NUL unchanged (and a bare CR
			 * is what SMTP smuggling hides a second message behind), nor a
			 * server without 8BITMIME 8-bit octets: refused rather than sent
			 * altered or raw.
			 */
			return smtp_refuse(res, "5.6.3", "the message holds %s content that %s cannot take "
											 "(it has no %s) and that cannot be converted: %s",
							   binary ? "binary" : "8-bit", c->peer, binary ? "BINARYMIME" : "8BITMIME", why);
	}
	p->body = message_has_8bit(p->data, p->len) ? "8BITMIME" : "7BIT";
	smtp_bdat_line_ends(p);
	return false;
}

/* Refuse locally what the server cannot take; true when refused. */
static bool
smtp_refuse_locally(struct smtp_client *c, const struct smtp_envelope *env, size_t len, bool utf8,
					struct smtp_result *res)
{
	if (utf8 && !c->has_smtputf8)
		return smtp_refuse(res, "5.6.7", "%s does not support SMTPUTF8, which the message needs "
										 "(non-ASCII addresses or header fields)",
						   c->peer);
	/* RFC 8689 4.2.1: only over TLS whose peer was authenticated, to a server that promises to keep it. */
	if (env->requiretls && (c->ssl == NULL || !c->tls_verified || !c->has_requiretls))
		return smtp_refuse(res, "5.7.30", "the message requires TLS (REQUIRETLS) and %s %s", c->peer,
						   c->ssl == NULL	  ? "offers no TLS"
						   : !c->tls_verified ? "could not be authenticated"
											  : "does not offer REQUIRETLS");
	if (c->size_limit > 0 && len > c->size_limit)
		return smtp_refuse(res, "5.3.4", "message of %zu bytes exceeds the limit of %lu bytes of %s",
						   len, c->size_limit, c->peer);
	return false;
}

/* The BDAT command and its chunk: the whole message, line ends as they are (RFC 3030 2). */
static void
smtp_bdat(const struct smtp_payload *p, struct buf *out)
{
	buf_printf(out, "BDAT %zu LAST\r\n", p->len);
	buf_append(out, p->data, p->len);
}

/* Read the replies of MAIL and each RCPT; false on an I/O failure. */
static bool
smtp_read_envelope_replies(struct smtp_client *c, const struct smtp_envelope *env,
						   struct smtp_reply *mail, struct smtp_result *res)
{
	res->phase = SMTP_PHASE_MAIL;
	if (!smtp_io_read_reply(c, mail))
		return false;
	for (size_t i = 0; i < env->nrcpt; i++)
	{
		res->phase = SMTP_PHASE_RCPT;
		if (!smtp_io_read_reply(c, &res->rcpt_replies[i]))
			return false;
	}
	return true;
}

/*
 * LMTP (RFC 2033 4.2): after the message, one reply per recipient whose
 * RCPT was accepted, in the order of the RCPTs.  res->reply becomes the
 * first 2xx among them, else the first 4xx, else the first 5xx, so the
 * transaction's outcome says whether anything was delivered.  Fewer
 * replies than accepted recipients (the server closed, or went silent
 * past the timeout) is an I/O error: which reply belongs to whom is then
 * unknowable, so no recipient counts as delivered.
 */
static bool
smtp_lmtp_data_replies(struct smtp_client *c, const struct smtp_envelope *env,
					   struct smtp_result *res)
{
	const struct smtp_reply *deciding = NULL;
	size_t					 expected = 0;
	size_t					 got = 0;

	for (size_t i = 0; i < env->nrcpt; i++)
		if (res->rcpt_replies[i].code / 100 == 2)
			expected++;
	for (size_t i = 0; i < env->nrcpt; i++)
	{
		if (res->rcpt_replies[i].code / 100 != 2)
			continue;
		if (!smtp_io_read_reply(c, &res->data_replies[i]))
		{
			size_t n = strlen(c->error);

			snprintf(c->error + n, sizeof(c->error) - n,
					 " after %zu of the %zu replies LMTP owes for the message's accepted recipients",
					 got, expected);
			for (size_t j = 0; j < env->nrcpt; j++)
				smtp_reply_reset(&res->data_replies[j]);
			return false;
		}
		got++;
	}
	for (int class = 2; class <= 5 && deciding == NULL; class ++)
		for (size_t i = 0; i < env->nrcpt && deciding == NULL; i++)
			if (res->data_replies[i].code / 100 == class)
				deciding = &res->data_replies[i];
	if (deciding)
		smtp_reply_copy(&res->reply, deciding);
	return true;
}

/* The reply to the message: one, or with LMTP one per accepted recipient. */
static bool
smtp_read_final_replies(struct smtp_client *c, const struct smtp_envelope *env, struct smtp_result *res)
{
	return c->opt.lmtp ? smtp_lmtp_data_replies(c, env, res) : smtp_io_read_reply(c, &res->reply);
}

/*
 * One transaction on a READY session.  Returns false on an I/O failure
 * (the session is then dropped and res says where).
 */
bool
smtp_transaction(struct smtp_client *c, const struct smtp_envelope *env, const char *raw,
				 size_t len, struct smtp_result *res)
{
	bool				utf8 = smtp_needs_utf8(env, raw, len);
	struct smtp_payload payload = {.owned = BUF_INIT};
	struct buf			commands = BUF_INIT;
	struct buf			wire = BUF_INIT;
	struct smtp_reply	mail = {0};
	struct smtp_reply	data = {0};
	size_t				accepted = 0;
	bool				temporary_rcpt = false;
	bool				pipelined_bdat;
	size_t				first_bad = (size_t) -1;
	bool				ok = false;

	/* What opened the session (EHLO, AUTH) decides nothing about this message. */
	smtp_reply_reset(&res->reply);
	if (smtp_refuse_locally(c, env, len, utf8, res) || smtp_prepare_payload(c, raw, len, utf8, &payload, res))
	{
		buf_free(&payload.owned);
		return true;
	}
	res->dsn_passed = c->has_dsn;
	res->bdat = payload.bdat;
	res->body_type = payload.body;
	res->downgraded = payload.downgraded;
	c->need_rset = true;
	/* With PIPELINING, the chunk goes with the envelope: one round trip for the whole message. */
	pipelined_bdat = payload.bdat && c->has_pipelining && !c->opt.lmtp;

	/* MAIL, the RCPTs and DATA (or BDAT): one write when the server pipelines. */
	smtp_mail_command(c, env, &payload, utf8, &commands);
	if (!c->has_pipelining)
	{
		res->phase = SMTP_PHASE_MAIL;
		if (!smtp_io_write(c, commands.data, commands.len) || !smtp_io_read_reply(c, &mail))
			goto io_err;
		if (mail.code / 100 != 2)
		{
			smtp_result_set(res, smtp_class(&mail), SMTP_PHASE_MAIL, &mail);
			ok = true;
			goto done;
		}
		for (size_t i = 0; i < env->nrcpt; i++)
		{
			buf_reset(&commands);
			smtp_rcpt_command(c, env, i, &commands);
			res->phase = SMTP_PHASE_RCPT;
			if (!smtp_io_write(c, commands.data, commands.len)
				|| !smtp_io_read_reply(c, &res->rcpt_replies[i]))
				goto io_err;
		}
	}
	else
	{
		for (size_t i = 0; i < env->nrcpt; i++)
			smtp_rcpt_command(c, env, i, &commands);
		/* BDAT waits for the RCPT replies when LMTP owes one reply per accepted recipient. */
		if (pipelined_bdat)
			smtp_bdat(&payload, &commands);
		else if (!payload.bdat)
			buf_append_str(&commands, "DATA\r\n");
		res->phase = SMTP_PHASE_MAIL;
		if (!smtp_io_write(c, commands.data, commands.len)
			|| !smtp_read_envelope_replies(c, env, &mail, res))
			goto io_err;
		res->phase = pipelined_bdat ? SMTP_PHASE_MESSAGE : SMTP_PHASE_DATA;
		if ((pipelined_bdat || !payload.bdat) && !smtp_io_read_reply(c, pipelined_bdat ? &res->reply : &data))
			goto io_err;
	}
	for (size_t i = 0; i < env->nrcpt; i++)
	{
		int code = res->rcpt_replies[i].code;

		if (code / 100 == 2)
			accepted++;
		else
		{
			if (code / 100 != 5)
				temporary_rcpt = true;
			if (first_bad == (size_t) -1 || (code / 100 != 5 && res->rcpt_replies[first_bad].code / 100 == 5))
				first_bad = i;
		}
	}
	if (mail.code / 100 != 2)
	{
		if (data.code == 354)
			(void) (smtp_io_write(c, ".\r\n", 3) && smtp_io_read_reply(c, &data));
		smtp_result_set(res, smtp_class(&mail), SMTP_PHASE_MAIL, &mail);
		ok = true;
		goto done;
	}
	if (accepted == 0)
	{
		if (data.code == 354)
		{
			/* A server that said 354 with no recipient gets an empty message it must refuse. */
			if (!smtp_io_write(c, ".\r\n", 3) || !smtp_io_read_reply(c, &data))
				goto io_err;
		}
		smtp_result_set(res, temporary_rcpt ? SMTP_TEMPORARY : SMTP_PERMANENT, SMTP_PHASE_RCPT,
						&res->rcpt_replies[first_bad]);
		ok = true;
		goto done;
	}
	if (payload.bdat && !pipelined_bdat)
	{
		smtp_bdat(&payload, &wire);
		res->phase = SMTP_PHASE_MESSAGE;
		if (!smtp_io_write(c, wire.data, wire.len) || !smtp_read_final_replies(c, env, res))
			goto io_err;
	}
	else if (!payload.bdat)
	{
		if (!c->has_pipelining)
		{
			res->phase = SMTP_PHASE_DATA;
			if (!smtp_io_write(c, "DATA\r\n", 6) || !smtp_io_read_reply(c, &data))
				goto io_err;
		}
		if (data.code != 354)
		{
			smtp_result_set(res, smtp_class(&data), SMTP_PHASE_DATA, &data);
			ok = true;
			goto done;
		}
		smtp_dot_stuff(payload.data, payload.len, &wire);
		res->phase = SMTP_PHASE_MESSAGE;
		if (!smtp_io_write(c, wire.data, wire.len) || !smtp_read_final_replies(c, env, res))
			goto io_err;
	}
	res->phase = SMTP_PHASE_MESSAGE;
	if (res->reply.code / 100 == 2)
	{
		res->outcome = SMTP_DELIVERED;
		c->need_rset = false;
	}
	else
		res->outcome = smtp_class(&res->reply);
	ok = true;
	goto done;

io_err:
	res->outcome = SMTP_TEMPORARY;
	smtp_reply_reset(&res->reply); /* what an earlier command said is not the reason */
	snprintf(res->error, sizeof(res->error), "%s while sending %s", c->error,
			 smtp_phase_name(res->phase));
	smtp_io_drop(c);
done:
	if (ok && (res->reply.code == 421 || mail.code == 421 || data.code == 421))
		smtp_io_drop(c);
	buf_free(&commands);
	buf_free(&wire);
	buf_free(&payload.owned);
	buf_free(&mail.text);
	buf_free(&data.text);
	return ok;
}
