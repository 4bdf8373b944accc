/*
 * keystore.c: reading the key store (keystore.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crypto/keystore.h"
#include "crypto/pgpsession.h"
#include "runtime/db.h"

/* A bytea column of a binary result into out. */
static void
keystore_bytes(PGresult *res, int row, int col, struct buf *out)
{
	buf_reset(out);
	buf_append(out, PQgetvalue(res, row, col), (size_t) PQgetlength(res, row, col));
}

/*
 * The key store's reads, prepared once per session (db_exec_prepared).  A
 * crypto stage reads a message's keys for every message (a key revoked or
 * replaced in the database counts from the next message on: nothing is
 * cached from the rows); sent as unnamed statements, pepsi-stage-encrypt's
 * two reads were parsed and planned afresh for every message
 * (bench/crypto's profile).  db.c prepares each on its first use in a
 * session and sends it plainly where preparing failed or the session lost
 * it.  The crypto stages connect directly ([crypto] CONNINFO, never a
 * pooler): see stage.c.
 */
enum keystore_statement
{
	KEYSTORE_IDENTITY,		  /* fingerprint, public_key */
	KEYSTORE_IDENTITY_SEALED, /* and private_wrapped, kek_id */
	KEYSTORE_PEER,
	KEYSTORE_STATEMENTS
};

#define KEYSTORE_IDENTITY_WHERE                                                              \
	" FROM pepsi.crypto_identity WHERE address = lower($1) AND protocol = $3 AND is_primary" \
	" AND status = 'active' AND capability IN ($2, 'both') AND (expires_at IS NULL OR expires_at > now())"

static const struct
{
	const char *name;
	const char *sql;
	int			nparams;
} keystore_statements[KEYSTORE_STATEMENTS] = {
	[KEYSTORE_IDENTITY] = {"pepsi_keystore_identity", "SELECT fingerprint, public_key" KEYSTORE_IDENTITY_WHERE, 3},
	[KEYSTORE_IDENTITY_SEALED] = {"pepsi_keystore_identity_sealed",
								  "SELECT fingerprint, public_key, private_wrapped, kek_id" KEYSTORE_IDENTITY_WHERE
								  " AND private_wrapped IS NOT NULL",
								  3},
	[KEYSTORE_PEER] = {"pepsi_keystore_peer",
					   "SELECT fingerprint, key_data, protocol,"
					   " coalesce('aes-256-gcm' = ANY (smime_capabilities), false)"
					   " FROM pepsi.peer_key"
					   " WHERE address = lower($1) AND ($2::text IS NULL OR protocol = $2)"
					   " AND verdict = 'valid'"
					   " AND cache_until > now() AND (expires_at IS NULL OR expires_at > now())"
					   " ORDER BY fetched_at DESC, id DESC LIMIT 1",
					   2},
};

/* Run statement which, with binary results. */
static PGresult *
keystore_exec(PGconn *conn, enum keystore_statement which, const char *const *values)
{
	return db_exec_prepared(conn, keystore_statements[which].name, keystore_statements[which].sql,
							keystore_statements[which].nparams, values, NULL, NULL, 1);
}

/* address's identity row of protocol: fingerprint, public_key and, when sealed, private_wrapped and kek_id. */
static PGresult *
keystore_identity_row(PGconn *conn, const char *address, const char *capability, bool sealed,
					  const char *protocol)
{
	const char *values[] = {address, capability, protocol};

	return keystore_exec(conn, sealed ? KEYSTORE_IDENTITY_SEALED : KEYSTORE_IDENTITY, values);
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
	PGresult *res = keystore_identity_row(conn, address, capability, secret != NULL, "openpgp");
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
keystore_identity_in_session(PGconn *conn, const struct pepsi_config *cfg, const struct pgp_secret_store *store,
							 const char *address, const char *capability, char *fingerprint, struct buf *public_key, char *err,
							 size_t errlen)
{
	PGresult			*res = keystore_identity_row(conn, address, capability, true, "openpgp");
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
		if (store->has_secret(fingerprint, digest))
			rc = 0;
		else if (!kek_from_config(cfg, &keks.cur, &keks.prev, &keks.has_prev, err, errlen))
			rc = -2;
		else if (!keystore_unseal(res, &keks, fingerprint, &secret, err, errlen)
				 || !store->add_secret(fingerprint, digest, secret.data, secret.len, err, errlen))
			rc = -1;
	}
	PQclear(res);
	buf_wipe(&secret);
	kek_wipe(&keks.cur);
	kek_wipe(&keks.prev);
	return rc;
}

