/* arc.c: see arc.h. */
#include "auth/arc.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "auth/dkim_sign.h"
#include "base/base64.h"
#include "base/log.h"
#include "base/xalloc.h"

#define ARC_MAX_TAGS 32
#define ARC_AMS_DEFAULT_HEADERS DKIM_DEFAULT_HEADERS ":dkim-signature"

static const char arc_aar_name[] = "ARC-Authentication-Results";
static const char arc_ams_name[] = "ARC-Message-Signature";
static const char arc_seal_name[] = "ARC-Seal";

const char *
arc_result_name(enum arc_result r)
{
	return r == ARC_PASS ? "pass" : r == ARC_FAIL ? "fail"
												  : "none";
}

/* A decimal instance 1..50 of exactly len characters; 0 if it is not one. */
static int
arc_instance_number(const char *text, size_t len)
{
	int n = 0;

	if (len == 0 || len > 2)
		return 0;
	for (size_t i = 0; i < len; i++)
	{
		if (!isdigit((unsigned char) text[i]))
			return 0;
		n = n * 10 + (text[i] - '0');
	}
	return n >= 1 && n <= ARC_MAX_INSTANCES ? n : 0;
}

/*
 * The i= of an ARC field.  An AAR's value is "i=N; authserv-id; results",
 * not a tag list, so only its leading tag is read; the other two are tag
 * lists read whole.
 */
static int
arc_field_instance(const struct header_field *f, bool is_aar)
{
	size_t		len;
	const char *value = header_field_value(f, &len);

	if (is_aar)
	{
		const char *semi = memchr(value, ';', len);
		struct tag	tag[1];
		size_t		n;

		if (semi == NULL || !tag_list_parse(value, (size_t) (semi - value), tag, 1, &n) || n != 1
			|| tag[0].name_len != 1 || tag[0].name[0] != 'i')
			return 0;
		return arc_instance_number(tag[0].value, tag[0].value_len);
	}
	else
	{
		struct tag		  tags[ARC_MAX_TAGS];
		size_t			  n;
		const struct tag *i;

		if (!tag_list_parse(value, len, tags, ARC_MAX_TAGS, &n) || (i = tag_find(tags, n, "i")) == NULL)
			return 0;
		return arc_instance_number(i->value, i->value_len);
	}
}

void
arc_chain_parse(const struct header_fields *fields, struct arc_chain *chain)
{
	memset(chain, 0, sizeof(*chain));
	for (size_t i = 0; i < fields->count; i++)
	{
		const struct header_field  *f = &fields->field[i];
		const struct header_field **slot;
		const char				   *name;
		int							instance;

		if (header_field_named(f, arc_aar_name, sizeof(arc_aar_name) - 1))
			name = arc_aar_name;
		else if (header_field_named(f, arc_ams_name, sizeof(arc_ams_name) - 1))
			name = arc_ams_name;
		else if (header_field_named(f, arc_seal_name, sizeof(arc_seal_name) - 1))
			name = arc_seal_name;
		else
			continue;
		instance = arc_field_instance(f, name == arc_aar_name);
		if (instance == 0)
		{
			if (!chain->malformed)
				snprintf(chain->reason, sizeof(chain->reason),
						 "an %s field has no valid i= (1 to %d)", name, ARC_MAX_INSTANCES);
			chain->malformed = true;
			continue;
		}
		slot = name == arc_aar_name	  ? &chain->set[instance].aar
			   : name == arc_ams_name ? &chain->set[instance].ams
									  : &chain->set[instance].seal;
		if (*slot && !chain->malformed)
		{
			snprintf(chain->reason, sizeof(chain->reason), "two %s fields for i=%d", name, instance);
			chain->malformed = true;
		}
		*slot = f;
		if (instance > chain->count)
			chain->count = instance;
	}
	for (int i = 1; i <= chain->count && !chain->malformed; i++)
		if (!chain->set[i].aar || !chain->set[i].ams || !chain->set[i].seal)
		{
			snprintf(chain->reason, sizeof(chain->reason), "the ARC set i=%d is incomplete", i);
			chain->malformed = true;
		}
}

/* The tags of an AMS or seal, and their common ones. */
struct arc_signature
{
	struct tag			tags[ARC_MAX_TAGS];
	size_t				count;
	enum sign_algorithm algorithm;
	char			   *domain;
	char			   *selector;
	unsigned char		sig[1024];
	size_t				siglen;
};

static void
arc_signature_free(struct arc_signature *s)
{
	free(s->domain);
	free(s->selector);
}

