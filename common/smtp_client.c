/*
 * smtp_client.c: see smtp_client.h.
 *
 * The session is one small state machine: DISCONNECTED, then READY after
 * connect, greeting, EHLO, STARTTLS (and EHLO again) and AUTH; a
 * transaction runs from READY and leaves it READY (or DISCONNECTED after
 * an I/O error or a 421).  This file is the protocol; the sockets, TLS
 * and deadlines are in smtp_client_io.c.
 */
#include "smtp_client.h"

#include <arpa/inet.h>
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
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "log.h"
#include "message.h"
#include "mime_downgrade.h"
#include "smtp_client_internal.h"
#include "tls_policy.h"
#include "xalloc.h"

/* When the options leave them at 0. */
#define SMTP_DEFAULT_CONNECT_TIMEOUT_MS 30000
#define SMTP_DEFAULT_COMMAND_TIMEOUT_MS 300000

/* ---------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------- */

bool
smtp_parse_destination(const char *value, const char *default_port, char **host, char **port)
{
	const char *colon;

	if (value == NULL || *value == '\0')
		return false;
	if (value[0] == '/')
	{
		*host = xstrdup(value);
		*port = NULL;
		return true;
	}
	if (value[0] == '[')
	{
		const char *close = strchr(value, ']');

		if (close == NULL || close == value + 1)
			return false;
		*host = xstrndup(value + 1, (size_t) (close - value - 1));
		if (close[1] == ':' && close[2])
			*port = xstrdup(close + 2);
		else if (close[1] == '\0')
			*port = xstrdup(default_port);
		else
		{
			free(*host);
			return false;
		}
	}
	else
	{
		colon = strrchr(value, ':');
		if (colon && strchr(value, ':') != colon)
			colon = NULL; /* a bare IPv6 address */
		if (colon && colon[1] == '\0')
			return false;
		*host = colon ? xstrndup(value, (size_t) (colon - value)) : xstrdup(value);
		*port = xstrdup(colon ? colon + 1 : default_port);
	}
	for (const char *p = *port; *p; p++)
		if (*p < '0' || *p > '9')
		{
			free(*host);
			free(*port);
			return false;
		}
	return true;
}

const char *
smtp_phase_name(enum smtp_phase phase)
{
	switch (phase)
	{
		case SMTP_PHASE_CONNECT:
			return "connect";
		case SMTP_PHASE_GREETING:
			return "greeting";
		case SMTP_PHASE_EHLO:
			return "EHLO";
		case SMTP_PHASE_STARTTLS:
			return "STARTTLS";
		case SMTP_PHASE_AUTH:
			return "AUTH";
		case SMTP_PHASE_MAIL:
			return "MAIL FROM";
		case SMTP_PHASE_RCPT:
			return "RCPT TO";
		case SMTP_PHASE_DATA:
			return "DATA";
		case SMTP_PHASE_MESSAGE:
			return "end of DATA";
	}
	return "?";
}

/* RFC 3461 section 4: xtext, "+" and hex for "+", "=", controls and non-ASCII. */
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
smtp_reply_flatten(struct smtp_reply *r)
{
	for (size_t i = 0; i < r->text.len; i++)
		if (r->text.data[i] == '\n')
			r->text.data[i] = ' ';
}

static void
smtp_reply_copy(struct smtp_reply *to, const struct smtp_reply *from)
{
	smtp_reply_reset(to);
	to->code = from->code;
	memcpy(to->enhanced, from->enhanced, sizeof(to->enhanced));
	buf_append(&to->text, from->text.data ? from->text.data : "", from->text.len);
}

/* ---------------------------------------------------------------------------
 * The session: greeting, EHLO, STARTTLS, AUTH
 * ------------------------------------------------------------------------- */

