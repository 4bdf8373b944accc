/*
 * fuzz_auth.c: libFuzzer target for the parsers of the message
 * authentication (common/auth/): what a domain's DNS records say is as
 * hostile as what a client sends.  "make fuzz" runs it.
 *
 * Input: one byte choosing the parser, then its text: 0, an SPF record;
 * 1, an SPF macro-string in a domain-spec; 2, in an explanation; 3, a
 * DKIM tag-list (a DKIM-Signature or a key record); 4, a DMARC record;
 * 5, a header block, for the From domain DMARC reads; 6, an address for
 * the SRS reverse path (common/message/srs.c); 7, a header block and body whose
 * ARC sets are read and validated (common/auth/arc.c, no key found).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "auth/arc.h"
#include "auth/dkim_verify.h"
#include "auth/dmarc.h"
#include "auth/spf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "message/srs.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
fuzz_tag(void *arg, const char *tag, size_t taglen, const char *value, size_t valuelen)
{
	/* Touch every octet handed out: ASan checks the bounds. */
	size_t *sum = arg;

	for (size_t i = 0; i < taglen; i++)
		*sum += (unsigned char) tag[i];
	for (size_t i = 0; i < valuelen; i++)
		*sum += (unsigned char) value[i];
}

static EVP_PKEY *
fuzz_no_key(void *arg, const char *domain, const char *selector, enum sign_algorithm algorithm,
			char *err, size_t errlen)
{
	snprintf(err, errlen, "no key for %s in %s", selector, domain);
	return NULL;
}

static void
fuzz_srs(const char *address)
{
	static char	 secret[] = "fuzz-secret";
	static char *secrets[] = {secret};
	struct srs	 srs = {
		  .domain = (char *) "srs.example",
		  .secrets = secrets,
		  .nsecrets = 1,
		  .max_age = 21,
		  .hash_length = SRS_MIN_HASH_LENGTH,
		  .separator = '=',
	  };
	char out[512];

	srs_reverse(&srs, address, 1764547200, out, sizeof(out));
	free(srs_forward(&srs, address, 1764547200));
}

static void
fuzz_arc(const char *data, size_t size)
{
	const char			*end = memmem(data, size, "\r\n\r\n", 4);
	size_t				 hlen = end ? (size_t) (end - data) + 2 : size;
	struct arc_verdict	 verdict;
	struct arc_chain	 chain;
	struct header_fields fields;
	struct arc_key_ref	 refs[8];
	char				 err[128];

	arc_verify(data, hlen, data + hlen, size - hlen, fuzz_no_key, NULL, &verdict);
	if (header_fields_parse(data, hlen, 0, &fields, err, sizeof(err)))
	{
		arc_chain_parse(&fields, &chain);
		arc_required_keys(&chain, refs, 8);
		header_fields_free(&fields);
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text;
	char  reason[256];

	if (size < 1)
		return 0;
	text = xstrndup((const char *) data + 1, size - 1);
	switch (data[0] % 8)
	{
		case 6:
			fuzz_srs(text);
			break;
		case 7:
			fuzz_arc((const char *) data + 1, size - 1);
			break;
		case 3:
			{
				size_t sum = 0;

				dkim_tag_list_parse((const char *) data + 1, size - 1, fuzz_tag, &sum);
				break;
			}
		case 4:
			{
				struct dmarc_record r;
				const char		   *why;

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
