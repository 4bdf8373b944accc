/*
 * openpgp.c: OpenPGP keys through GPGME (openpgp.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gpgme.h>
#include <openssl/crypto.h>

#include "crypto/kek.h"
#include "crypto/openpgp.h"
#include "crypto/openpgp_home.h"

bool
pgp_fail(char *err, size_t errlen, const char *what, gpgme_error_t e)
{
	snprintf(err, errlen, "%s: %s", what, gpgme_strerror(e));
	return false;
}

const char *
pgp_home_parent(void)
{
	const char *tmp = getenv("TMPDIR");

	/* gpg-agent's socket path must fit a sockaddr_un. */
	return tmp && *tmp == '/' && strlen(tmp) < 30 ? tmp : "/tmp";
}

bool
pgp_home_open(struct pgp_home *home, char *err, size_t errlen)
{
	gpgme_error_t e;

	home->ctx = NULL;
	if (gpgme_check_version(NULL) == NULL)
	{
		snprintf(err, errlen, "GPGME did not start");
		return false;
	}
	setlocale(LC_CTYPE, "");
	gpgme_set_locale(NULL, LC_CTYPE, setlocale(LC_CTYPE, NULL));
	snprintf(home->dir, sizeof(home->dir), "%s/" PGP_HOME_PREFIX "%ld.XXXXXX", pgp_home_parent(), (long) getpid());
	if (mkdtemp(home->dir) == NULL)
	{
		snprintf(err, errlen, "%s: %s", home->dir, strerror(errno));
		return false;
	}
	e = gpgme_new(&home->ctx);
	if (!e)
		e = gpgme_ctx_set_engine_info(home->ctx, GPGME_PROTOCOL_OpenPGP, NULL, home->dir);
	if (!e)
		e = gpgme_set_pinentry_mode(home->ctx, GPGME_PINENTRY_MODE_LOOPBACK);
	if (e)
	{
		rmdir(home->dir);
		if (home->ctx)
			gpgme_release(home->ctx);
		home->ctx = NULL;
		return pgp_fail(err, errlen, "GPGME", e);
	}
	return true;
}

static int
pgp_remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void) st, (void) flag, (void) ftw;
	return remove(path);
}

void
pgp_home_close(struct pgp_home *home)
{
	if (home->ctx)
		gpgme_release(home->ctx);
	home->ctx = NULL;
	pgp_home_remove(home->dir);
}

void
pgp_home_remove(const char *dir)
{
	pid_t pid;

	/* The agent the home's gpg started goes with it. */
	pid = fork();
	if (pid == 0)
	{
		int devnull = open("/dev/null", 1);

		if (devnull >= 0)
		{
			dup2(devnull, 1);
			dup2(devnull, 2);
		}
		execlp("gpgconf", "gpgconf", "--homedir", dir, "--kill", "gpg-agent", (char *) NULL);
		_exit(127);
	}
	if (pid > 0)
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
	nftw(dir, pgp_remove_one, 8, FTW_DEPTH | FTW_PHYS);
}

void
pgp_key_info_free(struct pgp_key_info *info)
{
	buf_free(&info->public_key);
	buf_wipe(&info->secret_key);
}

void
pgp_data_take(gpgme_data_t data, struct buf *out)
{
	size_t len = 0;
	char  *bytes = gpgme_data_release_and_get_mem(data, &len);

	if (bytes)
	{
		buf_append(out, bytes, len);
		OPENSSL_cleanse(bytes, len);
		gpgme_free(bytes);
	}
}

/* Export fpr's public key, and its secret key when secret, in binary. */
static bool
pgp_export(struct pgp_home *home, const char *fpr, bool secret, struct buf *out, char *err, size_t errlen)
{
	gpgme_data_t  data;
	gpgme_error_t e = gpgme_data_new(&data);

	if (e)
		return pgp_fail(err, errlen, "GPGME", e);
	gpgme_set_armor(home->ctx, 0);
	e = gpgme_op_export(home->ctx, fpr, secret ? GPGME_EXPORT_MODE_SECRET : 0, data);
	if (e)
	{
		gpgme_data_release(data);
		return pgp_fail(err, errlen, secret ? "exporting the secret key" : "exporting the public key", e);
	}
	pgp_data_take(data, out);
	if (out->len == 0)
	{
		snprintf(err, errlen, "%s exported nothing", fpr);
		return false;
	}
	return true;
}

