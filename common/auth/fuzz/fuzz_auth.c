/*
 * fuzz_auth.c: libFuzzer target for the parsers of the message
 * authentication (common/auth/): what a domain's DNS records say is as
 * hostile as what a client sends.  "make fuzz" runs it.
 *
 * Input: one byte choosing the parser, then its text: 0, an SPF record;
 * 1, an SPF macro-string in a domain-spec; 2, in an explanation; 3, a
 * DKIM tag-list (a DKIM-Signature or a key record); 4, a DMARC record;
 * 5, a header block, for the From domain DMARC reads.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "auth/dkim_verify.h"
#include "auth/dmarc.h"
#include "auth/spf.h"
#include "log.h"
#include "xalloc.h"

int			LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
fuzz_tag(void *arg, const char *tag, size_t taglen, const char *value, size_t valuelen)
{
	/* Touch every octet handed out: ASan checks the bounds. */
	size_t	   *sum = arg;

	for (size_t i = 0; i < taglen; i++)
		*sum += (unsigned char) tag[i];
	for (size_t i = 0; i < valuelen; i++)
		*sum += (unsigned char) value[i];
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char	   *text;
	char		reason[256];

	if (size < 1)
		return 0;
	text = xstrndup((const char *) data + 1, size - 1);
	switch (data[0] % 6)
	{
		case 3:
			{
				size_t		sum = 0;

				dkim_tag_list_parse((const char *) data + 1, size - 1, fuzz_tag, &sum);
				break;
			}
		case 4:
			{
				struct dmarc_record r;
				const char *why;

				dmarc_record_parse((const char *) data + 1, size - 1, &r, &why);
				break;
			}
		case 5:
			{
				const char *why;

				free(dmarc_from_domain((const char *) data + 1, size - 1, &why));
				break;
			}
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
