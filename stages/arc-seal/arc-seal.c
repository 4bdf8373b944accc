/*
 * pepsi-stage-arc-seal: add this host's ARC set (RFC 8617) to mail it
 * forwards: an ARC-Authentication-Results with what ingress found
 * (state.auth, under state.origin.authserv_id), an ARC-Message-Signature
 * and an ARC-Seal, made by common/auth/arc.c.
 *
 * The chain validation status (cv=) is ingress's verdict in state.auth.arc
 * when it has one; otherwise the stage validates the existing chain itself,
 * fetching the keys through the resolver ([pepsi] DNS_*).  A message
 * without a chain is sealed cv=none, a valid chain is continued with the
 * next instance and cv=pass, and a broken or malformed one is sealed
 * cv=fail over the new set alone (RFC 8617 5.1.2), the reason kept in
 * state.arc_seal.  Only the header block is written.
 *
 * Options of its [stage-*] section:
 *   KEY           the [dkim-key-<name>] to seal with (its DOMAIN is d=)
 *   NEXT_STAGE    where the message goes
 *   HEADERS       what the ARC-Message-Signature signs (default: the DKIM
 *                 header list and DKIM-Signature)
 *   KEY_RETRY     a key that cannot be loaded pauses the message this long
 *                 (default 5m)
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "auth/arc.h"
#include "auth/canon.h"
#include "auth/keys.h"
#include "auth/results.h"
#include "base/log.h"
#include "dns/dns.h"
#include "runtime/stage.h"


int pepsi_stage_arc_seal_main(int argc, char **argv);

static struct keyring			  seal_keyring;
static const struct pepsi_config *seal_keyring_config;
static struct dns_resolver		 *seal_resolver;

/* A key record through the blocking resolver, for arc_verify. */
static EVP_PKEY *
seal_lookup_key(void *arg, const char *domain, const char *selector, enum sign_algorithm algorithm,
				char *err, size_t errlen)
{
	struct dns_resolver *resolver = arg;
	struct dns_answer	 answer;
	char				 name[512];
	EVP_PKEY			*pub = NULL;

	snprintf(name, sizeof(name), "%s._domainkey.%s", selector, domain);
	dns_resolve_sync(resolver, name, DNS_TYPE_TXT, &answer);
	if (answer.status != DNS_OK || answer.count == 0)
		snprintf(err, errlen, "%s: %s", name, answer.status == DNS_NXDOMAIN ? "no such name" : answer.status == DNS_OK ? "no TXT record"
																													   : "lookup failed");
	else
		for (size_t i = 0; i < answer.count && pub == NULL; i++)
			if (answer.records[i].type == DNS_TYPE_TXT && answer.records[i].text)
				pub = keys_parse_record(answer.records[i].text, answer.records[i].len, algorithm,
										err, errlen);
	dns_answer_free(&answer);
	return pub;
}

/* Is text fit to stand in a header field as a token? */
static bool
seal_printable(const char *text)
{
	for (const char *p = text; *p; p++)
		if ((unsigned char) *p <= ' ' || *p == ';' || (unsigned char) *p >= 0x7f)
			return false;
	return *text != '\0';
}

/*
 * The results lines of the AAR: state.auth as ingress's
 * Authentication-Results wrote it (auth/results.c, one writer for both),
 * with this host's own verdict on the chain as arc= when there is one.
 */
static void
seal_results(json_t *auth, enum arc_result cv, bool had_chain, struct buf *out)
{
	json_t *copy = json_is_object(auth) ? json_deep_copy(auth) : json_object();

	if (had_chain)
		json_object_set_new(copy, "arc", auth_result(arc_result_name(cv), NULL, NULL));
	auth_results_resinfo(out, copy);
	json_decref(copy);
}

/* Ingress's verdict on the chain, from state.auth.arc, if it gave one. */
static bool
seal_state_cv(json_t *auth, enum arc_result *cv)
{
	json_t	   *arc = json_object_get(auth, "arc");
	const char *result = json_is_string(arc) ? json_string_value(arc)
											 : json_string_value(json_object_get(arc, "result"));

	if (result == NULL)
		return false;
	*cv = strcmp(result, "pass") == 0 ? ARC_PASS : strcmp(result, "none") == 0 ? ARC_NONE
																			   : ARC_FAIL;
	return true;
}

static int
seal_fail(struct pepsi_ctx *ctx, const char *reason)
{
	json_t *merge = json_pack("{s:{s:s}}", "arc_seal", "error", reason);
	int		rc;

	log_warnx("message %lld not sealed: %s", pepsi_id(ctx), reason);
	rc = pepsi_fail(ctx, merge);
	json_decref(merge);
	return rc;
}

static bool
seal_setup(const struct pepsi_config *cfg, char *err, size_t errlen)
{
	struct dns_config dns;

	if (seal_keyring_config == cfg)
		return true;
	keyring_free(&seal_keyring);
	if (!keyring_from_config(cfg, &seal_keyring, err, errlen))
		return false;
	if (seal_resolver == NULL)
	{
		if (!dns_config_load(cfg, &dns, err, errlen))
			return false;
		seal_resolver = dns_resolver_new(NULL, &dns, err, errlen);
		dns_config_free(&dns);
		if (seal_resolver == NULL)
			return false;
	}
	seal_keyring_config = cfg;
	return true;
}

