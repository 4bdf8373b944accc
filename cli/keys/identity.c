/*
 * identity.c: pepsi-keys over the key store.
 *
 *   pepsi-keys kek-generate ID
 *       print a new key-encryption key, the [crypto] KEK line of a
 *       secrets.d fragment readable by the pepsi-crypto group alone
 *   pepsi-keys kek-rotate [-c CONFIG]
 *       seal every private key under [crypto] KEK, opening those sealed
 *       under KEK_PREVIOUS: all or nothing, then KEK_PREVIOUS may go
 *   pepsi-keys identity generate [-t ed25519|rsa3072|smime-rsa3072|smime-ec] [-e DAYS] ADDRESS
 *       a new OpenPGP key pair for ADDRESS, signing and encrypting, the
 *       address's primary (its active primary is retired); smime-*: a
 *       self-signed S/MIME certificate and key instead
 *   pepsi-keys identity import [-P PASSWORD_FILE] ADDRESS FILE
 *       an OpenPGP secret key (armored or binary) for ADDRESS: refused if
 *       revoked, expired, or without a User ID of ADDRESS; or an S/MIME
 *       certificate with its key (PEM, or PKCS#12 opened with the password
 *       in PASSWORD_FILE): refused if expired or not naming ADDRESS
 *   pepsi-keys peer import ADDRESS FILE [CAPABILITIES]
 *       a correspondent's OpenPGP key or S/MIME certificate into peer_key
 *       (CAPABILITIES: the S/MIME ciphers it takes, aes-256-gcm,aes-256-cbc)
 *   pepsi-keys ca import FILE [NOTE]
 *       a CA certificate inbound S/MIME signatures may chain to (ca_trust)
 *   pepsi-keys identity export ADDRESS|FINGERPRINT
 *       the public key, armored, on standard output
 *   pepsi-keys identity list
 *   pepsi-keys identity wkd DIRECTORY
 *       the Web Key Directory tree of every primary key, marked published
 *   pepsi-keys identity openpgpkey ADDRESS
 *       the DNS OPENPGPKEY record (RFC 7929) of ADDRESS's primary key
 *   pepsi-keys identity revoke FINGERPRINT [REASON]
 *   pepsi-keys identity purge FINGERPRINT
 *       drop the private half (the row and the public half stay)
 *
 * They connect with [crypto] CONNINFO, as a member of pepsi_crypto (run
 * them as the pepsi-crypto user: peer authentication), and each change is
 * one transaction with its pepsi.event_log row (pepsi.key_event).
 */
#include <ctype.h>
#include <endian.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <libpq-fe.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/x509.h>

#include "base/base64.h"
#include "base/log.h"
#include "config/config.h"
#include "crypto/kek.h"
#include "crypto/openpgp.h"
#include "crypto/smime.h"
#include "crypto/wkd.h"
#include "identity.h"
#include "process/cli.h"
#include "runtime/db.h"

#define KEY_FILE_MAX (1024 * 1024)
/* sysexits(3), beside cli.h's */
#define CLI_EX_NOINPUT 66
#define CLI_EX_SOFTWARE 70
#define CLI_EX_CANTCREAT 73

const char keys_identity_usage[] =
	"       pepsi-keys kek-generate ID\n"
	"       pepsi-keys kek-rotate [-c CONFIG]\n"
	"       pepsi-keys identity generate [-c CONFIG] [-t ed25519|rsa3072|smime-rsa3072|smime-ec] [-e DAYS] ADDRESS\n"
	"       pepsi-keys identity import [-c CONFIG] [-P PASSWORD_FILE] ADDRESS FILE\n"
	"       pepsi-keys identity export [-c CONFIG] ADDRESS|FINGERPRINT\n"
	"       pepsi-keys identity list [-c CONFIG]\n"
	"       pepsi-keys identity wkd [-c CONFIG] DIRECTORY\n"
	"       pepsi-keys identity openpgpkey [-c CONFIG] ADDRESS\n"
	"       pepsi-keys identity revoke [-c CONFIG] FINGERPRINT [REASON]\n"
	"       pepsi-keys identity purge [-c CONFIG] FINGERPRINT\n"
	"       pepsi-keys peer import [-c CONFIG] ADDRESS FILE [CAPABILITIES]\n"
	"       pepsi-keys ca import [-c CONFIG] FILE [NOTE]\n";

int
keys_identity_command(const char *command)
{
	return strcmp(command, "identity") == 0 || strcmp(command, "peer") == 0 || strcmp(command, "ca") == 0
		   || strcmp(command, "kek-generate") == 0
		   || strcmp(command, "kek-rotate") == 0;
}

