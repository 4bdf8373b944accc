/*
 * wkd.c: the Web Key Directory's names (wkd.h).
 */
#include <ctype.h>

#include <openssl/sha.h>

#include "crypto/wkd.h"

/* The WKD hash of a local part (lower case): z-base-32 of its SHA-1. */
void
wkd_hash(const char *local, size_t len, char *out)
{
	static const char alphabet[] = "ybndrfg8ejkmcpqxot1uwisza345h769";
	unsigned char	  digest[SHA_DIGEST_LENGTH];
	char			  lower[320];
	unsigned int	  bits = 0, value = 0;
	size_t			  o = 0;

	for (size_t i = 0; i < len && i < sizeof(lower); i++)
		lower[i] = (char) tolower((unsigned char) local[i]);
	SHA1((const unsigned char *) lower, len < sizeof(lower) ? len : sizeof(lower), digest);
	for (size_t i = 0; i < sizeof(digest); i++)
	{
		value = (value << 8) | digest[i];
		bits += 8;
		while (bits >= 5)
		{
			out[o++] = alphabet[(value >> (bits - 5)) & 31];
			bits -= 5;
		}
	}
	if (bits > 0)
		out[o++] = alphabet[(value << (5 - bits)) & 31];
	out[o] = '\0';
}
