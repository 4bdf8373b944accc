/*
 * pepsi-stage-decrypt: decrypt inbound PGP/MIME mail (RFC 3156) to an
 * address whose owner chose server-side decryption (DECRYPT, an owner's
 * setting), with its identity in the key store, and verify its signature
 * against the sender's keys (pepsi.peer_key, or the identity of a sender
 * of ours).  The protected headers the encrypted entity carries replace
 * the outer ones (the Subject above all).
 *
 * The verdicts go in state.decrypt and an Authentication-Results field
 * of our authserv-id (methods x-pgp-decrypt and x-pgp-sign, RFC 8601's
 * form).  A message that does not decrypt (damaged, or not for the key)
 * goes on as it came, encrypted, with the reason: never half-decrypted.
 * Recipients whose choice differs from the first's are split off to this
 * stage again.
 *
 * S/MIME (RFC 8551) likewise: an application/pkcs7-mime enveloped (or
 * authEnveloped) message to an address with an S/MIME identity is
 * decrypted with it; a signature inside (multipart/signed or signed-data)
 * is good when the signer's certificate chains to a CA of pepsi.ca_trust,
 * is valid and names the From: address (methods x-smime-decrypt and
 * x-smime-sign).  Mail that is not encrypted, or to an address that did not
 * choose, goes on untouched.
 *
 * Installed setuid pepsi-crypto, like pepsi-stage-encrypt: it connects with
 * [crypto] CONNINFO.
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
#include "crypto/smime.h"
#include "message/header.h"
#include "runtime/stage.h"

int pepsi_stage_decrypt_main(int argc, char **argv);

static bool
decrypt_chosen(struct pepsi_ctx *ctx, const char *rcpt)
{
	const char *at = strrchr(rcpt, '@');

	return config_bool_for(pepsi_config(ctx), pepsi_section(ctx), "DECRYPT", at ? at + 1 : NULL, rcpt);
}

/* Go on as it came, with the reason; state.decrypt.result is result. */
static int
decrypt_pass_on(struct pepsi_ctx *ctx, const char *result, const char *reason)
{
	json_t *merge = json_pack("{s:{s:s,s:s?}}", "decrypt", "result", result, "reason", reason);

	pepsi_merge_state(ctx, merge);
	json_decref(merge);
	return pepsi_advance(ctx);
}

/* PGP/MIME to rcpt, whose owner chose server-side decryption. */
static int
decrypt_pgp(struct pepsi_ctx *ctx, const char *rcpt)
{
	const struct buf  *h = pepsi_headers(ctx);
	const struct buf  *body = pepsi_body(ctx);
	PGconn			  *conn = pepsi_db(ctx);
	char			   err[512], fpr[65], peer_fpr[65], own_fpr[65];
	struct buf		   pub = BUF_INIT, armored = BUF_INIT, plain = BUF_INIT;
	struct buf		   signer_key = BUF_INIT, signer_pub = BUF_INIT, out_h = BUF_INIT, out_b = BUF_INIT;
	const char		  *signers[2];
	size_t			   nsigners = 0;
	struct pgp_verdict verdict;
	char			  *from = NULL;
	int				   found, rc;

	if (!pgpmime_ciphertext(body->data, body->len, &armored))
	{
		buf_free(&armored);
		return decrypt_pass_on(ctx, "failed", "no OpenPGP message in the multipart/encrypted body");
	}
	found = keystore_identity_in_session(conn, pepsi_config(ctx), &pgp_session_secrets, rcpt, "encrypt", fpr, &pub, err, sizeof(err));
	if (found == -2)
	{
		buf_free(&armored);
		buf_free(&pub);
		return pepsi_error(ctx, "%s", err);
	}
	if (found != 0)
	{
		char reason[600];

		if (found < 0)
			log_warnx("%s: %s", pepsi_queue_id(ctx), err);
		snprintf(reason, sizeof(reason), "%s", found > 0 ? "the recipient has no identity that decrypts" : err);
		rc = decrypt_pass_on(ctx, "failed", reason);
		goto done;
	}
	/* The sender's keys: a correspondent's, or one of ours. */
	from = header_from_address(h->data, h->len);
	if (from && keystore_peer_key(conn, from, peer_fpr, &signer_key, err, sizeof(err)) == 0
		&& pgp_session_public(peer_fpr, signer_key.data, signer_key.len, NULL, err, sizeof(err)))
		signers[nsigners++] = peer_fpr;
	if (from && keystore_identity(conn, NULL, from, "sign", own_fpr, &signer_pub, NULL, err, sizeof(err)) == 0
		&& pgp_session_public(own_fpr, signer_pub.data, signer_pub.len, NULL, err, sizeof(err)))
		signers[nsigners++] = own_fpr;
	if (!pgp_session_decrypt(fpr, signers, nsigners, armored.data, armored.len, &plain, &verdict, err, sizeof(err)))
	{
		rc = decrypt_pass_on(ctx, "failed", err);
		goto done;
	}
	{
		const char *authserv = config_authserv_id(pepsi_config(ctx));
		const char *sign = !verdict.signed_ ? "none" : verdict.good ? "pass"
																	: "fail";
		struct buf	extra = BUF_INIT;
		json_t	   *merge;

		buf_printf(&extra, "Authentication-Results: %s;\r\n x-pgp-decrypt=pass (key %s);\r\n x-pgp-sign=%s", authserv,
				   fpr, sign);
		if (verdict.signed_)
			buf_printf(&extra, " header.from=%s (%s%s)", from ? from : "unknown",
					   verdict.good ? "key " : verdict.reason, verdict.good ? verdict.fingerprint : "");
		buf_append_str(&extra, "\r\n");
		pgpmime_restore(h->data, h->len, plain.data, plain.len, extra.data, &out_h, &out_b);
		buf_free(&extra);
		pepsi_set_headers(ctx, out_h.data, out_h.len);
		pepsi_set_body(ctx, out_b.data, out_b.len);
		merge = json_pack("{s:{s:s,s:s,s:s,s:s?,s:s?}}", "decrypt", "result", "decrypted", "key", fpr, "signature",
						  sign, "signed_by", verdict.signed_ ? verdict.fingerprint : NULL, "reason",
						  verdict.signed_ && !verdict.good ? verdict.reason : NULL);
		pepsi_merge_state(ctx, merge);
		json_decref(merge);
		rc = pepsi_advance(ctx);
	}
done:
	free(from);
	buf_free(&pub);
	buf_free(&armored);
	buf_wipe(&plain);
	buf_free(&signer_key);
	buf_free(&signer_pub);
	buf_wipe(&out_h);
	buf_wipe(&out_b);
	return rc;
}

