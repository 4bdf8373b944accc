/*
 * pgpmime.h: PGP/MIME (RFC 3156) with protected headers (the draft
 * "Protected Headers for Cryptographic E-mail", v1): the entity that is
 * encrypted carries the message's Content-* fields and a copy of its
 * Subject, From, To, Cc, Date, Message-ID and Reply-To; the outer Subject
 * becomes "...".
 */
#ifndef PEPSI_PGPMIME_H
#define PEPSI_PGPMIME_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"

/* The entity to encrypt, from a message's header block and body. */
void pgpmime_inner(const char *headers, size_t hlen, const char *body, size_t blen, struct buf *inner);

/*
 * The message that carries armored: headers without their Content-* and
 * MIME-Version fields and with Subject "...", and the multipart/encrypted
 * ones (with extra, whole header lines, added: an Autocrypt field).
 */
void pgpmime_outer(const char *headers, size_t hlen, const char *armored, size_t alen, const char *extra,
				   struct buf *out_headers, struct buf *out_body);

/*
 * The outer header fields of an encrypted message alone: headers without
 * their Content-* and MIME-Version fields, Subject "..." (S/MIME's outer
 * message is built on them).
 */
void pgpmime_outer_fields(const char *headers, size_t hlen, struct buf *out_headers);

/* Is this header block a PGP/MIME encrypted message's? */
bool pgpmime_is_encrypted(const char *headers, size_t hlen);

/* The armored ciphertext of a PGP/MIME body (its "-----BEGIN PGP MESSAGE-----" block); false if none. */
bool pgpmime_ciphertext(const char *body, size_t blen, struct buf *armored);

/*
 * Put a decrypted entity back as the message: the outer headers without
 * their Content-* and MIME-Version fields, with the protected ones the
 * entity carries replacing theirs (Subject first of all), then extra
 * (whole header lines) on top; the entity's body as the body.
 */
void pgpmime_restore(const char *headers, size_t hlen, const char *entity, size_t elen, const char *extra,
					 struct buf *out_headers, struct buf *out_body);

#endif
