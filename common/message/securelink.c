/*
 * securelink.c: the secure-link portal's seal (securelink.h).
 */
#include "securelink.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#define SECURELINK_TAG_LEN 16

/* HKDF-SHA256 of the secret under label into out (32 bytes). */
static bool
securelink_hkdf(const unsigned char *secret, size_t len, const char *label, unsigned char *out, size_t outlen)
{
	EVP_PKEY_CTX *pctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
	bool		  ok = pctx != NULL && EVP_PKEY_derive_init(pctx) > 0 && EVP_PKEY_CTX_set_hkdf_md(pctx, EVP_sha256()) > 0
			  && EVP_PKEY_CTX_set1_hkdf_salt(pctx, (const unsigned char *) "pepsi secure-link", 17) > 0
			  && EVP_PKEY_CTX_set1_hkdf_key(pctx, secret, (int) len) > 0
			  && EVP_PKEY_CTX_add1_hkdf_info(pctx, (const unsigned char *) label, (int) strlen(label)) > 0
			  && EVP_PKEY_derive(pctx, out, &outlen) > 0;

	EVP_PKEY_CTX_free(pctx);
	return ok;
}

static bool
securelink_derive(const unsigned char secret[32], struct securelink *link)
{
	static const char hex[] = "0123456789abcdef";

	for (size_t i = 0; i < 32; i++)
	{
		link->token[2 * i] = hex[secret[i] >> 4];
		link->token[2 * i + 1] = hex[secret[i] & 15];
	}
	link->token[SECURELINK_TOKEN_LEN] = '\0';
	return securelink_hkdf(secret, 32, "link id v1", link->id, sizeof(link->id))
		   && securelink_hkdf(secret, 32, "message key v1", link->key, sizeof(link->key));
}

bool
securelink_new(struct securelink *link)
{
	unsigned char secret[32];
	bool		  ok = RAND_bytes(secret, sizeof(secret)) == 1 && securelink_derive(secret, link);

	OPENSSL_cleanse(secret, sizeof(secret));
	return ok;
}

bool
securelink_from_token(const char *token, struct securelink *link)
{
	unsigned char secret[32];
	bool		  ok;

	if (token == NULL || strlen(token) != SECURELINK_TOKEN_LEN || strspn(token, "0123456789abcdef") != SECURELINK_TOKEN_LEN)
		return false;
	for (size_t i = 0; i < 32; i++)
	{
		char pair[3] = {token[2 * i], token[2 * i + 1], '\0'};

		secret[i] = (unsigned char) strtoul(pair, NULL, 16);
	}
	ok = securelink_derive(secret, link);
	OPENSSL_cleanse(secret, sizeof(secret));
	return ok;
}

void
securelink_buf_wipe(struct buf *b)
{
	if (b->data)
		OPENSSL_cleanse(b->data, b->cap);
	buf_free(b);
}

void
securelink_wipe(struct securelink *link)
{
	OPENSSL_cleanse(link, sizeof(*link));
}

/* The additional data: the identifier and the recipient (lower case). */
static bool
securelink_aad(EVP_CIPHER_CTX *ctx, const struct securelink *link, const char *recipient)
{
	char lower[512];
	int	 n = 0;
	int	 len = 0;

	for (; recipient[n] && n < (int) sizeof(lower) - 1; n++)
		lower[n] = (char) tolower((unsigned char) recipient[n]);
	return EVP_CipherUpdate(ctx, NULL, &len, link->id, SECURELINK_ID_LEN) == 1
		   && EVP_CipherUpdate(ctx, NULL, &len, (const unsigned char *) lower, n) == 1;
}

bool
securelink_seal(const struct securelink *link, const char *recipient, const void *plain, size_t len,
				unsigned char nonce[SECURELINK_NONCE_LEN], struct buf *sealed)
{
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	int				outl = 0, finl = 0;
	bool			ok = false;

	buf_reset(sealed);
	if (ctx == NULL || len > (size_t) 1 << 30 || RAND_bytes(nonce, SECURELINK_NONCE_LEN) != 1)
		goto done;
	buf_reserve(sealed, len + SECURELINK_TAG_LEN);
	if (EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, link->key, nonce) != 1 || !securelink_aad(ctx, link, recipient)
		|| EVP_EncryptUpdate(ctx, (unsigned char *) sealed->data, &outl, plain, (int) len) != 1
		|| EVP_EncryptFinal_ex(ctx, (unsigned char *) sealed->data + outl, &finl) != 1
		|| EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, SECURELINK_TAG_LEN, sealed->data + outl + finl) != 1)
		goto done;
	sealed->len = (size_t) (outl + finl) + SECURELINK_TAG_LEN;
	sealed->data[sealed->len] = '\0';
	ok = true;
done:
	EVP_CIPHER_CTX_free(ctx);
	return ok;
}

bool
securelink_open(const struct securelink *link, const char *recipient, const unsigned char *nonce,
				const unsigned char *sealed, size_t len, struct buf *plain)
{
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	unsigned char	tag[SECURELINK_TAG_LEN];
	int				outl = 0, finl = 0;
	bool			ok = false;

	buf_reset(plain);
	if (ctx == NULL || len < SECURELINK_TAG_LEN || len > (size_t) 1 << 30)
		goto done;
	memcpy(tag, sealed + len - SECURELINK_TAG_LEN, SECURELINK_TAG_LEN);
	buf_reserve(plain, len);
	if (EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, link->key, nonce) != 1 || !securelink_aad(ctx, link, recipient)
		|| EVP_DecryptUpdate(ctx, (unsigned char *) plain->data, &outl, sealed, (int) (len - SECURELINK_TAG_LEN)) != 1
		|| EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, SECURELINK_TAG_LEN, tag) != 1
		|| EVP_DecryptFinal_ex(ctx, (unsigned char *) plain->data + outl, &finl) != 1)
	{
		securelink_buf_wipe(plain);
		goto done;
	}
	plain->len = (size_t) (outl + finl);
	plain->data[plain->len] = '\0';
	ok = true;
done:
	EVP_CIPHER_CTX_free(ctx);
	return ok;
}
