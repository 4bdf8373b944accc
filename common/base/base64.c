/*
 * base64.c: see base64.h.  Encoding is OpenSSL's EVP_EncodeBlock; decoding
 * is ours, because EVP_DecodeBlock neither skips folding whitespace nor
 * says how much of its last quad was padding.
 */
#include "base/base64.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>

#include <openssl/evp.h>

void
base64_append(struct buf *out, const void *data, size_t len)
{
	/* Four characters per three octets or part of three, and the NUL. */
	buf_reserve(out, 4 * ((len + 2) / 3) + 1);
	out->len += (size_t) EVP_EncodeBlock((unsigned char *) out->data + out->len, data, (int) len);
}

/* A character's value plus one; 0 for a character outside the alphabet. */
static int
base64_value(unsigned char c)
{
	static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

	for (int i = 0; i < 64; i++)
		if (alphabet[i] == (char) c)
			return i + 1;
	return 0;
}

long
base64_decode(const char *in, size_t len, unsigned char *out, size_t outlen, enum base64_mode mode)
{
	bool	 strict = mode == BASE64_STRICT;
	uint32_t acc = 0;
	int		 bits = 0;
	size_t	 n = 0;
	bool	 padding = false;

	if (strict && len % 4 != 0)
		return -1;
	for (size_t i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) in[i];
		int			  value;

		if (!strict && isspace(c))
			continue;
		if (c == '=')
		{
			/* Strict: "x===" and "=" before the last two places are malformed. */
			if (strict && i + 2 < len)
				return -1;
			padding = true;
			continue;
		}
		if (padding || (value = base64_value(c)) == 0)
			return -1;
		acc = (acc << 6) | (uint32_t) (value - 1);
		bits += 6;
		if (bits >= 8)
		{
			bits -= 8;
			if (n == outlen)
				return -1;
			out[n++] = (unsigned char) (acc >> bits);
			acc &= (1U << bits) - 1;
		}
	}
	return (long) n;
}