static int
seal_run(struct pepsi_ctx *ctx)
{
	const struct buf	*headers = pepsi_headers(ctx);
	const struct buf	*body = pepsi_body(ctx);
	json_t				*state = pepsi_state(ctx);
	json_t				*auth = json_object_get(state, "auth");
	const char			*authserv_id = json_string_value(json_object_get(json_object_get(state, "origin"), "authserv_id"));
	const char			*key_name = pepsi_option(ctx, "KEY");
	struct signing_key	*key;
	struct header_fields fields;
	struct arc_chain	 chain;
	enum arc_result		 cv = ARC_NONE;
	struct buf			 results = BUF_INIT, out = BUF_INIT;
	char				 err[512];
	char				 why[256] = "";
	long				 retry_ms;
	int					 rc;

	if (headers == NULL || body == NULL)
		return -1;
	if (!seal_setup(pepsi_config(ctx), err, sizeof(err)))
		return pepsi_error(ctx, "%s", err);
	if (authserv_id == NULL)
		authserv_id = config_get(pepsi_config(ctx), "ingress", "AUTHSERV_ID");
	if (authserv_id == NULL)
		authserv_id = config_hostname(pepsi_config(ctx));
	if (authserv_id == NULL || !seal_printable(authserv_id))
		return seal_fail(ctx, "no authserv-id (state.origin.authserv_id, [ingress] AUTHSERV_ID or [pepsi] HOSTNAME)");
	key = key_name ? keyring_find(&seal_keyring, key_name) : NULL;
	if (key == NULL)
		return pepsi_error(ctx, "[stage-%s] KEY names no [dkim-key-*] section", pepsi_stage_name(ctx));
	if (!signing_key_ready(key, err, sizeof(err)))
	{
		json_t *merge = json_pack("{s:{s:s}}", "arc_seal", "error", err);

		retry_ms = (long) (pepsi_option_seconds(ctx, "KEY_RETRY") * 1000);
		log_warnx("message %lld paused: %s", pepsi_id(ctx), err);
		rc = pepsi_pause(ctx, merge, (double) retry_ms / 1000.0);
		json_decref(merge);
		return rc;
	}
	if (!header_fields_parse(headers->data, headers->len, 0, &fields, err, sizeof(err)))
		return seal_fail(ctx, err);
	arc_chain_parse(&fields, &chain);

	if (chain.malformed)
	{
		cv = ARC_FAIL;
		snprintf(why, sizeof(why), "malformed ARC chain: %s", chain.reason);
	}
	else if (chain.count > 0 && !seal_state_cv(auth, &cv))
	{
		struct arc_verdict verdict;

		arc_verify(headers->data, headers->len, body->data, body->len, seal_lookup_key,
				   seal_resolver, &verdict);
		cv = verdict.result == ARC_PASS ? ARC_PASS : ARC_FAIL;
		if (cv == ARC_FAIL)
			snprintf(why, sizeof(why), "%s", verdict.reason);
	}
	else if (chain.count > 0 && cv != ARC_PASS)
	{
		cv = ARC_FAIL;
		snprintf(why, sizeof(why), "ingress found the ARC chain failed");
	}
	if (chain.count == 0 && !chain.malformed)
		cv = ARC_NONE;

	seal_results(auth, cv, chain.count > 0 || chain.malformed, &results);
	{
		struct arc_sealer sealer = {
			.algorithm = key->algorithm,
			.pkey = key->pkey,
			.domain = key->domain,
			.selector = key->selector,
			.authserv_id = authserv_id,
			.results = results.data,
			.headers = pepsi_option(ctx, "HEADERS"),
			.timestamp = time(NULL),
		};

		if (!arc_seal(&sealer, &fields, &chain, cv, body->data, body->len, &out, err, sizeof(err)))
		{
			header_fields_free(&fields);
			buf_free(&results);
			buf_free(&out);
			return seal_fail(ctx, err);
		}
	}
	if (cv == ARC_FAIL)
	{
		json_t *merge = json_pack("{s:{s:s, s:s}}", "arc_seal", "cv", "fail", "reason", why);

		log_info("message %lld sealed cv=fail: %s", pepsi_id(ctx), why);
		pepsi_merge_state(ctx, merge);
		json_decref(merge);
	}
	buf_append(&out, headers->data, headers->len);
	pepsi_set_headers(ctx, out.data, out.len);
	header_fields_free(&fields);
	buf_free(&results);
	buf_free(&out);
	return pepsi_advance(ctx);
}

static bool
seal_check_config(const struct pepsi_config *cfg, const char *section, char *err, size_t errlen)
{
	struct keyring ring = {0};
	const char	  *key = config_get(cfg, section, "KEY");
	bool		   ok = keyring_from_config(cfg, &ring, err, errlen);

	if (ok && (key == NULL || keyring_find(&ring, key) == NULL))
	{
		snprintf(err, errlen, "%s: [%s] needs KEY, the name of a [dkim-key-<name>] section to seal with",
				 cfg->path, section);
		ok = false;
	}
	keyring_free(&ring);
	return ok;
}

const struct pepsi_stage pepsi_stage_arc_seal_stage = {
	.program = "pepsi-stage-arc-seal",
	.load = PEPSI_LOAD_FULL,
	.run = seal_run,
	.check_config = seal_check_config,
};

int
pepsi_stage_arc_seal_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_arc_seal_stage, argc, argv);
}
