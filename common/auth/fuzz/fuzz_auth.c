/*
 * fuzz_auth.c: libFuzzer target for the parsers of the message
 * authentication (common/auth/): what a domain's DNS records say is as
 * hostile as what a client sends.  "make fuzz" runs it.
 *
 * Input: one byte choosing the parser, then its text: 0, an SPF record;
 * 1, an SPF macro-string in a domain-spec; 2, in an explanation.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "auth/spf.h"
#include "log.h"
#include "xalloc.h"

int			LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char	   *text;
	char		reason[256];

	if (size < 1)
		return 0;
	text = xstrndup((const char *) data + 1, size - 1);
	switch (data[0] % 3)
	{
		case 0:
			spf_record_valid(text, reason, sizeof(reason));
			break;
		case 1:
		case 2:
			free(spf_expand_for_test(text, data[0] % 3 == 2));
			break;
	}
	free(text);
	return 0;
}
