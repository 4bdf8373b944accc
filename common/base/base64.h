/*
 * base64.h: RFC 4648 base64, the one encoder and the one decoder of
 * libpepsi (DKIM and ARC tags and keys, SMTP AUTH both ways, MIME bodies
 * and encoded words, SRS hashes).
 */
#ifndef PEPSI_BASE64_H
#define PEPSI_BASE64_H

#include <stddef.h>

#include "base/buf.h"

/*
 * How strictly base64_decode reads.  The two differ on purpose: an AUTH
 * response (RFC 4954) is one line of exact base64, and anything else is a
 * malformed response; a DKIM or ARC tag (RFC 6376 3.5) may be folded and
 * its whitespace is not part of the value.
 */
enum base64_mode
{
	/* Whole quads only, padding only in the last two places, no whitespace. */
	BASE64_STRICT,
	/* Whitespace skipped anywhere; after the first '=' only '=' or whitespace. */
	BASE64_FOLDED,
};

/* Append the base64 of data to out, with no line breaks; out stays NUL-terminated. */
void base64_append(struct buf *out, const void *data, size_t len);
/* Decode into out; the decoded length, or -1 if malformed or longer than outlen. */
long base64_decode(const char *in, size_t len, unsigned char *out, size_t outlen, enum base64_mode mode);

#endif
