/*
 * pepsi-stage-dkim-sign: sign outbound mail with DKIM (RFC 6376), RSA
 * and/or Ed25519 (RFC 8463: a domain with keys of both kinds gets both
 * signatures), over common/auth's one canonicalization.
 *
 * Only mail from inside the trust boundary is signed (state.origin.trust,
 * common/message/origin.h: an authenticated session, a trusted network, local
 * submission, or Pepsi's own DSNs and replies), and an outsider's
 * (forwarded) message only when its inbound DMARC passed for that very
 * From: domain: anything else goes on unsigned, whatever
 * REQUIRE_SIGNATURE says, with the reason in state.dkim_sign.
 *
 * The signing domain (d=) is the domain of the From: address, or with
 * SIGNING_DOMAIN = account the domain of the authenticated account
 * (state.origin.auth), never From:'s (but for Pepsi's own messages, whose
 * From: it wrote).  Every [dkim-key-*] section (or
 * those KEYS names) whose DOMAIN is that domain signs.  Only the header
 * block is written: the body is shared by the message's split rows and
 * stays one body row.
 *
 * Options of its [stage-*] section:
 *   NEXT_STAGE          where signed mail goes (typically the relay)
 *   KEYS                the [dkim-key-<name>] sections to use (default: all)
 *   CANONICALIZATION    header/body: relaxed/relaxed (default), simple/simple, ...
 *   HEADERS             colon-separated names to sign (default: DKIM_DEFAULT_HEADERS
 *                       in common/auth/dkim_sign.h)
 *   OVERSIGN            names signed once more than present (default from:to:subject:date)
 *   SIGNING_DOMAIN      from (default) or account (no account: not signed)
 *   REQUIRE_SIGNATURE   yes: a message that cannot be signed (no key for its
 *                       domain, no From:, a malformed or over-long header) is
 *                       failed with the reason in state.dkim_sign, never sent
 *                       unsigned; no (default): it goes on unsigned, the
 *                       reason logged and kept in state.dkim_sign
 *   KEY_RETRY           a configured key that cannot be loaded pauses the
 *                       message this long (default 5m) for the operator to
 *                       mend the file: never sent unsigned meanwhile
 *   DOWNGRADE_8BIT      yes: 8-bit content is converted to 7 bits
 *                       (common/message/mime_downgrade.h) before it is signed, as
 *                       RFC 6376 5.3 advises, so that a next hop without
 *                       8BITMIME gets the signed bytes; no (default): signed
 *                       as it is, and a relay that must convert it later
 *                       breaks the signature (it cannot sign again)
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "auth/canon.h"
#include "auth/dkim_sign.h"
#include "auth/keys.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "message/header.h"
#include "message/message.h"
#include "message/mime_downgrade.h"
#include "message/origin.h"
#include "runtime/stage.h"

/* RFC 5322 2.1.1: a line of a message must not exceed 998 octets. */
#define SIGN_MAX_LINE 998
#define SIGN_MAX_KEYS 16
/* The most rows a signing worker takes at once of those waiting (as the relay's batch). */
#define SIGN_BATCH_MAX 16

int pepsi_stage_dkim_sign_main(int argc, char **argv);

struct sign_options
{
	const char *keys;
	const char *headers;
	const char *oversigned;
	enum canon	header_canon;
	enum canon	body_canon;
	bool		by_account;
	bool		required;
	bool		downgrade;
	long		key_retry_ms;
};

static bool
sign_parse_canonicalization(const char *text, enum canon *header, enum canon *body)
{
	const char *slash = strchr(text, '/');

	if (!canon_parse(text, slash ? (size_t) (slash - text) : strlen(text), header))
		return false;
	/* RFC 6376 3.5: a lone "relaxed" means relaxed/simple. */
	if (slash == NULL)
	{
		*body = CANON_SIMPLE;
		return true;
	}
	return canon_parse(slash + 1, strlen(slash + 1), body);
}

