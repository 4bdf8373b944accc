/*
 * envelope.c: see envelope.h.  Every string written into a header here
 * was checked by the protocol (HELO, addresses, the account name), so no
 * client can inject a line into the trace headers.
 */
#include "envelope.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "auth/results.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "message/header.h"
#include "message/message.h"
#include "message/origin.h"

static void
envelope_received(const struct smtp_session *s, const struct envelope_origin *o, struct buf *h)
{
	char	  date[64];
	struct tm tm;

	localtime_r(&o->now, &tm);
	strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S %z", &tm);
	buf_printf(h, "Received: from %s (%s%s[%s])\r\n\tby %s (Pepsi) with %s id %s",
			   s->helo ? s->helo : "unknown", o->client_name ? o->client_name : "",
			   o->client_name ? " " : "", o->client_ip, o->hostname,
			   smtp_protocol_name(s), o->queue_id);
	if (s->tls)
		buf_printf(h, "\r\n\t(version=%s cipher=%s bits=%d)",
				   s->tls_info.version, s->tls_info.cipher, s->tls_info.bits);
	/* A recipient is named only when it is the only one (RFC 5321 7.2). */
	if (s->nrcpt == 1)
		buf_printf(h, "\r\n\tfor <%s>", s->rcpt[0].address);
	buf_printf(h, "; %s\r\n", date);
}

/*
 * state.auth: what the host found (verify.c), or, where it checked
 * nothing, none for each method; SMTP AUTH is the protocol's to say.
 */
static json_t *
envelope_auth(const struct smtp_session *s, const struct envelope_origin *o)
{
	json_t *auth;

	if (o->auth)
		auth = json_deep_copy(o->auth);
	else
	{
		auth = json_object();
		if (s->mail_from[0])
			json_object_set_new(auth, "spf", auth_result("none", "smtp.mailfrom", s->mail_from));
		else
			json_object_set_new(auth, "spf", auth_result("none", "smtp.helo", s->helo ? s->helo : "unknown"));
		json_object_set_new(auth, "dkim", json_array());
		json_object_set_new(auth, "dmarc", auth_result("none", NULL, NULL));
	}
	if (s->auth_account)
		json_object_set_new(auth, "auth", auth_result("pass", "smtp.auth", s->auth_account));
	return auth;
}

static char *
envelope_rcpt_array(const struct smtp_session *s)
{
	struct buf a = BUF_INIT;

	buf_append_char(&a, '{');
	for (size_t i = 0; i < s->nrcpt; i++)
	{
		if (i > 0)
			buf_append_char(&a, ',');
		buf_append_char(&a, '"');
		for (const char *p = s->rcpt[i].address; *p; p++)
		{
			if (*p == '"' || *p == '\\')
				buf_append_char(&a, '\\');
			buf_append_char(&a, *p);
		}
		buf_append_char(&a, '"');
	}
	buf_append_char(&a, '}');
	return a.data;
}

/*
 * state.origin.trust (common/message/origin.h), decided here only, from what
 * ingress alone knows: the account the session authenticated as, or the
 * client's address in TRUSTED_NETWORKS.  Nothing the client sends (a
 * parameter, a header field) can say it.
 */
static const char *
envelope_trust(const struct smtp_session *s, const struct envelope_origin *o)
{
	if (s->auth_account)
		return ORIGIN_TRUST_AUTHENTICATED;
	return o->trusted_network ? ORIGIN_TRUST_TRUSTED_NETWORK : ORIGIN_TRUST_UNTRUSTED;
}

/*
 * NOTIFY as it is kept: SUCCESS only for a client that authenticated or is
 * trusted.  Anyone else could otherwise have us mail a success DSN to a
 * forged sender for every recipient: a reflector (backscatter).  A NOTIFY
 * left with nothing but SUCCESS becomes FAILURE, the default (RFC 3461 4.1).
 */
static json_t *
envelope_notify(const char *notify, const char *trust)
{
	struct buf	kept = BUF_INIT;
	const char *p = notify;
	json_t	   *value;

	if (notify == NULL)
		return json_null();
	if (strcmp(trust, ORIGIN_TRUST_UNTRUSTED) != 0 || strstr(notify, "SUCCESS") == NULL)
		return json_string(notify);
	while (*p)
	{
		size_t n = strcspn(p, ",");

		if (!(n == 7 && strncmp(p, "SUCCESS", 7) == 0))
		{
			if (kept.len)
				buf_append_char(&kept, ',');
			buf_append(&kept, p, n);
		}
		p += n + (p[n] == ',');
	}
	value = json_string(kept.len ? kept.data : "FAILURE");
	buf_free(&kept);
	return value;
}