void
smtp_client_close(struct smtp_client *c)
{
	if (c->state == SMTP_READY)
	{
		struct smtp_reply r = {0};
		int				  timeout = c->opt.command_timeout_ms;

		/* A polite QUIT, but nobody waits long for its answer. */
		c->opt.command_timeout_ms = timeout < 2000 ? timeout : 2000;
		if (smtp_io_command(c, &r, "QUIT") && c->ssl)
			SSL_shutdown(c->ssl);
		c->opt.command_timeout_ms = timeout;
		buf_free(&r.text);
	}
	smtp_io_drop(c);
}

/* What a server without EHLO (or before it answered) offers: nothing. */
static void
smtp_forget_extensions(struct smtp_client *c)
{
	c->esmtp = false;
	c->has_starttls = c->has_pipelining = c->has_8bitmime = c->has_smtputf8 = false;
	c->has_chunking = c->has_binarymime = c->has_requiretls = false;
	c->has_dsn = c->has_enhanced = c->auth_plain = c->auth_login = c->has_size = false;
	c->size_limit = 0;
}

/* The EHLO keywords we act on: one per line after the first (the server's name). */
static void
smtp_parse_ehlo(struct smtp_client *c, const struct smtp_reply *r)
{
	const char *line = strchr(r->text.data, '\n');

	smtp_forget_extensions(c);
	c->esmtp = true;
	while (line)
	{
		const char *end;
		size_t		n;
		char		word[32];

		line++;
		end = strchr(line, '\n');
		n = strcspn(line, " =\n");
		snprintf(word, sizeof(word), "%.*s", (int) (n < sizeof(word) ? n : sizeof(word) - 1), line);
		if (strcasecmp(word, "STARTTLS") == 0)
			c->has_starttls = true;
		else if (strcasecmp(word, "PIPELINING") == 0)
			c->has_pipelining = true;
		else if (strcasecmp(word, "8BITMIME") == 0)
			c->has_8bitmime = true;
		else if (strcasecmp(word, "SMTPUTF8") == 0)
			c->has_smtputf8 = true;
		else if (strcasecmp(word, "CHUNKING") == 0)
			c->has_chunking = true;
		else if (strcasecmp(word, "BINARYMIME") == 0)
			c->has_binarymime = true;
		else if (strcasecmp(word, "REQUIRETLS") == 0)
			c->has_requiretls = true;
		else if (strcasecmp(word, "DSN") == 0)
			c->has_dsn = true;
		else if (strcasecmp(word, "ENHANCEDSTATUSCODES") == 0)
			c->has_enhanced = true;
		else if (strcasecmp(word, "SIZE") == 0)
		{
			c->has_size = true;
			c->size_limit = strtoul(line + n, NULL, 10);
		}
		else if (strcasecmp(word, "AUTH") == 0)
		{
			/* "AUTH PLAIN LOGIN" (or the old "AUTH=PLAIN LOGIN") */
			const char *q = line + n;
			const char *stop = end ? end : q + strlen(q);

			while (q < stop)
			{
				size_t m;

				q += strspn(q, " =");
				m = strcspn(q, " \n");
				if (m == 5 && strncasecmp(q, "PLAIN", 5) == 0)
					c->auth_plain = true;
				else if (m == 5 && strncasecmp(q, "LOGIN", 5) == 0)
					c->auth_login = true;
				q += m;
			}
		}
		line = end;
	}
}

static bool
smtp_ehlo(struct smtp_client *c, struct smtp_result *res)
{
	const char *name = c->opt.helo_name ? c->opt.helo_name : "localhost";

	res->phase = SMTP_PHASE_EHLO;
	if (!smtp_io_command(c, &res->reply, "%s %s", c->opt.lmtp ? "LHLO" : "EHLO", name))
		return false;
	if (res->reply.code / 100 == 2)
	{
		smtp_parse_ehlo(c, &res->reply);
		return true;
	}
	/* LMTP has no HELO to fall back to (RFC 2033 4.1). */
	if (res->reply.code / 100 == 5 && !c->opt.lmtp)
	{
		if (!smtp_io_command(c, &res->reply, "HELO %s", name))
			return false;
		if (res->reply.code / 100 == 2)
		{
			smtp_forget_extensions(c);
			return true;
		}
	}
	return false;
}

