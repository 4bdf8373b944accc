/*
 * pepsi-stage-autocrypt-learn: record what inbound mail says about its
 * sender's keys (Autocrypt Level 1).
 *
 * A message with one Autocrypt: field whose addr is its From: address
 * (and no attribute it does not know that does not start with "_") gives
 * that key to pepsi.peer_key, source autocrypt, with prefer-encrypt, once
 * the key passes the checks pepsi-stage-encrypt makes (not revoked, not
 * expired, a User ID of the address), for KEY_LIFETIME; a key that fails
 * them is not stored, the reason in state.autocrypt.  A message that
 * pepsi-stage-decrypt decrypted with one of our identities and whose
 * signature by the sender's own key passed proves the sender holds our
 * key: pepsi.peer_has_own_key records it.
 *
 * An S/MIME signed message (RFC 8551: multipart/signed, or signed-data)
 * whose signature is good (the signer's certificate chains to a CA of
 * pepsi.ca_trust, is valid now and names the From: address) gives the
 * signer's certificate to pepsi.peer_key, source smime-signed, with the
 * ciphers its SMIMECapabilities attribute announces
 * (peer_key.smime_capabilities), for KEY_LIFETIME: later mail to that
 * sender can be encrypted to it (pepsi-stage-encrypt), with AES-256-GCM
 * when the sender announced it.  A signature that is not good, or a
 * certificate that may not encrypt mail for the address, teaches nothing;
 * the reason is in state.smime.
 *
 * Nothing else changes: the row goes on as it is.  Place it after
 * pepsi-stage-decrypt.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/base64.h"
#include "base/log.h"
#include "crypto/keystore.h"
#include "crypto/openpgp.h"
#include "crypto/pgpmime.h"
#include "crypto/smime.h"
#include "message/header.h"
#include "runtime/stage.h"

int pepsi_stage_autocrypt_learn_main(int argc, char **argv);

#define AUTOCRYPT_KEY_MAX (64 * 1024)

struct autocrypt
{
	char	   addr[320];
	bool	   mutual;
	struct buf keydata; /* base64 */
};

/* Parse an Autocrypt: value; false with why if it must be ignored. */
static bool
autocrypt_parse(const char *value, struct autocrypt *a, char *why, size_t whylen)
{
	const char *p = value;

	memset(a, 0, sizeof(*a));
	while (*p)
	{
		const char *semi, *eq;
		size_t		len;

		while (*p == ' ' || *p == '\t' || *p == ';' || *p == '\r' || *p == '\n')
			p++;
		if (*p == '\0')
			break;
		semi = strchr(p, ';');
		len = semi ? (size_t) (semi - p) : strlen(p);
		eq = memchr(p, '=', len);
		if (eq == NULL)
		{
			snprintf(why, whylen, "an attribute without a value");
			return false;
		}
		if ((size_t) (eq - p) == 4 && strncasecmp(p, "addr", 4) == 0)
		{
			size_t vlen = len - 5;

			while (vlen > 0 && (p[5 + vlen - 1] == ' ' || p[5 + vlen - 1] == '\t'))
				vlen--;
			if (vlen >= sizeof(a->addr))
			{
				snprintf(why, whylen, "addr too long");
				return false;
			}
			for (size_t i = 0; i < vlen; i++)
				a->addr[i] = (char) tolower((unsigned char) p[5 + i]);
		}
		else if ((size_t) (eq - p) == 14 && strncasecmp(p, "prefer-encrypt", 14) == 0)
			a->mutual = len - 15 >= 6 && strncasecmp(eq + 1, "mutual", 6) == 0;
		else if ((size_t) (eq - p) == 7 && strncasecmp(p, "keydata", 7) == 0)
		{
			for (const char *c = eq + 1; c < p + len; c++)
				if (*c != ' ' && *c != '\t' && *c != '\r' && *c != '\n')
					buf_append_char(&a->keydata, *c);
		}
		else if (*p != '_')
		{
			snprintf(why, whylen, "an unknown critical attribute %.*s", (int) (eq - p), p);
			return false;
		}
		p += len;
	}
	if (a->addr[0] == '\0' || a->keydata.len == 0)
	{
		snprintf(why, whylen, "no %s", a->addr[0] ? "keydata" : "addr");
		return false;
	}
	return true;
}

