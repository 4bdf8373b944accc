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
 * BOUNCE_STAGE (failed without one), never sent in clear, or, when NO_KEY
 * says portal, sealed for the secure-link portal: the message is stored
 * encrypted under a key derived from a link's secret (pepsi.secure_link,
 * common/message/securelink.h) and the recipient's copy becomes a notice
 * with the link, from PORTAL_ADDRESS; pepsi-httpd serves the message to
 * whoever proves control of the address (pepsi-secure-link(8)), in at most
 * PORTAL_OPENS sessions (a limit the link keeps from when it is made).
 * Mail already encrypted goes on as it is.  Mail from an address with an identity
 * carries its key in an Autocrypt: field (Level 1) when AUTOCRYPT says so.
 * A recipient whose key is an S/MIME certificate gets S/MIME (RFC 8551)
 * instead: the entity signed (multipart/signed, with the From: address's
 * S/MIME identity) then enveloped to the certificates, AES-256-GCM when
 * every recipient announced it (peer_key.smime_capabilities), AES-256-CBC
 * otherwise; a certificate expired, not yet valid or naming another
 * address is refused with the reason like a bad OpenPGP key.
 * A recipient without a key may wait for one instead (KEYDISC): the
 * message parks (paused for KEYDISC_WAIT, state.encrypt.waiting_for the
 * address) with a pepsi.key_request row that pepsi-keydisc answers; its
 * keydisc_release resumes the message, which is then decided afresh.  A
 * message parks once, and not at all for an address whose last lookup
 * found nothing (key_request.negative_until, the negative cache).
 * The outcome is state.encrypt.  OpenPGP is encrypted and signed in
 * process through librnp (common/crypto/rnp_session.c), keys imported once
 * per worker and version of their row.
 *
 * Installed setuid pepsi-crypto: it connects with [crypto] CONNINFO (peer
 * authentication as a member of pepsi_crypto, the one role that reads the
 * private keys).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base64.h"
#include "base/log.h"
#include "crypto/kek.h"
#include "crypto/keystore.h"
#include "crypto/openpgp.h"
#include "crypto/pgpmime.h"
#include "crypto/rnp_session.h"
#include "crypto/smime.h"
#include "message/header.h"
#include "message/securelink.h"
#include "runtime/stage.h"

/* The most rows an encrypting worker takes at once of those waiting (as dkim-sign's batch). */
#define ENCRYPT_BATCH_MAX 16

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
	OUTCOME_REFUSE,
	OUTCOME_PARK,  /* wait for pepsi-keydisc */
	OUTCOME_PORTAL /* sealed for the secure-link portal, the recipient notified */
};

static const char *const outcome_name[] = {"encrypted", "clear", "refused", "parked", "portal"};

struct encrypt_rcpt
{
	enum encrypt_outcome outcome;
	char				 protocol[KEYSTORE_PROTOCOL_LEN]; /* of the key, when OUTCOME_ENCRYPT */
	bool				 gcm;							  /* an S/MIME recipient that takes AES-256-GCM */
	char				 fingerprint[65];
	struct buf			 key;
	char				 reason[600];
};

/* The sender's side of a message: its signing identity and Autocrypt: field. */
struct encrypt_sender
{
	char	  *from;
	char	  *autocrypt;
	char	   fingerprint[65];
	struct buf public_key; /* OpenPGP public key, or S/MIME certificate */
	struct buf secret;	   /* S/MIME private key (OpenPGP's stays in the session) */
	bool	   signing;
};

/*
 * May a message to rcpt (no key known) park for key discovery?  KEYDISC
 * says so for policy, the message has not parked before, and the address
 * is not in the negative cache; the key_request row is made (or renewed
 * once its negative cache has run out).
 */
