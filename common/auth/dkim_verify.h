/*
 * dkim_verify.h: DKIM verification (RFC 6376; ed25519-sha256, RFC 8463)
 * of a whole message, every signature, with the keys fetched through the
 * asynchronous resolver first.
 *
 * Why libopendkim: canonicalization (simple and relaxed, headers and
 * body), the tag grammar, key records and both algorithms are where DKIM
 * verifiers go wrong, and OpenDKIM's library is maintained, in Debian, and
 * the verifier of most of the mail that reaches us.  Its own key lookups
 * block, so it never makes one: we parse each DKIM-Signature's d= and s=
 * (our small tag parser, fuzzed), fetch <s>._domainkey.<d> TXT on the
 * loop, and only then run libopendkim over the message in one go, its key
 * lookup callback (dkim_set_key_lookup) answering from what we fetched.
 */
#ifndef PEPSI_AUTH_DKIM_VERIFY_H
#define PEPSI_AUTH_DKIM_VERIFY_H

#include <stdbool.h>
#include <stddef.h>

#include "dns/dns.h"

/* The most signatures of one message that are checked; the rest are ignored. */
#define DKIM_VERIFY_MAX_SIGNATURES 8

struct dkim_signature_result
{
	const char *result;	   /* RFC 8601: pass fail neutral policy temperror permerror */
	char	   *domain;	   /* d= (NULL if the signature had none) */
	char	   *selector;  /* s= */
	char	   *identity;  /* i= */
	char	   *algorithm; /* a= */
	char	   *b;		   /* the first 8 characters of b=, as RFC 6008 header.b */
	char	   *reason;
};

struct dkim_verify;

typedef void (*dkim_verify_done_fn)(void *arg);

/*
 * Three steps, so that a daemon can do the CPU-bound ones off its loop.
 * dkim_verify_new reads message's signatures (on any thread: it touches
 * no resolver); dkim_verify_lookup fetches the keys they name, on the
 * resolver's loop, and calls done from the loop once every key is
 * answered (never from within the call); dkim_verify_check then runs
 * libopendkim over the message, on any thread, while nothing else touches
 * d.  The message is read where it is, not copied: it must stay as it is
 * until dkim_verify_free.
 */
struct dkim_verify *dkim_verify_new(const char *message, size_t len);
void				dkim_verify_lookup(struct dkim_verify *d, struct dns_resolver *r,
									   struct dns_budget *budget, dkim_verify_done_fn done, void *arg);
void				dkim_verify_check(struct dkim_verify *d);
/* The results, one per signature (at most DKIM_VERIFY_MAX_SIGNATURES). */
size_t dkim_verify_results(const struct dkim_verify			   *d,
						   const struct dkim_signature_result **out);
/* Cancels lookups in flight. */
void dkim_verify_free(struct dkim_verify *d);

/*
 * The tag-list parser (RFC 6376 3.2) for DKIM-Signature and key records:
 * each tag and value (whitespace removed around them) handed to each;
 * false if the text is no tag-list.  Exposed for the fuzz target.
 */
typedef void (*dkim_tag_fn)(void *arg, const char *tag, size_t taglen, const char *value,
							size_t valuelen);
bool dkim_tag_list_parse(const char *text, size_t len, dkim_tag_fn each, void *arg);

#endif