static char *
envelope_state(const struct smtp_session *s, const struct envelope_origin *o, json_t *auth)
{
	const char *trust = envelope_trust(s, o);
	json_t	   *tls = json_null();
	json_t	   *rcpt = json_array();
	json_t	   *state;
	char	   *text;

	if (s->tls)
		tls = json_pack("{s:s, s:s, s:i}", "version", s->tls_info.version,
						"cipher", s->tls_info.cipher, "bits", s->tls_info.bits);
	for (size_t i = 0; i < s->nrcpt; i++)
		json_array_append_new(rcpt, json_pack("{s:o, s:s?}", "notify",
											  envelope_notify(s->rcpt[i].notify, trust),
											  "orcpt", s->rcpt[i].orcpt));
	state = json_pack("{s:{s:s, s:s, s:s?, s:b, s:b, s:s, s:o, s:s, s:s?, s:s},"
					  " s:{s:s?, s:s?, s:o}}",
					  "origin",
					  "trust", trust,
					  "client_ip", o->client_ip,
					  "helo", s->helo,
					  "esmtp", s->esmtp,
					  "smtputf8", s->smtputf8,
					  "body", smtp_body_name(s->body),
					  "tls", tls ? tls : json_null(),
					  "listener", o->listener,
					  "auth", s->auth_account,
					  "authserv_id", o->authserv_id,
					  "dsn",
					  "ret", s->ret,
					  "envid", s->envid,
					  "rcpt", rcpt);
	if (state == NULL)
	{
		json_decref(auth);
		return NULL; /* json_pack took the references either way */
	}
	json_object_set_new(state, "auth", auth);
	json_object_set_new(state, "queue_id", json_string(o->queue_id));
	/* RFC 8689: the relays send it on only over verified TLS (common/smtp/smtp_client.c). */
	if (s->requiretls)
		json_object_set_new(json_object_get(state, "origin"), "requiretls", json_true());
	if (o->iprev)
		json_object_set_new(json_object_get(state, "origin"), "iprev", json_deep_copy(o->iprev));
	text = json_dumps(state, JSON_COMPACT);
	json_decref(state);
	return text;
}

/*
 * The trace fields a client sent: too many hops is a loop (RFC 5321
 * 6.3), refused with 5.4.6; an Authentication-Results that claims our
 * authserv-id is a forgery from outside our boundary and is dropped
 * (RFC 8601 5), so that only ours says what we checked.
 */
static const char *
envelope_check_trace(const struct envelope_origin *o, struct buf *headers)
{
	const char *h = headers->data ? headers->data : "";
	struct buf	kept = BUF_INIT;

	if (o->max_hops > 0 && (header_count(h, headers->len, "Received") >= o->max_hops || header_count(h, headers->len, "Delivered-To") >= o->max_hops))
		return "554 5.4.6 Message refused: too many hops (a mail loop?)";
	if (header_remove_results_of(h, headers->len, o->authserv_id, &kept) > 0)
	{
		buf_free(headers);
		*headers = kept;
	}
	else
		buf_free(&kept);
	return NULL;
}

const char *
envelope_build(const struct smtp_session *s, const struct envelope_origin *o, struct envelope *e)
{
	const char *raw = s->message.data ? s->message.data : "";
	size_t		len = s->message.len;
	struct buf	headers = BUF_INIT;
	json_t	   *auth;
	const char *refusal;

	memset(e, 0, sizeof(*e));
	message_split(raw, len, &headers, &e->body);
	if (s->body == SMTP_BODY_BINARYMIME)
	{
		/*
		 * message_split makes line ends CRLF, which a binary body must not
		 * see.  The header section of a binary message is still lines
		 * (RFC 3030 3), so it must already be CRLF: then the body is the
		 * octets after the empty line, verbatim.
		 */
		if (headers.len > len || memcmp(raw, headers.data ? headers.data : "", headers.len) != 0
			|| (headers.len < len
				&& (headers.len + 2 > len || memcmp(raw + headers.len, "\r\n", 2) != 0)))
		{
			buf_free(&headers);
			envelope_free(e);
			return "554 5.6.0 Message refused: bare CR or LF in the header section";
		}
		buf_reset(&e->body);
		if (headers.len < len)
			buf_append(&e->body, raw + headers.len + 2, len - headers.len - 2);
	}
	if ((refusal = envelope_check_trace(o, &headers)) != NULL)
	{
		buf_free(&headers);
		envelope_free(e);
		return refusal;
	}
	auth = envelope_auth(s, o);
	envelope_received(s, o, &e->headers);
	auth_results_header(&e->headers, o->authserv_id, auth);
	buf_append(&e->headers, headers.data, headers.len);
	buf_free(&headers);
	if (e->body.data == NULL)
		buf_append(&e->body, "", 0);
	e->mail_from = xstrdup(s->mail_from);
	e->rcpt_array = envelope_rcpt_array(s);
	e->client_ip = xstrdup(o->client_ip);
	e->auth_account = s->auth_account ? xstrdup(s->auth_account) : NULL;
	e->state = envelope_state(s, o, auth);
	if (e->state == NULL)
	{
		/* Cannot happen: every string was checked to be UTF-8. */
		envelope_free(e);
		return "451 4.3.0 Cannot record the message state";
	}
	return NULL;
}

void
envelope_free(struct envelope *e)
{
	free(e->mail_from);
	free(e->rcpt_array);
	buf_free(&e->headers);
	buf_free(&e->body);
	free(e->state);
	free(e->client_ip);
	free(e->auth_account);
	free(e->log_detail);
	memset(e, 0, sizeof(*e));
}
