/*
 * fuzz_mime.c: libFuzzer target for the MIME downgrade
 * (common/message/mime_downgrade.c), which walks the structure of whatever message
 * a client sent (boundaries, nested message/rfc822, transfer encodings)
 * before the relay client re-encodes it for a hop without 8BITMIME or
 * BINARYMIME, and for the text a reader sees (common/message/mime.c
 * mime_text: transfer encodings, charsets, HTML), which
 * pepsi-stage-detect-language reads.  "make fuzz" runs it.
 *
 * Input: one byte choosing the target (even: 7-bit, odd: 8-bit), then the
 * message, header block and body.  A converted message must need no
 * further downgrade for the same target: anything else is a bug, and
 * abort() makes libFuzzer keep the input; so is text longer than the
 * limit it was read with.
 */
#include <stdint.h>
#include <stdlib.h>

#include "message/mime.h"
#include "message/mime_downgrade.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	enum mime_downgrade_target target;
	const char				  *raw = (const char *) data + 1;
	size_t					   len;
	struct buf				   out = BUF_INIT;
	char					   why[256];

	if (size < 1)
		return 0;
	target = data[0] % 2 ? MIME_TO_8BIT : MIME_TO_7BIT;
	len = size - 1;
	mime_has_binary(raw, len);
	mime_needs_downgrade(raw, len, target);
	if (mime_downgrade(raw, len, target, &out, why, sizeof(why)) == MIME_DOWNGRADE_DONE
		&& mime_needs_downgrade(out.data, out.len, target))
		abort();
	buf_free(&out);
	mime_text(raw, len, 0, &out);
	buf_free(&out);
	mime_text(raw, len, 64, &out);
	if (out.len > 64)
		abort();
	buf_free(&out);
	return 0;
}