static void
smtp_base64(const char *in, size_t len, struct buf *out)
{
	size_t cap = 4 * ((len + 2) / 3) + 1;

	buf_reserve(out, cap);
	out->len += (size_t) EVP_EncodeBlock((unsigned char *) out->data + out->len,
										 (const unsigned char *) in, (int) len);
	out->data[out->len] = '\0';
}

static bool
smtp_auth(struct smtp_client *c, struct smtp_result *res)
{
	const char *user = c->opt.auth_user;
	const char *pass = c->opt.auth_password ? c->opt.auth_password : "";
	struct buf	token = BUF_INIT;
	struct buf	plain = BUF_INIT;
	bool		ok = false;

	res->phase = SMTP_PHASE_AUTH;
	if (c->ssl == NULL && c->opt.tls != SMTP_TLS_NONE)
	{
		smtp_io_set_error(c, "%s offered no STARTTLS; credentials are not sent in the clear "
							 "(TLS = none allows it)",
						  c->peer);
		return false;
	}
	if (c->auth_plain)
	{
		buf_append_char(&plain, '\0');
		buf_append_str(&plain, user);
		buf_append_char(&plain, '\0');
		buf_append_str(&plain, pass);
		smtp_base64(plain.data, plain.len, &token);
		ok = smtp_io_command(c, &res->reply, "AUTH PLAIN %s", token.data);
	}
	else if (c->auth_login)
	{
		ok = smtp_io_command(c, &res->reply, "AUTH LOGIN");
		if (ok && res->reply.code == 334)
		{
			smtp_base64(user, strlen(user), &token);
			ok = smtp_io_command(c, &res->reply, "%s", token.data);
			if (ok && res->reply.code == 334)
			{
				buf_reset(&token);
				smtp_base64(pass, strlen(pass), &token);
				ok = smtp_io_command(c, &res->reply, "%s", token.data);
			}
		}
	}
	else
		smtp_io_set_error(c, "%s offers neither AUTH PLAIN nor AUTH LOGIN", c->peer);
	if (plain.data)
		OPENSSL_cleanse(plain.data, plain.len);
	if (token.data)
		OPENSSL_cleanse(token.data, token.len);
	buf_free(&plain);
	buf_free(&token);
	return ok && res->reply.code == 235;
}

/* Does this session have to have TLS, and does it want it when offered? */
static void
smtp_tls_wanted(const struct smtp_client *c, bool *want, bool *must)
{
	if (c->policy)
	{
		*want = true;
		*must = tls_policy_requires_tls(c->policy);
		return;
	}
	*want = c->opt.tls != SMTP_TLS_NONE;
	*must = c->opt.tls == SMTP_TLS_VERIFY || c->opt.tls == SMTP_TLS_NO_VERIFY;
}

