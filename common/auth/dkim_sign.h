/*
 * dkim_sign.h: making a signature field of the DKIM family (RFC 6376 3.5):
 * the DKIM-Signature of pepsi-stage-dkim-sign and the ARC-Message-Signature
 * of pepsi-stage-arc-seal differ only in their name and leading tags, so
 * both are made here, over the canonicalization of canon.h.
 */
#ifndef PEPSI_AUTH_DKIM_SIGN_H
#define PEPSI_AUTH_DKIM_SIGN_H

#include <stdbool.h>
#include <time.h>

#include "auth/canon.h"
#include "auth/keys.h"
#include "base/buf.h"

/*
 * The default header list (the fields a DKIM signature covers when
 * present), after RFC 6376 5.4.1's recommendation: the originator and
 * recipient fields, the subject and date, the threading and list fields
 * and the MIME fields that say how the body reads.  From, To, Subject and
 * Date are also oversigned (listed once more than they occur), so a field
 * of those names added in transit breaks the signature instead of
 * changing what a reader sees.
 */
#define DKIM_DEFAULT_HEADERS                                                       \
	"from:reply-to:subject:date:to:cc:message-id:in-reply-to:references:"          \
	"mime-version:content-type:content-transfer-encoding:content-disposition:"     \
	"resent-date:resent-from:resent-sender:resent-to:resent-cc:resent-message-id:" \
	"list-id:list-help:list-unsubscribe:list-unsubscribe-post:list-subscribe:"     \
	"list-post:list-owner:list-archive:sender"
#define DKIM_DEFAULT_OVERSIGNED "from:to:subject:date"

struct dkim_signer
{
	const char		   *field_name;	  /* "DKIM-Signature" or "ARC-Message-Signature" */
	const char		   *leading_tags; /* "v=1" or "i=2" */
	enum sign_algorithm algorithm;
	EVP_PKEY		   *pkey;
	const char		   *domain;
	const char		   *selector;
	enum canon			header_canon;
	enum canon			body_canon;
	const char		   *headers;	/* colon-separated names, each signed once per occurrence */
	const char		   *oversigned; /* names signed once more than they occur (may be NULL) */
	time_t				timestamp;	/* t=; 0 leaves it out */
};

/*
 * Append the complete signature field (with its CRLF) for the message
 * whose header fields are fields and whose body hash, in the signer's body
 * canonicalization, is body_hash.  False only if the key cannot sign.
 */
bool dkim_sign_field(const struct dkim_signer *signer, struct header_fields *fields,
					 const unsigned char body_hash[CANON_HASH_LEN], struct buf *out);

/*
 * The h= value for a message: every name of headers once per occurrence
 * in fields, the oversigned ones once more.  Appends lower-case names,
 * colon-separated.
 */
void dkim_header_list(const struct header_fields *fields, const char *headers,
					  const char *oversigned, struct buf *out);

/* Append a long tag value, folded so that no line grows past ~76 columns. */
void dkim_append_folded(struct buf *out, const char *value, size_t len, size_t *column,
						const char *breaks);

#endif
