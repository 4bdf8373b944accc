/*
 * auth.h: the credentials AUTH PLAIN and LOGIN are checked against: a file
 * of "user:hash" lines, the hash in crypt(3) form ($6$ SHA-512, or any
 * method libcrypt knows), read once at start, before privileges are
 * dropped, so the file may be readable by root alone.
 */
#ifndef PEPSI_INGRESS_AUTH_H
#define PEPSI_INGRESS_AUTH_H

#include <stdbool.h>
#include <stddef.h>

struct credentials;

struct credentials *credentials_load(const char *path, char *err, size_t errlen);
/* The same work whether or not the user exists, so timing tells nothing. */
bool credentials_check(const struct credentials *c, const char *user, const char *password);
/*
 * The two halves of credentials_check, for auth_worker.c: the lookup on
 * the event loop (a copy of the user's hash, or a dummy one with *known
 * false), the hashing on a worker thread (thread-safe, touches nothing
 * shared).
 */
char *credentials_hash_for(const struct credentials *c, const char *user, bool *known);
bool  credentials_verify(const char *hash, const char *password);
void  credentials_free(struct credentials *c);

#endif
