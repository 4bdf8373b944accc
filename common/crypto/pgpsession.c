/*
 * pgpsession.c: a crypto stage worker's one OpenPGP session (pgpsession.h).
 *
 * The home holds the keys of several identities and correspondents at
 * once, so nothing here trusts the home to pick a key: encryption names
 * its recipients and its signer, and decryption checks afterwards that
 * the message was encrypted to the key asked for and that a good
 * signature is by one of the keys given for the sender.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <gpgme.h>

#include "crypto/kek.h"
#include "crypto/openpgp_home.h"
#include "crypto/pgpsession.h"

static void pgp_session_release(void *key);

static struct pgp_home		session_home;
static bool					session_open;
static pid_t				session_pid;
static struct pgp_key_cache session_keys = {.release = pgp_session_release};

/* At exit: the home and its agent go (only in the process that made them). */
static void
pgp_session_close(void)
{
	if (!session_open || getpid() != session_pid)
		return;
	/* The home goes with the keys in it: unreferenced, not deleted one by one. */
	for (size_t i = 0; i < PGP_SESSION_KEYS; i++)
		if (session_keys.keys[i].key)
			gpgme_key_unref(session_keys.keys[i].key);
	memset(session_keys.keys, 0, sizeof(session_keys.keys));
	pgp_home_close(&session_home);
	session_open = false;
}

/*
 * Remove the homes of our effective user whose maker is gone: a worker
 * killed (SIGKILL at MAX_RUNTIME, SIGTERM at shutdown) leaves its home,
 * and the keys its agent wrote there, behind.
 */
static void
pgp_session_sweep(void)
{
	const char	  *parent = pgp_home_parent();
	DIR			  *d = opendir(parent);
	struct dirent *e;
	size_t		   prefix = strlen(PGP_HOME_PREFIX);

	if (d == NULL)
		return;
	while ((e = readdir(d)) != NULL)
	{
		struct stat st;
		char		path[300];
		char	   *end;
		long		pid;

		if (strncmp(e->d_name, PGP_HOME_PREFIX, prefix) != 0)
			continue;
		pid = strtol(e->d_name + prefix, &end, 10);
		if (end == e->d_name + prefix || *end != '.' || pid <= 0 || pid == (long) getpid())
			continue;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)
			|| st.st_uid != geteuid())
			continue;
		if (kill((pid_t) pid, 0) == 0 || errno != ESRCH)
			continue;
		snprintf(path, sizeof(path), "%s/%s", parent, e->d_name);
		pgp_home_remove(path);
	}
	closedir(d);
}

static bool
pgp_session_start(char *err, size_t errlen)
{
	static bool registered;

	if (session_open)
		return true;
	pgp_session_sweep();
	if (!pgp_home_open(&session_home, err, errlen))
		return false;
	session_open = true;
	session_pid = getpid();
	if (!registered)
		registered = atexit(pgp_session_close) == 0;
	return true;
}

static struct pgp_cached_key *
pgp_session_find(const char *fingerprint)
{
	return pgp_cache_find(&session_keys, fingerprint);
}

/* Delete key (public and secret halves) from the home. */
static void
pgp_session_delete(gpgme_key_t key)
{
	gpgme_op_delete_ext(session_home.ctx, key, GPGME_DELETE_ALLOW_SECRET | GPGME_DELETE_FORCE);
}

static void
pgp_session_release(void *key)
{
	pgp_session_delete(key);
	gpgme_key_unref(key);
}

/* Import data as fingerprint's key (afresh: an older version goes first). */
static struct pgp_cached_key *
pgp_session_import(const char *fingerprint, const unsigned char digest[PGP_DIGEST_LEN], const void *data,
				   size_t len, bool secret, char *err, size_t errlen)
{
	struct pgp_cached_key *k;
	struct pgp_blob		   blob = {data, len};
	char				   got[65];
	gpgme_key_t			   key = NULL;
	gpgme_error_t		   e;

	if (!pgp_session_start(err, errlen))
		return NULL;
	k = pgp_cache_slot(&session_keys, fingerprint);
	if (!pgp_import_one(&session_home, &blob, got, sizeof(got), err, errlen))
		return NULL;
	e = gpgme_get_key(session_home.ctx, got, &key, secret);
	if (e)
	{
		pgp_fail(err, errlen, got, e);
		return NULL;
	}
	if (strcasecmp(got, fingerprint) != 0)
	{
		snprintf(err, errlen, "the key stored as %s is %s", fingerprint, got);
		pgp_session_delete(key);
		gpgme_key_unref(key);
		return NULL;
	}
	if (secret && !key->secret)
	{
		snprintf(err, errlen, "key %s: only its public half was stored", fingerprint);
		pgp_session_delete(key);
		gpgme_key_unref(key);
		return NULL;
	}
	pgp_cache_fill(&session_keys, k, fingerprint, digest, secret, key);
	return k;
}