/* Record that from holds our key fingerprint (state.decrypt says so). */
static void
learn_own_key(struct pepsi_ctx *ctx, const char *from)
{
	json_t	   *d = json_object_get(pepsi_state(ctx), "decrypt");
	const char *key = json_string_value(json_object_get(d, "key"));
	const char *values[2];
	PGresult   *res;

	if (from == NULL || key == NULL || !json_is_string(json_object_get(d, "signature"))
		|| strcmp(json_string_value(json_object_get(d, "signature")), "pass") != 0)
		return;
	values[0] = from;
	values[1] = key;
	res = PQexecParams(pepsi_db(ctx),
					   "INSERT INTO pepsi.peer_has_own_key (peer_address, identity_id)"
					   " SELECT $1, i.id FROM pepsi.crypto_identity i WHERE i.fingerprint = $2"
					   " ON CONFLICT (peer_address, identity_id) DO UPDATE SET last_seen = now()",
					   2, NULL, values, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		log_warnx("%s: recording that %s holds key %s: %s", pepsi_queue_id(ctx), from, key,
				  PQresultErrorMessage(res));
	PQclear(res);
}

/* Record an S/MIME signed message's signer, whose signature is good, with its capabilities: state.smime. */
static void
learn_smime(struct pepsi_ctx *ctx, const char *from)
{
	struct buf			   message = BUF_INIT, cert = BUF_INIT, caps = BUF_INIT, content = BUF_INIT;
	struct buf			  *cas = NULL;
	size_t				   ncas = 0;
	struct pgp_verdict	   v;
	struct smime_cert_info info;
	char				   why[600] = "", err[512];
	const char			  *result = "ignored";
	json_t				  *merge;
	json_t				  *decrypt = json_object_get(pepsi_state(ctx), "decrypt");
	/* pepsi-stage-decrypt verified a signature inside an envelope, and removed it: its word. */
	const char *verified = json_string_value(json_object_get(decrypt, "signer_certificate"));

	memset(&info, 0, sizeof(info));
	memset(&v, 0, sizeof(v));
	if (verified == NULL && (!pepsi_raw_message(ctx, &message) || !smime_is_signed(message.data, message.len)))
	{
		buf_free(&message);
		return;
	}
	if (from == NULL)
		snprintf(why, sizeof(why), "no From: address");
	else if (verified)
	{
		const char *announced = json_string_value(json_object_get(decrypt, "signer_capabilities"));
		size_t		n = strlen(verified);
		long		len;

		buf_reserve(&cert, n);
		len = base64_decode(verified, n, (unsigned char *) cert.data, n, BASE64_STRICT);
		cert.len = len > 0 ? (size_t) len : 0;
		v.good = len > 0;
		if (!v.good)
			snprintf(why, sizeof(why), "state.decrypt.signer_certificate is not base64");
		buf_append_str(&caps, announced ? announced : "");
	}
	else if (keystore_ca_certs(pepsi_db(ctx), &cas, &ncas, err, sizeof(err)) < 0)
		snprintf(why, sizeof(why), "%s", err);
	else if (!smime_verify_signer(message.data, message.len, cas, ncas, NULL, 0, from, &content, &v, &cert, &caps, err,
								  sizeof(err)))
		snprintf(why, sizeof(why), "%s", err);
	if (why[0])
		;
	else if (!v.good)
		snprintf(why, sizeof(why), "the signature is not good: %s", v.reason);
	else if (!smime_inspect(cert.data, cert.len, NULL, from, false, &info, err, sizeof(err)))
		snprintf(why, sizeof(why), "%s", err);
	else
	{
		char		lifetime[32], expires[32] = "";
		const char *values[] = {from, info.fingerprint, info.cert.data, lifetime, NULL, caps.data ? caps.data : ""};
		const int	lengths[] = {0, 0, (int) info.cert.len, 0, 0, 0};
		const int	formats[] = {0, 0, 1, 0, 0, 0};
		PGresult   *res;

		snprintf(lifetime, sizeof(lifetime), "%.0f", pepsi_option_seconds(ctx, "KEY_LIFETIME"));
		if (info.expires)
			snprintf(expires, sizeof(expires), "%lld", (long long) info.expires), values[4] = expires;
		res = PQexecParams(pepsi_db(ctx),
						   "INSERT INTO pepsi.peer_key (address, protocol, fingerprint, key_data, source, verdict,"
						   " cache_until, expires_at, smime_capabilities)"
						   " VALUES ($1, 'smime', $2, $3, 'smime-signed', 'valid',"
						   " now() + make_interval(secs => $4::double precision), to_timestamp($5::bigint),"
						   " string_to_array(nullif($6, ''), ','))"
						   " ON CONFLICT (address, protocol, fingerprint) DO UPDATE SET key_data = excluded.key_data,"
						   " source = excluded.source, verdict = 'valid', verdict_reason = NULL, fetched_at = now(),"
						   " cache_until = excluded.cache_until, expires_at = excluded.expires_at,"
						   " smime_capabilities = excluded.smime_capabilities",
						   6, NULL, values, lengths, formats, 0);
		if (PQresultStatus(res) != PGRES_COMMAND_OK)
		{
			log_warnx("%s: recording %s's certificate: %s", pepsi_queue_id(ctx), from, PQresultErrorMessage(res));
			snprintf(why, sizeof(why), "the certificate could not be recorded");
		}
		else
			result = "learned";
		PQclear(res);
	}
	merge = strcmp(result, "learned") == 0
				? json_pack("{s:{s:s,s:s,s:s}}", "smime", "result", result, "certificate", info.fingerprint,
							"capabilities", caps.data ? caps.data : "")
				: json_pack("{s:{s:s,s:s}}", "smime", "result", result, "reason", why);
	pepsi_merge_state(ctx, merge);
	json_decref(merge);
	keystore_bufs_free(cas, ncas);
	smime_cert_info_free(&info);
	buf_free(&message);
	buf_free(&cert);
	buf_free(&caps);
	buf_wipe(&content);
}

static int
learn_run(struct pepsi_ctx *ctx)
{
	const struct buf *h = pepsi_headers(ctx);
	char			 *from = h ? header_from_address(h->data, h->len) : NULL;
	char			  why[600] = "";
	const char		 *result = "none";
	struct autocrypt  a;

	memset(&a, 0, sizeof(a));
	if (h == NULL)
		return pepsi_error(ctx, "no headers");
	learn_own_key(ctx, from);
	learn_smime(ctx, from);
	if (header_count(h->data, h->len, "Autocrypt") > 1)
		result = "ignored", snprintf(why, sizeof(why), "more than one Autocrypt field");
	else if (header_count(h->data, h->len, "Autocrypt") == 1)
	{
		char *value = header_get(h->data, h->len, "Autocrypt");

		result = "ignored";
		if (!autocrypt_parse(value, &a, why, sizeof(why)))
			;
		else if (from == NULL || strcmp(a.addr, from) != 0)
			snprintf(why, sizeof(why), "addr %s is not the From: address", a.addr);
		else if (a.keydata.len > AUTOCRYPT_KEY_MAX * 4 / 3)
			snprintf(why, sizeof(why), "keydata over %d bytes", AUTOCRYPT_KEY_MAX);
		else
		{
			unsigned char	   *key = malloc(a.keydata.len);
			long				len = key ? base64_decode(a.keydata.data, a.keydata.len, key, a.keydata.len,
														  BASE64_STRICT)
										  : -1;
			struct pgp_key_info info;
			char				err[512];

			if (len <= 0)
				snprintf(why, sizeof(why), "keydata is not base64");
			else if (!pgp_inspect(key, (size_t) len, a.addr, false, &info, err, sizeof(err)))
				snprintf(why, sizeof(why), "%s", err);
			else
			{
				char		lifetime[32];
				char		expires[32] = "";
				const char *values[] = {a.addr, info.fingerprint, info.public_key.data,
										a.mutual ? "true" : "false", lifetime, NULL};
				const int	lengths[] = {0, 0, (int) info.public_key.len, 0, 0, 0};
				const int	formats[] = {0, 0, 1, 0, 0, 0};
				PGresult   *res;

				snprintf(lifetime, sizeof(lifetime), "%.0f", pepsi_option_seconds(ctx, "KEY_LIFETIME"));
				if (info.expires)
					snprintf(expires, sizeof(expires), "%lld", (long long) info.expires), values[5] = expires;
				res = PQexecParams(pepsi_db(ctx),
								   "INSERT INTO pepsi.peer_key (address, protocol, fingerprint, key_data, source,"
								   " verdict, prefer_encrypt, cache_until, expires_at)"
								   " VALUES ($1, 'openpgp', $2, $3, 'autocrypt', 'valid', $4,"
								   " now() + make_interval(secs => $5::double precision), to_timestamp($6::bigint))"
								   " ON CONFLICT (address, protocol, fingerprint) DO UPDATE SET key_data = excluded.key_data,"
								   " verdict = 'valid', verdict_reason = NULL, prefer_encrypt = excluded.prefer_encrypt,"
								   " fetched_at = now(), cache_until = excluded.cache_until, expires_at = excluded.expires_at",
								   6, NULL, values, lengths, formats, 0);
				if (PQresultStatus(res) != PGRES_COMMAND_OK)
				{
					log_warnx("%s: recording %s's key: %s", pepsi_queue_id(ctx), a.addr, PQresultErrorMessage(res));
					snprintf(why, sizeof(why), "the key could not be recorded");
				}
				else
				{
					result = "learned";
					snprintf(why, sizeof(why), "%s", info.fingerprint);
				}
				PQclear(res);
				pgp_key_info_free(&info);
			}
			free(key);
		}
		free(value);
	}
	{
		json_t *merge = json_pack("{s:{s:s,s:s?}}", "autocrypt", "result", result, strcmp(result, "learned") == 0 ? "key" : "reason",
								  why[0] ? why : NULL);

		pepsi_merge_state(ctx, merge);
		json_decref(merge);
	}
	free(from);
	buf_free(&a.keydata);
	return pepsi_advance(ctx);
}

const struct pepsi_stage pepsi_stage_autocrypt_learn_stage = {
	.program = "pepsi-stage-autocrypt-learn",
	/* The body: an S/MIME signature is in it. */
	.load = PEPSI_LOAD_FULL,
	.run = learn_run,
};

int
pepsi_stage_autocrypt_learn_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_autocrypt_learn_stage, argc, argv);
}
