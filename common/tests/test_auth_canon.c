/*
 * test_auth_canon.c: the one DKIM canonicalization of the project
 * (common/auth/canon.c), byte for byte against the published examples:
 * RFC 6376 3.4.6 (both canonicalizations of one header block and body)
 * and RFC 8463 Appendix A (a message signed with ed25519-sha256 and
 * rsa-sha256 under relaxed/relaxed): the published signatures verify, and
 * signing again with the published private keys gives the very same b=
 * (both schemes are deterministic).  Then the signer's own fields, the tag
 * parser and the key loader's refusals.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "auth/canon.h"
#include "auth/dkim_sign.h"
#include "auth/keys.h"
#include "base/base64.h"
#include "base/buf.h"

/* RFC 6376 3.4.6. */
static const char rfc6376_headers[] = "A: X\r\nB : Y\t\r\n\tZ  \r\n";
static const char rfc6376_body[] = " C \r\nD \t E\r\n\r\n\r\n";

/* RFC 8463 A.3 (the message is RFC 6376's Appendix A example). */
static const char rfc8463_ed25519_signature[] =
	"DKIM-Signature: v=1; a=ed25519-sha256; c=relaxed/relaxed;\r\n"
	" d=football.example.com; i=@football.example.com;\r\n"
	" q=dns/txt; s=brisbane; t=1528637909; h=from : to :\r\n"
	" subject : date : message-id : from : subject : date;\r\n"
	" bh=2jUSOH9NhtVGCQWNr9BrIAPreKQjO6Sn7XIkfJVOzv8=;\r\n"
	" b=/gCrinpcQOoIfuHNQIbq4pgh9kyIK3AQUdt9OdqQehSwhEIug4D11Bus\r\n"
	" Fa3bT3FY5OsU7ZbnKELq+eXdp1Q1Dw==\r\n";
static const char rfc8463_rsa_signature[] =
	"DKIM-Signature: v=1; a=rsa-sha256; c=relaxed/relaxed;\r\n"
	" d=football.example.com; i=@football.example.com;\r\n"
	" q=dns/txt; s=test; t=1528637909; h=from : to : subject :\r\n"
	" date : message-id : from : subject : date;\r\n"
	" bh=2jUSOH9NhtVGCQWNr9BrIAPreKQjO6Sn7XIkfJVOzv8=;\r\n"
	" b=F45dVWDfMbQDGHJFlXUNB2HKfbCeLRyhDXgFpEL8GwpsRe0IeIixNTe3\r\n"
	" DhCVlUrSjV4BwcVcOF6+FF3Zo9Rpo1tFOeS9mPYQTnGdaSGsgeefOsk2Jz\r\n"
	" dA+L10TeYt9BgDfQNZtKdN1WO//KgIqXP7OdEFE4LjFYNcUxZQ4FADY+8=\r\n";
static const char rfc8463_headers[] =
	"From: Joe SixPack <joe@football.example.com>\r\n"
	"To: Suzie Q <suzie@shopping.example.net>\r\n"
	"Subject: Is dinner ready?\r\n"
	"Date: Fri, 11 Jul 2003 21:00:37 -0700 (PDT)\r\n"
	"Message-ID: <20030712040037.46341.5F8J@football.example.com>\r\n";
static const char rfc8463_body[] = "Hi.\r\n\r\nWe lost the game.  Are you hungry yet?\r\n\r\nJoe.\r\n";
static const char rfc8463_h[] = "from : to : subject : date : message-id : from : subject : date";
static const char rfc8463_ed25519_record[] = "v=DKIM1; k=ed25519; p=11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
static const char rfc8463_ed25519_seed[] = "nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=";
static const char rfc8463_rsa_record[] =
	"v=DKIM1; k=rsa; p=MIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQDkHlOQoBTzWRiGs5V6NpP3idY6Wk08a5qhdR6wy5bdOKb2jLQiY/"
	"J16JYi0Qvx/byYzCNb3W91y3FutACDfzwQ/BC/e/8uBsCR+yz1Lxj+PL6lHvqMKrM3rG4hstT5QjvHO9PzoxZyVYLzBfO2EeC3Ip3G+2kryOTIKT+l/K4w3QIDAQAB";