bool
pgp_session_has_secret(const char *fingerprint, const unsigned char digest[PGP_DIGEST_LEN])
{
	return pgp_cache_has_secret(&session_keys, fingerprint, digest);
}

bool
pgp_session_add_secret(const char *fingerprint, const unsigned char digest[PGP_DIGEST_LEN], const void *secret,
					   size_t len, char *err, size_t errlen)
{
	return pgp_session_import(fingerprint, digest, secret, len, true, err, errlen) != NULL;
}

const struct pgp_secret_store pgp_session_secrets = {pgp_session_has_secret, pgp_session_add_secret};

/* Is key one to encrypt to for address now?  The reason in err if not. */
static bool
pgp_key_encrypts_to(gpgme_key_t key, const char *fingerprint, const char *address, char *err, size_t errlen)
{
	time_t		   now = time(NULL);
	gpgme_subkey_t primary = key->subkeys;
	bool		   uid_ok = false, subkey_ok = false;

	for (gpgme_user_id_t u = key->uids; u; u = u->next)
		if (!u->revoked && !u->invalid && u->email && strcasecmp(u->email, address) == 0)
			uid_ok = true;
	for (gpgme_subkey_t s = key->subkeys; s; s = s->next)
		if (s->can_encrypt && !s->revoked && !s->expired && !s->disabled && !s->invalid
			&& (s->expires == 0 || s->expires > now))
			subkey_ok = true;
	return pgp_key_verdict(fingerprint, address, key->revoked,
						   key->expired || (primary && primary->expires && primary->expires <= now), uid_ok,
						   !key->disabled && !key->invalid && subkey_ok, err, errlen);
}

bool
pgp_session_public(const char *fingerprint, const void *data, size_t len, const char *address, char *err,
				   size_t errlen)
{
	unsigned char		   digest[PGP_DIGEST_LEN];
	struct pgp_cached_key *k;

	pgp_digest(data, len, digest);
	k = pgp_cache_public(&session_keys, fingerprint, digest);
	if (k == NULL)
		k = pgp_session_import(fingerprint, digest, data, len, false, err, errlen);
	if (k == NULL)
		return false;
	return address == NULL || pgp_key_encrypts_to(k->key, fingerprint, address, err, errlen);
}

bool
pgp_session_encrypt(const char *const *recipients, size_t count, const char *signer, const void *plain,
					size_t len, struct buf *out, char *err, size_t errlen)
{
	gpgme_ctx_t	  ctx = session_home.ctx;
	gpgme_key_t	  keys[33] = {0};
	gpgme_data_t  in = NULL, cipher = NULL;
	gpgme_error_t e;

	if (count == 0 || count > 32)
	{
		snprintf(err, errlen, "%zu recipient keys: 1 to 32 at once", count);
		return false;
	}
	for (size_t i = 0; i < count; i++)
	{
		struct pgp_cached_key *k = session_open ? pgp_session_find(recipients[i]) : NULL;

		if (k == NULL)
		{
			snprintf(err, errlen, "key %s was not read from the key store", recipients[i]);
			return false;
		}
		keys[i] = k->key;
	}
	gpgme_signers_clear(ctx);
	if (signer)
	{
		struct pgp_cached_key *k = pgp_session_find(signer);

		if (k == NULL || !k->secret)
		{
			snprintf(err, errlen, "the signing key %s was not read from the key store", signer);
			return false;
		}
		e = gpgme_signers_add(ctx, k->key);
		if (e)
			return pgp_fail(err, errlen, "the signing key", e);
	}
	gpgme_set_armor(ctx, 1);
	e = gpgme_data_new_from_mem(&in, plain, len, 0);
	if (!e)
		e = gpgme_data_new(&cipher);
	if (!e)
		e = signer ? gpgme_op_encrypt_sign(ctx, keys, GPGME_ENCRYPT_ALWAYS_TRUST, in, cipher)
				   : gpgme_op_encrypt(ctx, keys, GPGME_ENCRYPT_ALWAYS_TRUST, in, cipher);
	gpgme_signers_clear(ctx);
	if (in)
		gpgme_data_release(in);
	if (e)
	{
		gpgme_encrypt_result_t r = gpgme_op_encrypt_result(ctx);

		if (cipher)
			gpgme_data_release(cipher);
		if (r && r->invalid_recipients)
			snprintf(err, errlen, "key %s: %s", r->invalid_recipients->fpr ? r->invalid_recipients->fpr : "?",
					 gpgme_strerror(r->invalid_recipients->reason));
		else
			pgp_fail(err, errlen, "encrypting", e);
		return false;
	}
	pgp_data_take(cipher, out);
	return true;
}