/* The key store's connection and the configuration; NULL after saying why. */
static PGconn *
identity_connect(const char *config_path, struct pepsi_config **cfg, int *rc)
{
	char	err[512];
	PGconn *conn;

	*cfg = config_load(config_path, err, sizeof(err));
	if (*cfg == NULL)
	{
		fprintf(stderr, "pepsi-keys: %s\n", err);
		*rc = CLI_EX_CONFIG;
		return NULL;
	}
	conn = db_connect_as(*cfg, "crypto", "CONNINFO", "pepsi-keys", err, sizeof(err));
	if (conn == NULL)
	{
		fprintf(stderr, "pepsi-keys: %s\n", err);
		config_free(*cfg);
		*cfg = NULL;
		*rc = CLI_EX_TEMPFAIL;
	}
	return conn;
}

/* Run sql with text parameters (a NULL value is SQL NULL; binary ones where lengths[i] > 0). */
static PGresult *
identity_exec(PGconn *conn, const char *sql, int n, const char *const *values, const int *lengths)
{
	int formats[8] = {0};

	for (int i = 0; lengths && i < n; i++)
		formats[i] = lengths[i] > 0;
	return PQexecParams(conn, sql, n, NULL, values, lengths, formats, 0);
}

static bool
identity_ok(PGresult *res, const char *what)
{
	ExecStatusType st = PQresultStatus(res);

	if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
		return true;
	fprintf(stderr, "pepsi-keys: %s: %s", what, PQresultErrorMessage(res));
	return false;
}

/* Run sql; false after saying why. */
static bool
identity_run(PGconn *conn, const char *what, const char *sql, int n, const char *const *values,
			 const int *lengths)
{
	PGresult *res = identity_exec(conn, sql, n, values, lengths);
	bool	  ok = identity_ok(res, what);

	PQclear(res);
	return ok;
}

/* An address as the key store keeps it: lower case, local@domain. */
static bool
identity_address(const char *in, char *out, size_t outlen)
{
	const char *at = strrchr(in, '@');
	size_t		len = strlen(in);

	if (at == NULL || at == in || at[1] == '\0' || len >= outlen || strpbrk(in, " <>\t\r\n\"") != NULL)
	{
		fprintf(stderr, "pepsi-keys: %s is not an address (local@domain)\n", in);
		return false;
	}
	for (size_t i = 0; i <= len; i++)
		out[i] = (char) tolower((unsigned char) in[i]);
	return true;
}

static int
kek_generate_command(const char *id)
{
	struct buf out = BUF_INIT;
	char	   err[256];

	if (!kek_generate(id, &out, err, sizeof(err)))
	{
		fprintf(stderr, "pepsi-keys: %s\n", err);
		return CLI_EX_USAGE;
	}
	printf("[crypto]\nKEK = %s\n", out.data);
	buf_wipe(&out);
	return CLI_EX_OK;
}

/* A new identity to store, of either protocol. */
struct identity_new
{
	const char		 *protocol;
	const char		 *algorithm;
	const char		 *fingerprint;
	const struct buf *public_key;
	const struct buf *secret;
	time_t			  expires;
	bool			  can_sign, can_encrypt;
};

/* Store a new identity (sealed under kek) as address's primary of its protocol; one transaction. */
static int
identity_store(PGconn *conn, const struct kek *kek, const char *address, const struct identity_new *id,
			   const char *action)
{
	struct buf	wrapped = BUF_INIT;
	char		err[512];
	char		expires[32] = "";
	const char *capability = id->can_sign && id->can_encrypt ? "both" : id->can_sign ? "sign"
																					 : "encrypt";
	int			rc = CLI_EX_OK;

	if (!kek_wrap(kek, id->fingerprint, id->secret->data, id->secret->len, &wrapped, err, sizeof(err)))
	{
		fprintf(stderr, "pepsi-keys: %s\n", err);
		return CLI_EX_SOFTWARE;
	}
	if (id->expires)
		snprintf(expires, sizeof(expires), "%lld", (long long) id->expires);
	{
		const char *values[] = {address, capability, id->algorithm, id->fingerprint, id->public_key->data,
								wrapped.data, kek->id, expires[0] ? expires : NULL, id->protocol};
		const int	lengths[] = {0, 0, 0, 0, (int) id->public_key->len, (int) wrapped.len, 0, 0, 0};
		const char *event[] = {action, address, id->fingerprint, id->algorithm, capability, id->protocol};

		if (!identity_run(conn, "BEGIN", "BEGIN", 0, NULL, NULL)
			|| !identity_run(conn, "retiring the primary key",
							 "UPDATE pepsi.crypto_identity SET is_primary = false, status = 'retired'"
							 " WHERE address = $1 AND protocol = $2 AND is_primary",
							 2, (const char *const[]){address, id->protocol}, NULL)
			|| !identity_run(conn, "storing the key",
							 "INSERT INTO pepsi.crypto_identity (address, protocol, capability, algorithm,"
							 " fingerprint, public_key, private_wrapped, kek_id, expires_at, is_primary)"
							 " VALUES ($1, $9, $2, $3, $4, $5, $6, $7, to_timestamp($8::bigint), true)",
							 9, values, lengths)
			|| !identity_run(conn, "recording the event",
							 "SELECT pepsi.key_event($1, jsonb_build_object('address', $2::text, 'fingerprint', "
							 "$3::text, 'algorithm', $4::text, 'capability', $5::text, 'protocol', $6::text))",
							 6, event, NULL)
			|| !identity_run(conn, "COMMIT", "COMMIT", 0, NULL, NULL))
		{
			PQclear(PQexec(conn, "ROLLBACK"));
			rc = CLI_EX_DATAERR;
		}
	}
	buf_wipe(&wrapped);
	if (rc == CLI_EX_OK)
		printf("%s %s %s %s %s\n", address, id->fingerprint, id->protocol, id->algorithm, capability);
	return rc;
}

