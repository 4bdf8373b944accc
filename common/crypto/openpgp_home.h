/*
 * openpgp_home.h: a private GNUPGHOME and a GPGME context on it, shared
 * by the one-shot calls of openpgp.c and the worker's session of
 * pgpsession.c (inside pepsi-crypto only).
 */
#ifndef PEPSI_OPENPGP_HOME_H
#define PEPSI_OPENPGP_HOME_H

#include <stdbool.h>
#include <stddef.h>

#include <gpgme.h>

#include "base/buf.h"
#include "crypto/openpgp.h"

/* A home is PARENT/pepsi-gnupg.PID.XXXXXX: PID, its maker's, tells a home left by a killed worker. */
#define PGP_HOME_PREFIX "pepsi-gnupg."

struct pgp_home
{
	char		dir[64];
	gpgme_ctx_t ctx;
};

/* "what: GPGME's reason" into err; false. */
bool pgp_fail(char *err, size_t errlen, const char *what, gpgme_error_t e);
/* Where homes are made: TMPDIR when it is short enough for gpg-agent's socket, else /tmp. */
const char *pgp_home_parent(void);
/* A new 0700 directory under pgp_home_parent() (owned by the effective user) and a context on it, pinentry loopback. */
bool pgp_home_open(struct pgp_home *home, char *err, size_t errlen);
/* Release the context, stop the home's gpg-agent, remove the directory. */
void pgp_home_close(struct pgp_home *home);
/* Stop dir's gpg-agent and remove dir. */
void pgp_home_remove(const char *dir);
/* Append a data object's bytes to out (wiping GPGME's copy) and release it. */
void pgp_data_take(gpgme_data_t data, struct buf *out);
/* Import blob into the home; the fingerprint of its (first) key in fpr. */
bool pgp_import_one(struct pgp_home *home, const struct pgp_blob *blob, char *fpr, size_t fprlen, char *err,
					size_t errlen);

#endif