/* address's newest usable key of protocol (NULL: either): see keystore_peer_key. */
static int
keystore_peer_row(PGconn *conn, const char *address, const char *protocol, char *protocol_out, char *fingerprint,
				  struct buf *key, bool *gcm, char *err, size_t errlen)
{
	const char *values[] = {address, protocol};
	PGresult   *res = keystore_exec(conn, KEYSTORE_PEER, values);
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
		if (protocol_out)
			snprintf(protocol_out, KEYSTORE_PROTOCOL_LEN, "%.*s", PQgetlength(res, 0, 2), PQgetvalue(res, 0, 2));
		if (gcm)
			*gcm = PQgetlength(res, 0, 3) == 1 && PQgetvalue(res, 0, 3)[0] == 1;
	}
	PQclear(res);
	return rc;
}

int
keystore_peer_key(PGconn *conn, const char *address, char *fingerprint, struct buf *key, char *err, size_t errlen)
{
	return keystore_peer_row(conn, address, "openpgp", NULL, fingerprint, key, NULL, err, errlen);
}

int
keystore_peer_any(PGconn *conn, const char *address, char *protocol, char *fingerprint, struct buf *key, bool *gcm,
				  char *err, size_t errlen)
{
	return keystore_peer_row(conn, address, NULL, protocol, fingerprint, key, gcm, err, errlen);
}

int
keystore_smime_identity(PGconn *conn, const struct pepsi_config *cfg, const char *address, const char *capability,
						char *fingerprint, struct buf *cert, struct buf *key, char *err, size_t errlen)
{
	PGresult			*res = keystore_identity_row(conn, address, capability, key != NULL, "smime");
	struct keystore_keks keks;
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
		keystore_bytes(res, 0, 1, cert);
		if (key == NULL)
			rc = 0;
		else if (!kek_from_config(cfg, &keks.cur, &keks.prev, &keks.has_prev, err, errlen))
			rc = -2;
		else if (!keystore_unseal(res, &keks, fingerprint, key, err, errlen))
			rc = -1;
	}
	PQclear(res);
	kek_wipe(&keks.cur);
	kek_wipe(&keks.prev);
	return rc;
}

int
keystore_ca_certs(PGconn *conn, struct buf **cas, size_t *count, char *err, size_t errlen)
{
	PGresult *res = PQexecParams(conn,
								 "SELECT certificate FROM pepsi.ca_trust"
								 " WHERE not_after IS NULL OR not_after > now() ORDER BY fingerprint",
								 0, NULL, NULL, NULL, NULL, 1);
	int		  n;

	*cas = NULL;
	*count = 0;
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		snprintf(err, errlen, "reading the trusted CAs: %s", PQresultErrorMessage(res));
		PQclear(res);
		return -1;
	}
	n = PQntuples(res);
	*cas = calloc((size_t) n + 1, sizeof(**cas));
	for (int i = 0; i < n && *cas; i++)
		keystore_bytes(res, i, 0, &(*cas)[(*count)++]);
	PQclear(res);
	return 0;
}

void
keystore_bufs_free(struct buf *bufs, size_t count)
{
	for (size_t i = 0; i < count; i++)
		buf_wipe(&bufs[i]);
	free(bufs);
}
