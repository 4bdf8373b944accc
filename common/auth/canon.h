/*
 * canon.h: the DKIM canonicalization, header selection and hashing shared
 * by every signature of the DKIM family Pepsi makes or checks: the
 * DKIM-Signature of pepsi-stage-dkim-sign (RFC 6376) and the
 * ARC-Message-Signature and ARC-Seal of pepsi-stage-arc-seal and of ARC
 * verification at ingress (RFC 8617).
 *
 * Why our own and not libopendkim's: libopendkim keeps its
 * canonicalization private (no exported canon API), cannot sign under any
 * header name but DKIM-Signature (the name is inside the signed data, so
 * an ARC-Message-Signature cannot be made by renaming one) and has no
 * header-only ARC-Seal mode; and Debian 12 has no libopenarc.  Signing
 * through libopendkim would therefore mean two canonicalizations in the
 * project, one of them ours anyway.  So there is exactly one, here,
 * checked byte for byte against the signed examples of RFC 6376 and RFC
 * 8463 (common/tests/test_auth_canon.c) and by three independent
 * verifiers in the TAP tests (Mail::DKIM, python3-dkim and libopendkim
 * itself through opendkim-testmsg).  libopendkim stays the project's DKIM
 * *verification* library for inbound mail.
 */
#ifndef PEPSI_AUTH_CANON_H
#define PEPSI_AUTH_CANON_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"

#define CANON_HASH_LEN 32 /* SHA-256, the only hash RFC 8301 allows */

/*
 * What a verifier takes of a DKIM-Signature, ARC-Message-Signature or
 * ARC-Seal: a longer field, or an h= naming more fields, fails
 * verification without being hashed.  128 names is more than any signer
 * uses (oversigning included); 16 KiB is four times a DKIM-Signature with
 * 128 long names and an RSA-4096 b=.
 */
#define CANON_MAX_SIGNED_FIELDS 128
#define CANON_MAX_SIGNATURE_FIELD 16384

enum canon
{
	CANON_SIMPLE,
	CANON_RELAXED
};

/* One (possibly folded) field of a header block, line end included. */
struct header_field
{
	const char *start;
	size_t		len;	  /* through the CRLF that ends its last line */
	size_t		name_len; /* the name, without trailing whitespace */
	bool		used;	  /* taken by a header selection already */
};

struct header_fields
{
	struct header_field *field;
	size_t				 count;
};

/*
 * Split a header block into its fields.  False (with a reason in err) for a
 * line that is neither a field nor a continuation, or one longer than
 * max_line octets (0: no limit).
 */
bool header_fields_parse(const char *headers, size_t len, size_t max_line,
						 struct header_fields *out, char *err, size_t errlen);
void header_fields_free(struct header_fields *fields);
bool header_field_named(const struct header_field *f, const char *name, size_t name_len);
/* The count of fields named name. */
size_t header_fields_count(const struct header_fields *fields, const char *name);
/* The field's value with the name and colon cut off (still folded). */
const char *header_field_value(const struct header_field *f, size_t *len);

/* "simple" or "relaxed", and the reverse; false for anything else. */
bool		canon_parse(const char *text, size_t len, enum canon *out);
const char *canon_name(enum canon c);

/* Append the canonical form of one header field (with its CRLF). */
void canon_header(enum canon c, const char *field, size_t len, struct buf *out);
/* SHA-256 of the canonical body (RFC 6376 3.4.3, 3.4.4; no l=). */
void canon_body_hash(enum canon c, const char *body, size_t len,
					 unsigned char hash[CANON_HASH_LEN]);

/* The count of names in an h= value (colon-separated; empty: none). */
size_t canon_names_count(const char *names, size_t len);

/*
 * The header hash of RFC 6376 3.7: the fields the colon-separated names
 * select, each name taking the last instance not yet taken (a name with
 * none left, an oversigned one, contributes nothing), then the signature
 * field itself in canonical form without its final CRLF and with the value
 * of its b= tag removed.  Leaves the used flags set on fields.  The fields
 * are indexed by name once (sorted), so the cost grows with the header's
 * size and the names' count, not with their product.
 */
void canon_header_hash(enum canon c, struct header_fields *fields, const char *names,
					   const char *signature, size_t signature_len,
					   unsigned char hash[CANON_HASH_LEN]);
/*
 * The same hash over fields given in order (the ARC-Seal's, chosen by
 * instance rather than by name): each in canonical form, then the
 * signature field as above.
 */
void canon_hash_fields(enum canon c, const struct header_field *const *list, size_t n,
					   const char *signature, size_t signature_len,
					   unsigned char hash[CANON_HASH_LEN]);
/* Clear the used flags, for the next signature over the same fields. */
void header_fields_reset(struct header_fields *fields);

/*
 * A tag=value list (RFC 6376 3.2): DKIM-Signature and ARC fields, key
 * records.  Names and values are trimmed of surrounding whitespace (values
 * keep inner folding; b=, bh= and p= are base64 that skips it).  False for
 * a malformed list: an element without '=', an empty or invalid name, a
 * name given twice, or more than max tags.
 */
struct tag
{
	const char *name;
	size_t		name_len;
	const char *value;
	size_t		value_len;
};
bool			  tag_list_parse(const char *text, size_t len, struct tag *tags, size_t max,
								 size_t *count);
const struct tag *tag_find(const struct tag *tags, size_t count, const char *name);
/* A tag's value as a new string (NULL if absent). */
char *tag_strdup(const struct tag *tags, size_t count, const char *name);

#endif