static const char rfc8463_rsa_private[] =
	"-----BEGIN RSA PRIVATE KEY-----\n"
	"MIICXQIBAAKBgQDkHlOQoBTzWRiGs5V6NpP3idY6Wk08a5qhdR6wy5bdOKb2jLQi\n"
	"Y/J16JYi0Qvx/byYzCNb3W91y3FutACDfzwQ/BC/e/8uBsCR+yz1Lxj+PL6lHvqM\n"
	"KrM3rG4hstT5QjvHO9PzoxZyVYLzBfO2EeC3Ip3G+2kryOTIKT+l/K4w3QIDAQAB\n"
	"AoGAH0cxOhFZDgzXWhDhnAJDw5s4roOXN4OhjiXa8W7Y3rhX3FJqmJSPuC8N9vQm\n"
	"6SVbaLAE4SG5mLMueHlh4KXffEpuLEiNp9Ss3O4YfLiQpbRqE7Tm5SxKjvvQoZZe\n"
	"zHorimOaChRL2it47iuWxzxSiRMv4c+j70GiWdxXnxe4UoECQQDzJB/0U58W7RZy\n"
	"6enGVj2kWF732CoWFZWzi1FicudrBFoy63QwcowpoCazKtvZGMNlPWnC7x/6o8Gc\n"
	"uSe0ga2xAkEA8C7PipPm1/1fTRQvj1o/dDmZp243044ZNyxjg+/OPN0oWCbXIGxy\n"
	"WvmZbXriOWoSALJTjExEgraHEgnXssuk7QJBALl5ICsYMu6hMxO73gnfNayNgPxd\n"
	"WFV6Z7ULnKyV7HSVYF0hgYOHjeYe9gaMtiJYoo0zGN+L3AAtNP9huqkWlzECQE1a\n"
	"licIeVlo1e+qJ6Mgqr0Q7Aa7falZ448ccbSFYEPD6oFxiOl9Y9se9iYHZKKfIcst\n"
	"o7DUw1/hz2Ck4N5JrgUCQQCyKveNvjzkkd8HjYs0SwM0fPjK16//5qDZ2UiDGnOe\n"
	"uEzxBDAr518Z8VFbR41in3W4Y3yCDgQlLlcETrS+zYcL\n"
	"-----END RSA PRIVATE KEY-----\n";

static void
sha256_of(const char *data, size_t len, unsigned char out[CANON_HASH_LEN])
{
	unsigned n = CANON_HASH_LEN;

	EVP_Digest(data, len, out, &n, EVP_sha256(), NULL);
}

static void
test_rfc6376_headers(void **unused)
{
	struct header_fields fields;
	struct buf			 relaxed = BUF_INIT;
	struct buf			 simple = BUF_INIT;
	char				 err[256];

	assert_true(header_fields_parse(rfc6376_headers, strlen(rfc6376_headers), 998, &fields, err, sizeof(err)));
	assert_int_equal(fields.count, 2);
	for (size_t i = 0; i < fields.count; i++)
	{
		canon_header(CANON_RELAXED, fields.field[i].start, fields.field[i].len, &relaxed);
		canon_header(CANON_SIMPLE, fields.field[i].start, fields.field[i].len, &simple);
	}
	assert_string_equal(relaxed.data, "a:X\r\nb:Y Z\r\n");
	assert_string_equal(simple.data, rfc6376_headers);
	header_fields_free(&fields);
	buf_free(&relaxed);
	buf_free(&simple);
}