/* Store an OpenPGP key pair. */
static int
identity_store_pgp(PGconn *conn, const struct kek *kek, const char *address, struct pgp_key_info *info,
				   const char *action)
{
	struct identity_new id = {"openpgp", info->algorithm, info->fingerprint, &info->public_key,
							  &info->secret_key, info->expires, info->can_sign, info->can_encrypt};

	return identity_store(conn, kek, address, &id, action);
}

/* Store an S/MIME certificate and key. */
static int
identity_store_smime(PGconn *conn, const struct kek *kek, const char *address, struct smime_cert_info *info,
					 const char *action)
{
	struct identity_new id = {"smime", info->algorithm, info->fingerprint, &info->cert,
							  &info->key, info->expires, info->can_sign, info->can_encrypt};

	return identity_store(conn, kek, address, &id, action);
}

static int
identity_generate_command(PGconn *conn, const struct kek *kek, const char *type, int days, const char *address)
{
	struct pgp_key_info info;
	char				err[512];
	int					rc;

	if (strncmp(type, "smime-", 6) == 0)
	{
		struct smime_cert_info cert;

		if (!smime_generate(address, type + 6, days, &cert, err, sizeof(err)))
		{
			fprintf(stderr, "pepsi-keys: %s: %s\n", address, err);
			return CLI_EX_DATAERR;
		}
		rc = identity_store_smime(conn, kek, address, &cert, "key_generate");
		smime_cert_info_free(&cert);
		return rc;
	}
	if (!pgp_generate(address, type, days, &info, err, sizeof(err)))
	{
		fprintf(stderr, "pepsi-keys: %s: %s\n", address, err);
		return CLI_EX_DATAERR;
	}
	rc = identity_store_pgp(conn, kek, address, &info, "key_generate");
	pgp_key_info_free(&info);
	return rc;
}

/* A password from a file (its first line), for a PKCS#12 bundle; "" without one. */
static bool
identity_password(const char *path, char *out, size_t outlen)
{
	struct buf data = BUF_INIT;
	char	   err[512];
	size_t	   n;

	out[0] = '\0';
	if (path == NULL)
		return true;
	if (!buf_append_file(&data, path, outlen - 1, err, sizeof(err)))
	{
		fprintf(stderr, "pepsi-keys: -P: %s\n", err);
		buf_wipe(&data);
		return false;
	}
	for (n = 0; n < data.len && data.data[n] != '\n' && data.data[n] != '\r'; n++)
		out[n] = data.data[n];
	out[n] = '\0';
	buf_wipe(&data);
	return true;
}

static int
identity_import_command(PGconn *conn, const struct kek *kek, const char *address, const char *path,
						const char *password_file)
{
	struct pgp_key_info	   info;
	struct smime_cert_info cert;
	struct buf			   data = BUF_INIT;
	char				   err[512], password[256];
	int					   rc;

	if (!identity_password(password_file, password, sizeof(password)))
		return CLI_EX_NOINPUT;
	if (!buf_append_file(&data, path, KEY_FILE_MAX, err, sizeof(err)))
	{
		fprintf(stderr, "pepsi-keys: %s\n", err);
		buf_wipe(&data);
		return CLI_EX_NOINPUT;
	}
	if (smime_looks_like(data.data, data.len))
	{
		bool ok = smime_inspect(data.data, data.len, password, address, true, &cert, err, sizeof(err));

		buf_wipe(&data);
		OPENSSL_cleanse(password, sizeof(password));
		if (!ok)
		{
			fprintf(stderr, "pepsi-keys: %s: %s\n", path, err);
			return CLI_EX_DATAERR;
		}
		rc = identity_store_smime(conn, kek, address, &cert, "key_import");
		smime_cert_info_free(&cert);
		return rc;
	}
	if (!pgp_inspect(data.data, data.len, address, true, &info, err, sizeof(err)))
	{
		fprintf(stderr, "pepsi-keys: %s: %s\n", path, err);
		buf_wipe(&data);
		return CLI_EX_DATAERR;
	}
	buf_wipe(&data);
	rc = identity_store_pgp(conn, kek, address, &info, "key_import");
	pgp_key_info_free(&info);
	return rc;
}

