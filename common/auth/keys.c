/* keys.c: see keys.h. */
#include "auth/keys.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <openssl/x509.h>

#include "base/base64.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "dns/dns.h"

bool
sign_algorithm_parse(const char *text, size_t len, enum sign_algorithm *out)
{
	if (len == 10 && strncasecmp(text, "rsa-sha256", 10) == 0)
		*out = SIGN_RSA_SHA256;
	else if (len == 14 && strncasecmp(text, "ed25519-sha256", 14) == 0)
		*out = SIGN_ED25519_SHA256;
	else
		return false;
	return true;
}

const char *
sign_algorithm_name(enum sign_algorithm a)
{
	return a == SIGN_RSA_SHA256 ? "rsa-sha256" : "ed25519-sha256";
}

const char *
sign_algorithm_key_type(enum sign_algorithm a)
{
	return a == SIGN_RSA_SHA256 ? "rsa" : "ed25519";
}

static int
keys_pkey_type(enum sign_algorithm a)
{
	return a == SIGN_RSA_SHA256 ? EVP_PKEY_RSA : EVP_PKEY_ED25519;
}

/* The key's type as a person would name it, for messages. */
static const char *
keys_type_name(EVP_PKEY *pkey)
{
	switch (EVP_PKEY_get_base_id(pkey))
	{
		case EVP_PKEY_RSA:
			return "an RSA key";
		case EVP_PKEY_ED25519:
			return "an Ed25519 key";
		case EVP_PKEY_EC:
			return "an EC key";
		case EVP_PKEY_ED448:
			return "an Ed448 key";
		default:
			return "a key of another type";
	}
}

/* Is pkey usable for algorithm?  Else a reason in err. */
static bool
keys_check_type(EVP_PKEY *pkey, enum sign_algorithm algorithm, const char *what, char *err,
				size_t errlen)
{
	if (EVP_PKEY_get_base_id(pkey) != keys_pkey_type(algorithm))
	{
		snprintf(err, errlen, "%s holds %s, but the selector's algorithm is %s (needs %s key)",
				 what, keys_type_name(pkey), sign_algorithm_name(algorithm),
				 algorithm == SIGN_RSA_SHA256 ? "an RSA" : "an Ed25519");
		return false;
	}
	if (algorithm == SIGN_RSA_SHA256
		&& (EVP_PKEY_get_bits(pkey) < KEYS_RSA_MIN_BITS || EVP_PKEY_get_bits(pkey) > KEYS_RSA_MAX_BITS))
	{
		snprintf(err, errlen, "%s holds a %d-bit RSA key; use %d to %d bits (2048 or 3072)",
				 what, EVP_PKEY_get_bits(pkey), KEYS_RSA_MIN_BITS, KEYS_RSA_MAX_BITS);
		return false;
	}
	return true;
}