static void
test_rfc6376_body(void **unused)
{
	unsigned char	  got[CANON_HASH_LEN], want[CANON_HASH_LEN];
	static const char relaxed[] = " C\r\nD E\r\n";
	static const char simple[] = " C \r\nD \t E\r\n";

	canon_body_hash(CANON_RELAXED, rfc6376_body, strlen(rfc6376_body), got);
	sha256_of(relaxed, strlen(relaxed), want);
	assert_memory_equal(got, want, CANON_HASH_LEN);
	canon_body_hash(CANON_SIMPLE, rfc6376_body, strlen(rfc6376_body), got);
	sha256_of(simple, strlen(simple), want);
	assert_memory_equal(got, want, CANON_HASH_LEN);

	/* The empty body: one CRLF to simple, nothing to relaxed (3.4.3, 3.4.4). */
	canon_body_hash(CANON_SIMPLE, "", 0, got);
	sha256_of("\r\n", 2, want);
	assert_memory_equal(got, want, CANON_HASH_LEN);
	canon_body_hash(CANON_RELAXED, "\r\n\r\n", 4, got);
	sha256_of("", 0, want);
	assert_memory_equal(got, want, CANON_HASH_LEN);
	/* A last line without its CRLF gets one. */
	canon_body_hash(CANON_SIMPLE, "x", 1, got);
	sha256_of("x\r\n", 3, want);
	assert_memory_equal(got, want, CANON_HASH_LEN);
}

/*
 * The body canonicalizations as RFC 6376 3.4.3 and 3.4.4 state them, one
 * rule after the other over a copy, slow and plain: what the one-pass
 * canon_body_hash (which hashes unchanged lines straight from the body)
 * must agree with.
 */
static void
reference_body(enum canon c, const char *body, size_t len, struct buf *out)
{
	size_t last_line_end = 0; /* the end of the last line that is not empty */

	for (size_t pos = 0; pos < len;)
	{
		const char *nl = memchr(body + pos, '\n', len - pos);
		size_t		end = nl ? (size_t) (nl - body) + 1 : len;
		size_t		content = end - pos - (nl ? 1 : 0);
		size_t		from = out->len;

		if (nl && content > 0 && body[pos + content - 1] == '\r')
			content--;
		for (size_t i = 0; i < content; i++)
		{
			char ch = body[pos + i];
			bool wsp = ch == ' ' || ch == '\t';

			if (c == CANON_RELAXED && wsp)
			{
				/* A run of WSP is one SP; at the end of the line, none. */
				if (out->len == from || out->data[out->len - 1] != ' ')
					buf_append_char(out, ' ');
				continue;
			}
			buf_append_char(out, ch);
		}
		if (c == CANON_RELAXED && out->len > from && out->data[out->len - 1] == ' ')
			out->len--;
		if (out->len > from)
			last_line_end = out->len + 2;
		buf_append(out, "\r\n", 2);
		pos = end;
	}
	/* Empty lines at the end go; simple makes an empty body one CRLF. */
	out->len = last_line_end;
	if (c == CANON_SIMPLE && out->len == 0)
		buf_append(out, "\r\n", 2);
}

/* Random bodies of the octets that matter, and long clean runs, against the reference. */
static void
test_body_hash_against_reference(void **unused)
{
	static const char octets[] = "ab  \t\r\n\n.";
	unsigned		  seed = 14;
	struct buf		  body = BUF_INIT;
	struct buf		  canonical = BUF_INIT;

	for (int round = 0; round < 20000; round++)
	{
		size_t n = (size_t) (rand_r(&seed) % (round < 10000 ? 40 : 400));

		buf_reset(&body);
		for (size_t i = 0; i < n; i++)
		{
			/* Now and then a whole clean line, so the direct path runs long. */
			if (rand_r(&seed) % 16 == 0)
				buf_append_str(&body, "Lorem ipsum dolor sit amet, consectetur adipiscing.\r\n");
			else
				buf_append_char(&body, octets[rand_r(&seed) % (sizeof(octets) - 1)]);
		}
		for (int c = CANON_SIMPLE; c <= CANON_RELAXED; c++)
		{
			unsigned char got[CANON_HASH_LEN], want[CANON_HASH_LEN];

			buf_reset(&canonical);
			reference_body((enum canon) c, body.data ? body.data : "", body.len, &canonical);
			sha256_of(canonical.data ? canonical.data : "", canonical.len, want);
			canon_body_hash((enum canon) c, body.data ? body.data : "", body.len, got);
			if (memcmp(got, want, CANON_HASH_LEN) != 0)
				fail_msg("%s body hash differs from the reference for the %zu octets \"%s\"",
						 canon_name((enum canon) c), body.len, body.data);
		}
	}
	buf_free(&body);
	buf_free(&canonical);
}