/* Fill info from the one key of the home; check address's User ID if given. */
static bool
pgp_describe(struct pgp_home *home, const char *address, bool want_secret, struct pgp_key_info *info, char *err,
			 size_t errlen)
{
	gpgme_key_t	  key = NULL, other = NULL;
	gpgme_error_t e;
	bool		  uid_ok = address == NULL;
	time_t		  now = time(NULL);

	/* Every key, with whether its secret half is there (key->secret). */
	e = gpgme_set_keylist_mode(home->ctx, GPGME_KEYLIST_MODE_LOCAL | GPGME_KEYLIST_MODE_WITH_SECRET);
	if (!e)
		e = gpgme_op_keylist_start(home->ctx, NULL, 0);
	if (!e)
		e = gpgme_op_keylist_next(home->ctx, &key);
	if (!e && gpgme_op_keylist_next(home->ctx, &other) == 0)
	{
		gpgme_key_unref(other);
		gpgme_key_unref(key);
		gpgme_op_keylist_end(home->ctx);
		snprintf(err, errlen, "more than one key given: give one key at a time");
		return false;
	}
	gpgme_op_keylist_end(home->ctx);
	if (e || key == NULL)
	{
		snprintf(err, errlen, "no OpenPGP key in what was given");
		return false;
	}
	snprintf(info->fingerprint, sizeof(info->fingerprint), "%s", key->fpr ? key->fpr : "");
	snprintf(info->algorithm, sizeof(info->algorithm), "%s",
			 key->subkeys ? gpgme_pubkey_algo_name(key->subkeys->pubkey_algo) : "?");
	if (key->subkeys && key->subkeys->curve && *key->subkeys->curve)
		snprintf(info->algorithm, sizeof(info->algorithm), "%s", key->subkeys->curve);
	else if (key->subkeys)
		snprintf(info->algorithm + strlen(info->algorithm), sizeof(info->algorithm) - strlen(info->algorithm),
				 "%u", key->subkeys->length);
	info->expires = key->subkeys ? key->subkeys->expires : 0;
	info->has_secret = key->secret;
	info->can_sign = key->can_sign;
	info->can_encrypt = key->can_encrypt;
	for (gpgme_user_id_t u = key->uids; address && u; u = u->next)
		if (!u->revoked && !u->invalid && u->email && strcasecmp(u->email, address) == 0)
			uid_ok = true;
	if (key->revoked)
		snprintf(err, errlen, "key %s is revoked", info->fingerprint);
	else if (key->expired || (info->expires && info->expires <= now))
		snprintf(err, errlen, "key %s has expired", info->fingerprint);
	else if (!uid_ok)
		snprintf(err, errlen, "key %s has no User ID with the address %s", info->fingerprint, address);
	else if (want_secret && !key->secret)
		snprintf(err, errlen, "key %s: only its public half was given, not its secret key", info->fingerprint);
	else if (!key->can_sign && !key->can_encrypt)
		snprintf(err, errlen, "key %s can neither sign nor encrypt", info->fingerprint);
	else
	{
		gpgme_key_unref(key);
		return pgp_export(home, info->fingerprint, false, &info->public_key, err, errlen)
			   && (!want_secret || pgp_export(home, info->fingerprint, true, &info->secret_key, err, errlen));
	}
	gpgme_key_unref(key);
	return false;
}

bool
pgp_import_one(struct pgp_home *home, const struct pgp_blob *blob, char *fpr, size_t fprlen, char *err,
			   size_t errlen)
{
	gpgme_data_t		  in;
	gpgme_error_t		  e = gpgme_data_new_from_mem(&in, blob->data, blob->len, 0);
	gpgme_import_result_t r;

	if (!e)
	{
		e = gpgme_op_import(home->ctx, in);
		gpgme_data_release(in);
	}
	if (e)
		return pgp_fail(err, errlen, "reading the key", e);
	r = gpgme_op_import_result(home->ctx);
	if (r == NULL || r->imports == NULL || r->imports->fpr == NULL || r->imports->result != 0)
	{
		snprintf(err, errlen, "no OpenPGP key in what was given");
		return false;
	}
	snprintf(fpr, fprlen, "%s", r->imports->fpr);
	return true;
}