EVP_PKEY *
keys_load_private(const char *path, enum sign_algorithm algorithm, char *err, size_t errlen)
{
	int			fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	struct stat st;
	FILE	   *f;
	EVP_PKEY   *pkey;

	if (fd < 0)
	{
		snprintf(err, errlen, "cannot open key file %s: %s", path, strerror(errno));
		return NULL;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
	{
		snprintf(err, errlen, "key file %s is not a regular file", path);
		close(fd);
		return NULL;
	}
	if (st.st_mode & (S_IRWXG | S_IRWXO))
	{
		snprintf(err, errlen, "key file %s is accessible to group or others (mode %04o): "
							  "a private key must be mode 0600 or 0400 (chmod go= %s)",
				 path, (unsigned) (st.st_mode & 07777), path);
		close(fd);
		return NULL;
	}
	f = fdopen(fd, "r");
	if (f == NULL)
	{
		snprintf(err, errlen, "cannot read key file %s: %s", path, strerror(errno));
		close(fd);
		return NULL;
	}
	pkey = PEM_read_PrivateKey(f, NULL, NULL, NULL);
	fclose(f);
	if (pkey == NULL)
	{
		snprintf(err, errlen, "key file %s holds no PEM private key (%s)", path,
				 ERR_reason_error_string(ERR_get_error()) ? ERR_reason_error_string(ERR_peek_last_error()) : "unreadable");
		ERR_clear_error();
		return NULL;
	}
	{
		char what[512];

		snprintf(what, sizeof(what), "key file %s", path);
		if (!keys_check_type(pkey, algorithm, what, err, errlen))
		{
			EVP_PKEY_free(pkey);
			return NULL;
		}
	}
	return pkey;
}

static bool
keys_section_error(const struct pepsi_config *cfg, const char *section, const char *option,
				   const char *problem, char *err, size_t errlen)
{
	char where[256];

	snprintf(err, errlen, "%s: [%s] %s %s", config_origin(cfg, section, option, where, sizeof(where)),
			 section, option, problem);
	return false;
}

bool
keyring_from_config(const struct pepsi_config *cfg, struct keyring *ring, char *err, size_t errlen)
{
	const char *names[256];
	size_t		n = config_sections(cfg, KEYS_SECTION_PREFIX, names, 256);

	ring->key = xcalloc(n ? n : 1, sizeof(*ring->key));
	ring->count = 0;
	for (size_t i = 0; i < n; i++)
	{
		const char		   *domain = config_get(cfg, names[i], "DOMAIN");
		const char		   *selector = config_get(cfg, names[i], "SELECTOR");
		const char		   *algorithm = config_get(cfg, names[i], "ALGORITHM");
		const char		   *path = config_get(cfg, names[i], "KEY_FILE");
		struct signing_key *k = &ring->key[ring->count];

		if (domain == NULL || !*domain)
			return keys_section_error(cfg, names[i], "DOMAIN", "is required (the d= it signs for)", err, errlen);
		if (selector == NULL || !*selector)
			return keys_section_error(cfg, names[i], "SELECTOR", "is required", err, errlen);
		if (path == NULL || !*path)
			return keys_section_error(cfg, names[i], "KEY_FILE", "is required (a PEM private key)", err, errlen);
		if (algorithm == NULL)
			algorithm = "rsa-sha256";
		if (!sign_algorithm_parse(algorithm, strlen(algorithm), &k->algorithm))
			return keys_section_error(cfg, names[i], "ALGORITHM", "must be rsa-sha256 or ed25519-sha256",
									  err, errlen);
		for (const char *p = selector; *p; p++)
			if (!isalnum((unsigned char) *p) && *p != '-' && *p != '_' && *p != '.')
				return keys_section_error(cfg, names[i], "SELECTOR", "is not a DNS label", err, errlen);
		k->section = xstrdup(names[i]);
		k->domain = xstrdup(domain);
		for (char *p = k->domain; *p; p++)
			*p = (char) tolower((unsigned char) *p);
		k->selector = xstrdup(selector);
		k->path = xstrdup(path);
		ring->count++;
	}
	return true;
}

void
keyring_free(struct keyring *ring)
{
	for (size_t i = 0; i < ring->count; i++)
	{
		free(ring->key[i].section);
		free(ring->key[i].domain);
		free(ring->key[i].selector);
		free(ring->key[i].path);
		EVP_PKEY_free(ring->key[i].pkey);
	}
	free(ring->key);
	ring->key = NULL;
	ring->count = 0;
}

struct signing_key *
keyring_find(struct keyring *ring, const char *name)
{
	size_t plen = strlen(KEYS_SECTION_PREFIX);

	for (size_t i = 0; i < ring->count; i++)
		if (strcmp(ring->key[i].section, name) == 0
			|| strcmp(ring->key[i].section + plen, name) == 0)
			return &ring->key[i];
	return NULL;
}

/* A monotonic clock in milliseconds, coarse (a tick or so): cheap to read. */
static long long
keys_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * A stat costs as much as hashing a 2 KB body (measured: 7 us a message
 * of a signing worker, as much as canon_body_hash), for a file that
 * changes when the operator rotates the key: a loaded key's file is looked
 * at again once a second.
 */
bool
signing_key_ready(struct signing_key *key, char *err, size_t errlen)
{
	struct stat st;
	long long	now = keys_now_ms();

	if (key->pkey && now - key->checked_ms < KEYS_RECHECK_MS && now >= key->checked_ms)
		return true;
	if (stat(key->path, &st) < 0)
	{
		snprintf(err, errlen, "[%s] KEY_FILE %s: %s", key->section, key->path, strerror(errno));
		EVP_PKEY_free(key->pkey);
		key->pkey = NULL;
		return false;
	}
	if (key->pkey && st.st_dev == key->dev && st.st_ino == key->ino && st.st_mtime == key->mtime)
	{
		key->checked_ms = now;
		return true;
	}
	EVP_PKEY_free(key->pkey);
	key->pkey = keys_load_private(key->path, key->algorithm, err, errlen);
	if (key->pkey == NULL)
		return false;
	key->dev = st.st_dev;
	key->ino = st.st_ino;
	key->mtime = st.st_mtime;
	key->checked_ms = now;
	return true;
}

/*
 * The signing contexts of the keys a process signs with, set up once each:
 * a fresh context per signature (the provider's algorithm fetched, the
 * padding and digest set, the key's operation state built) costs about a
 * tenth of the RSA-2048 private-key operation itself (measured: 295 us a
 * signature with a fresh context, 263 us with a kept one), and a signing
 * worker signs with the same few keys all its life.  Each entry holds a
 * reference on its key, so a key freed elsewhere (reloaded from a changed
 * file) is never taken for a new key at the same address; the oldest entry
 * makes room.  Per thread: a context must not be shared between threads.
 */
#define KEYS_SIGN_CONTEXTS 4

struct keys_sign_context
{
	EVP_PKEY		   *pkey;
	enum sign_algorithm algorithm;
	EVP_PKEY_CTX	   *rsa; /* RSA: initialised for PKCS#1 v1.5 over SHA-256 */
	EVP_MD_CTX		   *ed;	 /* Ed25519: initialised, copied into scratch for each signature */
	EVP_MD_CTX		   *scratch;
};

static __thread struct keys_sign_context keys_sign_contexts[KEYS_SIGN_CONTEXTS];
static __thread size_t					 keys_sign_oldest;

static void
keys_sign_context_clear(struct keys_sign_context *c)
{
	EVP_PKEY_CTX_free(c->rsa);
	EVP_MD_CTX_free(c->ed);
	EVP_MD_CTX_free(c->scratch);
	EVP_PKEY_free(c->pkey);
	memset(c, 0, sizeof(*c));
}

static struct keys_sign_context *
keys_sign_context(EVP_PKEY *pkey, enum sign_algorithm algorithm)
{
	struct keys_sign_context *c;
	bool					  ok;

	for (size_t i = 0; i < KEYS_SIGN_CONTEXTS; i++)
		if (keys_sign_contexts[i].pkey == pkey && keys_sign_contexts[i].algorithm == algorithm)
			return &keys_sign_contexts[i];
	c = &keys_sign_contexts[keys_sign_oldest];
	keys_sign_oldest = (keys_sign_oldest + 1) % KEYS_SIGN_CONTEXTS;
	keys_sign_context_clear(c);
	if (algorithm == SIGN_RSA_SHA256)
	{
		c->rsa = EVP_PKEY_CTX_new(pkey, NULL);
		ok = c->rsa && EVP_PKEY_sign_init(c->rsa) > 0
			 && EVP_PKEY_CTX_set_rsa_padding(c->rsa, RSA_PKCS1_PADDING) > 0
			 && EVP_PKEY_CTX_set_signature_md(c->rsa, EVP_sha256()) > 0;
	}
	else
	{
		/* RFC 8463 3: PureEdDSA over the SHA-256 hash, not over the data. */
		c->ed = EVP_MD_CTX_new();
		c->scratch = EVP_MD_CTX_new();
		ok = c->ed && c->scratch && EVP_DigestSignInit(c->ed, NULL, NULL, NULL, pkey) > 0;
	}
	if (!ok || !EVP_PKEY_up_ref(pkey))
	{
		keys_sign_context_clear(c);
		return NULL;
	}
	c->pkey = pkey;
	c->algorithm = algorithm;
	return c;
}

bool
keys_sign_hash(EVP_PKEY *pkey, enum sign_algorithm algorithm,
			   const unsigned char hash[CANON_HASH_LEN], struct buf *b64)
{
	unsigned char			  sig[1024];
	size_t					  siglen = sizeof(sig);
	struct keys_sign_context *c = keys_sign_context(pkey, algorithm);
	bool					  ok = false;

	if (c && c->rsa)
		ok = EVP_PKEY_sign(c->rsa, sig, &siglen, hash, CANON_HASH_LEN) > 0;
	else if (c)
		ok = EVP_MD_CTX_copy_ex(c->scratch, c->ed)
			 && EVP_DigestSign(c->scratch, sig, &siglen, hash, CANON_HASH_LEN) > 0;
	if (!ok)
	{
		log_warnx("signing failed: %s", ERR_error_string(ERR_get_error(), NULL));
		ERR_clear_error();
		if (c)
			keys_sign_context_clear(c); /* set up afresh next time */
		return false;
	}
	base64_append(b64, sig, siglen);
	return true;
}

bool
keys_verify_hash(EVP_PKEY *pub, enum sign_algorithm algorithm,
				 const unsigned char hash[CANON_HASH_LEN], const unsigned char *sig, size_t siglen)
{
	bool ok;

	if (EVP_PKEY_get_base_id(pub) != keys_pkey_type(algorithm))
		return false;
	if (algorithm == SIGN_RSA_SHA256)
	{
		EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new(pub, NULL);

		ok = ctx && EVP_PKEY_verify_init(ctx) > 0
			 && EVP_PKEY_CTX_set_rsa_padding(ctx, RSA_PKCS1_PADDING) > 0
			 && EVP_PKEY_CTX_set_signature_md(ctx, EVP_sha256()) > 0
			 && EVP_PKEY_verify(ctx, sig, siglen, hash, CANON_HASH_LEN) == 1;
		EVP_PKEY_CTX_free(ctx);
	}
	else
	{
		EVP_MD_CTX *md = EVP_MD_CTX_new();

		ok = md && EVP_DigestVerifyInit(md, NULL, NULL, NULL, pub) > 0
			 && EVP_DigestVerify(md, sig, siglen, hash, CANON_HASH_LEN) == 1;
		EVP_MD_CTX_free(md);
	}
	ERR_clear_error();
	return ok;
}

EVP_PKEY *
keys_generate(enum sign_algorithm algorithm, int bits)
{
	EVP_PKEY *pkey = NULL;

	if (algorithm == SIGN_RSA_SHA256)
		pkey = EVP_RSA_gen((unsigned) bits);
	else
		pkey = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
	return pkey;
}

void
keys_public_record(EVP_PKEY *pkey, enum sign_algorithm algorithm, struct buf *out)
{
	unsigned char raw[32];
	size_t		  rawlen = sizeof(raw);

	buf_printf(out, "v=DKIM1; k=%s; p=", sign_algorithm_key_type(algorithm));
	if (algorithm == SIGN_ED25519_SHA256)
	{
		/* RFC 8463 4: the bare 32-octet key, not a SubjectPublicKeyInfo. */
		if (EVP_PKEY_get_raw_public_key(pkey, raw, &rawlen) > 0)
			base64_append(out, raw, rawlen);
	}
	else
	{
		unsigned char *der = NULL;
		int			   len = i2d_PUBKEY(pkey, &der);

		if (len > 0)
			base64_append(out, der, (size_t) len);
		OPENSSL_free(der);
	}
}

EVP_PKEY *
keys_parse_record(const char *record, size_t len, enum sign_algorithm algorithm, char *err,
				  size_t errlen)
{
	struct tag		  tags[16];
	size_t			  n;
	const struct tag *v, *k, *p;
	unsigned char	  raw[2048];
	long			  rawlen;
	EVP_PKEY		 *pub = NULL;

	if (!tag_list_parse(record, len, tags, 16, &n))
	{
		snprintf(err, errlen, "the key record is not a valid tag list");
		return NULL;
	}
	v = tag_find(tags, n, "v");
	if (v && (v != &tags[0] || v->value_len != 5 || memcmp(v->value, "DKIM1", 5) != 0))
	{
		snprintf(err, errlen, "the key record's v= is not DKIM1 first");
		return NULL;
	}
	k = tag_find(tags, n, "k");
	if ((k ? k->value_len : 3) != strlen(sign_algorithm_key_type(algorithm))
		|| (k && strncasecmp(k->value, sign_algorithm_key_type(algorithm), k->value_len) != 0))
	{
		snprintf(err, errlen, "the key record's k=%.*s does not match %s",
				 k ? (int) k->value_len : 3, k ? k->value : "rsa", sign_algorithm_name(algorithm));
		return NULL;
	}
	p = tag_find(tags, n, "p");
	if (p == NULL || p->value_len == 0)
	{
		snprintf(err, errlen, p ? "the key record is revoked (empty p=)" : "the key record has no p=");
		return NULL;
	}
	rawlen = base64_decode(p->value, p->value_len, raw, sizeof(raw), BASE64_FOLDED);
	if (rawlen <= 0)
	{
		snprintf(err, errlen, "the key record's p= is not base64");
		return NULL;
	}
	if (algorithm == SIGN_ED25519_SHA256)
	{
		if (rawlen == 32)
			pub = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, raw, 32);
	}
	else
	{
		const unsigned char *q = raw;

		pub = d2i_PUBKEY(NULL, &q, rawlen);
		if (pub == NULL)
		{
			/* RFC 6376 3.6.1 allows a bare RSAPublicKey too. */
			q = raw;
			pub = d2i_PublicKey(EVP_PKEY_RSA, NULL, &q, rawlen);
		}
	}
	ERR_clear_error();
	if (pub == NULL || EVP_PKEY_get_base_id(pub) != keys_pkey_type(algorithm))
	{
		snprintf(err, errlen, "the key record's p= holds no %s public key",
				 sign_algorithm_key_type(algorithm));
		EVP_PKEY_free(pub);
		return NULL;
	}
	return pub;
}