/* Is id (a fingerprint or a 16-digit key id) key's primary key or one of its subkeys? */
static bool
pgp_key_has(gpgme_key_t key, const char *id)
{
	size_t n = id ? strlen(id) : 0;

	for (gpgme_subkey_t s = key->subkeys; n && s; s = s->next)
		if ((s->fpr && strcasecmp(s->fpr, id) == 0) || (n == 16 && s->keyid && strcasecmp(s->keyid, id) == 0))
			return true;
	return false;
}

/* The verdict of the first signature: good only if by one of signers. */
static void
pgp_session_verdict(const char *const *signers, size_t nsigners, struct pgp_verdict *verdict)
{
	gpgme_verify_result_t v = gpgme_op_verify_result(session_home.ctx);
	gpgme_signature_t	  s = v ? v->signatures : NULL;
	bool				  by_sender = false;

	if (s == NULL)
		return;
	verdict->signed_ = true;
	snprintf(verdict->fingerprint, sizeof(verdict->fingerprint), "%s", s->fpr ? s->fpr : "");
	for (size_t i = 0; i < nsigners; i++)
	{
		struct pgp_cached_key *k = pgp_session_find(signers[i]);

		if (k && pgp_key_has(k->key, s->fpr))
			by_sender = true;
	}
	if (gpgme_err_code(s->status) == GPG_ERR_NO_ERROR && !(s->summary & GPGME_SIGSUM_RED) && by_sender)
		verdict->good = true;
	else if (gpgme_err_code(s->status) == GPG_ERR_NO_PUBKEY || !by_sender)
		snprintf(verdict->reason, sizeof(verdict->reason), "signed with a key not known for the sender");
	else if (gpgme_err_code(s->status) == GPG_ERR_KEY_EXPIRED || (s->summary & GPGME_SIGSUM_KEY_EXPIRED))
		snprintf(verdict->reason, sizeof(verdict->reason), "signed with an expired key");
	else if (s->summary & GPGME_SIGSUM_KEY_REVOKED)
		snprintf(verdict->reason, sizeof(verdict->reason), "signed with a revoked key");
	else
		snprintf(verdict->reason, sizeof(verdict->reason), "bad signature: %s", gpgme_strerror(s->status));
}

bool
pgp_session_decrypt(const char *secret, const char *const *signers, size_t nsigners, const void *cipher,
					size_t len, struct buf *out, struct pgp_verdict *verdict, char *err, size_t errlen)
{
	struct pgp_cached_key *k = session_open ? pgp_session_find(secret) : NULL;
	gpgme_data_t		   in = NULL, plain = NULL;
	gpgme_decrypt_result_t result;
	gpgme_error_t		   e;
	bool				   for_key = false;
	struct buf			   text = BUF_INIT;

	memset(verdict, 0, sizeof(*verdict));
	if (k == NULL || !k->secret)
	{
		snprintf(err, errlen, "the secret key %s was not read from the key store", secret);
		return false;
	}
	e = gpgme_data_new_from_mem(&in, cipher, len, 0);
	if (!e)
		e = gpgme_data_new(&plain);
	if (!e)
		e = gpgme_op_decrypt_verify(session_home.ctx, in, plain);
	if (in)
		gpgme_data_release(in);
	if (plain)
		pgp_data_take(plain, &text);
	if (e)
	{
		buf_wipe(&text);
		return pgp_fail(err, errlen, "the message does not decrypt", e);
	}
	/* The home may hold other identities' keys: the message must be for this one. */
	result = gpgme_op_decrypt_result(session_home.ctx);
	for (gpgme_recipient_t r = result ? result->recipients : NULL; r; r = r->next)
		if (pgp_key_has(k->key, r->keyid))
			for_key = true;
	if (!for_key)
	{
		buf_wipe(&text);
		snprintf(err, errlen, "the message does not decrypt: it is not encrypted to key %s", secret);
		return false;
	}
	pgp_session_verdict(signers, nsigners, verdict);
	buf_append(out, text.data, text.len);
	buf_wipe(&text);
	return true;
}