/* STARTTLS, the handshake and EHLO again, as the policy or the tls option says; false on failure. */
static bool
smtp_starttls(struct smtp_client *c, struct smtp_result *res)
{
	bool want;
	bool must;
	char reason[300];

	smtp_tls_wanted(c, &want, &must);
	c->tls_outcome[0] = c->tls_result[0] = '\0';
	c->tls_verified = false;
	if (!want || (!c->has_starttls && !must))
	{
		/* In clear: a policy still says so, for the log and TLSRPT. */
		if (c->policy)
			(void) tls_policy_check(c->policy, NULL, c->has_starttls, &c->tls_verified, c->tls_outcome,
									sizeof(c->tls_outcome), c->tls_result, sizeof(c->tls_result),
									reason, sizeof(reason));
		return true;
	}
	res->phase = SMTP_PHASE_STARTTLS;
	if (!c->has_starttls)
	{
		if (c->policy)
		{
			(void) tls_policy_check(c->policy, NULL, false, &c->tls_verified, c->tls_outcome,
									sizeof(c->tls_outcome), c->tls_result, sizeof(c->tls_result),
									reason, sizeof(reason));
			smtp_io_set_error(c, "%s does not offer STARTTLS, which the %s policy requires", c->peer,
							  tls_policy_name(c->policy));
		}
		else
			smtp_io_set_error(c, "%s does not offer STARTTLS, which TLS = %s requires", c->peer,
							  c->opt.tls == SMTP_TLS_VERIFY ? "verify" : "no-verify");
		smtp_reply_reset(&res->reply);
		return false;
	}
	if (!smtp_io_command(c, &res->reply, "STARTTLS") || res->reply.code != 220)
		return false;
	if (c->in.len > 0)
	{
		/* Anything sent before the handshake could be injected; refuse it. */
		smtp_io_set_error(c, "%s sent data after its STARTTLS reply", c->peer);
		smtp_reply_reset(&res->reply);
		return false;
	}
	if (!smtp_io_tls_handshake(c, res))
	{
		smtp_reply_reset(&res->reply);
		return false;
	}
	return smtp_ehlo(c, res);
}

/* From DISCONNECTED to READY; on failure res says why and the session is dropped. */
static bool
smtp_open(struct smtp_client *c, struct smtp_result *res)
{
	c->error[0] = '\0';
	res->phase = SMTP_PHASE_CONNECT;
	if (!smtp_io_connect(c))
		goto err;
	res->phase = SMTP_PHASE_GREETING;
	if (!smtp_io_read_reply(c, &res->reply))
		goto err;
	if (res->reply.code != 220)
		goto err;
	{
		size_t n = strcspn(res->reply.text.data, " ");

		snprintf(c->remote_mta, sizeof(c->remote_mta), "%.*s",
				 (int) (n > 0 && n < sizeof(c->remote_mta) ? n : 0), res->reply.text.data);
		if (c->remote_mta[0] == '\0')
			snprintf(c->remote_mta, sizeof(c->remote_mta), "%s", c->opt.host);
	}
	if (!smtp_ehlo(c, res))
		goto err;
	if (!smtp_starttls(c, res))
		goto err;
	if (c->opt.auth_user && !smtp_auth(c, res))
		goto err;
	c->state = SMTP_READY;
	c->messages = 0;
	c->need_rset = false;
	return true;
err:
	smtp_io_drop(c);
	return false;
}

/* ---------------------------------------------------------------------------
 * The transaction
 * ------------------------------------------------------------------------- */

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
static bool
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

/* Is the open session still worth using?  Closes it if not. */
static void
smtp_check_reuse(struct smtp_client *c)
{
	struct pollfd pfd;

	if (c->state != SMTP_READY)
		return;
	if ((c->opt.max_messages_per_connection > 0 && c->messages >= c->opt.max_messages_per_connection)
		|| (c->opt.max_idle_ms > 0 && smtp_io_now_ms() - c->last_used_ms > c->opt.max_idle_ms))
	{
		smtp_client_close(c);
		return;
	}
	/* Anything to read now is a 421 or the end: the server gave up on us. */
	pfd.fd = c->fd;
	pfd.events = POLLIN;
	if (c->in.len > 0 || (c->ssl && SSL_pending(c->ssl) > 0) || poll(&pfd, 1, 0) != 0)
	{
		smtp_io_drop(c);
		return;
	}
	if (c->need_rset)
	{
		struct smtp_reply r = {0};

		if (!smtp_io_command(c, &r, "RSET") || r.code != 250)
			smtp_io_drop(c);
		else
			c->need_rset = false;
		buf_free(&r.text);
	}
}