/* Every option of the section, read and checked in this one place. */
static bool
sign_read_options(const struct pepsi_config *cfg, const char *section, struct sign_options *o,
				  char *err, size_t errlen)
{
	const char *canon = config_text(cfg, section, "CANONICALIZATION");

	o->keys = config_text(cfg, section, "KEYS");
	o->headers = config_text(cfg, section, "HEADERS");
	if (o->headers == NULL)
		o->headers = DKIM_DEFAULT_HEADERS;
	o->oversigned = config_text(cfg, section, "OVERSIGN");
	if (o->oversigned == NULL)
		o->oversigned = DKIM_DEFAULT_OVERSIGNED;
	if (!sign_parse_canonicalization(canon, &o->header_canon, &o->body_canon))
	{
		snprintf(err, errlen, "%s: [%s] CANONICALIZATION \"%s\" is not header/body of simple or relaxed",
				 cfg->path, section, canon);
		return false;
	}
	/* SIGNING_DOMAIN's choices are from|account (schema/options.def). */
	o->by_account = config_enum(cfg, section, "SIGNING_DOMAIN") == 1;
	if (!strstr(o->headers, "from") && !strstr(o->headers, "From") && !strstr(o->headers, "FROM"))
	{
		snprintf(err, errlen, "%s: [%s] HEADERS must include From (RFC 6376 5.4)", cfg->path, section);
		return false;
	}
	o->required = config_bool(cfg, section, "REQUIRE_SIGNATURE");
	o->downgrade = config_bool(cfg, section, "DOWNGRADE_8BIT");
	o->key_retry_ms = config_duration_ms(cfg, section, "KEY_RETRY");
	return true;
}

/*
 * What the worker signs with, kept per configuration: the keyring of the
 * configuration and the options of the section it runs, both dropped and
 * built again together when the configuration changes, so that neither can
 * belong to another configuration than the other.  Read for every message
 * the options would cost more than all of the signing but the private-key
 * operation (each a lookup through the option schema); none is scoped by
 * domain or address, so one reading holds for every message.  A worker
 * that runs another signing section (fused after a stage whose rows go to
 * several) reads that section's options again, and keeps the keyring.
 */
static struct
{
	const struct pepsi_config *config; /* NULL: nothing valid is kept */
	struct keyring			   keyring;
	char					   section[256]; /* "": the options are not read */
	struct sign_options		   options;
} sign_state;

static const struct sign_options *
sign_state_ready(const struct pepsi_config *cfg, const char *section, char *err, size_t errlen)
{
	if (sign_state.config != cfg)
	{
		sign_state.config = NULL;
		sign_state.section[0] = '\0';
		keyring_free(&sign_state.keyring);
		if (!keyring_from_config(cfg, &sign_state.keyring, err, errlen))
			return NULL;
		sign_state.config = cfg;
	}
	if (strcmp(sign_state.section, section) != 0)
	{
		sign_state.section[0] = '\0';
		if (!sign_read_options(cfg, section, &sign_state.options, err, errlen))
			return NULL;
		snprintf(sign_state.section, sizeof(sign_state.section), "%s", section);
	}
	return &sign_state.options;
}

/* Is key among the names of KEYS (or is KEYS unset)? */
static bool
sign_key_selected(const struct signing_key *key, const char *keys)
{
	const char *name = key->section + strlen(KEYS_SECTION_PREFIX);
	size_t		len = strlen(name);

	if (keys == NULL)
		return true;
	for (const char *p = keys; *p;)
	{
		size_t n;

		p += strspn(p, ", \t");
		n = strcspn(p, ", \t");
		if ((n == len && strncmp(p, name, n) == 0)
			|| (n == strlen(key->section) && strncmp(p, key->section, n) == 0))
			return true;
		p += n;
	}
	return false;
}

/* The domain of the first address of From:, lower case; NULL with a reason. */
static char *
sign_from_domain(const struct header_fields *fields, char *err, size_t errlen)
{
	size_t count = header_fields_count(fields, "From");
	char **addresses = NULL;
	size_t naddresses = 0;
	char  *domain = NULL;

	if (count != 1)
	{
		snprintf(err, errlen, count == 0 ? "the message has no From: field" : "the message has %zu From: fields (RFC 5322 allows one)", count);
		return NULL;
	}
	for (size_t i = 0; i < fields->count; i++)
		if (header_field_named(&fields->field[i], "From", 4))
		{
			size_t		len;
			const char *value = header_field_value(&fields->field[i], &len);
			char	   *unfolded = xstrndup(value, len);

			header_addresses(unfolded, &addresses, &naddresses);
			free(unfolded);
		}
	if (naddresses > 0 && strrchr(addresses[0], '@') && strrchr(addresses[0], '@')[1])
		domain = xstrdup(strrchr(addresses[0], '@') + 1);
	else
		snprintf(err, errlen, "the From: field holds no address with a domain");
	for (size_t i = 0; i < naddresses; i++)
		free(addresses[i]);
	free(addresses);
	for (char *p = domain; p && *p; p++)
		*p = (char) tolower((unsigned char) *p);
	return domain;
}

