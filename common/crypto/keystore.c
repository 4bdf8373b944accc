/*
 * keystore.c: reading the key store (keystore.h).
 */
#include <stdio.h>
#include <string.h>

#include "crypto/keystore.h"
#include "crypto/pgpsession.h"

/* A bytea column of a binary result into out. */
static void
keystore_bytes(PGresult *res, int row, int col, struct buf *out)
{
	buf_reset(out);
	buf_append(out, PQgetvalue(res, row, col), (size_t) PQgetlength(res, row, col));
}

/* address's identity row: fingerprint, public_key and, when sealed, private_wrapped and kek_id. */
static PGresult *
keystore_identity_row(PGconn *conn, const char *address, const char *capability, bool sealed)
{
	const char *values[] = {address, capability};

	return PQexecParams(conn,
						sealed ? "SELECT fingerprint, public_key, private_wrapped, kek_id FROM pepsi.crypto_identity"
								 " WHERE address = lower($1) AND protocol = 'openpgp' AND is_primary"
								 " AND status = 'active' AND capability IN ($2, 'both')"
								 " AND (expires_at IS NULL OR expires_at > now()) AND private_wrapped IS NOT NULL"
							   : "SELECT fingerprint, public_key FROM pepsi.crypto_identity"
								 " WHERE address = lower($1) AND protocol = 'openpgp' AND is_primary"
								 " AND status = 'active' AND capability IN ($2, 'both')"
								 " AND (expires_at IS NULL OR expires_at > now())",
						2, NULL, values, NULL, NULL, 1);
}

/* Open row 0's sealed key (columns 2 and 3) with the KEK that sealed it. */
static bool
keystore_unseal(PGresult *res, const struct keystore_keks *keks, const char *fingerprint, struct buf *secret,
				char *err, size_t errlen)
{
	char			  kek_id[KEK_ID_MAX + 1];
	const struct kek *kek = &keks->cur;

	snprintf(kek_id, sizeof(kek_id), "%.*s", PQgetlength(res, 0, 3), PQgetvalue(res, 0, 3));
	if (keks->has_prev && strcmp(kek_id, keks->prev.id) == 0)
		kek = &keks->prev;
	return kek_unwrap(kek, fingerprint, PQgetvalue(res, 0, 2), (size_t) PQgetlength(res, 0, 2), secret, err,
					  errlen);
}

int
keystore_identity(PGconn *conn, const struct keystore_keks *keks, const char *address, const char *capability,
				  char *fingerprint, struct buf *public_key, struct buf *secret, char *err, size_t errlen)
{
	PGresult *res = keystore_identity_row(conn, address, capability, secret != NULL);
	int		  rc = 0;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		snprintf(err, errlen, "reading the identity of %s: %s", address, PQresultErrorMessage(res));
		rc = -1;
	}
	else if (PQntuples(res) == 0)
		rc = 1;
	else
	{
		snprintf(fingerprint, 65, "%.*s", PQgetlength(res, 0, 0), PQgetvalue(res, 0, 0));
		keystore_bytes(res, 0, 1, public_key);
		if (secret && !keystore_unseal(res, keks, fingerprint, secret, err, errlen))
			rc = -1;
	}
	PQclear(res);
	return rc;
}

int
keystore_identity_in_session(PGconn *conn, const struct pepsi_config *cfg, const char *address,
							 const char *capability, char *fingerprint, struct buf *public_key, char *err,
							 size_t errlen)
{
	PGresult			*res = keystore_identity_row(conn, address, capability, true);
	unsigned char		 digest[PGP_DIGEST_LEN];
	struct keystore_keks keks;
	struct buf			 secret = BUF_INIT;
	int					 rc = 0;

	memset(&keks, 0, sizeof(keks));
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		snprintf(err, errlen, "reading the identity of %s: %s", address, PQresultErrorMessage(res));
		rc = -1;
	}
	else if (PQntuples(res) == 0)
		rc = 1;
	else
	{
		snprintf(fingerprint, 65, "%.*s", PQgetlength(res, 0, 0), PQgetvalue(res, 0, 0));
		keystore_bytes(res, 0, 1, public_key);
		pgp_digest(PQgetvalue(res, 0, 2), (size_t) PQgetlength(res, 0, 2), digest);
		if (pgp_session_has_secret(fingerprint, digest))
			rc = 0;
		else if (!kek_from_config(cfg, &keks.cur, &keks.prev, &keks.has_prev, err, errlen))
			rc = -2;
		else if (!keystore_unseal(res, &keks, fingerprint, &secret, err, errlen)
				 || !pgp_session_add_secret(fingerprint, digest, secret.data, secret.len, err, errlen))
			rc = -1;
	}
	PQclear(res);
	buf_wipe(&secret);
	kek_wipe(&keks.cur);
	kek_wipe(&keks.prev);
	return rc;
}

int
keystore_peer_key(PGconn *conn, const char *address, char *fingerprint, struct buf *key, char *err, size_t errlen)
{
	const char *values[] = {address};
	PGresult   *res = PQexecParams(conn,
								   "SELECT fingerprint, key_data FROM pepsi.peer_key"
									 " WHERE address = lower($1) AND protocol = 'openpgp' AND verdict = 'valid'"
									 " AND cache_until > now() AND (expires_at IS NULL OR expires_at > now())"
									 " ORDER BY fetched_at DESC, id DESC LIMIT 1",
								   1, NULL, values, NULL, NULL, 1);
	int			rc = 0;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		snprintf(err, errlen, "reading the key of %s: %s", address, PQresultErrorMessage(res));
		rc = -1;
	}
	else if (PQntuples(res) == 0)
		rc = 1;
	else
	{
		snprintf(fingerprint, 65, "%.*s", PQgetlength(res, 0, 0), PQgetvalue(res, 0, 0));
		keystore_bytes(res, 0, 1, key);
	}
	PQclear(res);
	return rc;
}