/*
 * pepsi-keys peer import ADDRESS FILE [CAPABILITIES]: a correspondent's
 * OpenPGP key or S/MIME certificate into pepsi.peer_key (source import,
 * verdict valid, no cache deadline) once checked for address.
 */
static int
peer_import_command(PGconn *conn, const char *address, const char *path, const char *capabilities)
{
	struct pgp_key_info	   info;
	struct smime_cert_info cert;
	struct buf			   data = BUF_INIT;
	char				   err[512], expires[32] = "", caps[300] = "";
	bool				   smime;
	const struct buf	  *key;
	const char			  *fpr;
	time_t				   exp;
	int					   rc = CLI_EX_OK;

	memset(&info, 0, sizeof(info));
	memset(&cert, 0, sizeof(cert));
	if (!buf_append_file(&data, path, KEY_FILE_MAX, err, sizeof(err)))
	{
		fprintf(stderr, "pepsi-keys: %s\n", err);
		return CLI_EX_NOINPUT;
	}
	smime = smime_looks_like(data.data, data.len);
	if (smime ? !smime_inspect(data.data, data.len, NULL, address, false, &cert, err, sizeof(err))
			  : !pgp_inspect(data.data, data.len, address, false, &info, err, sizeof(err)))
	{
		fprintf(stderr, "pepsi-keys: %s: %s\n", path, err);
		buf_free(&data);
		return CLI_EX_DATAERR;
	}
	buf_free(&data);
	key = smime ? &cert.cert : &info.public_key;
	fpr = smime ? cert.fingerprint : info.fingerprint;
	exp = smime ? cert.expires : info.expires;
	if (exp)
		snprintf(expires, sizeof(expires), "%lld", (long long) exp);
	if (capabilities)
		snprintf(caps, sizeof(caps), "{%s}", capabilities);
	{
		const char *values[] = {address, smime ? "smime" : "openpgp", fpr, key->data, expires[0] ? expires : NULL,
								capabilities ? caps : NULL};
		const int	lengths[] = {0, 0, 0, (int) key->len, 0, 0};

		if (!identity_run(conn, "storing the key",
						  "INSERT INTO pepsi.peer_key (address, protocol, fingerprint, key_data, source, verdict,"
						  " expires_at, cache_until, smime_capabilities)"
						  " VALUES ($1, $2, $3, $4, 'import', 'valid', to_timestamp($5::bigint), 'infinity', $6)"
						  " ON CONFLICT (address, protocol, fingerprint) DO UPDATE SET key_data = EXCLUDED.key_data,"
						  " verdict = 'valid', verdict_reason = NULL, expires_at = EXCLUDED.expires_at,"
						  " fetched_at = now(), cache_until = 'infinity',"
						  " smime_capabilities = EXCLUDED.smime_capabilities",
						  6, values, lengths))
			rc = CLI_EX_DATAERR;
		else
			printf("%s %s %s peer\n", address, fpr, smime ? "smime" : "openpgp");
	}
	pgp_key_info_free(&info);
	smime_cert_info_free(&cert);
	return rc;
}

/* pepsi-keys ca import FILE [NOTE]: a CA certificate S/MIME signatures may chain to (pepsi.ca_trust). */
static int
ca_import_command(PGconn *conn, const char *path, const char *note)
{
	struct buf data = BUF_INIT;
	char	   err[512];
	int		   rc = CLI_EX_OK;
	X509	  *x = NULL;
	BIO		  *bio;

	if (!buf_append_file(&data, path, KEY_FILE_MAX, err, sizeof(err)))
	{
		fprintf(stderr, "pepsi-keys: %s\n", err);
		return CLI_EX_NOINPUT;
	}
	bio = BIO_new_mem_buf(data.data, (int) data.len);
	x = PEM_read_bio_X509(bio, NULL, NULL, NULL);
	BIO_free(bio);
	if (x == NULL)
	{
		const unsigned char *p = (const unsigned char *) data.data;

		x = d2i_X509(NULL, &p, (long) data.len);
	}
	buf_free(&data);
	if (x == NULL)
	{
		fprintf(stderr, "pepsi-keys: %s: not an X.509 certificate (PEM or DER)\n", path);
		return CLI_EX_DATAERR;
	}
	{
		unsigned char *der = NULL, md[32];
		int			   n = i2d_X509(x, &der);
		char		   fpr[65], subject[512], not_after[32];
		struct tm	   tm;

		SHA256(der, (size_t) n, md);
		for (int i = 0; i < 32; i++)
			snprintf(fpr + 2 * i, 3, "%02X", md[i]);
		X509_NAME_oneline(X509_get_subject_name(x), subject, sizeof(subject));
		snprintf(not_after, sizeof(not_after), "%lld",
				 ASN1_TIME_to_tm(X509_get0_notAfter(x), &tm) == 1 ? (long long) timegm(&tm) : 0LL);
		{
			const char *values[] = {fpr, subject, (const char *) der, not_after, note};
			const int	lengths[] = {0, 0, n, 0, 0};

			if (!identity_run(conn, "storing the CA",
							  "INSERT INTO pepsi.ca_trust (fingerprint, subject, certificate, not_after, note)"
							  " VALUES ($1, $2, $3, to_timestamp($4::bigint), $5) ON CONFLICT (fingerprint) DO NOTHING",
							  5, values, lengths))
				rc = CLI_EX_DATAERR;
			else
				printf("%s %s ca\n", fpr, subject);
		}
		OPENSSL_free(der);
	}
	X509_free(x);
	return rc;
}