static char *
sign_account_domain(struct pepsi_ctx *ctx)
{
	json_t	   *origin = json_object_get(pepsi_state(ctx), "origin");
	const char *account = json_string_value(json_object_get(origin, "auth"));
	const char *at = account ? strrchr(account, '@') : NULL;
	char	   *domain;

	if (at == NULL || at[1] == '\0')
		return NULL;
	domain = xstrdup(at + 1);
	for (char *p = domain; *p; p++)
		*p = (char) tolower((unsigned char) *p);
	return domain;
}

/* Did inbound DMARC (state.auth.dmarc, pepsi-ingress's verdict) pass for domain? */
static bool
sign_dmarc_passed(struct pepsi_ctx *ctx, const char *domain)
{
	json_t	   *dmarc = json_object_get(json_object_get(pepsi_state(ctx), "auth"), "dmarc");
	const char *result = json_string_value(json_object_get(dmarc, "result"));
	const char *from = json_string_value(json_object_get(dmarc, "header.from"));

	return result && from && strcmp(result, "pass") == 0 && strcasecmp(from, domain) == 0;
}

/*
 * Whose mail this is, the one predicate of what may be signed: mail from
 * inside the trust boundary (state.origin.trust, common/message/origin.h), or an
 * outsider's (forwarded) message whose inbound DMARC passed for that very
 * From: domain, which its own signature then vouches for again.  Anything
 * else would lend our domains' names to a forged From:.  NULL: it may be
 * signed; else why not, in reason.
 */
static const char *
sign_not_ours(struct pepsi_ctx *ctx, const char *from_domain, const char *from_err, char *reason,
			  size_t reasonlen)
{
	const char *trust = origin_trust(pepsi_state(ctx));

	if (origin_trusted(pepsi_state(ctx)))
		return NULL;
	if (from_domain && sign_dmarc_passed(ctx, from_domain))
		return NULL;
	if (from_domain)
		snprintf(reason, reasonlen, "state.origin.trust is \"%s\" and inbound DMARC did not pass for %s",
				 trust ? trust : "(none)", from_domain);
	else
		snprintf(reason, reasonlen, "state.origin.trust is \"%s\" and %s", trust ? trust : "(none)", from_err);
	return reason;
}

/*
 * A message that cannot be signed: failed when a signature is required
 * and may_fail (an outsider's message is not ours to sign, and goes on
 * whatever REQUIRE_SIGNATURE says), else sent on unsigned.  Either way the
 * reason is in state.dkim_sign.
 */
static int
sign_unsigned(struct pepsi_ctx *ctx, const struct sign_options *o, const char *reason, bool may_fail)
{
	json_t *merge = json_pack("{s:{s:s, s:b}}", "dkim_sign", "error", reason, "signed", 0);
	int		rc;

	if (o->required && may_fail)
	{
		log_warnx("%s: row %lld: not signed and REQUIRE_SIGNATURE is set: %s", pepsi_queue_id(ctx), pepsi_id(ctx), reason);
		rc = pepsi_fail(ctx, merge);
	}
	else
	{
		log_info("%s: row %lld: goes on unsigned: %s", pepsi_queue_id(ctx), pepsi_id(ctx), reason);
		pepsi_merge_state(ctx, merge);
		rc = pepsi_advance(ctx);
	}
	json_decref(merge);
	return rc;
}

/*
 * DOWNGRADE_8BIT: the message as a hop without 8BITMIME will get it, so
 * that the signature covers those bytes.  A message that cannot be
 * converted (8-bit header fields: SMTPUTF8) is signed as it is.
 */