void
smtp_client_send(struct smtp_client *c, const struct smtp_envelope *env, const char *raw,
				 size_t len, struct smtp_result *res)
{
	memset(res, 0, sizeof(*res));
	smtp_reply_reset(&res->reply);
	res->nrcpt = env->nrcpt;
	res->rcpt_replies = xcalloc(env->nrcpt + 1, sizeof(struct smtp_reply));
	if (c->opt.lmtp)
		res->data_replies = xcalloc(env->nrcpt + 1, sizeof(struct smtp_reply));
	for (int attempt = 0; attempt < 2; attempt++)
	{
		long long started = smtp_io_now_ms();
		bool	  reused;
		bool	  opened;
		bool	  sent;

		smtp_check_reuse(c);
		reused = c->state == SMTP_READY;
		opened = reused || smtp_open(c, res);
		res->connect_seconds += (double) (smtp_io_now_ms() - started) / 1000.0;
		snprintf(res->relay, sizeof(res->relay), "%s", c->peer);
		snprintf(res->tls, sizeof(res->tls), "%s", c->ssl ? c->tls : "");
		snprintf(res->tls_outcome, sizeof(res->tls_outcome), "%s", c->tls_outcome);
		snprintf(res->tls_result, sizeof(res->tls_result), "%s", c->tls_result);
		if (!opened)
		{
			res->outcome = SMTP_TEMPORARY;
			/* (a reply cut short, say too long, leaves its code but the error says why) */
			if (res->reply.code == 0 || c->error[0])
				snprintf(res->error, sizeof(res->error), "%s", c->error);
			break;
		}
		snprintf(res->remote_mta, sizeof(res->remote_mta), "%s", c->remote_mta);
		started = smtp_io_now_ms();
		sent = smtp_transaction(c, env, raw, len, res);
		res->transfer_seconds += (double) (smtp_io_now_ms() - started) / 1000.0;
		if (sent)
		{
			c->messages++;
			c->last_used_ms = smtp_io_now_ms();
			/* A reused session the server had already closed gets one fresh try. */
			if (!(reused && res->outcome == SMTP_TEMPORARY && res->reply.code == 421
				  && res->phase == SMTP_PHASE_MAIL))
				break;
		}
		else if (!(reused && res->phase == SMTP_PHASE_MAIL))
			break;
		/* Start over on a new connection. */
		for (size_t i = 0; i < env->nrcpt; i++)
		{
			smtp_reply_reset(&res->rcpt_replies[i]);
			if (res->data_replies)
				smtp_reply_reset(&res->data_replies[i]);
		}
		smtp_reply_reset(&res->reply);
		res->error[0] = '\0';
	}
	if (res->remote_mta[0] == '\0')
		snprintf(res->remote_mta, sizeof(res->remote_mta), "%s", c->opt.host);
	/* Multi-line replies were kept line by line (for EHLO); callers get one line. */
	smtp_reply_flatten(&res->reply);
	for (size_t i = 0; i < env->nrcpt; i++)
	{
		smtp_reply_flatten(&res->rcpt_replies[i]);
		if (res->data_replies)
			smtp_reply_flatten(&res->data_replies[i]);
	}
}

void
smtp_result_free(struct smtp_result *res)
{
	buf_free(&res->reply.text);
	for (size_t i = 0; i < res->nrcpt; i++)
	{
		buf_free(&res->rcpt_replies[i].text);
		if (res->data_replies)
			buf_free(&res->data_replies[i].text);
	}
	free(res->rcpt_replies);
	free(res->data_replies);
	res->rcpt_replies = NULL;
	res->data_replies = NULL;
	res->nrcpt = 0;
}

/* ---------------------------------------------------------------------------
 * Construction
 * ------------------------------------------------------------------------- */

/* Keep a private copy of an option string; the copies are freed with the client. */
static const char *
smtp_client_keep_option(struct smtp_client *c, const char *s)
{
	char *copy;

	if (s == NULL)
		return NULL;
	copy = xstrdup(s);
	c->owned[c->nowned++] = copy;
	return copy;
}

