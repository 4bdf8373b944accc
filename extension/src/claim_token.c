/*
 * claim_token.c: the claim tokens' randomness and digests, in C.
 *
 * A claim stamps each row it makes running with a fresh random token,
 * hands the token to the worker and keeps only its SHA-256 digest in
 * workqueue.claim_digest (pepsi.h); every transition names the token and
 * matches the row only while the digest is the token's, so a worker whose
 * row was reclaimed (it timed out, crashed, or the dispatcher restarted)
 * cannot commit the new claim's work.  The digest is computed here, once
 * a row at the claim and once at each guarded transition, and passed to
 * the statements as a bytea parameter: through SQL's sha256(), four calls
 * a stage hop (three in the claim's UPDATE, one in the commit's guard),
 * each made and freed a digest context, and on OpenSSL 3.0 a context's
 * set-up looks the algorithm up in the providers every time: some 0.5 us
 * of CPU a call, 0.38 of them OpenSSL's.  Here the algorithm is fetched
 * and the context made once per backend (0.1 us a digest of 16 bytes);
 * the claim's and the commit's server CPU went from 32.8 to 31.3 us a
 * hop (bench/stages has the figures).
 *
 * The digest is exactly SQL's sha256(uuid_send(token)), the SHA-256 of the
 * token's 16 bytes: the PL/pgSQL functions that match rows by token
 * (workqueue_recover, the secretary's batch hold) compute it that way, and
 * rows claimed by an older library keep theirs.
 */
#include "pepsi.h"

#include <openssl/evp.h>

#include "utils/uuid.h"

#define CLAIM_DIGEST_LEN 32

/* The backend's SHA-256 and its context, made on first use and kept for the backend's life. */
static const EVP_MD *claim_sha256;
static EVP_MD_CTX	*claim_sha256_ctx;

static void
claim_token_digest_init(void)
{
	if (claim_sha256_ctx != NULL)
		return;
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
	/* Fetched once: EVP_sha256() would be looked up again at every EVP_DigestInit_ex. */
	if (claim_sha256 == NULL)
		claim_sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
#else
	claim_sha256 = EVP_sha256();
#endif
	if (claim_sha256 == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not load SHA-256 for claim tokens")));
	claim_sha256_ctx = EVP_MD_CTX_new();
	if (claim_sha256_ctx == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("could not create a SHA-256 context for claim tokens")));
}

/*
 * The digest of token (a bytea of CLAIM_DIGEST_LEN bytes, palloc'd), or
 * NULL for no token: the statements compare "claim_digest IS NOT DISTINCT
 * FROM" it, so no token matches only a row claimed without one, as
 * sha256(uuid_send(NULL)) did.
 */
bytea *
queue_token_digest(const pg_uuid_t *token)
{
	bytea		*digest;
	unsigned int len = 0;

	if (token == NULL)
		return NULL;
	claim_token_digest_init();
	digest = palloc(VARHDRSZ + CLAIM_DIGEST_LEN);
	SET_VARSIZE(digest, VARHDRSZ + CLAIM_DIGEST_LEN);
	if (EVP_DigestInit_ex(claim_sha256_ctx, claim_sha256, NULL) != 1
		|| EVP_DigestUpdate(claim_sha256_ctx, token->data, UUID_LEN) != 1
		|| EVP_DigestFinal_ex(claim_sha256_ctx, (unsigned char *) VARDATA(digest), &len) != 1
		|| len != CLAIM_DIGEST_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not compute the digest of a claim token")));
	return digest;
}

/* The same as a parameter: its Datum, with nulls[argno]. */
Datum
queue_token_digest_arg(const pg_uuid_t *token, char *nulls, int argno)
{
	bytea *digest = queue_token_digest(token);

	nulls[argno] = digest != NULL ? ' ' : 'n';
	return PointerGetDatum(digest);
}

/*
 * count fresh tokens into tokens[], from the strong random source in one
 * call: 128 random bits each, as unguessable as a version-4 uuid.
 */
void
queue_new_claim_tokens(pg_uuid_t *tokens, int count)
{
	if (count > 0 && !pg_strong_random(tokens, sizeof(pg_uuid_t) * count))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate random claim tokens")));
}
