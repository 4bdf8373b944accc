/*
 * password.h: the Argon2id hash of an administrator's password, as
 * pepsi.admin_account stores it.  pepsi-httpd hashes with it (passwd, and
 * the dummy hash a login for an unknown account is checked against) and
 * pepsi-setup's admin_account task too, so that both make the same hashes.
 */
#ifndef PEPSI_PASSWORD_H
#define PEPSI_PASSWORD_H

#include <stdbool.h>

/* Argon2id as OWASP recommends it: 19 MiB, two passes, one lane. */
#define PASSWORD_T_COST 2
#define PASSWORD_M_COST (19 * 1024)
#define PASSWORD_PARALLELISM 1
#define PASSWORD_SALT_BYTES 16
#define PASSWORD_HASH_BYTES 32

/* The encoded hash ($argon2id$...) with a fresh salt, allocated; NULL on failure. */
char *password_hash(const char *password);
/* Does password match an encoded hash? */
bool password_verify(const char *encoded, const char *password);

#endif