static bool
encrypt_may_park(struct pepsi_ctx *ctx, PGconn *conn, const char *rcpt, enum encrypt_policy policy)
{
	const char *at = strrchr(rcpt, '@');
	int			keydisc = config_enum_for(pepsi_config(ctx), pepsi_section(ctx), "KEYDISC", at ? at + 1 : NULL, rcpt);
	json_t	   *state = pepsi_state(ctx);
	const char *values[] = {rcpt};
	char		err[256];
	PGresult   *res;
	bool		park;

	if (keydisc == 0 || (keydisc == 1 && policy != POLICY_REQUIRED)
		|| json_is_true(json_object_get(json_object_get(state, "encrypt"), "parked")))
		return false;
	/* The request stands only if the message's outcome (parked, or split) is committed. */
	if (!pepsi_write_with_outcome(ctx, err, sizeof(err)))
	{
		log_warnx("%s: key_request for %s: %s", pepsi_queue_id(ctx), rcpt, err);
		return false;
	}
	res = PQexecParams(conn,
					   "WITH r AS (INSERT INTO pepsi.key_request (address) VALUES (lower($1))"
					   " ON CONFLICT (address) DO UPDATE SET requested_at = now(), settled_at = NULL,"
					   " negative_until = NULL, methods_asked = '{}', methods_replied = '{}'"
					   " WHERE key_request.negative_until <= now() RETURNING address)"
					   " SELECT NOT EXISTS (SELECT 1 FROM pepsi.key_request WHERE address = lower($1)"
					   " AND negative_until > now()) OR EXISTS (SELECT 1 FROM r)",
					   1, NULL, values, NULL, NULL, 0);
	park = PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't';
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		log_warnx("%s: key_request for %s: %s", pepsi_queue_id(ctx), rcpt, PQresultErrorMessage(res));
	PQclear(res);
	return park;
}

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
	found = keystore_peer_any(conn, rcpt, r->protocol, r->fingerprint, &r->key, &r->gcm, err, sizeof(err));
	if (found == 0)
	{
		/* Checked on every use; an OpenPGP key is imported into the worker's session once per version of the row. */
		if (strcmp(r->protocol, "smime") == 0 ? smime_check(r->key.data, r->key.len, rcpt, err, sizeof(err))
											  : rnp_session_public(r->fingerprint, r->key.data, r->key.len, rcpt, err,
																   sizeof(err)))
		{
			r->outcome = OUTCOME_ENCRYPT;
			return;
		}
		snprintf(r->reason, sizeof(r->reason), "%s", err);
	}
	else if (found == 1)
	{
		snprintf(r->reason, sizeof(r->reason), "no key known for %s", rcpt);
		if (encrypt_may_park(ctx, conn, rcpt, policy))
		{
			r->outcome = OUTCOME_PARK;
			return;
		}
	}
	else
		snprintf(r->reason, sizeof(r->reason), "%s", err);
	if (policy == POLICY_REQUIRED)
		r->outcome = found >= 0 && config_enum_for(pepsi_config(ctx), pepsi_section(ctx), "NO_KEY", at ? at + 1 : NULL, rcpt) == 1
						 ? OUTCOME_PORTAL
						 : OUTCOME_REFUSE;
}

/* Does b go the way a does (the same outcome, and the same protocol when encrypted)? */
static bool
encrypt_same_way(const struct encrypt_rcpt *a, const struct encrypt_rcpt *b)
{
	return a->outcome == b->outcome && (a->outcome != OUTCOME_ENCRYPT || strcmp(a->protocol, b->protocol) == 0)
		   && a->outcome != OUTCOME_PARK	/* each parked message waits for one address */
		   && a->outcome != OUTCOME_PORTAL; /* and each portal recipient has a link of its own */
}