/*
 * The certificates that may complete the chain of from's signature: the
 * sender's in pepsi.peer_key, or its S/MIME identity's when it is ours.
 */
static size_t
decrypt_sender_certs(PGconn *conn, const char *from, struct buf extra[2])
{
	char   protocol[KEYSTORE_PROTOCOL_LEN], fpr[65], err[512];
	size_t n = 0;

	if (from == NULL)
		return 0;
	if (keystore_peer_any(conn, from, protocol, fpr, &extra[n], NULL, err, sizeof(err)) == 0
		&& strcmp(protocol, "smime") == 0)
		n++;
	else
		buf_reset(&extra[n]);
	if (keystore_smime_identity(conn, NULL, from, "sign", fpr, &extra[n], NULL, err, sizeof(err)) == 0)
		n++;
	return n;
}

/*
 * Decrypted entity's signature, verified: its content into content, the
 * verdict into v; a good one's certificate (DER) and announced ciphers into
 * signer_cert and caps, for pepsi-stage-autocrypt-learn (state.decrypt).
 */
static void
decrypt_smime_verify(PGconn *conn, const char *from, const struct buf *entity, struct buf *content,
					 struct pgp_verdict *v, struct buf *signer_cert, struct buf *caps)
{
	struct buf *cas = NULL;
	struct buf	extra[2] = {BUF_INIT, BUF_INIT};
	size_t		ncas = 0, nextra;
	char		err[512];

	memset(v, 0, sizeof(*v));
	if (!smime_is_signed(entity->data, entity->len))
	{
		buf_append(content, entity->data, entity->len);
		return;
	}
	if (keystore_ca_certs(conn, &cas, &ncas, err, sizeof(err)) < 0)
		log_warnx("%s", err);
	nextra = decrypt_sender_certs(conn, from, extra);
	if (!smime_verify_signer(entity->data, entity->len, cas, ncas, extra, nextra, from, content, v, signer_cert, caps,
							 err, sizeof(err)))
	{
		/* Announced as signed but no signature inside: the entity as it is, the signature failed. */
		buf_reset(content);
		buf_append(content, entity->data, entity->len);
		v->signed_ = true;
		snprintf(v->reason, sizeof(v->reason), "%.150s", err);
	}
	keystore_bufs_free(cas, ncas);
	buf_free(&extra[0]);
	buf_free(&extra[1]);
}

