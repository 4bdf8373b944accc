/*
 * smtp_client.c: see smtp_client.h.
 *
 * The session is one small state machine: DISCONNECTED, then READY after
 * connect, greeting, EHLO, STARTTLS (and EHLO again) and AUTH; a
 * transaction runs from READY and leaves it READY (or DISCONNECTED after
 * an I/O error or a 421).  This file is the session; the transaction
 * (MAIL, RCPT, DATA or BDAT and their replies) is in smtp_transaction.c,
 * the sockets, TLS and deadlines in smtp_client_io.c.
 */
#include "smtp/smtp_client.h"

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
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "base/base64.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "smtp/smtp_client_internal.h"
#include "smtp/tls_policy.h"

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
static void
smtp_reply_flatten(struct smtp_reply *r)
{
	for (size_t i = 0; i < r->text.len; i++)
		if (r->text.data[i] == '\n')
			r->text.data[i] = ' ';
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
	c->has_dsn = c->has_enhanced = c->has_size = false;
	c->auth_plain = c->auth_login = c->auth_xoauth2 = c->auth_oauthbearer = false;
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
			/* "AUTH PLAIN LOGIN XOAUTH2" (or the old "AUTH=PLAIN LOGIN") */
			const char *q = line + n;
			const char *stop = end ? end : q + strlen(q);

			while (q < stop)
			{
				size_t m;

				q += strspn(q, " =");
				m = strcspn(q, " \n");
				smtp_auth_offered(c, q, m);
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
		res->sessions_opened += !reused;
		opened = reused || smtp_open(c, res);
		res->connect_seconds += (double) (smtp_io_now_ms() - started) / 1000.0;
		snprintf(res->relay, sizeof(res->relay), "%s", c->peer);
		snprintf(res->local_address, sizeof(res->local_address), "%s", c->local_address);
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
		&& had->auth_mechanism == o->auth_mechanism
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
