/*
 * srs.h: the Sender Rewriting Scheme, in the format of libsrs2, postsrsd
 * and Mail::SRS (Guarded), so that their addresses and ours reverse each
 * other given the same secret:
 *
 *   SRS0=HHHH=TT=orig.example=alice@srs.example      first hop
 *   SRS1=HHHH=hop1.example==HHHH=TT=orig.example=alice@srs.example
 *
 * HHHH is the first HASH_LENGTH characters of the base64 HMAC-SHA1, keyed
 * by the first secret, of the lower-cased fields (TT, host, user for SRS0;
 * host, rest for SRS1); any secret of the list verifies, so a new secret
 * can be put first while the old ones still reverse the mail in flight.
 * Hashes compare without case (a mail system may smash it), so a character
 * is worth about 5 bits: HASH_LENGTH is 8 at least (about 40 bits), and a
 * hash is compared in constant time.  TT is the day (time / 86400, modulo
 * 1024) in two base32 characters; an SRS0 address is valid for MAX_AGE
 * days.  An SRS1 address reverses only when the SRS0 part inside it checks
 * as far as we can check another forwarder's address: its form and its
 * age, and its hash too when its first hop is our own SRS domain.
 *
 * The [srs] section of pepsi.conf, file only (the secrets must not come
 * from the database):
 *   DOMAIN        the domain of the rewritten addresses (mail to it is ours)
 *   SECRET        the signing secret, from a secrets.d fragment (config.h)
 *   SECRET_FILE   one secret per line, the first used to sign unless SECRET
 *                 is set (then they only verify); mode 0600/0400
 *   MAX_AGE       days an address stays valid (default 21, as libsrs2)
 *   HASH_LENGTH   characters of hash (default and minimum 8)
 *   SEPARATOR     the character after SRS0/SRS1: = (default), + or -
 */
#ifndef PEPSI_SRS_H
#define PEPSI_SRS_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "config/config.h"

/* The fewest characters of hash an address may have (options.def's minimum for HASH_LENGTH). */
#define SRS_MIN_HASH_LENGTH 8

struct srs
{
	char	*domain; /* NULL: SRS is not configured */
	char   **secrets;
	size_t	 nsecrets;
	unsigned max_age; /* days */
	unsigned hash_length;
	char	 separator;
};

enum srs_result
{
	SRS_NOT_SRS, /* not an SRS address of ours: leave it alone */
	SRS_REVERSED,
	SRS_MALFORMED,
	SRS_BAD_HASH,
	SRS_EXPIRED
};

/* The [srs] section; true with srs->domain NULL when there is none.  False with err. */
bool srs_from_config(const struct pepsi_config *cfg, struct srs *srs, char *err, size_t errlen);
void srs_free(struct srs *srs);

/*
 * The forward rewrite of a sender: a new string (free it), or NULL when
 * the sender is left as it is (the null sender, no domain, or already in
 * the SRS domain).
 */
char *srs_forward(const struct srs *srs, const char *sender, time_t now);

/*
 * Reverse an address of the SRS domain: SRS_REVERSED with the original
 * (SRS0) or the previous hop's address (SRS1) in out; SRS_NOT_SRS for an
 * address outside the SRS domain or not starting SRS0/SRS1.
 */
enum srs_result srs_reverse(const struct srs *srs, const char *address, time_t now, char *out,
							size_t outlen);
const char	   *srs_result_text(enum srs_result r);

#endif