/* The b= of a signature field, without its folding. */
static void
signature_b(const char *field, struct buf *out)
{
	const char *b = strstr(field, " b=") + 3;

	for (; *b; b++)
		if (*b != ' ' && *b != '\r' && *b != '\n' && *b != '\t')
			buf_append_char(out, *b);
}

static void
rfc8463_check(const char *signature, const char *record, enum sign_algorithm algorithm,
			  EVP_PKEY *private)
{
	struct buf			 headers = BUF_INIT;
	struct header_fields fields;
	unsigned char		 bh[CANON_HASH_LEN], hash[CANON_HASH_LEN];
	unsigned char		 sig[1024];
	struct buf			 want = BUF_INIT, got = BUF_INIT, bh64 = BUF_INIT;
	char				 err[256];
	EVP_PKEY			*pub;
	long				 siglen;

	buf_append_str(&headers, signature);
	buf_append_str(&headers, rfc8463_headers);
	assert_true(header_fields_parse(headers.data, headers.len, 998, &fields, err, sizeof(err)));

	canon_body_hash(CANON_RELAXED, rfc8463_body, strlen(rfc8463_body), bh);
	base64_append(&bh64, bh, sizeof(bh));
	assert_string_equal(bh64.data, "2jUSOH9NhtVGCQWNr9BrIAPreKQjO6Sn7XIkfJVOzv8=");

	/* The signature field is the first: it must not select itself. */
	fields.field[0].used = true;
	canon_header_hash(CANON_RELAXED, &fields, rfc8463_h, fields.field[0].start, fields.field[0].len, hash);
	pub = keys_parse_record(record, strlen(record), algorithm, err, sizeof(err));
	assert_non_null(pub);
	signature_b(signature, &want);
	siglen = base64_decode(want.data, want.len, sig, sizeof(sig), BASE64_FOLDED);
	assert_true(siglen > 0);
	assert_true(keys_verify_hash(pub, algorithm, hash, sig, (size_t) siglen));
	/* One octet of the hash changed: the same signature no longer verifies. */
	hash[0] ^= 1;
	assert_false(keys_verify_hash(pub, algorithm, hash, sig, (size_t) siglen));
	hash[0] ^= 1;

	assert_true(keys_sign_hash(private, algorithm, hash, &got));
	assert_string_equal(got.data, want.data);

	EVP_PKEY_free(pub);
	header_fields_free(&fields);
	buf_free(&headers);
	buf_free(&want);
	buf_free(&got);
	buf_free(&bh64);
}

static void
test_rfc8463_ed25519(void **unused)
{
	unsigned char seed[32];
	EVP_PKEY *private;

	assert_int_equal(base64_decode(rfc8463_ed25519_seed, strlen(rfc8463_ed25519_seed), seed, sizeof(seed), BASE64_FOLDED), 32);
	private = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed, sizeof(seed));
	assert_non_null(private);
	rfc8463_check(rfc8463_ed25519_signature, rfc8463_ed25519_record, SIGN_ED25519_SHA256, private);
	EVP_PKEY_free(private);
}

/* Does b64 hold a signature of hash that key verifies? */
static bool
signature_verifies(EVP_PKEY *key, enum sign_algorithm algorithm, const unsigned char *hash,
				   const struct buf *b64)
{
	unsigned char sig[1024];
	long		  len = base64_decode(b64->data, b64->len, sig, sizeof(sig), BASE64_FOLDED);

	return len > 0 && keys_verify_hash(key, algorithm, hash, sig, (size_t) len);
}

/*
 * keys_sign_hash keeps each key's signing context for its next signatures:
 * every signature made through a kept context verifies, signing the same
 * hash again gives the same signature (both algorithms are deterministic),
 * and more keys than it keeps, made one after another where a freed key's
 * memory may be reused, each sign with their own key, never another's.
 */
