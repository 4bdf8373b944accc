/*
 * fuzz_dns.c: libFuzzer target for the decoding of DNS answers
 * (common/dns/dns.c): what libunbound hands over (struct ub_result: rcode,
 * DNSSEC flags, TTL and each record's rdata in wire format) becomes a
 * struct dns_answer, TXT character-strings joined, MX, PTR and CNAME names
 * decoded, A and AAAA of the wrong length dropped; the answer is kept in
 * the resolver's cache and copied out of it; a TLSA record's rdata is read
 * for DANE (common/smtp/tls_policy.c).  The lookup itself needs libunbound and
 * a network: this target includes dns.c to reach its static functions and
 * builds the ub_result libunbound would.  "make fuzz" runs it.
 *
 * Input: one byte of flags (bits 0-1: the rcode, 0, 2, 3 or 5; bit 2:
 * secure; bit 3: bogus), one choosing the query type, one the TTL, then
 * records, each a length octet and that many octets of rdata.  The copy
 * from the cache must equal the answer: anything else is a bug, and
 * abort() makes libFuzzer keep the input.
 */
#include "../dns/dns.c"

#include "smtp/tls_policy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_RECORDS 64

static void
fuzz_same(const struct dns_answer *a, const struct dns_answer *b)
{
	if (a->status != b->status || a->secure != b->secure || a->count != b->count)
		abort();
	for (size_t i = 0; i < a->count; i++)
	{
		const struct dns_record *x = &a->records[i];
		const struct dns_record *y = &b->records[i];

		if (x->type != y->type || x->preference != y->preference || x->len != y->len
			|| x->rdata_len != y->rdata_len || memcmp(x->rdata, y->rdata, x->rdata_len) != 0
			|| (x->text == NULL) != (y->text == NULL))
			abort();
		if (x->text && memcmp(x->text, y->text, x->type == DNS_TYPE_TXT ? x->len : strlen(x->text)) != 0)
			abort();
		if (x->type == DNS_TYPE_TXT && x->len > x->rdata_len)
			abort();
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const int		rcodes[] = {0, 2, 3, 5};
	static const int		types[] = {DNS_TYPE_A, DNS_TYPE_CNAME, DNS_TYPE_PTR, DNS_TYPE_MX,
									   DNS_TYPE_TXT, DNS_TYPE_AAAA, DNS_TYPE_TLSA};
	static struct ev_loop  *loop;
	char				   *rdata[FUZZ_MAX_RECORDS + 1] = {NULL};
	int						lens[FUZZ_MAX_RECORDS + 1] = {0};
	struct ub_result		result;
	struct dns_resolver		r;
	struct dns_answer		a;
	struct dns_cache_entry *e;
	char				   *key;
	size_t					at = 3;
	size_t					n = 0;

	if (size < 3)
		return 0;
	if (loop == NULL)
		loop = ev_default_loop(0);
	while (at < size && n < FUZZ_MAX_RECORDS)
	{
		size_t len = data[at++];

		if (len > size - at)
			len = size - at;
		rdata[n] = (char *) data + at;
		lens[n++] = (int) len;
		at += len;
	}
	memset(&result, 0, sizeof(result));
	result.qname = (char *) "example.org";
	result.qtype = types[data[1] % (sizeof(types) / sizeof(types[0]))];
	result.qclass = 1;
	result.data = rdata;
	result.len = lens;
	result.rcode = rcodes[data[0] & 3];
	result.havedata = n > 0;
	result.nxdomain = result.rcode == 3;
	result.secure = (data[0] >> 2) & 1;
	result.bogus = (data[0] >> 3) & 1;
	result.ttl = data[2];
	dns_answer_from_unbound(&a, 0, &result);

	memset(&r, 0, sizeof(r));
	r.loop = loop;
	r.cache = xcalloc(DNS_CACHE_BUCKETS, sizeof(*r.cache));
	key = dns_cache_key("Example.ORG.", (enum dns_type) result.qtype);
	dns_cache_store(&r, key, &a);
	if ((e = dns_cache_find(&r, key)) != NULL)
	{
		struct dns_answer copy;

		dns_answer_copy(&copy, &e->answer);
		fuzz_same(&a, &copy);
		dns_answer_free(&copy);
	}
	for (size_t i = 0; i < a.count; i++)
	{
		struct tls_policy_tlsa t;
		char				   reverse[128];

		if (a.records[i].type == DNS_TYPE_TLSA
			&& tls_policy_parse_tlsa(a.records[i].rdata, a.records[i].rdata_len, &t))
			free(t.data);
		if (a.records[i].text && a.records[i].type != DNS_TYPE_TXT)
			dns_reverse_name(a.records[i].text, reverse, sizeof(reverse));
	}
	free(key);
	dns_cache_flush(&r);
	free(r.cache);
	dns_answer_free(&a);
	return 0;
}