/* S/MIME enveloped data to rcpt, whose owner chose server-side decryption. */
static int
decrypt_smime(struct pepsi_ctx *ctx, const char *rcpt)
{
	const struct buf  *h = pepsi_headers(ctx);
	const struct buf  *body = pepsi_body(ctx);
	PGconn			  *conn = pepsi_db(ctx);
	struct buf		   cert = BUF_INIT, key = BUF_INIT, message = BUF_INIT, entity = BUF_INIT, content = BUF_INIT;
	struct buf		   extra = BUF_INIT, out_h = BUF_INIT, out_b = BUF_INIT;
	struct buf		   signer = BUF_INIT, caps = BUF_INIT, signer_b64 = BUF_INIT;
	struct pgp_verdict v;
	char			   err[512], fpr[65];
	char			  *from = NULL;
	const char		  *sign;
	int				   found, rc;

	found = keystore_smime_identity(conn, pepsi_config(ctx), rcpt, "encrypt", fpr, &cert, &key, err, sizeof(err));
	if (found == -2)
	{
		rc = pepsi_error(ctx, "%s", err);
		goto done;
	}
	if (found != 0)
	{
		if (found < 0)
			log_warnx("%s: %s", pepsi_queue_id(ctx), err);
		rc = decrypt_pass_on(ctx, "failed", found > 0 ? "the recipient has no S/MIME identity that decrypts" : err);
		goto done;
	}
	buf_append(&message, h->data, h->len);
	buf_append_str(&message, "\r\n");
	buf_append(&message, body->data, body->len);
	if (!smime_decrypt(&cert, &key, message.data, message.len, &entity, err, sizeof(err)))
	{
		rc = decrypt_pass_on(ctx, "failed", err);
		goto done;
	}
	from = header_from_address(h->data, h->len);
	decrypt_smime_verify(conn, from, &entity, &content, &v, &signer, &caps);
	sign = !v.signed_ ? "none" : v.good ? "pass"
										: "fail";
	buf_printf(&extra, "Authentication-Results: %s;\r\n x-smime-decrypt=pass (certificate %s);\r\n x-smime-sign=%s",
			   config_authserv_id(pepsi_config(ctx)), fpr, sign);
	if (v.signed_)
		buf_printf(&extra, " header.from=%s (%s%s)", from ? from : "unknown", v.good ? "certificate " : v.reason,
				   v.good ? v.fingerprint : "");
	buf_append_str(&extra, "\r\n");
	pgpmime_restore(h->data, h->len, content.data, content.len, extra.data, &out_h, &out_b);
	pepsi_set_headers(ctx, out_h.data, out_h.len);
	pepsi_set_body(ctx, out_b.data, out_b.len);
	{
		json_t *merge;

		/* A good signer's certificate and capabilities: pepsi-stage-autocrypt-learn records them. */
		if (v.good && signer.len > 0)
			base64_append(&signer_b64, signer.data, signer.len);
		merge = json_pack("{s:{s:s,s:s,s:s,s:s,s:s?,s:s?,s:s?,s:s?}}", "decrypt", "result", "decrypted", "format",
						  "s/mime", "key", fpr, "signature", sign, "signed_by",
						  v.signed_ && v.fingerprint[0] ? v.fingerprint : NULL, "reason",
						  v.signed_ && !v.good ? v.reason : NULL, "signer_certificate",
						  signer_b64.len ? signer_b64.data : NULL, "signer_capabilities",
						  signer_b64.len ? (caps.data ? caps.data : "") : NULL);

		pepsi_merge_state(ctx, merge);
		json_decref(merge);
	}
	rc = pepsi_advance(ctx);
done:
	free(from);
	buf_free(&cert);
	buf_wipe(&key);
	buf_free(&message);
	buf_wipe(&entity);
	buf_wipe(&content);
	buf_free(&extra);
	buf_wipe(&out_h);
	buf_wipe(&out_b);
	buf_free(&signer);
	buf_free(&caps);
	buf_free(&signer_b64);
	return rc;
}

static int
decrypt_run(struct pepsi_ctx *ctx)
{
	const struct buf *h = pepsi_headers(ctx);
	size_t			  n = pepsi_rcpt_count(ctx);
	const char		 *rcpt = n ? pepsi_rcpt(ctx, 0) : NULL;
	bool			  chosen, pgp, smime;
	int				  idx[256];
	size_t			  nidx = 0;

	if (h == NULL || pepsi_body(ctx) == NULL || rcpt == NULL)
		return pepsi_error(ctx, "no message to decrypt");
	pgp = pgpmime_is_encrypted(h->data, h->len);
	smime = !pgp && smime_is_encrypted(h->data, h->len);
	if (!pgp && !smime)
		return decrypt_pass_on(ctx, "not encrypted", NULL);
	chosen = decrypt_chosen(ctx, rcpt);
	for (size_t i = 1; i < n && nidx < sizeof(idx) / sizeof(idx[0]); i++)
		if (decrypt_chosen(ctx, pepsi_rcpt(ctx, i)) != chosen)
			idx[nidx++] = (int) i + 1;
	if (nidx > 0 && pepsi_split_off_recipients(ctx, idx, nidx, pepsi_stage_name(ctx)) < 0)
		return -1;
	if (!chosen)
		return decrypt_pass_on(ctx, "not chosen", NULL);
	return pgp ? decrypt_pgp(ctx, rcpt) : decrypt_smime(ctx, rcpt);
}

const struct pepsi_stage pepsi_stage_decrypt_stage = {
	.program = "pepsi-stage-decrypt",
	.load = PEPSI_LOAD_FULL,
	.run = decrypt_run,
	.conninfo_section = "crypto",
};

int
pepsi_stage_decrypt_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_decrypt_stage, argc, argv);
}
