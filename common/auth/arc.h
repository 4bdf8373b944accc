/*
 * arc.h: Authenticated Received Chain (RFC 8617): reading the ARC sets of
 * a message, validating the chain, and adding the next set.  Signatures
 * and hashes are those of common/auth/canon.c and dkim_sign.c, the one
 * DKIM implementation of the project.
 *
 * Validation needs the public keys of the sealers and signers.  A caller
 * that can block (a stage worker) passes a lookup that queries DNS; one
 * that cannot (ingress, on its event loop) first asks arc_required_keys
 * for the (domain, selector) pairs, fetches their TXT records
 * asynchronously, then calls arc_verify with a lookup that answers from
 * what it fetched.
 */
#ifndef PEPSI_AUTH_ARC_H
#define PEPSI_AUTH_ARC_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include <openssl/evp.h>

#include "auth/canon.h"
#include "auth/keys.h"
#include "base/buf.h"

#define ARC_MAX_INSTANCES 50 /* RFC 8617 4.2.1 */

enum arc_result
{
	ARC_NONE, /* no ARC set */
	ARC_PASS,
	ARC_FAIL
};

/* One instance's three fields, found by their i= tag. */
struct arc_set
{
	const struct header_field *aar;
	const struct header_field *ams;
	const struct header_field *seal;
};

struct arc_chain
{
	struct arc_set set[ARC_MAX_INSTANCES + 1]; /* [1..count] */
	int			   count;					   /* the highest instance; 0: none */
	bool		   malformed;				   /* then reason says why */
	char		   reason[160];
};

/*
 * Read the ARC sets of fields.  A field whose i= is missing or out of range,
 * a field given twice for one instance, or an incomplete instance makes
 * the chain malformed (a chain that must be sealed cv=fail).
 */
void arc_chain_parse(const struct header_fields *fields, struct arc_chain *chain);

/* A public key: the record at selector._domainkey.domain, parsed (keys_parse_record). */
typedef EVP_PKEY *(*arc_key_lookup)(void *arg, const char *domain, const char *selector,
									enum sign_algorithm algorithm, char *err, size_t errlen);

struct arc_key_ref
{
	char domain[256];
	char selector[64];
};

/* The keys arc_verify will ask for (each once); returns their count. */
size_t arc_required_keys(const struct arc_chain *chain, struct arc_key_ref *refs, size_t max);

struct arc_verdict
{
	enum arc_result result;
	int				instance; /* the chain's highest instance */
	/*
	 * The oldest instance from which every ARC-Message-Signature up to
	 * the newest still validates (RFC 8617 7.2's arc.oldest-pass); 1 when
	 * the message is unchanged since the first, 0 when the result is not pass.
	 */
	int	 oldest_pass;
	char reason[200];
};

/* RFC 8617 5.2: validate the chain of a message. */
void arc_verify(const char *headers, size_t hlen, const char *body, size_t blen,
				arc_key_lookup lookup, void *arg, struct arc_verdict *out);

/* What to seal with. */
struct arc_sealer
{
	enum sign_algorithm algorithm;
	EVP_PKEY		   *pkey;
	const char		   *domain;
	const char		   *selector;
	const char		   *authserv_id;
	const char		   *results; /* the results lines, from auth_results_resinfo (auth/results.h) */
	const char		   *headers; /* what the ARC-Message-Signature signs; NULL: the default */
	time_t				timestamp;
};

/*
 * Add the next ARC set for a chain whose validation status is cv: appends
 * ARC-Seal, ARC-Message-Signature and ARC-Authentication-Results (in that
 * order, to go above the existing header block).  cv is ARC_NONE for a
 * message without a chain.  A failed chain is sealed over the new set
 * alone.  False with a reason (a chain already at its limit, a key that
 * cannot sign).
 */
bool arc_seal(const struct arc_sealer *s, struct header_fields *fields,
			  const struct arc_chain *chain, enum arc_result cv, const char *body,
			  size_t blen, struct buf *out, char *err, size_t errlen);

const char *arc_result_name(enum arc_result r);

#endif