struct smtp_client *
smtp_client_new(const struct smtp_client_options *options)
{
	struct smtp_client *c = xcalloc(1, sizeof(*c));

	c->opt = *options;
	c->opt.host = smtp_client_keep_option(c, options->host);
	c->opt.address = smtp_client_keep_option(c, options->address);
	c->opt.port = smtp_client_keep_option(c, options->port);
	c->opt.tls_ca_file = smtp_client_keep_option(c, options->tls_ca_file);
	c->opt.tls_name = smtp_client_keep_option(c, options->tls_name);
	c->opt.helo_name = smtp_client_keep_option(c, options->helo_name);
	c->opt.auth_user = smtp_client_keep_option(c, options->auth_user);
	c->opt.auth_password = smtp_client_keep_option(c, options->auth_password);
	if (c->opt.connect_timeout_ms <= 0)
		c->opt.connect_timeout_ms = SMTP_DEFAULT_CONNECT_TIMEOUT_MS;
	if (c->opt.command_timeout_ms <= 0)
		c->opt.command_timeout_ms = SMTP_DEFAULT_COMMAND_TIMEOUT_MS;
	c->fd = -1;
	c->state = SMTP_DISCONNECTED;
	return c;
}

static bool
smtp_same_option(const char *a, const char *b)
{
	return a == b || (a && b && strcmp(a, b) == 0);
}

struct smtp_client *
smtp_client_reuse(struct smtp_client *current, const struct smtp_client_options *o)
{
	const struct smtp_client_options *had = current ? &current->opt : NULL;

	if (had && smtp_same_option(had->host, o->host) && smtp_same_option(had->address, o->address)
		&& smtp_same_option(had->port, o->port)
		&& had->tls == o->tls && smtp_same_option(had->tls_ca_file, o->tls_ca_file)
		&& smtp_same_option(had->tls_name, o->tls_name)
		&& smtp_same_option(had->helo_name, o->helo_name)
		&& smtp_same_option(had->auth_user, o->auth_user)
		&& smtp_same_option(had->auth_password, o->auth_password)
		&& had->connect_timeout_ms == (o->connect_timeout_ms > 0 ? o->connect_timeout_ms : SMTP_DEFAULT_CONNECT_TIMEOUT_MS)
		&& had->command_timeout_ms == (o->command_timeout_ms > 0 ? o->command_timeout_ms : SMTP_DEFAULT_COMMAND_TIMEOUT_MS)
		&& had->max_messages_per_connection == o->max_messages_per_connection
		&& had->max_idle_ms == o->max_idle_ms && had->lmtp == o->lmtp)
		return current;
	smtp_client_free(current);
	return smtp_client_new(o);
}

bool
smtp_client_connected(const struct smtp_client *c)
{
	return c->state == SMTP_READY;
}

void
smtp_client_set_tls_policy(struct smtp_client *c, const struct tls_policy *policy)
{
	if (policy == NULL ? c->policy == NULL : c->policy != NULL && tls_policy_same(c->policy, policy))
		return;
	/* A session and a TLS context made under another policy are not reused. */
	smtp_client_close(c);
	if (c->ssl_ctx)
		SSL_CTX_free(c->ssl_ctx);
	c->ssl_ctx = NULL;
	if (c->policy_copy)
	{
		tls_policy_free(c->policy_copy);
		free(c->policy_copy);
		c->policy_copy = NULL;
	}
	if (policy)
	{
		c->policy_copy = xmalloc(sizeof(*c->policy_copy));
		tls_policy_copy(c->policy_copy, policy);
	}
	c->policy = c->policy_copy;
}

void
smtp_client_free(struct smtp_client *c)
{
	if (c == NULL)
		return;
	smtp_client_close(c);
	if (c->ssl_ctx)
		SSL_CTX_free(c->ssl_ctx);
	if (c->policy_copy)
	{
		tls_policy_free(c->policy_copy);
		free(c->policy_copy);
	}
	buf_free(&c->in);
	for (int i = 0; i < c->nowned; i++)
	{
		OPENSSL_cleanse(c->owned[i], strlen(c->owned[i])); /* one of them is a password */
		free(c->owned[i]);
	}
	free(c);
}