static int
identity_export_command(PGconn *conn, const char *which)
{
	const char *values[] = {which};
	PGresult   *res = identity_exec(conn,
									"SELECT public_key, protocol FROM pepsi.crypto_identity"
									  " WHERE fingerprint = upper($1) OR (address = lower($1) AND is_primary)"
									  " ORDER BY protocol = 'openpgp' DESC LIMIT 1",
									1, values, NULL);
	int			rc = CLI_EX_OK;

	if (!identity_ok(res, "reading the key"))
		rc = CLI_EX_TEMPFAIL;
	else if (PQntuples(res) != 1)
	{
		fprintf(stderr, "pepsi-keys: %s: no such key (an address's primary, or a fingerprint)\n", which);
		rc = CLI_EX_DATAERR;
	}
	else
	{
		size_t		   len = 0;
		unsigned char *key = PQunescapeBytea((const unsigned char *) PQgetvalue(res, 0, 0), &len);
		struct buf	   out = BUF_INIT;
		char		   err[512];

		bool smime = strcmp(PQgetvalue(res, 0, 1), "smime") == 0;

		if (key && (smime ? smime_cert_pem(key, len, &out, err, sizeof(err)) : pgp_armor(key, len, &out, err, sizeof(err))))
			fwrite(out.data, 1, out.len, stdout);
		else
		{
			fprintf(stderr, "pepsi-keys: %s: %s\n", which, key ? err : "out of memory");
			rc = CLI_EX_SOFTWARE;
		}
		PQfreemem(key);
		buf_free(&out);
	}
	PQclear(res);
	return rc;
}

static int
identity_list_command(PGconn *conn)
{
	PGresult *res = PQexec(conn, "SELECT address, protocol, fingerprint, algorithm, capability, status,"
								 " CASE WHEN is_primary THEN 'primary' ELSE '-' END,"
								 " coalesce(to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD'), 'never'),"
								 " CASE WHEN private_wrapped IS NULL THEN 'purged' ELSE 'private' END"
								 " FROM pepsi.crypto_identity ORDER BY address, protocol, created_at");

	if (!identity_ok(res, "listing the keys"))
	{
		PQclear(res);
		return CLI_EX_TEMPFAIL;
	}
	for (int i = 0; i < PQntuples(res); i++)
		for (int j = 0; j < PQnfields(res); j++)
			printf("%s%c", PQgetvalue(res, i, j), j + 1 < PQnfields(res) ? ' ' : '\n');
	PQclear(res);
	return CLI_EX_OK;
}

/* Write path from data; false after saying why. */
static bool
wkd_write(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");

	if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0)
	{
		fprintf(stderr, "pepsi-keys: %s: %s\n", path, strerror(errno));
		if (f)
			fclose(f);
		return false;
	}
	return true;
}

static bool
wkd_mkdir(const char *path)
{
	if (mkdir(path, 0755) == 0 || errno == EEXIST)
		return true;
	fprintf(stderr, "pepsi-keys: %s: %s\n", path, strerror(errno));
	return false;
}

/*
 * Publish every active primary OpenPGP identity in a Web Key Directory
 * tree under dir: DIR/DOMAIN/hu/HASH (the key, binary) and DIR/DOMAIN/policy,
 * what https://openpgpkey.DOMAIN/.well-known/openpgpkey/DOMAIN/ (advanced)
 * or https://DOMAIN/.well-known/openpgpkey/ (direct) serves; marks them
 * published, with a key_publish event.
 */