static struct buf sign_converted_headers; /* kept for the next message: a worker signs many */
static struct buf sign_converted_body;

static void
sign_downgrade(struct pepsi_ctx *ctx, const struct buf **headers, const struct buf **body)
{
	struct buf *converted_headers = &sign_converted_headers;
	struct buf *converted_body = &sign_converted_body;
	struct buf	raw = BUF_INIT;
	struct buf	converted = BUF_INIT;
	char		why[256];

	buf_reset(converted_headers);
	buf_reset(converted_body);
	if (!mime_needs_downgrade((*body)->data ? (*body)->data : "", (*body)->len, MIME_TO_7BIT))
		return;
	message_join((*headers)->data, (*headers)->len, (*body)->data ? (*body)->data : "", (*body)->len, &raw);
	if (mime_downgrade(raw.data, raw.len, MIME_TO_7BIT, &converted, why, sizeof(why)) == MIME_DOWNGRADE_DONE)
	{
		message_split(converted.data, converted.len, converted_headers, converted_body);
		pepsi_set_body(ctx, converted_body->data ? converted_body->data : "", converted_body->len);
		*headers = converted_headers;
		*body = converted_body;
	}
	else
		log_info("%s: row %lld: signed with its 8-bit content: %s", pepsi_queue_id(ctx), pepsi_id(ctx), why);
	buf_free(&raw);
	buf_free(&converted);
}

static int
sign_run(struct pepsi_ctx *ctx)
{
	char					   section[256];
	char					   err[512];
	const struct sign_options *o;
	const struct buf		  *headers = pepsi_headers(ctx);
	const struct buf		  *body = pepsi_body(ctx);
	struct header_fields	   fields = {0};
	struct signing_key		  *keys[SIGN_MAX_KEYS];
	size_t					   nkeys = 0;
	char					  *domain = NULL;
	unsigned char			   body_hash[CANON_HASH_LEN];
	struct buf				   out = BUF_INIT;
	int						   rc;
	/* An outsider's message is never failed for want of a signature: it is not ours to sign. */
	const bool trusted = origin_trusted(pepsi_state(ctx));

	if (headers == NULL || body == NULL)
		return -1;
	snprintf(section, sizeof(section), "stage-%s", pepsi_stage_name(ctx));
	o = sign_state_ready(pepsi_config(ctx), section, err, sizeof(err));
	if (o == NULL)
		return pepsi_error(ctx, "%s", err);

	if (o->downgrade)
		sign_downgrade(ctx, &headers, &body);
	if (!header_fields_parse(headers->data, headers->len, SIGN_MAX_LINE, &fields, err, sizeof(err)))
		return sign_unsigned(ctx, o, err, trusted);
	{
		char		from_err[256];
		char	   *from_domain = sign_from_domain(&fields, from_err, sizeof(from_err));
		const char *why = sign_not_ours(ctx, from_domain, from_err, err, sizeof(err));
		const char *trust = origin_trust(pepsi_state(ctx));

		if (why == NULL && o->by_account)
		{
			/*
			 * The account's domain, never From:'s, but for Pepsi's own
			 * messages (DSNs, vacation replies), which have no account
			 * and whose From: Pepsi wrote.
			 */
			if ((trust == NULL || strcmp(trust, ORIGIN_TRUST_PEPSI) != 0) && origin_list_domain(pepsi_state(ctx)) == NULL)
			{
				free(from_domain);
				from_domain = trust && strcmp(trust, ORIGIN_TRUST_AUTHENTICATED) == 0 ? sign_account_domain(ctx) : NULL;
				if (from_domain == NULL)
					why = "SIGNING_DOMAIN = account and the message has no authenticated account";
				else if (header_fields_count(&fields, "From") == 0)
					why = "the message has no From: field";
			}
		}
		else if (why == NULL && from_domain == NULL)
			why = from_err;
		if (why)
		{
			rc = sign_unsigned(ctx, o, why, trusted);
			header_fields_free(&fields);
			free(from_domain);
			return rc;
		}
		domain = from_domain;
		/* A list's post is the list's mail: its domain signs, whatever From: says (RFC 8058 4). */
		if (origin_list_domain(pepsi_state(ctx)) != NULL)
		{
			free(domain);
			domain = xstrdup(origin_list_domain(pepsi_state(ctx)));
		}
	}

	for (size_t i = 0; i < sign_state.keyring.count && nkeys < SIGN_MAX_KEYS; i++)
	{
		struct signing_key *k = &sign_state.keyring.key[i];

		if (strcmp(k->domain, domain) != 0 || !sign_key_selected(k, o->keys))
			continue;
		if (!signing_key_ready(k, err, sizeof(err)))
		{
			json_t *merge = json_pack("{s:{s:s, s:b}}", "dkim_sign", "error", err, "signed", 0);

			log_warnx("%s: row %lld: paused: %s", pepsi_queue_id(ctx), pepsi_id(ctx), err);
			rc = pepsi_pause(ctx, merge, (double) o->key_retry_ms / 1000.0);
			json_decref(merge);
			header_fields_free(&fields);
			free(domain);
			return rc;
		}
		keys[nkeys++] = k;
	}
	if (nkeys == 0)
	{
		snprintf(err, sizeof(err), "no signing key for the domain %s", domain);
		header_fields_free(&fields);
		free(domain);
		return sign_unsigned(ctx, o, err, trusted);
	}

	canon_body_hash(o->body_canon, body->data, body->len, body_hash);
	for (size_t i = 0; i < nkeys; i++)
	{
		struct dkim_signer s = {
			.field_name = "DKIM-Signature",
			.leading_tags = "v=1",
			.algorithm = keys[i]->algorithm,
			.pkey = keys[i]->pkey,
			.domain = keys[i]->domain,
			.selector = keys[i]->selector,
			.header_canon = o->header_canon,
			.body_canon = o->body_canon,
			.headers = o->headers,
			.oversigned = o->oversigned,
			.timestamp = time(NULL),
		};

		if (!dkim_sign_field(&s, &fields, body_hash, &out))
		{
			header_fields_free(&fields);
			free(domain);
			buf_free(&out);
			return pepsi_error(ctx, "[%s] could not sign with %s", keys[i]->section, keys[i]->path);
		}
	}
	buf_append(&out, headers->data, headers->len);
	pepsi_set_headers(ctx, out.data, out.len);
	header_fields_free(&fields);
	free(domain);
	buf_free(&out);
	return pepsi_advance(ctx);
}

