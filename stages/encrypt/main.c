/*
 * pepsi-stage-encrypt: encrypt outbound mail end to end (OpenPGP, PGP/MIME
 * RFC 3156 with protected headers), before DKIM signing and ARC sealing
 * so that their signatures cover what is sent.
 *
 * For each recipient, POLICY (per address or domain, from the overlay)
 * says never, opportunistic or required; its key is its newest key in
 * pepsi.peer_key whose verdict is valid and whose cache deadline has not
 * passed, checked again when used (a revoked or expired key, or one
 * without a User ID of the address, is refused with the reason).  A
 * message whose recipients come out differently is split, each group to
 * this stage again: those with keys get the message encrypted to all
 * their keys, signed with the sender's identity (the From: address's
 * primary key in pepsi.crypto_identity, opened with [crypto] KEK) when
 * SIGN says so and it has one; those without a key get it as it is
 * unless their policy is required: then it is bounced through
 * BOUNCE_STAGE (failed without one), never sent in clear.  Mail already
 * encrypted goes on as it is.  Mail from an address with an identity
 * carries its key in an Autocrypt: field (Level 1) when AUTOCRYPT says so.
 * The outcome is state.encrypt.
 *
 * Installed setuid pepsi-crypto: it connects with [crypto] CONNINFO (peer
 * authentication as a member of pepsi_crypto, the one role that reads the
 * private keys).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base64.h"
#include "base/log.h"
#include "crypto/kek.h"
#include "crypto/keystore.h"
#include "crypto/openpgp.h"
#include "crypto/pgpmime.h"
#include "crypto/pgpsession.h"
#include "message/header.h"
#include "runtime/stage.h"

int pepsi_stage_encrypt_main(int argc, char **argv);

enum encrypt_policy
{
	POLICY_NEVER,
	POLICY_OPPORTUNISTIC,
	POLICY_REQUIRED
};

enum encrypt_outcome
{
	OUTCOME_ENCRYPT,
	OUTCOME_CLEAR,
	OUTCOME_REFUSE
};

struct encrypt_rcpt
{
	enum encrypt_outcome outcome;
	char				 fingerprint[65];
	struct buf			 key;
	char				 reason[600];
};

/* Decide what rcpt gets (r): its policy and its key. */
static void
encrypt_decide(struct pepsi_ctx *ctx, PGconn *conn, const char *rcpt, struct encrypt_rcpt *r)
{
	const char		   *at = strrchr(rcpt, '@');
	enum encrypt_policy policy = (enum encrypt_policy) config_enum_for(pepsi_config(ctx), pepsi_section(ctx),
																	   "POLICY", at ? at + 1 : NULL, rcpt);
	char				err[512];
	int					found;

	r->outcome = OUTCOME_CLEAR;
	if (policy == POLICY_NEVER)
	{
		snprintf(r->reason, sizeof(r->reason), "policy never");
		return;
	}
	found = keystore_peer_key(conn, rcpt, r->fingerprint, &r->key, err, sizeof(err));
	if (found == 0)
	{
		/* Imported into the worker's session once per version of the row, checked on every use. */
		if (pgp_session_public(r->fingerprint, r->key.data, r->key.len, rcpt, err, sizeof(err)))
		{
			r->outcome = OUTCOME_ENCRYPT;
			return;
		}
		snprintf(r->reason, sizeof(r->reason), "%s", err);
	}
	else if (found == 1)
		snprintf(r->reason, sizeof(r->reason), "no key known for %s", rcpt);
	else
		snprintf(r->reason, sizeof(r->reason), "%s", err);
	if (policy == POLICY_REQUIRED)
		r->outcome = OUTCOME_REFUSE;
}

/* The Autocrypt: field (Level 1) of the sender's identity, or NULL. */
static char *
encrypt_autocrypt(const char *from, const struct buf *public_key)
{
	struct buf b64 = BUF_INIT, field = BUF_INIT;

	base64_append(&b64, public_key->data, public_key->len);
	buf_printf(&field, "Autocrypt: addr=%s; keydata=", from);
	for (size_t i = 0; i < b64.len; i += 76)
		buf_printf(&field, "\r\n %.*s", (int) (b64.len - i < 76 ? b64.len - i : 76), b64.data + i);
	buf_append_str(&field, "\r\n");
	buf_free(&b64);
	return field.data;
}

static const char *const outcome_name[] = {"encrypted", "clear", "refused"};