static int
identity_wkd_command(PGconn *conn, const char *dir)
{
	PGresult *res = PQexecParams(conn,
								 "SELECT address, fingerprint, public_key FROM pepsi.crypto_identity"
								 " WHERE protocol = 'openpgp' AND is_primary AND status = 'active' ORDER BY address",
								 0, NULL, NULL, NULL, NULL, 1);
	int		  rc = CLI_EX_OK;

	if (!identity_ok(res, "reading the keys"))
	{
		PQclear(res);
		return CLI_EX_TEMPFAIL;
	}
	if (!wkd_mkdir(dir))
		rc = CLI_EX_CANTCREAT;
	for (int i = 0; rc == CLI_EX_OK && i < PQntuples(res); i++)
	{
		char		address[320], fpr[65], hash[40], path[PATH_MAX];
		const char *at;

		snprintf(address, sizeof(address), "%.*s", PQgetlength(res, i, 0), PQgetvalue(res, i, 0));
		snprintf(fpr, sizeof(fpr), "%.*s", PQgetlength(res, i, 1), PQgetvalue(res, i, 1));
		at = strrchr(address, '@');
		if (at == NULL || strchr(at + 1, '/') || at[1] == '.')
			continue;
		wkd_hash(address, (size_t) (at - address), hash);
		snprintf(path, sizeof(path), "%s/%s", dir, at + 1);
		if (!wkd_mkdir(path))
		{
			rc = CLI_EX_CANTCREAT;
			break;
		}
		snprintf(path, sizeof(path), "%s/%s/policy", dir, at + 1);
		if (!wkd_write(path, "", 0))
			rc = CLI_EX_CANTCREAT;
		snprintf(path, sizeof(path), "%s/%s/hu", dir, at + 1);
		if (rc == CLI_EX_OK && !wkd_mkdir(path))
			rc = CLI_EX_CANTCREAT;
		snprintf(path, sizeof(path), "%s/%s/hu/%s", dir, at + 1, hash);
		if (rc == CLI_EX_OK && !wkd_write(path, PQgetvalue(res, i, 2), (size_t) PQgetlength(res, i, 2)))
			rc = CLI_EX_CANTCREAT;
		if (rc == CLI_EX_OK)
		{
			const char *values[] = {fpr, address, hash};

			if (!identity_run(conn, "marking it published",
							  "UPDATE pepsi.crypto_identity SET published = true WHERE fingerprint = $1", 1, values,
							  NULL)
				|| !identity_run(conn, "recording the event",
								 "SELECT pepsi.key_event('key_publish', jsonb_build_object('fingerprint', $1::text,"
								 " 'address', $2::text, 'wkd', $3::text))",
								 3, values, NULL))
				rc = CLI_EX_TEMPFAIL;
			else
				printf("%s %s/%s/hu/%s\n", address, dir, at + 1, hash);
		}
	}
	PQclear(res);
	return rc;
}

/* The OPENPGPKEY record (RFC 7929) of an address's primary key. */
static int
identity_openpgpkey_command(PGconn *conn, const char *address)
{
	const char *values[] = {address};
	PGresult   *res = PQexecParams(conn,
								   "SELECT public_key FROM pepsi.crypto_identity WHERE address = lower($1)"
									 " AND protocol = 'openpgp' AND is_primary AND status = 'active'",
								   1, NULL, values, NULL, NULL, 1);
	const char *at = strrchr(address, '@');
	int			rc = CLI_EX_OK;

	if (!identity_ok(res, "reading the key"))
		rc = CLI_EX_TEMPFAIL;
	else if (at == NULL || PQntuples(res) != 1)
	{
		fprintf(stderr, "pepsi-keys: %s has no primary OpenPGP key\n", address);
		rc = CLI_EX_DATAERR;
	}
	else
	{
		unsigned char digest[SHA256_DIGEST_LENGTH];
		struct buf	  b64 = BUF_INIT;

		/* The owner name: the SHA2-256 of the local part (as written), truncated to 28 octets, in hex. */
		SHA256((const unsigned char *) address, (size_t) (at - address), digest);
		for (int i = 0; i < 28; i++)
			printf("%02x", digest[i]);
		base64_append(&b64, PQgetvalue(res, 0, 0), (size_t) PQgetlength(res, 0, 0));
		printf("._openpgpkey.%s. IN OPENPGPKEY %s\n", at + 1, b64.data);
		buf_free(&b64);
	}
	PQclear(res);
	return rc;
}

/* revoke or purge one key by fingerprint, with its event; one transaction. */
static int
identity_change_command(PGconn *conn, const char *action, const char *fingerprint, const char *reason)
{
	const char *values[] = {fingerprint, reason};
	const char *sql = strcmp(action, "key_revoke") == 0
						  ? "UPDATE pepsi.crypto_identity SET status = 'revoked', is_primary = false,"
							" revoked_at = now(), revocation_reason = $2"
							" WHERE fingerprint = upper($1) AND status <> 'revoked' RETURNING address"
						  : "UPDATE pepsi.crypto_identity SET private_wrapped = NULL, kek_id = NULL,"
							" private_purged_at = now(), is_primary = false,"
							" status = CASE WHEN status = 'active' THEN 'retired' ELSE status END"
							" WHERE fingerprint = upper($1) AND private_wrapped IS NOT NULL RETURNING address";
	PGresult   *res;
	int			rc = CLI_EX_OK;

	if (!identity_run(conn, "BEGIN", "BEGIN", 0, NULL, NULL))
		return CLI_EX_TEMPFAIL;
	res = identity_exec(conn, sql, strcmp(action, "key_revoke") == 0 ? 2 : 1, values, NULL);
	if (!identity_ok(res, action + 4))
		rc = CLI_EX_DATAERR;
	else if (PQntuples(res) != 1)
	{
		fprintf(stderr, "pepsi-keys: %s: no such key%s\n", fingerprint,
				strcmp(action, "key_revoke") == 0 ? " that is not revoked already" : " with its private half");
		rc = CLI_EX_DATAERR;
	}
	else
	{
		const char *event[] = {action, PQgetvalue(res, 0, 0), fingerprint, reason};

		if (!identity_run(conn, "recording the event",
						  "SELECT pepsi.key_event($1, jsonb_strip_nulls(jsonb_build_object('address', $2::text,"
						  " 'fingerprint', upper($3), 'reason', $4::text)))",
						  4, event, NULL)
			|| !identity_run(conn, "COMMIT", "COMMIT", 0, NULL, NULL))
			rc = CLI_EX_DATAERR;
	}
	PQclear(res);
	if (rc != CLI_EX_OK)
		PQclear(PQexec(conn, "ROLLBACK"));
	else
		printf("%s %s\n", strcmp(action, "key_revoke") == 0 ? "revoked" : "purged", fingerprint);
	return rc;
}