bool
pgp_generate(const char *address, const char *type, int days, struct pgp_key_info *info, char *err,
			 size_t errlen)
{
	struct pgp_home home;
	char			uid[512];
	const char	   *primary, *sub;
	gpgme_error_t	e;
	gpgme_key_t		key = NULL;
	unsigned long	expires = days > 0 ? (unsigned long) days * 86400 : 0;
	unsigned int	flags = GPGME_CREATE_NOPASSWD | GPGME_CREATE_FORCE | (expires ? 0 : GPGME_CREATE_NOEXPIRE);
	bool			ok = false;

	memset(info, 0, sizeof(*info));
	if (strcmp(type, "ed25519") == 0)
		primary = "ed25519", sub = "cv25519";
	else if (strcmp(type, "rsa3072") == 0)
		primary = "rsa3072", sub = "rsa3072";
	else
	{
		snprintf(err, errlen, "-t %s: an OpenPGP key is ed25519 or rsa3072", type);
		return false;
	}
	if (strchr(address, '<') || strchr(address, '>') || strlen(address) > 400)
	{
		snprintf(err, errlen, "%s is not an address", address);
		return false;
	}
	snprintf(uid, sizeof(uid), "<%s>", address);
	if (!pgp_home_open(&home, err, errlen))
		return false;
	e = gpgme_op_createkey(home.ctx, uid, primary, 0, expires, NULL, flags | GPGME_CREATE_SIGN | GPGME_CREATE_CERT);
	if (!e)
	{
		gpgme_genkey_result_t r = gpgme_op_genkey_result(home.ctx);

		e = gpgme_get_key(home.ctx, r->fpr, &key, 1);
	}
	if (!e)
		e = gpgme_op_createsubkey(home.ctx, key, sub, 0, expires, flags | GPGME_CREATE_ENCR);
	if (key)
		gpgme_key_unref(key);
	if (e)
		pgp_fail(err, errlen, "generating the key", e);
	else
		ok = pgp_describe(&home, address, true, info, err, errlen);
	pgp_home_close(&home);
	if (!ok)
		pgp_key_info_free(info);
	return ok;
}

bool
pgp_inspect(const void *data, size_t len, const char *address, bool want_secret, struct pgp_key_info *info,
			char *err, size_t errlen)
{
	struct pgp_home home;
	struct pgp_blob blob = {data, len};
	char			fpr[65];
	bool			ok;

	memset(info, 0, sizeof(*info));
	if (!pgp_home_open(&home, err, errlen))
		return false;
	ok = pgp_import_one(&home, &blob, fpr, sizeof(fpr), err, errlen)
		 && pgp_describe(&home, address, want_secret, info, err, errlen);
	pgp_home_close(&home);
	if (!ok)
		pgp_key_info_free(info);
	return ok;
}

bool
pgp_armor(const void *data, size_t len, struct buf *out, char *err, size_t errlen)
{
	struct pgp_home home;
	struct pgp_blob blob = {data, len};
	gpgme_data_t	armored = NULL;
	gpgme_error_t	e;
	char			fpr[65];
	bool			ok = false;

	if (!pgp_home_open(&home, err, errlen))
		return false;
	if (pgp_import_one(&home, &blob, fpr, sizeof(fpr), err, errlen))
	{
		gpgme_set_armor(home.ctx, 1);
		e = gpgme_data_new(&armored);
		if (!e)
			e = gpgme_op_export(home.ctx, fpr, 0, armored);
		if (e)
		{
			pgp_fail(err, errlen, "armoring the key", e);
			if (armored)
				gpgme_data_release(armored);
		}
		else
		{
			pgp_data_take(armored, out);
			ok = true;
		}
	}
	pgp_home_close(&home);
	return ok;
}