static void
test_sign_context_kept(void **unused)
{
	const enum sign_algorithm algorithms[] = {SIGN_RSA_SHA256, SIGN_ED25519_SHA256};

	for (size_t a = 0; a < 2; a++)
	{
		enum sign_algorithm algorithm = algorithms[a];
		EVP_PKEY		   *first = keys_generate(algorithm, 2048);
		unsigned char		hash[CANON_HASH_LEN] = {0};
		struct buf			once = BUF_INIT, again = BUF_INIT;

		assert_non_null(first);
		for (int i = 0; i < 3; i++)
		{
			hash[0] = (unsigned char) i;
			buf_reset(&once);
			assert_true(keys_sign_hash(first, algorithm, hash, &once));
			assert_true(signature_verifies(first, algorithm, hash, &once));
		}
		buf_reset(&again);
		assert_true(keys_sign_hash(first, algorithm, hash, &again));
		assert_string_equal(again.data, once.data);

		for (int k = 0; k < 6; k++)
		{
			EVP_PKEY *key = keys_generate(algorithm, 2048);

			assert_non_null(key);
			for (int i = 0; i < 2; i++)
			{
				hash[1] = (unsigned char) i;
				buf_reset(&again);
				assert_true(keys_sign_hash(key, algorithm, hash, &again));
				assert_true(signature_verifies(key, algorithm, hash, &again));
				assert_false(signature_verifies(first, algorithm, hash, &again));
			}
			EVP_PKEY_free(key);
		}
		/* The first key, its context long since made room for others, still signs. */
		buf_reset(&again);
		assert_true(keys_sign_hash(first, algorithm, hash, &again));
		assert_true(signature_verifies(first, algorithm, hash, &again));
		EVP_PKEY_free(first);
		buf_free(&once);
		buf_free(&again);
	}
}

static void
test_rfc8463_rsa(void **unused)
{
	BIO *bio = BIO_new_mem_buf(rfc8463_rsa_private, -1);
	EVP_PKEY *private = PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL);

	assert_non_null(private);
	rfc8463_check(rfc8463_rsa_signature, rfc8463_rsa_record, SIGN_RSA_SHA256, private);
	EVP_PKEY_free(private);
	BIO_free(bio);
}

/* Our own field: oversigned names, folding, and a signature that verifies. */
static void
test_sign_field(void **unused)
{
	static const char headers[] =
		"From: a@example.org\r\nTo: b@example.net\r\nSubject: one\r\nSubject: two\r\n"
		"X-Other: not signed\r\n";
	struct header_fields fields;
	struct buf			 out = BUF_INIT, list = BUF_INIT, all = BUF_INIT;
	unsigned char		 bh[CANON_HASH_LEN], hash[CANON_HASH_LEN], sig[1024];
	char				 err[256];
	EVP_PKEY			*key = keys_generate(SIGN_ED25519_SHA256, 0);
	struct dkim_signer	 s = {
		  .field_name = "DKIM-Signature",
		  .leading_tags = "v=1",
		  .algorithm = SIGN_ED25519_SHA256,
		  .pkey = key,
		  .domain = "example.org",
		  .selector = "sel",
		  .header_canon = CANON_RELAXED,
		  .body_canon = CANON_RELAXED,
		  .headers = DKIM_DEFAULT_HEADERS,
		  .oversigned = DKIM_DEFAULT_OVERSIGNED,
		  .timestamp = 1700000000,
	  };
	const char *h;
	struct tag	tags[16];
	size_t		ntags;
	long		siglen;

	assert_true(header_fields_parse(headers, strlen(headers), 998, &fields, err, sizeof(err)));
	dkim_header_list(&fields, s.headers, s.oversigned, &list);
	assert_string_equal(list.data, "from:from:subject:subject:subject:date:to:to");

	canon_body_hash(CANON_RELAXED, "hello\r\n", 7, bh);
	assert_true(dkim_sign_field(&s, &fields, bh, &out));
	for (char *p = out.data; (p = strstr(p, "\r\n")) != NULL; p += 2)
		assert_true(p[2] == '\0' || p[2] == '\t');
	for (char *line = out.data, *end; (end = strstr(line, "\r\n")) != NULL; line = end + 2)
		assert_true(end - line <= 80);

	/* Verify it as a receiver would: the new field on top. */
	buf_append(&all, out.data, out.len);
	buf_append_str(&all, headers);
	header_fields_free(&fields);
	assert_true(header_fields_parse(all.data, all.len, 998, &fields, err, sizeof(err)));
	h = strchr(out.data, ':') + 1;
	assert_true(tag_list_parse(h, strlen(h), tags, 16, &ntags));
	assert_non_null(tag_find(tags, ntags, "h"));
	{
		char			 *hv = tag_strdup(tags, ntags, "h");
		const struct tag *bt = tag_find(tags, ntags, "b");

		fields.field[0].used = true;
		canon_header_hash(CANON_RELAXED, &fields, hv, fields.field[0].start, fields.field[0].len, hash);
		siglen = base64_decode(bt->value, bt->value_len, sig, sizeof(sig), BASE64_FOLDED);
		assert_int_equal(siglen, 64);
		assert_true(keys_verify_hash(key, SIGN_ED25519_SHA256, hash, sig, (size_t) siglen));
		free(hv);
	}
	EVP_PKEY_free(key);
	header_fields_free(&fields);
	buf_free(&out);
	buf_free(&list);
	buf_free(&all);
}