/* Rewrap every private key not sealed under cur; all or nothing. */
static int
kek_rotate_command(PGconn *conn, const struct kek *cur, const struct kek *prev, bool has_prev)
{
	PGresult *res;
	int		  rc = CLI_EX_OK;
	int		  rewrapped = 0;
	char	  count[16];

	if (!identity_run(conn, "BEGIN", "BEGIN", 0, NULL, NULL))
		return CLI_EX_TEMPFAIL;
	res = PQexecParams(conn,
					   "SELECT id, fingerprint, private_wrapped, kek_id FROM pepsi.crypto_identity"
					   " WHERE private_wrapped IS NOT NULL FOR UPDATE",
					   0, NULL, NULL, NULL, NULL, 1);
	if (!identity_ok(res, "reading the keys"))
		rc = CLI_EX_TEMPFAIL;
	for (int i = 0; rc == CLI_EX_OK && i < PQntuples(res); i++)
	{
		const char *fingerprint = PQgetvalue(res, i, 1);
		const char *kek_id = PQgetvalue(res, i, 3);
		struct buf	plain = BUF_INIT, wrapped = BUF_INIT;
		char		err[512];
		char		id[24];
		uint64_t	raw_id;

		if (strcmp(kek_id, cur->id) == 0)
			continue;
		if (!has_prev || strcmp(kek_id, prev->id) != 0)
		{
			fprintf(stderr, "pepsi-keys: the private key of %s is sealed under KEK %s, which is neither [crypto] KEK (%s) nor KEK_PREVIOUS%s: nothing rewrapped\n",
					fingerprint, kek_id, cur->id, has_prev ? "" : " (unset)");
			rc = CLI_EX_CONFIG;
			break;
		}
		if (!kek_unwrap(prev, fingerprint, PQgetvalue(res, i, 2), (size_t) PQgetlength(res, i, 2), &plain, err,
						sizeof(err))
			|| !kek_wrap(cur, fingerprint, plain.data, plain.len, &wrapped, err, sizeof(err)))
		{
			fprintf(stderr, "pepsi-keys: %s: nothing rewrapped\n", err);
			rc = CLI_EX_DATAERR;
		}
		else
		{
			memcpy(&raw_id, PQgetvalue(res, i, 0), sizeof(raw_id));
			snprintf(id, sizeof(id), "%llu", (unsigned long long) be64toh(raw_id));
			{
				const char *values[] = {id, wrapped.data, cur->id};
				const int	lengths[] = {0, (int) wrapped.len, 0};

				if (!identity_run(conn, "rewrapping",
								  "UPDATE pepsi.crypto_identity SET private_wrapped = $2, kek_id = $3 WHERE id = $1",
								  3, values, lengths))
					rc = CLI_EX_DATAERR;
				else
					rewrapped++;
			}
		}
		buf_wipe(&plain);
		buf_wipe(&wrapped);
	}
	PQclear(res);
	snprintf(count, sizeof(count), "%d", rewrapped);
	if (rc == CLI_EX_OK)
	{
		const char *event[] = {cur->id, has_prev ? prev->id : NULL, count};

		if (!identity_run(conn, "recording the event",
						  "SELECT pepsi.key_event('kek_rotate', jsonb_strip_nulls(jsonb_build_object('kek', $1::text,"
						  " 'previous', $2::text, 'rewrapped', $3::int)))",
						  3, event, NULL)
			|| !identity_run(conn, "COMMIT", "COMMIT", 0, NULL, NULL))
			rc = CLI_EX_DATAERR;
	}
	if (rc != CLI_EX_OK)
		PQclear(PQexec(conn, "ROLLBACK"));
	else
		printf("rewrapped %d key%s under KEK %s\n", rewrapped, rewrapped == 1 ? "" : "s", cur->id);
	return rc;
}