static int
encrypt_run(struct pepsi_ctx *ctx)
{
	size_t				 n = pepsi_rcpt_count(ctx);
	struct encrypt_rcpt *r = calloc(n ? n : 1, sizeof(*r));
	const struct buf	*h = pepsi_headers(ctx);
	const struct buf	*body = pepsi_body(ctx);
	PGconn				*conn = pepsi_db(ctx);
	char				*from = NULL;
	char				*autocrypt = NULL;
	char				 err[512];
	char				 signer_fpr[65] = "";
	struct buf			 signer_pub = BUF_INIT;
	bool				 signing = false;
	int					 rc = 0;
	int					 idx[256];
	size_t				 nidx = 0;
	json_t				*merge;

	if (r == NULL || h == NULL || body == NULL)
	{
		free(r);
		return pepsi_error(ctx, "no message to encrypt");
	}
	if (pgpmime_is_encrypted(h->data, h->len))
	{
		free(r);
		merge = json_pack("{s:{s:s}}", "encrypt", "result", "already encrypted");
		pepsi_merge_state(ctx, merge);
		json_decref(merge);
		rc = pepsi_advance(ctx);
		return rc;
	}
	for (size_t i = 0; i < n; i++)
		encrypt_decide(ctx, conn, pepsi_rcpt(ctx, i), &r[i]);
	/* Recipients that come out unlike the first go on as a message of their own, through this stage again. */
	for (size_t i = 1; i < n && nidx < sizeof(idx) / sizeof(idx[0]); i++)
		if (r[i].outcome != r[0].outcome)
			idx[nidx++] = (int) i + 1;
	if (nidx > 0 && pepsi_split_off_recipients(ctx, idx, nidx, pepsi_stage_name(ctx)) < 0)
	{
		rc = -1;
		goto done;
	}
	if (r[0].outcome == OUTCOME_REFUSE)
	{
		const char *bounce_stage = pepsi_option(ctx, "BOUNCE_STAGE");
		char		diagnostic[700];

		snprintf(diagnostic, sizeof(diagnostic), "5.7.1 the recipient's policy requires encryption: %s",
				 r[0].reason);
		log_info("%s: not sent: %s", pepsi_queue_id(ctx), diagnostic);
		merge = json_pack("{s:{s:s,s:s},s:{s:s,s:s}}", "encrypt", "result", "refused", "reason", r[0].reason, "bounce",
						  "kind", "permanent", "diagnostic", diagnostic);
		rc = bounce_stage ? pepsi_reroute(ctx, bounce_stage, merge) : pepsi_fail(ctx, merge);
		json_decref(merge);
		goto done;
	}

	from = header_from_address(h->data, h->len);
	if (from && (pepsi_option_bool(ctx, "SIGN") || pepsi_option_bool(ctx, "AUTOCRYPT")))
	{
		int found = 1;

		if (pepsi_option_bool(ctx, "SIGN") && r[0].outcome == OUTCOME_ENCRYPT)
		{
			found = keystore_identity_in_session(conn, pepsi_config(ctx), from, "sign", signer_fpr, &signer_pub,
												 err, sizeof(err));
			if (found == -2)
			{
				rc = pepsi_error(ctx, "%s", err);
				goto done;
			}
			signing = found == 0;
		}
		else
			found = keystore_identity(conn, NULL, from, "sign", signer_fpr, &signer_pub, NULL, err, sizeof(err));
		if (found < 0)
		{
			/* A key that does not open is the operator's to mend: wait, never send in clear meanwhile. */
			log_warnx("%s: %s", pepsi_queue_id(ctx), err);
			merge = json_pack("{s:{s:s}}", "encrypt", "reason", err);
			rc = pepsi_pause(ctx, merge, 300);
			json_decref(merge);
			goto done;
		}
		if (found == 0 && pepsi_option_bool(ctx, "AUTOCRYPT"))
			autocrypt = encrypt_autocrypt(from, &signer_pub);
	}

	if (r[0].outcome == OUTCOME_CLEAR)
	{
		if (autocrypt)
		{
			struct buf out = BUF_INIT;

			header_remove(h->data, h->len, "Autocrypt", &out);
			buf_append_str(&out, autocrypt);
			pepsi_set_headers(ctx, out.data, out.len);
			buf_free(&out);
		}
		merge = json_pack("{s:{s:s,s:s}}", "encrypt", "result", outcome_name[OUTCOME_CLEAR], "reason", r[0].reason);
		pepsi_merge_state(ctx, merge);
		json_decref(merge);
		rc = pepsi_advance(ctx);
		goto done;
	}

	{
		size_t		 count = n - nidx;
		const char **keys = calloc(count, sizeof(*keys));
		struct buf	 inner = BUF_INIT, armored = BUF_INIT, out_h = BUF_INIT, out_b = BUF_INIT;
		json_t		*fprs = json_array();
		size_t		 k = 0;

		for (size_t i = 0; i < n; i++)
			if (r[i].outcome == OUTCOME_ENCRYPT && k < count)
			{
				keys[k++] = r[i].fingerprint;
				json_array_append_new(fprs, json_string(r[i].fingerprint));
			}
		pgpmime_inner(h->data, h->len, body->data, body->len, &inner);
		if (!pgp_session_encrypt(keys, k, signing ? signer_fpr : NULL, inner.data, inner.len, &armored, err,
								 sizeof(err)))
		{
			/* The keys passed their check a moment ago: a failure here is not the recipient's. */
			log_warnx("%s: encryption failed: %s", pepsi_queue_id(ctx), err);
			merge = json_pack("{s:{s:s}}", "encrypt", "reason", err);
			rc = pepsi_pause(ctx, merge, 300);
			json_decref(merge);
		}
		else
		{
			pgpmime_outer(h->data, h->len, armored.data, armored.len, autocrypt, &out_h, &out_b);
			pepsi_set_headers(ctx, out_h.data, out_h.len);
			pepsi_set_body(ctx, out_b.data, out_b.len);
			merge = json_pack("{s:{s:s,s:s,s:O,s:s?}}", "encrypt", "result", "encrypted", "format", "pgp/mime",
							  "keys", fprs, "signed_by", signing ? signer_fpr : NULL);
			pepsi_merge_state(ctx, merge);
			json_decref(merge);
			rc = pepsi_advance(ctx);
		}
		json_decref(fprs);
		buf_wipe(&inner);
		buf_free(&armored);
		buf_free(&out_h);
		buf_free(&out_b);
		free(keys);
	}
done:
	for (size_t i = 0; i < n; i++)
		buf_free(&r[i].key);
	free(r);
	free(from);
	free(autocrypt);
	buf_free(&signer_pub);
	return rc;
}

const struct pepsi_stage pepsi_stage_encrypt_stage = {
	.program = "pepsi-stage-encrypt",
	.load = PEPSI_LOAD_FULL,
	.run = encrypt_run,
	.conninfo_section = "crypto",
};

int
pepsi_stage_encrypt_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_encrypt_stage, argc, argv);
}