static void
test_header_parse_refusals(void **unused)
{
	struct header_fields fields;
	char				 err[256];
	char				 long_line[1200];

	assert_false(header_fields_parse(" continued\r\n", 12, 998, &fields, err, sizeof(err)));
	assert_non_null(strstr(err, "continues a field"));
	assert_false(header_fields_parse("no colon here\r\n", 15, 998, &fields, err, sizeof(err)));
	assert_non_null(strstr(err, "header line 1 is not a field"));
	memset(long_line, 'x', sizeof(long_line));
	memcpy(long_line, "Subject: ", 9);
	memcpy(long_line + sizeof(long_line) - 2, "\r\n", 2);
	assert_false(header_fields_parse(long_line, sizeof(long_line), 998, &fields, err, sizeof(err)));
	assert_non_null(strstr(err, "header line 1 is 1198 octets long, over the limit of 998"));
}

static void
test_tag_list(void **unused)
{
	struct tag		  tags[8];
	size_t			  n;
	static const char ok[] = " v = 1 ; a=rsa-sha256;\r\n\tb= ab\r\n cd ; ";
	static const char dup[] = "a=1; a=2";
	static const char noeq[] = "a=1; junk";

	assert_true(tag_list_parse(ok, strlen(ok), tags, 8, &n));
	assert_int_equal(n, 3);
	assert_int_equal(tag_find(tags, n, "v")->value_len, 1);
	assert_int_equal(tag_find(tags, n, "b")->value_len, 7); /* "ab", CRLF, " cd" */
	assert_false(tag_list_parse(dup, strlen(dup), tags, 8, &n));
	assert_false(tag_list_parse(noeq, strlen(noeq), tags, 8, &n));
	assert_false(tag_list_parse("=x", 2, tags, 8, &n));
}

static char *
write_key(EVP_PKEY *key, mode_t mode)
{
	char *path = strdup("/tmp/pepsi-test-key-XXXXXX");
	int	  fd = mkstemp(path);
	FILE *f = fdopen(fd, "w");

	PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL);
	fclose(f);
	chmod(path, mode);
	return path;
}