int
keys_identity_main(int argc, char **argv)
{
	const char			*command = argv[1];
	const char			*sub = NULL;
	const char			*config_path = NULL;
	const char			*type = "ed25519";
	const char			*password_file = NULL;
	long				 days = 0;
	int					 c, rc = CLI_EX_OK;
	struct pepsi_config *cfg = NULL;
	PGconn				*conn;
	struct kek			 cur, prev;
	bool				 has_prev = false;
	char				 err[512];
	char				 address[320];

	memset(&cur, 0, sizeof(cur));
	memset(&prev, 0, sizeof(prev));
	if (strcmp(command, "kek-generate") == 0)
		return argc == 3 ? kek_generate_command(argv[2]) : CLI_EX_USAGE;
	optind = 2;
	if (strcmp(command, "identity") == 0 || strcmp(command, "peer") == 0 || strcmp(command, "ca") == 0)
	{
		if (argc < 3)
			return CLI_EX_USAGE;
		sub = argv[2];
		optind = 3;
	}
	while ((c = getopt(argc, argv, "c:t:e:P:")) != -1)
	{
		switch (c)
		{
			case 'c':
				config_path = optarg;
				break;
			case 't':
				type = optarg;
				break;
			case 'P':
				password_file = optarg;
				break;
			case 'e':
				if (!cli_parse_int_range(optarg, 1, 36500, &days))
				{
					fprintf(stderr, "pepsi-keys: -e %s: a key lives 1 to 36500 days\n", optarg);
					return CLI_EX_USAGE;
				}
				break;
			default:
				return CLI_EX_USAGE;
		}
	}
	argc -= optind;
	argv += optind;
	if (strcmp(command, "peer") == 0 || strcmp(command, "ca") == 0)
	{
		if (strcmp(sub, "import") != 0 || argc < (command[0] == 'p' ? 2 : 1) || argc > (command[0] == 'p' ? 3 : 2))
			return CLI_EX_USAGE;
		sub = command[0] == 'p' ? "peer-import" : "ca-import";
		if (command[0] == 'p' && !identity_address(argv[0], address, sizeof(address)))
			return CLI_EX_USAGE;
	}
	else if (sub == NULL																			   ? argc != 0
			 : strcmp(sub, "generate") == 0 || strcmp(sub, "export") == 0 || strcmp(sub, "purge") == 0 ? argc != 1
			 : strcmp(sub, "import") == 0															   ? argc != 2
			 : strcmp(sub, "revoke") == 0															   ? argc < 1 || argc > 2
			 : strcmp(sub, "wkd") == 0 || strcmp(sub, "openpgpkey") == 0							   ? argc != 1
			 : strcmp(sub, "list") == 0																   ? argc != 0
																									   : true)
		return CLI_EX_USAGE;
	if (sub && (strcmp(sub, "generate") == 0 || strcmp(sub, "import") == 0)
		&& !identity_address(argv[0], address, sizeof(address)))
		return CLI_EX_USAGE;
	conn = identity_connect(cli_config_path(config_path), &cfg, &rc);
	if (conn == NULL)
		return rc;
	if (sub == NULL || strcmp(sub, "generate") == 0 || strcmp(sub, "import") == 0)
	{
		if (!kek_from_config(cfg, &cur, &prev, &has_prev, err, sizeof(err)))
		{
			fprintf(stderr, "pepsi-keys: %s\n", err);
			PQfinish(conn);
			config_free(cfg);
			return CLI_EX_CONFIG;
		}
	}
	if (sub == NULL)
		rc = kek_rotate_command(conn, &cur, &prev, has_prev);
	else if (strcmp(sub, "generate") == 0)
		rc = identity_generate_command(conn, &cur, type, days, address);
	else if (strcmp(sub, "import") == 0)
		rc = identity_import_command(conn, &cur, address, argv[1], password_file);
	else if (strcmp(sub, "peer-import") == 0)
		rc = peer_import_command(conn, address, argv[1], argc > 2 ? argv[2] : NULL);
	else if (strcmp(sub, "ca-import") == 0)
		rc = ca_import_command(conn, argv[0], argc > 1 ? argv[1] : NULL);
	else if (strcmp(sub, "export") == 0)
		rc = identity_export_command(conn, argv[0]);
	else if (strcmp(sub, "list") == 0)
		rc = identity_list_command(conn);
	else if (strcmp(sub, "wkd") == 0)
		rc = identity_wkd_command(conn, argv[0]);
	else if (strcmp(sub, "openpgpkey") == 0)
		rc = identity_openpgpkey_command(conn, argv[0]);
	else if (strcmp(sub, "revoke") == 0)
		rc = identity_change_command(conn, "key_revoke", argv[0], argc > 1 ? argv[1] : NULL);
	else
		rc = identity_change_command(conn, "key_purge", argv[0], NULL);
	kek_wipe(&cur);
	kek_wipe(&prev);
	PQfinish(conn);
	config_free(cfg);
	return rc;
}