/* Park the message until pepsi-keydisc releases rcpt's request, or KEYDISC_WAIT. */
static int
encrypt_park(struct pepsi_ctx *ctx, const char *rcpt)
{
	json_t *merge = json_pack("{s:{s:s,s:b,s:s}}", "encrypt", "result", outcome_name[OUTCOME_PARK], "parked", 1,
							  "waiting_for", rcpt);
	int		rc;

	log_info("%s: parked: waiting for key discovery for %s", pepsi_queue_id(ctx), rcpt);
	rc = pepsi_pause(ctx, merge, pepsi_option_seconds(ctx, "KEYDISC_WAIT"));
	json_decref(merge);
	return rc;
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

/* Merge merge into the state and go on (merge is released). */
static int
encrypt_advance(struct pepsi_ctx *ctx, json_t *merge)
{
	pepsi_merge_state(ctx, merge);
	json_decref(merge);
	return pepsi_advance(ctx);
}

/* Wait (a key that does not open, a failure that is not the recipient's): never clear text meanwhile. */
static int
encrypt_wait(struct pepsi_ctx *ctx, const char *err)
{
	json_t *merge = json_pack("{s:{s:s}}", "encrypt", "reason", err);
	int		rc;

	log_warnx("%s: %s", pepsi_queue_id(ctx), err);
	rc = pepsi_pause(ctx, merge, 300);
	json_decref(merge);
	return rc;
}

/* Policy required and no usable key: bounced with the reason (failed without BOUNCE_STAGE). */
static int
encrypt_refuse(struct pepsi_ctx *ctx, const struct encrypt_rcpt *r)
{
	const char *bounce_stage = pepsi_option(ctx, "BOUNCE_STAGE");
	char		diagnostic[700];
	json_t	   *merge;
	int			rc;

	snprintf(diagnostic, sizeof(diagnostic), "5.7.1 the recipient's policy requires encryption: %s", r->reason);
	log_info("%s: not sent: %s", pepsi_queue_id(ctx), diagnostic);
	merge = json_pack("{s:{s:s,s:s},s:{s:s,s:s}}", "encrypt", "result", "refused", "reason", r->reason, "bounce",
					  "kind", "permanent", "diagnostic", diagnostic);
	rc = bounce_stage ? pepsi_reroute(ctx, bounce_stage, merge) : pepsi_fail(ctx, merge);
	json_decref(merge);
	return rc;
}

/* A lifetime in seconds for the notice: "14 days", "12 hours", "90 minutes". */
static void
encrypt_portal_lifetime(double seconds, char *out, size_t outlen)
{
	long long s = (long long) seconds;

	if (s >= 86400 && s % 86400 == 0)
		snprintf(out, outlen, "%lld day%s", s / 86400, s == 86400 ? "" : "s");
	else if (s >= 3600 && s % 3600 == 0)
		snprintf(out, outlen, "%lld hour%s", s / 3600, s == 3600 ? "" : "s");
	else if (s >= 60 && s % 60 == 0)
		snprintf(out, outlen, "%lld minute%s", s / 60, s == 60 ? "" : "s");
	else
		snprintf(out, outlen, "%lld seconds", s);
}

/*
 * The message sealed for the secure-link portal (NO_KEY = portal): stored
 * in pepsi.secure_link under a key only the link carries, and the row,
 * now rcpt's alone, becomes the notice with the link.  A portal that is
 * not configured waits (never clear text), naming the option.
 */
static int
encrypt_portal(struct pepsi_ctx *ctx, const char *rcpt, const struct encrypt_rcpt *r)
{
	const char		 *url = pepsi_option(ctx, "PORTAL_URL");
	const char		 *portal = pepsi_option(ctx, "PORTAL_ADDRESS");
	const char		 *next = pepsi_option(ctx, "NEXT_STAGE");
	const struct buf *h = pepsi_headers(ctx);
	const struct buf *body = pepsi_body(ctx);
	char			 *from = header_from_address(h->data, h->len);
	const char		 *sender = from ? from : pepsi_mail_from(ctx);
	struct securelink link;
	struct buf		  raw = BUF_INIT, sealed = BUF_INIT, notice_h = BUF_INIT, notice_b = BUF_INIT;
	unsigned char	  nonce[SECURELINK_NONCE_LEN];
	char			  lifetime[32], lifetime_text[48], opens[24], visits[64] = "", err[256];
	long long		  open_limit = pepsi_option_int(ctx, "PORTAL_OPENS");
	size_t			  escaped_len;
	unsigned char	 *id_hex = NULL, *nonce_hex = NULL, *sealed_hex = NULL;
	PGresult		 *res = NULL;
	int				  rc;

	if (url == NULL || *url == '\0' || portal == NULL || strchr(portal, '@') == NULL || next == NULL)
	{
		free(from);
		return encrypt_wait(ctx, url == NULL || *url == '\0' ? "NO_KEY is portal but PORTAL_URL is not set"
								 : next == NULL				 ? "NO_KEY is portal but NEXT_STAGE is not set"
															 : "NO_KEY is portal but PORTAL_ADDRESS is not an address");
	}
	buf_append(&raw, h->data, h->len);
	buf_append_str(&raw, "\r\n");
	buf_append(&raw, body->data, body->len);
	if (!securelink_new(&link) || !securelink_seal(&link, rcpt, raw.data, raw.len, nonce, &sealed))
	{
		rc = encrypt_wait(ctx, "the portal's seal failed (OpenSSL)");
		goto done;
	}
	/* The link (the sealed message) stands only if the notice's outcome is committed. */
	if (!pepsi_write_with_outcome(ctx, err, sizeof(err)))
	{
		rc = encrypt_wait(ctx, err);
		goto done;
	}
	snprintf(lifetime, sizeof(lifetime), "%.0f seconds", pepsi_option_seconds(ctx, "PORTAL_LIFETIME"));
	snprintf(opens, sizeof(opens), "%lld", open_limit);
	id_hex = PQescapeByteaConn(pepsi_db(ctx), link.id, sizeof(link.id), &escaped_len);
	nonce_hex = PQescapeByteaConn(pepsi_db(ctx), nonce, sizeof(nonce), &escaped_len);
	sealed_hex = PQescapeByteaConn(pepsi_db(ctx), (const unsigned char *) sealed.data, sealed.len, &escaped_len);
	{
		/* PORTAL_OPENS 0 is no limit: NULL, as links made before it. */
		const char *values[] = {(const char *) id_hex, rcpt, sender ? sender : "", portal, next, pepsi_queue_id(ctx),
								(const char *) nonce_hex, (const char *) sealed_hex, lifetime, open_limit > 0 ? opens : NULL};

		res = PQexecParams(pepsi_db(ctx),
						   "SELECT pepsi.secure_link_store($1::bytea, $2, $3, $4, $5, $6, $7::bytea, $8::bytea,"
						   " $9::interval, $10::integer)",
						   10, NULL, values, NULL, NULL, 0);
	}
	if (id_hex == NULL || PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		rc = encrypt_wait(ctx, res ? PQresultErrorMessage(res) : "out of memory");
		goto done;
	}
	buf_printf(&notice_h,
			   "From: <%s>\r\nTo: <%s>\r\nSubject: An encrypted message from %s is waiting for you\r\n", portal,
			   rcpt, sender && *sender ? sender : "a sender");
	{
		time_t	  now = time(NULL);
		struct tm tm;
		char	  date[64];

		strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S +0000", gmtime_r(&now, &tm));
		buf_printf(&notice_h, "Date: %s\r\n", date);
	}
	buf_printf(&notice_h, "Message-ID: <secure-link.%s.%s@%s>\r\nMIME-Version: 1.0\r\n"
						  "Content-Type: text/plain; charset=utf-8\r\n",
			   pepsi_queue_id(ctx), PQgetvalue(res, 0, 0), strchr(portal, '@') + 1);
	buf_printf(&notice_h, "X-Pepsi-Secure-Link: %s\r\n", PQgetvalue(res, 0, 0));
	/* Said in the notice, so that a second visit's refusal is no surprise. */
	encrypt_portal_lifetime(pepsi_option_seconds(ctx, "PORTAL_LIFETIME"), lifetime_text, sizeof(lifetime_text));
	if (open_limit == 1)
		snprintf(visits, sizeof(visits), ", for one visit: read and reply in it");
	else if (open_limit > 1)
		snprintf(visits, sizeof(visits), ", for %lld visits", open_limit);
	buf_printf(&notice_b,
			   "%s sent you a message that must reach you encrypted, and no key of yours is known.\r\n"
			   "It is kept encrypted for you: open this link to read it (and to reply).\r\n"
			   "You will be asked for a code, mailed to this address.\r\n\r\n"
			   "    %s/secure/%s\r\n\r\n"
			   "The link works for %s%s.  Keep it to yourself: whoever has it and can read\r\n"
			   "your mail can read the message.\r\n",
			   sender && *sender ? sender : "Someone", url, link.token, lifetime_text, visits);
	log_info("%s: sealed for the secure-link portal (link %s) for %s: %s", pepsi_queue_id(ctx), PQgetvalue(res, 0, 0),
			 rcpt, r->reason);
	pepsi_set_headers(ctx, notice_h.data, notice_h.len);
	pepsi_set_body(ctx, notice_b.data, notice_b.len);
	rc = encrypt_advance(ctx, json_pack("{s:{s:s,s:s,s:I}}", "encrypt", "result", outcome_name[OUTCOME_PORTAL],
										"reason", r->reason, "secure_link", (json_int_t) atoll(PQgetvalue(res, 0, 0))));
done:
	PQclear(res);
	PQfreemem(id_hex);
	PQfreemem(nonce_hex);
	PQfreemem(sealed_hex);
	securelink_wipe(&link);
	securelink_buf_wipe(&raw);
	securelink_buf_wipe(&notice_b);
	buf_free(&sealed);
	buf_free(&notice_h);
	free(from);
	return rc;
}

/*
 * The sender's identity (s) for a message going the way of r: its signing
 * key when SIGN says so and the message is encrypted, its OpenPGP key for
 * the Autocrypt: field.  0, or the stage's return when it cannot go on.
 */
static int
encrypt_find_sender(struct pepsi_ctx *ctx, PGconn *conn, const struct encrypt_rcpt *r, struct encrypt_sender *s,
					int *stop)
{
	const struct buf *h = pepsi_headers(ctx);
	bool			  smime = r->outcome == OUTCOME_ENCRYPT && strcmp(r->protocol, "smime") == 0;
	bool			  sign = pepsi_option_bool(ctx, "SIGN") && r->outcome == OUTCOME_ENCRYPT;
	char			  err[512];
	int				  found = 1;

	*stop = 0;
	s->from = header_from_address(h->data, h->len);
	if (s->from == NULL || (!pepsi_option_bool(ctx, "SIGN") && !pepsi_option_bool(ctx, "AUTOCRYPT")))
		return 0;
	if (sign && smime)
		found = keystore_smime_identity(conn, pepsi_config(ctx), s->from, "sign", s->fingerprint, &s->public_key,
										&s->secret, err, sizeof(err));
	else if (sign)
		found = keystore_identity_in_session(conn, pepsi_config(ctx), &rnp_session_secrets, s->from, "sign", s->fingerprint,
											 &s->public_key, err, sizeof(err));
	else
		found = keystore_identity(conn, NULL, s->from, "sign", s->fingerprint, &s->public_key, NULL, err,
								  sizeof(err));
	if (found == -2)
	{
		*stop = 1;
		return pepsi_error(ctx, "%s", err);
	}
	if (found < 0)
	{
		*stop = 1;
		return encrypt_wait(ctx, err);
	}
	s->signing = sign && found == 0;
	if (found == 0 && !smime && pepsi_option_bool(ctx, "AUTOCRYPT"))
		s->autocrypt = encrypt_autocrypt(s->from, &s->public_key);
	return 0;
}

/* Sent in clear (policy allows it), with the sender's Autocrypt: field. */
static int
encrypt_clear(struct pepsi_ctx *ctx, const struct encrypt_rcpt *r, const struct encrypt_sender *s)
{
	const struct buf *h = pepsi_headers(ctx);

	if (s->autocrypt)
	{
		struct buf out = BUF_INIT;

		header_remove(h->data, h->len, "Autocrypt", &out);
		buf_append_str(&out, s->autocrypt);
		pepsi_set_headers(ctx, out.data, out.len);
		buf_free(&out);
	}
	return encrypt_advance(ctx, json_pack("{s:{s:s,s:s}}", "encrypt", "result", outcome_name[OUTCOME_CLEAR],
										  "reason", r->reason));
}

/* PGP/MIME to the fingerprints keys, signed when s says so. */
static int
encrypt_pgp(struct pepsi_ctx *ctx, const char **keys, size_t k, json_t *fprs, const struct encrypt_sender *s)
{
	const struct buf *h = pepsi_headers(ctx);
	const struct buf *body = pepsi_body(ctx);
	struct buf		  inner = BUF_INIT, armored = BUF_INIT, out_h = BUF_INIT, out_b = BUF_INIT;
	char			  err[512];
	int				  rc;

	pgpmime_inner(h->data, h->len, body->data, body->len, &inner);
	if (!rnp_session_encrypt(keys, k, s->signing ? s->fingerprint : NULL, inner.data, inner.len, &armored, err,
							 sizeof(err)))
		/* The keys passed their check a moment ago: a failure here is not the recipient's. */
		rc = encrypt_wait(ctx, err);
	else
	{
		pgpmime_outer(h->data, h->len, armored.data, armored.len, s->autocrypt, &out_h, &out_b);
		pepsi_set_headers(ctx, out_h.data, out_h.len);
		pepsi_set_body(ctx, out_b.data, out_b.len);
		rc = encrypt_advance(ctx, json_pack("{s:{s:s,s:s,s:O,s:s?}}", "encrypt", "result", "encrypted", "format",
											"pgp/mime", "keys", fprs, "signed_by", s->signing ? s->fingerprint : NULL));
	}
	buf_wipe(&inner);
	buf_free(&armored);
	buf_free(&out_h);
	buf_free(&out_b);
	return rc;
}

/* S/MIME to the certificates certs: signed (multipart/signed) when s says so, then enveloped. */
static int
encrypt_smime(struct pepsi_ctx *ctx, const struct buf *certs, size_t k, bool gcm, json_t *fprs,
			  const struct encrypt_sender *s)
{
	const struct buf *h = pepsi_headers(ctx);
	const struct buf *body = pepsi_body(ctx);
	struct buf		  inner = BUF_INIT, signed_ = BUF_INIT, mime = BUF_INIT, out_h = BUF_INIT;
	const struct buf *entity = &inner;
	const char		 *sep;
	char			  err[512];
	int				  rc;

	pgpmime_inner(h->data, h->len, body->data, body->len, &inner);
	if (s->signing)
	{
		if (!smime_sign(&s->public_key, &s->secret, inner.data, inner.len, &signed_, err, sizeof(err)))
		{
			rc = encrypt_wait(ctx, err);
			goto done;
		}
		entity = &signed_;
	}
	if (!smime_encrypt(certs, k, gcm, entity->data, entity->len, &mime, err, sizeof(err))
		|| (sep = memmem(mime.data, mime.len, "\r\n\r\n", 4)) == NULL)
	{
		rc = encrypt_wait(ctx, mime.len ? "the S/MIME entity has no body" : err);
		goto done;
	}
	pgpmime_outer_fields(h->data, h->len, &out_h);
	buf_append_str(&out_h, "MIME-Version: 1.0\r\n");
	buf_append(&out_h, mime.data, (size_t) (sep - mime.data) + 2);
	pepsi_set_headers(ctx, out_h.data, out_h.len);
	pepsi_set_body(ctx, sep + 4, mime.len - (size_t) (sep - mime.data) - 4);
	rc = encrypt_advance(ctx, json_pack("{s:{s:s,s:s,s:s,s:O,s:s?}}", "encrypt", "result", "encrypted", "format",
										"s/mime", "cipher", gcm ? "aes-256-gcm" : "aes-256-cbc", "keys", fprs,
										"signed_by", s->signing ? s->fingerprint : NULL));
done:
	buf_wipe(&inner);
	buf_wipe(&signed_);
	buf_free(&mime);
	buf_free(&out_h);
	return rc;
}

/* Encrypt to the recipients r[0..n) whose outcome is to encrypt (all of one protocol). */
static int
encrypt_to(struct pepsi_ctx *ctx, const struct encrypt_rcpt *r, size_t n, const struct encrypt_sender *s)
{
	const char **keys = calloc(n ? n : 1, sizeof(*keys));
	struct buf	*certs = calloc(n ? n : 1, sizeof(*certs));
	json_t		*fprs = json_array();
	bool		 gcm = true;
	size_t		 k = 0;
	int			 rc;

	if (keys == NULL || certs == NULL)
	{
		free(keys);
		free(certs);
		json_decref(fprs);
		return pepsi_error(ctx, "out of memory");
	}
	for (size_t i = 0; i < n; i++)
		if (r[i].outcome == OUTCOME_ENCRYPT)
		{
			keys[k] = r[i].fingerprint;
			certs[k++] = r[i].key; /* shared, not copied */
			gcm = gcm && r[i].gcm;
			json_array_append_new(fprs, json_string(r[i].fingerprint));
		}
	if (strcmp(r[0].protocol, "smime") == 0)
		rc = encrypt_smime(ctx, certs, k, gcm, fprs, s);
	else
		rc = encrypt_pgp(ctx, keys, k, fprs, s);
	json_decref(fprs);
	free(keys);
	free(certs);
	return rc;
}

static int
encrypt_run(struct pepsi_ctx *ctx)
{
	size_t				  n = pepsi_rcpt_count(ctx);
	struct encrypt_rcpt	 *r = calloc(n ? n : 1, sizeof(*r));
	const struct buf	 *h = pepsi_headers(ctx);
	struct encrypt_sender s;
	int					  rc = 0, stop = 0;
	int					  idx[256];
	size_t				  nidx = 0;

	memset(&s, 0, sizeof(s));
	if (r == NULL || h == NULL || pepsi_body(ctx) == NULL)
	{
		free(r);
		return pepsi_error(ctx, "no message to encrypt");
	}
	if (pgpmime_is_encrypted(h->data, h->len) || smime_is_encrypted(h->data, h->len))
	{
		free(r);
		return encrypt_advance(ctx, json_pack("{s:{s:s}}", "encrypt", "result", "already encrypted"));
	}
	for (size_t i = 0; i < n; i++)
		encrypt_decide(ctx, pepsi_db(ctx), pepsi_rcpt(ctx, i), &r[i]);
	/* Recipients that come out unlike the first go on as a message of their own, through this stage again. */
	for (size_t i = 1; i < n && nidx < sizeof(idx) / sizeof(idx[0]); i++)
		if (!encrypt_same_way(&r[0], &r[i]))
		{
			idx[nidx++] = (int) i + 1;
			r[i].outcome = OUTCOME_CLEAR; /* not this message's any more */
		}
	if (nidx > 0 && pepsi_split_off_recipients(ctx, idx, nidx, pepsi_stage_name(ctx)) < 0)
		rc = -1;
	else if (r[0].outcome == OUTCOME_REFUSE)
		rc = encrypt_refuse(ctx, &r[0]);
	else if (r[0].outcome == OUTCOME_PARK)
		rc = encrypt_park(ctx, pepsi_rcpt(ctx, 0));
	else if (r[0].outcome == OUTCOME_PORTAL)
		rc = encrypt_portal(ctx, pepsi_rcpt(ctx, 0), &r[0]);
	else
	{
		rc = encrypt_find_sender(ctx, pepsi_db(ctx), &r[0], &s, &stop);
		if (!stop)
			rc = r[0].outcome == OUTCOME_CLEAR ? encrypt_clear(ctx, &r[0], &s) : encrypt_to(ctx, r, n, &s);
	}
	for (size_t i = 0; i < n; i++)
		buf_free(&r[i].key);
	free(r);
	free(s.from);
	free(s.autocrypt);
	buf_free(&s.public_key);
	buf_wipe(&s.secret);
	return rc;
}

const struct pepsi_stage pepsi_stage_encrypt_stage = {
	.program = "pepsi-stage-encrypt",
	.load = PEPSI_LOAD_FULL,
	.run = encrypt_run,
	.conninfo_section = "crypto",
	/*
	 * The rows waiting are loaded together, as dkim-sign's: one load for up
	 * to ENCRYPT_BATCH_MAX messages rather than one a message, and then
	 * encrypted one after another.  Each message's outcome is still a
	 * commit of its own (an encrypted message's body changed: no arrayed
	 * commit takes it), and a message the stage wrote for (a key request,
	 * a portal link: pepsi_write_with_outcome) commits with those writes
	 * right after it is encrypted, so that they stand or fall with it.
	 */
	.batch_max = ENCRYPT_BATCH_MAX,
};

int
pepsi_stage_encrypt_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_encrypt_stage, argc, argv);
}