static void
test_key_refusals(void **unused)
{
	EVP_PKEY *ed = keys_generate(SIGN_ED25519_SHA256, 0);
	EVP_PKEY *small = keys_generate(SIGN_RSA_SHA256, 1024);
	char	 *ok = write_key(ed, 0600);
	char	 *open_to_group = write_key(ed, 0640);
	char	 *short_rsa = write_key(small, 0400);
	char	  err[512];
	EVP_PKEY *k;

	k = keys_load_private(ok, SIGN_ED25519_SHA256, err, sizeof(err));
	assert_non_null(k);
	assert_true(keys_same_public(k, ed));
	EVP_PKEY_free(k);

	assert_null(keys_load_private(ok, SIGN_RSA_SHA256, err, sizeof(err)));
	assert_non_null(strstr(err, "holds an Ed25519 key, but the selector's algorithm is rsa-sha256"));
	assert_null(keys_load_private(open_to_group, SIGN_ED25519_SHA256, err, sizeof(err)));
	assert_non_null(strstr(err, "accessible to group or others (mode 0640)"));
	assert_null(keys_load_private(short_rsa, SIGN_RSA_SHA256, err, sizeof(err)));
	assert_non_null(strstr(err, "1024-bit RSA key"));
	assert_null(keys_load_private("/nonexistent/key.pem", SIGN_RSA_SHA256, err, sizeof(err)));
	assert_non_null(strstr(err, "cannot open key file /nonexistent/key.pem"));

	/* The record printed for a key parses back to the same key. */
	{
		struct buf record = BUF_INIT;
		EVP_PKEY  *pub;

		keys_public_record(ed, SIGN_ED25519_SHA256, &record);
		assert_non_null(strstr(record.data, "v=DKIM1; k=ed25519; p="));
		pub = keys_parse_record(record.data, record.len, SIGN_ED25519_SHA256, err, sizeof(err));
		assert_non_null(pub);
		assert_true(keys_same_public(pub, ed));
		assert_null(keys_parse_record(record.data, record.len, SIGN_RSA_SHA256, err, sizeof(err)));
		assert_non_null(strstr(err, "k=ed25519 does not match rsa-sha256"));
		EVP_PKEY_free(pub);
		buf_free(&record);
	}
	unlink(ok);
	unlink(open_to_group);
	unlink(short_rsa);
	free(ok);
	free(open_to_group);
	free(short_rsa);
	EVP_PKEY_free(ed);
	EVP_PKEY_free(small);
}

/* RFC 6376 5.4.2, as canon_header_hash did it first: for each name, a scan from the last field. */
static size_t
reference_selection(struct header_fields *fields, const char *names, const struct header_field **list)
{
	size_t n = 0;

	for (const char *p = names; *p;)
	{
		size_t		len = strcspn(p, ":");
		const char *name = p;
		size_t		name_len = len;

		while (name_len > 0 && (*name == ' ' || *name == '\t' || *name == '\r' || *name == '\n'))
			name++, name_len--;
		while (name_len > 0 && strchr(" \t\r\n", name[name_len - 1]))
			name_len--;
		for (size_t i = fields->count; i-- > 0;)
			if (!fields->field[i].used && name_len > 0 && header_field_named(&fields->field[i], name, name_len))
			{
				fields->field[i].used = true;
				list[n++] = &fields->field[i];
				break;
			}
		p += len;
		if (*p == ':')
			p++;
	}
	return n;
}

/*
 * The indexed selection picks what the scan picks: names repeated, of
 * another case, oversigned, absent, empty, with whitespace; fields taken
 * before the call passed over.
 */