bool
keys_same_public(EVP_PKEY *a, EVP_PKEY *b)
{
	return EVP_PKEY_eq(a, b) == 1;
}

bool
keys_write_private(const char *path, EVP_PKEY *pkey, char *err, size_t errlen)
{
	int	  fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	FILE *f;

	if (fd < 0 || (f = fdopen(fd, "w")) == NULL)
	{
		snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
		if (fd >= 0)
		{
			close(fd);
			unlink(path);
		}
		return false;
	}
	if (!PEM_write_PrivateKey(f, pkey, NULL, NULL, 0, NULL, NULL) || fclose(f) != 0)
	{
		snprintf(err, errlen, "cannot write %s", path);
		unlink(path);
		return false;
	}
	return true;
}

bool
keys_check_published(struct dns_resolver *resolver, struct signing_key *k, char *name, size_t namelen,
					 char *verdict, size_t verdictlen)
{
	struct dns_answer answer;
	bool			  ok = false;

	snprintf(name, namelen, "%s._domainkey.%s", k->selector, k->domain);
	snprintf(verdict, verdictlen, "no TXT record");
	if (!signing_key_ready(k, verdict, verdictlen))
	{
		char why[512];

		snprintf(why, sizeof(why), "%s", verdict);
		snprintf(verdict, verdictlen, "the private key cannot be loaded: %s", why);
		return false;
	}
	dns_resolve_sync(resolver, name, DNS_TYPE_TXT, &answer);
	if (answer.status != DNS_OK)
		snprintf(verdict, verdictlen, "%s", answer.status == DNS_NXDOMAIN ? "no such name" : answer.status == DNS_TIMEOUT ? "the lookup timed out"
																														  : "the lookup failed");
	for (size_t i = 0; answer.status == DNS_OK && i < answer.count && !ok; i++)
	{
		EVP_PKEY *pub;

		if (answer.records[i].type != DNS_TYPE_TXT || answer.records[i].text == NULL)
			continue;
		pub = keys_parse_record(answer.records[i].text, answer.records[i].len, k->algorithm, verdict, verdictlen);
		if (pub && keys_same_public(pub, k->pkey))
			ok = true;
		else if (pub)
			snprintf(verdict, verdictlen, "the published key is not the private key's");
		EVP_PKEY_free(pub);
	}
	dns_answer_free(&answer);
	if (ok)
		snprintf(verdict, verdictlen, "ok");
	return ok;
}
