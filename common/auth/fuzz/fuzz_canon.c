/*
 * fuzz_canon.c: libFuzzer target for the DKIM canonicalisation at scale
 * (common/auth/canon.c): a header block of many fields, repeated, and the
 * h= list a signature names them by, as a hostile DKIM-Signature or
 * ARC-Message-Signature would.  "make fuzz" runs it.
 *
 * Input: one byte of flags (bit 0: relaxed, else simple; bits 1-6: the
 * header block is repeated that many times more, so that a 4 KiB input
 * makes thousands of fields), then the h= value up to the first LF, then
 * the header block up to an empty line, then the body.  The hash over the
 * same fields with the used flags reset must come out the same: anything
 * else is a bug, and abort() makes libFuzzer keep the input.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "auth/canon.h"
#include "base/buf.h"
#include "base/xalloc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char fuzz_signature[] = "DKIM-Signature: v=1; a=rsa-sha256; d=example.org; s=sel;\r\n"
									 "\th=from:to:subject; bh=; b=AAAA\r\n";

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	enum canon			 c;
	int					 repeat;
	const char			*p = (const char *) data + 1;
	size_t				 left;
	const char			*nl;
	char				*names;
	const char			*block;
	size_t				 blocklen;
	const char			*body;
	size_t				 bodylen;
	struct buf			 headers = BUF_INIT;
	struct header_fields fields;
	char				 err[256];

	if (size < 1)
		return 0;
	c = data[0] & 1 ? CANON_RELAXED : CANON_SIMPLE;
	repeat = (data[0] >> 1) & 0x3f;
	left = size - 1;
	nl = memchr(p, '\n', left);
	names = xstrndup(p, nl ? (size_t) (nl - p) : left);
	block = nl ? nl + 1 : p + left;
	blocklen = (size_t) (p + left - block);
	body = memmem(block, blocklen, "\r\n\r\n", 4);
	if (body)
	{
		bodylen = blocklen - (size_t) (body + 4 - block);
		blocklen = (size_t) (body - block) + 2;
		body += 4;
	}
	else
	{
		body = "";
		bodylen = 0;
	}
	for (int i = 0; i <= repeat; i++)
		buf_append(&headers, block, blocklen);
	canon_names_count(names, strlen(names));
	if (header_fields_parse(headers.data ? headers.data : "", headers.len, 0, &fields, err, sizeof(err)))
	{
		unsigned char first[CANON_HASH_LEN];
		unsigned char again[CANON_HASH_LEN];
		struct buf	  out = BUF_INIT;

		canon_header_hash(c, &fields, names, fuzz_signature, sizeof(fuzz_signature) - 1, first);
		header_fields_reset(&fields);
		canon_header_hash(c, &fields, names, fuzz_signature, sizeof(fuzz_signature) - 1, again);
		if (memcmp(first, again, sizeof(first)) != 0)
			abort();
		for (size_t i = 0; i < fields.count && i < 64; i++)
		{
			size_t vlen;

			canon_header(c, fields.field[i].start, fields.field[i].len, &out);
			header_field_value(&fields.field[i], &vlen);
		}
		{
			const struct header_field *list[16];
			size_t					   n = fields.count < 16 ? fields.count : 16;

			for (size_t i = 0; i < n; i++)
				list[i] = &fields.field[fields.count - 1 - i];
			canon_hash_fields(c, list, n, fuzz_signature, sizeof(fuzz_signature) - 1, again);
		}
		buf_free(&out);
		header_fields_free(&fields);
	}
	{
		unsigned char hash[CANON_HASH_LEN];

		canon_body_hash(c, body, bodylen, hash);
	}
	buf_free(&headers);
	free(names);
	return 0;
}