static void
test_header_selection_against_reference(void **unused)
{
	static const char *const names[] = {"From", "to", "Subject", "X-A", "x-a ", "Received", "X-B"};
	uint32_t				 seed = 12345;

	for (int round = 0; round < 2000; round++)
	{
		struct buf					headers = BUF_INIT;
		struct buf					h = BUF_INIT;
		struct header_fields		fields;
		const struct header_field **list;
		char						err[128];
		unsigned char				got[CANON_HASH_LEN], want[CANON_HASH_LEN];
		size_t						nfields, nnames, n;
		size_t						pre = SIZE_MAX;

		seed = seed * 1103515245 + 12345;
		nfields = 1 + (seed >> 16) % 12;
		for (size_t i = 0; i < nfields; i++)
		{
			seed = seed * 1103515245 + 12345;
			buf_printf(&headers, "%s: value %d\r\n", names[(seed >> 16) % 7], round);
		}
		seed = seed * 1103515245 + 12345;
		nnames = (seed >> 16) % 16;
		for (size_t i = 0; i < nnames; i++)
		{
			static const char *const h_names[] = {"from", "TO", " subject", "x-a", "X-A\r\n ", "received", "absent", "", "x-b"};

			seed = seed * 1103515245 + 12345;
			buf_printf(&h, "%s%s", i ? ":" : "", h_names[(seed >> 16) % 9]);
		}
		assert_true(header_fields_parse(headers.data, headers.len, 0, &fields, err, sizeof(err)));
		seed = seed * 1103515245 + 12345;
		if ((seed >> 16) % 2)
			pre = (seed >> 17) % fields.count;
		list = calloc(fields.count + 1, sizeof(*list));
		if (pre != SIZE_MAX)
			fields.field[pre].used = true;
		n = reference_selection(&fields, h.data ? h.data : "", list);
		canon_hash_fields(CANON_RELAXED, list, n, fields.field[0].start, fields.field[0].len, want);
		header_fields_reset(&fields);
		if (pre != SIZE_MAX)
			fields.field[pre].used = true;
		canon_header_hash(CANON_RELAXED, &fields, h.data ? h.data : "", fields.field[0].start,
						  fields.field[0].len, got);
		assert_memory_equal(got, want, CANON_HASH_LEN);
		/* The used flags end the same: every selected field, and the one taken before. */
		for (size_t i = 0; i < fields.count; i++)
		{
			bool selected = i == pre;

			for (size_t k = 0; k < n; k++)
				selected |= list[k] == &fields.field[i];
			assert_int_equal(fields.field[i].used, selected);
		}
		free(list);
		header_fields_free(&fields);
		buf_free(&headers);
		buf_free(&h);
	}
}

/*
 * 100,000 fields and an h= naming each of them, the last first: the
 * selection is made through the index (a scan per name would compare
 * 5 * 10^9 names), and in h='s order.
 */
static void
test_header_selection_many(void **unused)
{
	const size_t				count = 100000;
	struct buf					headers = BUF_INIT;
	struct buf					h = BUF_INIT;
	struct header_fields		fields;
	const struct header_field **list = calloc(count, sizeof(*list));
	char						err[128];
	unsigned char				got[CANON_HASH_LEN], want[CANON_HASH_LEN];

	for (size_t i = 0; i < count; i++)
		buf_printf(&headers, "X-Field-%06zu: v\r\n", i);
	for (size_t i = count; i-- > 0;)
		buf_printf(&h, "%sx-field-%06zu", i == count - 1 ? "" : ":", i);
	assert_true(header_fields_parse(headers.data, headers.len, 0, &fields, err, sizeof(err)));
	assert_int_equal(fields.count, count);
	assert_int_equal(canon_names_count(h.data, h.len), count);
	for (size_t i = 0; i < count; i++)
		list[i] = &fields.field[count - 1 - i];
	canon_hash_fields(CANON_SIMPLE, list, count, "Sig: b=", 7, want);
	canon_header_hash(CANON_SIMPLE, &fields, h.data, "Sig: b=", 7, got);
	assert_memory_equal(got, want, CANON_HASH_LEN);
	free(list);
	header_fields_free(&fields);
	buf_free(&headers);
	buf_free(&h);
}

static void
test_names_count(void **unused)
{
	assert_int_equal(canon_names_count("", 0), 0);
	assert_int_equal(canon_names_count(" \r\n ", 4), 0);
	assert_int_equal(canon_names_count("from", 4), 1);
	assert_int_equal(canon_names_count("from : to :\r\n subject", 22), 3);
	assert_int_equal(canon_names_count("a::b", 4), 3);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rfc6376_headers),
		cmocka_unit_test(test_rfc6376_body),
		cmocka_unit_test(test_body_hash_against_reference),
		cmocka_unit_test(test_rfc8463_ed25519),
		cmocka_unit_test(test_rfc8463_rsa),
		cmocka_unit_test(test_sign_context_kept),
		cmocka_unit_test(test_sign_field),
		cmocka_unit_test(test_header_parse_refusals),
		cmocka_unit_test(test_tag_list),
		cmocka_unit_test(test_key_refusals),
		cmocka_unit_test(test_header_selection_against_reference),
		cmocka_unit_test(test_header_selection_many),
		cmocka_unit_test(test_names_count),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