static bool
arc_signature_parse(const struct header_field *f, struct arc_signature *s, char *why, size_t whylen)
{
	size_t			  len;
	const char		 *value = header_field_value(f, &len);
	const struct tag *a, *b;
	long			  n;

	memset(s, 0, sizeof(*s));
	if (f->len > CANON_MAX_SIGNATURE_FIELD)
	{
		snprintf(why, whylen, "the field is too long (over %d octets)", CANON_MAX_SIGNATURE_FIELD);
		return false;
	}
	if (!tag_list_parse(value, len, s->tags, ARC_MAX_TAGS, &s->count))
	{
		snprintf(why, whylen, "a malformed tag list");
		return false;
	}
	a = tag_find(s->tags, s->count, "a");
	b = tag_find(s->tags, s->count, "b");
	s->domain = tag_strdup(s->tags, s->count, "d");
	s->selector = tag_strdup(s->tags, s->count, "s");
	if (!a || !sign_algorithm_parse(a->value, a->value_len, &s->algorithm))
		snprintf(why, whylen, "no a= of rsa-sha256 or ed25519-sha256");
	else if (!b || !s->domain || !*s->domain || !s->selector || !*s->selector)
		snprintf(why, whylen, "b=, d= or s= missing");
	else if ((n = base64_decode(b->value, b->value_len, s->sig, sizeof(s->sig), BASE64_FOLDED)) <= 0)
		snprintf(why, whylen, "b= is not base64");
	else
	{
		s->siglen = (size_t) n;
		return true;
	}
	return false;
}

static bool
arc_check_hash(const struct arc_signature *s, const unsigned char hash[CANON_HASH_LEN],
			   arc_key_lookup lookup, void *arg, char *why, size_t whylen)
{
	char	  err[100];
	EVP_PKEY *pub = lookup(arg, s->domain, s->selector, s->algorithm, err, sizeof(err));
	bool	  ok;

	if (pub == NULL)
	{
		struct buf text = BUF_INIT;

		buf_printf(&text, "no key for %s._domainkey.%s: %s", s->selector, s->domain, err);
		snprintf(why, whylen, "%s", text.data);
		buf_free(&text);
		return false;
	}
	ok = keys_verify_hash(pub, s->algorithm, hash, s->sig, s->siglen);
	EVP_PKEY_free(pub);
	if (!ok)
		snprintf(why, whylen, "the signature does not verify");
	return ok;
}

/*
 * The body's hash under each canonicalization, made once per chain: every
 * ARC-Message-Signature of up to 50 covers the same body.
 */
struct arc_body
{
	const char	 *text;
	size_t		  len;
	bool		  hashed[2];
	unsigned char hash[2][CANON_HASH_LEN];
};

static const unsigned char *
arc_body_hash(struct arc_body *b, enum canon c)
{
	if (!b->hashed[c])
	{
		canon_body_hash(c, b->text, b->len, b->hash[c]);
		b->hashed[c] = true;
	}
	return b->hash[c];
}

/* Does the ARC-Message-Signature verify (body hash and header hash)? */
static bool
arc_check_ams(struct header_fields *fields, const struct header_field *ams, struct arc_body *body,
			  arc_key_lookup lookup, void *arg, char *why, size_t whylen)
{
	struct arc_signature s;
	const struct tag	*c, *bh;
	enum canon			 hc = CANON_SIMPLE, bc = CANON_SIMPLE;
	unsigned char		 want[64], hash[CANON_HASH_LEN];
	char				*h = NULL;
	bool				 ok = false;

	if (!arc_signature_parse(ams, &s, why, whylen))
		goto out;
	c = tag_find(s.tags, s.count, "c");
	bh = tag_find(s.tags, s.count, "bh");
	h = tag_strdup(s.tags, s.count, "h");
	if (c)
	{
		const char *slash = memchr(c->value, '/', c->value_len);
		size_t		hl = slash ? (size_t) (slash - c->value) : c->value_len;

		if (!canon_parse(c->value, hl, &hc)
			|| (slash && !canon_parse(slash + 1, c->value_len - hl - 1, &bc)))
		{
			snprintf(why, whylen, "an unknown c=");
			goto out;
		}
	}
	if (!bh || !h || base64_decode(bh->value, bh->value_len, want, sizeof(want), BASE64_FOLDED) != CANON_HASH_LEN)
	{
		snprintf(why, whylen, "bh= or h= missing or malformed");
		goto out;
	}
	if (canon_names_count(h, strlen(h)) > CANON_MAX_SIGNED_FIELDS)
	{
		snprintf(why, whylen, "h= names more than %d fields", CANON_MAX_SIGNED_FIELDS);
		goto out;
	}
	if (strcasestr(h, "arc-seal"))
	{
		snprintf(why, whylen, "h= signs ARC-Seal");
		goto out;
	}
	if (memcmp(arc_body_hash(body, bc), want, CANON_HASH_LEN) != 0)
	{
		snprintf(why, whylen, "the body hash does not match (the body changed)");
		goto out;
	}
	header_fields_reset(fields);
	fields->field[ams - fields->field].used = true;
	canon_header_hash(hc, fields, h, ams->start, ams->len, hash);
	ok = arc_check_hash(&s, hash, lookup, arg, why, whylen);
out:
	free(h);
	arc_signature_free(&s);
	return ok;
}