static bool
sign_check_config(const struct pepsi_config *cfg, const char *section, char *err, size_t errlen)
{
	struct sign_options o;
	struct keyring		ring = {0};
	bool				ok;

	if (!sign_read_options(cfg, section, &o, err, errlen))
		return false;
	ok = keyring_from_config(cfg, &ring, err, errlen);
	if (ok && o.keys)
	{
		for (const char *p = o.keys; *p && ok;)
		{
			size_t n;
			char  *name;

			p += strspn(p, ", \t");
			n = strcspn(p, ", \t");
			if (n == 0)
				break;
			name = xstrndup(p, n);
			if (keyring_find(&ring, name) == NULL)
			{
				snprintf(err, errlen, "%s: [%s] KEYS names \"%s\", which has no [dkim-key-%s] section",
						 cfg->path, section, name, name);
				ok = false;
			}
			free(name);
			p += n;
		}
	}
	keyring_free(&ring);
	return ok;
}

const struct pepsi_stage pepsi_stage_dkim_sign_stage = {
	.program = "pepsi-stage-dkim-sign",
	.load = PEPSI_LOAD_FULL,
	.run = sign_run,
	.check_config = sign_check_config,
	/*
	 * The rows waiting are taken as one batch and signed one after another,
	 * not claimed and loaded one at a time.  Where the relay is fused after
	 * each and finishes it, the batch's finishes are one statement
	 * (stage_commit.c: a finished row keeps nothing of its rewrite); a
	 * signed row that only advances commits its new headers in a statement
	 * of its own.
	 */
	.batch_max = SIGN_BATCH_MAX,
	/*
	 * After route (body-free), in the same pass: the headers and body are
	 * loaded then for the batch's rows that go on to be signed, instead of
	 * each row being committed at route, claimed and loaded again.
	 */
	.late_load = true,
};

int
pepsi_stage_dkim_sign_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_dkim_sign_stage, argc, argv);
}
