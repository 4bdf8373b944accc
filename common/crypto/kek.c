/*
 * kek.c: sealing the key store's private keys under the key-encryption
 * key (kek.h): AES-256-GCM through OpenSSL's EVP.
 */
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "base/base64.h"
#include "crypto/kek.h"

#define KEK_VERSION 1
#define KEK_NONCE_LEN 12
#define KEK_TAG_LEN 16

void
buf_wipe(struct buf *b)
{
	if (b->data)
		OPENSSL_cleanse(b->data, b->cap);
	buf_free(b);
}

void
kek_wipe(struct kek *kek)
{
	OPENSSL_cleanse(kek, sizeof(*kek));
}

static bool
kek_id_valid(const char *id, size_t len)
{
	if (len == 0 || len > KEK_ID_MAX)
		return false;
	for (size_t i = 0; i < len; i++)
	{
		char c = id[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.'))
			return false;
	}
	return true;
}

bool
kek_parse(const char *text, struct kek *kek, char *err, size_t errlen)
{
	const char	 *colon = strchr(text, ':');
	unsigned char key[KEK_KEY_LEN + 3];
	long		  n;

	memset(kek, 0, sizeof(*kek));
	if (colon == NULL || !kek_id_valid(text, (size_t) (colon - text)))
	{
		snprintf(err, errlen,
				 "not a key-encryption key: ID:BASE64, the ID 1 to %d letters, digits, '-' or '.' (pepsi-keys "
				 "kek-generate makes one)",
				 KEK_ID_MAX);
		return false;
	}
	n = base64_decode(colon + 1, strlen(colon + 1), key, sizeof(key), BASE64_STRICT);
	if (n != KEK_KEY_LEN)
	{
		OPENSSL_cleanse(key, sizeof(key));
		snprintf(err, errlen, "key-encryption key %.*s: not %d bytes of base64", (int) (colon - text), text,
				 KEK_KEY_LEN);
		return false;
	}
	memcpy(kek->id, text, (size_t) (colon - text));
	memcpy(kek->key, key, KEK_KEY_LEN);
	OPENSSL_cleanse(key, sizeof(key));
	return true;
}

bool
kek_from_config(const struct pepsi_config *cfg, struct kek *cur, struct kek *prev, bool *has_prev, char *err,
				size_t errlen)
{
	const char *text = config_text(cfg, "crypto", "KEK");
	const char *previous = config_text(cfg, "crypto", "KEK_PREVIOUS");
	char		why[256];

	*has_prev = false;
	if (text == NULL || *text == '\0')
	{
		snprintf(err, errlen,
				 "[crypto] KEK is not set: the key store needs its key-encryption key in a secrets.d fragment "
				 "readable by pepsi-crypto (pepsi-keys kek-generate)");
		return false;
	}
	if (!kek_parse(text, cur, why, sizeof(why)))
	{
		snprintf(err, errlen, "[crypto] KEK: %s", why);
		return false;
	}
	if (previous && *previous)
	{
		if (!kek_parse(previous, prev, why, sizeof(why)))
		{
			kek_wipe(cur);
			snprintf(err, errlen, "[crypto] KEK_PREVIOUS: %s", why);
			return false;
		}
		if (strcmp(prev->id, cur->id) == 0)
		{
			snprintf(err, errlen, "[crypto] KEK_PREVIOUS has the id of KEK (%s): give the new key a new id",
					 cur->id);
			kek_wipe(cur);
			kek_wipe(prev);
			return false;
		}
		*has_prev = true;
	}
	return true;
}

bool
kek_generate(const char *id, struct buf *out, char *err, size_t errlen)
{
	unsigned char key[KEK_KEY_LEN];

	if (!kek_id_valid(id, strlen(id)))
	{
		snprintf(err, errlen, "%s: a KEK id is 1 to %d letters, digits, '-' or '.'", id, KEK_ID_MAX);
		return false;
	}
	if (RAND_bytes(key, sizeof(key)) != 1)
	{
		snprintf(err, errlen, "no random bytes for the key-encryption key");
		return false;
	}
	buf_printf(out, "%s:", id);
	base64_append(out, key, sizeof(key));
	OPENSSL_cleanse(key, sizeof(key));
	return true;
}

/* The authenticated data: the blob's header and the key's fingerprint. */
static bool
kek_aad(EVP_CIPHER_CTX *ctx, const unsigned char *header, size_t header_len, const char *fingerprint)
{
	int n;

	return EVP_CipherUpdate(ctx, NULL, &n, header, (int) header_len) == 1
		   && EVP_CipherUpdate(ctx, NULL, &n, (const unsigned char *) fingerprint, (int) strlen(fingerprint)) == 1;
}

bool
kek_wrap(const struct kek *kek, const char *fingerprint, const void *plain, size_t len, struct buf *out,
		 char *err, size_t errlen)
{
	unsigned char	header[2 + KEK_ID_MAX];
	size_t			header_len = 2 + strlen(kek->id);
	unsigned char	nonce[KEK_NONCE_LEN];
	unsigned char	tag[KEK_TAG_LEN];
	EVP_CIPHER_CTX *ctx;
	int				n = 0, m = 0;
	bool			ok = false;

	header[0] = KEK_VERSION;
	header[1] = (unsigned char) strlen(kek->id);
	memcpy(header + 2, kek->id, strlen(kek->id));
	if (len > (size_t) 1 << 24 || RAND_bytes(nonce, sizeof(nonce)) != 1)
	{
		snprintf(err, errlen, "cannot seal a private key of %zu bytes", len);
		return false;
	}
	ctx = EVP_CIPHER_CTX_new();
	buf_reset(out);
	buf_append(out, header, header_len);
	buf_append(out, nonce, sizeof(nonce));
	buf_reserve(out, len + KEK_TAG_LEN + 16);
	if (ctx && EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL) == 1
		&& EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, KEK_NONCE_LEN, NULL) == 1
		&& EVP_EncryptInit_ex(ctx, NULL, NULL, kek->key, nonce) == 1 && kek_aad(ctx, header, header_len, fingerprint)
		&& EVP_EncryptUpdate(ctx, (unsigned char *) out->data + out->len, &n, plain, (int) len) == 1
		&& EVP_EncryptFinal_ex(ctx, (unsigned char *) out->data + out->len + n, &m) == 1
		&& EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, KEK_TAG_LEN, tag) == 1)
	{
		out->len += (size_t) (n + m);
		buf_append(out, tag, sizeof(tag));
		ok = true;
	}
	else
		snprintf(err, errlen, "AES-256-GCM sealing failed");
	EVP_CIPHER_CTX_free(ctx);
	return ok;
}