/* The fields a seal of instance covers: sets 1..instance-1 whole, then its AAR and AMS. */
static size_t
arc_seal_fields(const struct arc_chain *chain, int instance, bool prior,
				const struct header_field **list)
{
	size_t n = 0;

	for (int i = prior ? 1 : instance; i < instance; i++)
	{
		list[n++] = chain->set[i].aar;
		list[n++] = chain->set[i].ams;
		list[n++] = chain->set[i].seal;
	}
	list[n++] = chain->set[instance].aar;
	list[n++] = chain->set[instance].ams;
	return n;
}

static bool
arc_check_seal(const struct arc_chain *chain, int instance, arc_key_lookup lookup, void *arg,
			   char *why, size_t whylen)
{
	const struct header_field *list[3 * ARC_MAX_INSTANCES];
	const struct header_field *seal = chain->set[instance].seal;
	struct arc_signature	   s;
	unsigned char			   hash[CANON_HASH_LEN];
	bool					   ok = false;

	if (arc_signature_parse(seal, &s, why, whylen))
	{
		if (tag_find(s.tags, s.count, "h"))
			snprintf(why, whylen, "an ARC-Seal may not have h=");
		else
		{
			size_t n = arc_seal_fields(chain, instance, true, list);

			canon_hash_fields(CANON_RELAXED, list, n, seal->start, seal->len, hash);
			ok = arc_check_hash(&s, hash, lookup, arg, why, whylen);
		}
	}
	arc_signature_free(&s);
	return ok;
}

/* The cv= of a seal: "none", "pass", "fail", or NULL if it has none. */
static char *
arc_seal_cv(const struct header_field *seal)
{
	size_t		len;
	const char *value = header_field_value(seal, &len);
	struct tag	tags[ARC_MAX_TAGS];
	size_t		n;

	if (!tag_list_parse(value, len, tags, ARC_MAX_TAGS, &n))
		return NULL;
	return tag_strdup(tags, n, "cv");
}

size_t
arc_required_keys(const struct arc_chain *chain, struct arc_key_ref *refs, size_t max)
{
	size_t n = 0;

	for (int i = 1; i <= chain->count; i++)
		for (int k = 0; k < 2; k++)
		{
			const struct header_field *f = k ? chain->set[i].seal : chain->set[i].ams;
			struct arc_signature	   s;
			char					   why[64];
			bool					   seen = false;

			if (f == NULL || !arc_signature_parse(f, &s, why, sizeof(why)))
			{
				if (f)
					arc_signature_free(&s);
				continue;
			}
			for (size_t j = 0; j < n; j++)
				seen |= strcasecmp(refs[j].domain, s.domain) == 0 && strcmp(refs[j].selector, s.selector) == 0;
			if (!seen && n < max && strlen(s.domain) < sizeof(refs[n].domain)
				&& strlen(s.selector) < sizeof(refs[n].selector))
			{
				strcpy(refs[n].domain, s.domain);
				strcpy(refs[n].selector, s.selector);
				n++;
			}
			arc_signature_free(&s);
		}
	return n;
}

void
arc_verify(const char *headers, size_t hlen, const char *body, size_t blen,
		   arc_key_lookup lookup, void *arg, struct arc_verdict *out)
{
	struct header_fields fields;
	struct arc_chain	 chain;
	struct arc_body		 b = {.text = body, .len = blen};
	char				 why[160];
	int					 n;

	memset(out, 0, sizeof(*out));
	out->result = ARC_FAIL;
	if (!header_fields_parse(headers, hlen, 0, &fields, why, sizeof(why)))
	{
		snprintf(out->reason, sizeof(out->reason), "%s", why);
		return;
	}
	arc_chain_parse(&fields, &chain);
	n = out->instance = chain.count;
	if (n == 0 && !chain.malformed)
	{
		out->result = ARC_NONE;
		goto done;
	}
	if (chain.malformed)
	{
		snprintf(out->reason, sizeof(out->reason), "%s", chain.reason);
		goto done;
	}
	for (int i = 1; i <= n; i++)
	{
		char	   *cv = arc_seal_cv(chain.set[i].seal);
		const char *want = i == 1 ? "none" : "pass";

		if (cv == NULL || strcasecmp(cv, want) != 0)
		{
			snprintf(out->reason, sizeof(out->reason), "ARC-Seal i=%d has cv=%s, not %s", i,
					 cv ? cv : "(none)", want);
			free(cv);
			goto done;
		}
		free(cv);
	}
	if (!arc_check_ams(&fields, chain.set[n].ams, &b, lookup, arg, why, sizeof(why)))
	{
		snprintf(out->reason, sizeof(out->reason), "ARC-Message-Signature i=%d: %s", n, why);
		goto done;
	}
	out->oldest_pass = n;
	for (int i = n - 1; i >= 1; i--)
	{
		if (!arc_check_ams(&fields, chain.set[i].ams, &b, lookup, arg, why, sizeof(why)))
			break;
		out->oldest_pass = i;
	}
	for (int i = n; i >= 1; i--)
		if (!arc_check_seal(&chain, i, lookup, arg, why, sizeof(why)))
		{
			snprintf(out->reason, sizeof(out->reason), "ARC-Seal i=%d: %s", i, why);
			out->oldest_pass = 0;
			goto done;
		}
	out->result = ARC_PASS;
done:
	header_fields_free(&fields);
}

