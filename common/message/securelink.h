/*
 * securelink.h: the sealing of the secure-link portal's messages
 * (docs/architecture.md 9, pepsi-secure-link(8)).
 *
 * A link carries a secret of 256 random bits (64 hex digits).  From it,
 * HKDF-SHA256 derives, under two labels, the link's identifier (what the
 * database looks a link up by) and the message's AES-256-GCM key; the
 * database keeps the identifier and the ciphertext only, so neither a dump
 * nor a role reading the table opens a message without the link.  The
 * additional data of the seal is the identifier and the recipient, so a
 * row's ciphertext moved to another row does not open.
 * pepsi-stage-encrypt seals, pepsi-httpd opens.
 */
#ifndef PEPSI_SECURELINK_H
#define PEPSI_SECURELINK_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"

#define SECURELINK_TOKEN_LEN 64 /* hex digits of the secret */
#define SECURELINK_ID_LEN 32
#define SECURELINK_KEY_LEN 32
#define SECURELINK_NONCE_LEN 12

struct securelink
{
	char		  token[SECURELINK_TOKEN_LEN + 1];
	unsigned char id[SECURELINK_ID_LEN];
	unsigned char key[SECURELINK_KEY_LEN];
};

/* A new link (random secret): false when the system has no randomness. */
bool securelink_new(struct securelink *link);
/* The link of a token (64 lower-case hex digits): false for anything else. */
bool securelink_from_token(const char *token, struct securelink *link);
/* Overwrite b's bytes, then free it (for clear text). */
void securelink_buf_wipe(struct buf *b);
/* Forget the link's secret and key. */
void securelink_wipe(struct securelink *link);

/* Seal plain for recipient under link's key: a fresh nonce and the ciphertext with its tag appended. */
bool securelink_seal(const struct securelink *link, const char *recipient, const void *plain, size_t len,
					 unsigned char nonce[SECURELINK_NONCE_LEN], struct buf *sealed);
/* Open what securelink_seal sealed: false (plain empty) when it does not open (another link, recipient or altered). */
bool securelink_open(const struct securelink *link, const char *recipient, const unsigned char *nonce,
					 const unsigned char *sealed, size_t len, struct buf *plain);

#endif