bool
kek_wrapped_id(const void *blob, size_t len, char *id, size_t idlen)
{
	const unsigned char *p = blob;

	if (len < 2 || p[0] != KEK_VERSION || p[1] == 0 || p[1] > KEK_ID_MAX
		|| len < 2 + (size_t) p[1] + KEK_NONCE_LEN + KEK_TAG_LEN || idlen <= p[1])
		return false;
	memcpy(id, p + 2, p[1]);
	id[p[1]] = '\0';
	return kek_id_valid(id, p[1]);
}

bool
kek_unwrap(const struct kek *kek, const char *fingerprint, const void *blob, size_t len, struct buf *out,
		   char *err, size_t errlen)
{
	const unsigned char *p = blob;
	char				 id[KEK_ID_MAX + 1];
	size_t				 header_len, body_len;
	unsigned char		 tag[KEK_TAG_LEN];
	EVP_CIPHER_CTX		*ctx;
	int					 n = 0, m = 0;
	bool				 ok = false;

	if (!kek_wrapped_id(blob, len, id, sizeof(id)))
	{
		snprintf(err, errlen, "the private key of %s is not a sealed key (damaged?)", fingerprint);
		return false;
	}
	if (strcmp(id, kek->id) != 0)
	{
		snprintf(err, errlen, "the private key of %s is sealed under KEK %s, not %s", fingerprint, id, kek->id);
		return false;
	}
	header_len = 2 + strlen(id);
	body_len = len - header_len - KEK_NONCE_LEN - KEK_TAG_LEN;
	memcpy(tag, p + len - KEK_TAG_LEN, KEK_TAG_LEN);
	ctx = EVP_CIPHER_CTX_new();
	buf_reset(out);
	buf_reserve(out, body_len + 16);
	if (ctx && EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL) == 1
		&& EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, KEK_NONCE_LEN, NULL) == 1
		&& EVP_DecryptInit_ex(ctx, NULL, NULL, kek->key, p + header_len) == 1
		&& kek_aad(ctx, p, header_len, fingerprint)
		&& EVP_DecryptUpdate(ctx, (unsigned char *) out->data, &n, p + header_len + KEK_NONCE_LEN, (int) body_len)
			   == 1
		&& EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, KEK_TAG_LEN, tag) == 1
		&& EVP_DecryptFinal_ex(ctx, (unsigned char *) out->data + n, &m) == 1)
	{
		out->len = (size_t) (n + m);
		ok = true;
	}
	else
	{
		OPENSSL_cleanse(out->data, out->cap);
		out->len = 0;
		snprintf(err, errlen,
				 "the private key of %s does not open under KEK %s: the key or the blob is not the one it was "
				 "sealed with",
				 fingerprint, id);
	}
	EVP_CIPHER_CTX_free(ctx);
	return ok;
}