/* One field of our own, as a struct header_field over its text. */
static bool
arc_own_field(const struct buf *text, struct header_fields *one)
{
	char err[64];

	return header_fields_parse(text->data, text->len, 0, one, err, sizeof(err)) && one->count == 1;
}

bool
arc_seal(const struct arc_sealer *s, struct header_fields *fields, const struct arc_chain *chain,
		 enum arc_result cv, const char *body, size_t blen, struct buf *out, char *err, size_t errlen)
{
	int						   instance = chain->count + 1;
	struct buf				   aar = BUF_INIT, ams = BUF_INIT, seal = BUF_INIT, sig = BUF_INIT;
	struct header_fields	   aar_field = {0}, ams_field = {0};
	unsigned char			   bh[CANON_HASH_LEN], hash[CANON_HASH_LEN];
	const struct header_field *list[3 * ARC_MAX_INSTANCES];
	struct arc_chain		   own = *chain;
	char					   leading[16];
	size_t					   n, column;
	bool					   ok = false;

	if (instance > ARC_MAX_INSTANCES)
	{
		snprintf(err, errlen, "the message already has %d ARC sets, the most RFC 8617 allows",
				 chain->count);
		return false;
	}
	buf_printf(&aar, "%s: i=%d; %s;\r\n%s", arc_aar_name, instance, s->authserv_id, s->results);

	snprintf(leading, sizeof(leading), "i=%d", instance);
	canon_body_hash(CANON_RELAXED, body, blen, bh);
	{
		struct dkim_signer signer = {
			.field_name = arc_ams_name,
			.leading_tags = leading,
			.algorithm = s->algorithm,
			.pkey = s->pkey,
			.domain = s->domain,
			.selector = s->selector,
			.header_canon = CANON_RELAXED,
			.body_canon = CANON_RELAXED,
			.headers = s->headers ? s->headers : ARC_AMS_DEFAULT_HEADERS,
			.oversigned = NULL,
			.timestamp = s->timestamp,
		};

		if (!dkim_sign_field(&signer, fields, bh, &ams))
		{
			snprintf(err, errlen, "the key for %s cannot sign", s->domain);
			goto out;
		}
	}
	if (!arc_own_field(&aar, &aar_field) || !arc_own_field(&ams, &ams_field))
	{
		snprintf(err, errlen, "the results for ARC-Authentication-Results are not a valid field");
		goto out;
	}
	own.set[instance].aar = &aar_field.field[0];
	own.set[instance].ams = &ams_field.field[0];

	buf_printf(&seal, "%s: i=%d; a=%s; t=%lld; cv=%s;\r\n\td=%s; s=%s;\r\n\tb=\r\n", arc_seal_name,
			   instance, sign_algorithm_name(s->algorithm), (long long) s->timestamp,
			   arc_result_name(cv), s->domain, s->selector);
	/* A failed chain is sealed over the new set alone (RFC 8617 5.1.2). */
	n = arc_seal_fields(&own, instance, cv != ARC_FAIL, list);
	canon_hash_fields(CANON_RELAXED, list, n, seal.data, seal.len, hash);
	if (!keys_sign_hash(s->pkey, s->algorithm, hash, &sig))
	{
		snprintf(err, errlen, "the key for %s cannot sign", s->domain);
		goto out;
	}
	seal.len -= 2;
	column = 10;
	dkim_append_folded(&seal, sig.data, sig.len, &column, NULL);
	buf_append_str(&seal, "\r\n");
	buf_append(out, seal.data, seal.len);
	buf_append(out, ams.data, ams.len);
	buf_append(out, aar.data, aar.len);
	ok = true;
out:
	header_fields_free(&aar_field);
	header_fields_free(&ams_field);
	buf_free(&aar);
	buf_free(&ams);
	buf_free(&seal);
	buf_free(&sig);
	return ok;
}
