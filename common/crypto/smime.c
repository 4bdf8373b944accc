/*
 * smime.c: S/MIME through OpenSSL CMS (smime.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/bio.h>
#include <openssl/cms.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/pkcs12.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "crypto/kek.h"
#include "crypto/smime.h"
#include "message/header.h"

/* err: what, and OpenSSL's first reason when it has one. */
static void
smime_fail(char *err, size_t errlen, const char *what)
{
	unsigned long e = ERR_peek_last_error();
	char		  reason[256] = "";

	if (e)
		ERR_error_string_n(e, reason, sizeof(reason));
	ERR_clear_error();
	if (reason[0])
		snprintf(err, errlen, "%s (%s)", what, reason);
	else
		snprintf(err, errlen, "%s", what);
}

void
smime_cert_info_free(struct smime_cert_info *info)
{
	buf_free(&info->cert);
	buf_wipe(&info->key);
}

static void
smime_fingerprint(X509 *cert, char out[65])
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int  n = 0;

	X509_digest(cert, EVP_sha256(), md, &n);
	for (unsigned int i = 0; i < n && i < 32; i++)
		snprintf(out + 2 * i, 3, "%02X", md[i]);
}

static void
smime_der(X509 *cert, struct buf *out)
{
	unsigned char *der = NULL;
	int			   n = i2d_X509(cert, &der);

	buf_reset(out);
	if (n > 0)
		buf_append(out, der, (size_t) n);
	OPENSSL_free(der);
}

static X509 *
smime_x509(const void *der, size_t len)
{
	const unsigned char *p = der;

	return d2i_X509(NULL, &p, (long) len);
}

bool
smime_is_der_certificate(const void *der, size_t len)
{
	const unsigned char *p = der;
	X509				*cert = d2i_X509(NULL, &p, (long) len);
	bool				 whole = cert != NULL && p == (const unsigned char *) der + len;

	X509_free(cert);
	ERR_clear_error();
	return whole;
}

bool
smime_looks_like(const void *data, size_t len)
{
	const unsigned char *p = data;

	return (len > 0 && p[0] == 0x30) || memmem(data, len, "-----BEGIN CERTIFICATE-----", 27) != NULL;
}

bool
smime_check(const void *der, size_t len, const char *address, char *err, size_t errlen)
{
	X509	*cert = smime_x509(der, len);
	uint32_t flags;
	bool	 ok = false;

	if (cert == NULL)
	{
		smime_fail(err, errlen, "not an X.509 certificate");
		return false;
	}
	flags = X509_get_extension_flags(cert);
	if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0)
		snprintf(err, errlen, "the certificate for %s has expired", address);
	else if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0)
		snprintf(err, errlen, "the certificate for %s is not valid yet", address);
	else if (X509_check_email(cert, address, strlen(address), 0) != 1)
		snprintf(err, errlen, "the certificate names no address %s", address);
	else if ((flags & EXFLAG_XKUSAGE) && !(X509_get_extended_key_usage(cert) & XKU_SMIME))
		snprintf(err, errlen, "the certificate for %s is not for e-mail protection (extended key usage)", address);
	else
		ok = true;
	X509_free(cert);
	return ok;
}

/* Describe cert and key into info. */
static void
smime_describe(X509 *cert, EVP_PKEY *key, struct smime_cert_info *info)
{
	EVP_PKEY *pub = X509_get0_pubkey(cert);
	bool	  ec = pub && EVP_PKEY_get_base_id(pub) == EVP_PKEY_EC;
	uint32_t  ku = X509_get_key_usage(cert);
	struct tm tm;

	memset(info, 0, sizeof(*info));
	smime_fingerprint(cert, info->fingerprint);
	snprintf(info->algorithm, sizeof(info->algorithm), "%s%d", ec ? "ec" : "rsa", pub ? EVP_PKEY_get_bits(pub) : 0);
	if (ASN1_TIME_to_tm(X509_get0_notAfter(cert), &tm) == 1)
		info->expires = timegm(&tm);
	info->can_sign = (ku & (KU_DIGITAL_SIGNATURE | KU_NON_REPUDIATION)) != 0;
	info->can_encrypt = (ku & (ec ? KU_KEY_AGREEMENT : KU_KEY_ENCIPHERMENT)) != 0;
	smime_der(cert, &info->cert);
	if (key)
	{
		PKCS8_PRIV_KEY_INFO *p8 = EVP_PKEY2PKCS8(key);
		unsigned char		*der = NULL;
		int					 n = p8 ? i2d_PKCS8_PRIV_KEY_INFO(p8, &der) : -1;

		if (n > 0)
		{
			buf_append(&info->key, der, (size_t) n);
			OPENSSL_cleanse(der, (size_t) n);
			info->has_secret = true;
		}
		OPENSSL_free(der);
		PKCS8_PRIV_KEY_INFO_free(p8);
	}
}

static EVP_PKEY *
smime_pkey(const struct buf *key)
{
	const unsigned char *p = (const unsigned char *) key->data;
	PKCS8_PRIV_KEY_INFO *p8 = d2i_PKCS8_PRIV_KEY_INFO(NULL, &p, (long) key->len);
	EVP_PKEY			*pkey = p8 ? EVP_PKCS82PKEY(p8) : NULL;

	PKCS8_PRIV_KEY_INFO_free(p8);
	return pkey;
}

/* A certificate and key from PKCS#12, PEM or DER bytes. */
static bool
smime_read(const void *data, size_t len, const char *password, X509 **cert, EVP_PKEY **key)
{
	const unsigned char *p = data;
	PKCS12				*p12 = d2i_PKCS12(NULL, &p, (long) len);
	BIO					*bio;
	char				 pass[256];

	*cert = NULL;
	*key = NULL;
	if (p12)
	{
		STACK_OF(X509) *ca = NULL;
		bool ok = PKCS12_parse(p12, password ? password : "", key, cert, &ca) == 1;

		sk_X509_pop_free(ca, X509_free);
		PKCS12_free(p12);
		return ok && *cert;
	}
	ERR_clear_error();
	if ((*cert = smime_x509(data, len)) != NULL)
		return true;
	ERR_clear_error();
	bio = BIO_new_mem_buf(data, (int) len);
	*cert = PEM_read_bio_X509(bio, NULL, NULL, NULL);
	BIO_free(bio);
	ERR_clear_error();
	bio = BIO_new_mem_buf(data, (int) len);
	snprintf(pass, sizeof(pass), "%s", password ? password : "");
	*key = PEM_read_bio_PrivateKey(bio, NULL, NULL, pass);
	OPENSSL_cleanse(pass, sizeof(pass));
	BIO_free(bio);
	ERR_clear_error();
	return *cert != NULL;
}

bool
smime_inspect(const void *data, size_t len, const char *password, const char *address, bool want_secret,
			  struct smime_cert_info *info, char *err, size_t errlen)
{
	X509	 *cert;
	EVP_PKEY *key;
	bool	  ok = false;

	memset(info, 0, sizeof(*info));
	if (len > SMIME_MAX || !smime_read(data, len, password, &cert, &key))
		smime_fail(err, errlen, "neither an X.509 certificate nor a PKCS#12 bundle (or its password is not the one)");
	else if (want_secret && key == NULL)
		snprintf(err, errlen, "a certificate without its private key: an identity needs both");
	else if (key && X509_check_private_key(cert, key) != 1)
		smime_fail(err, errlen, "the private key is not the certificate's");
	else
	{
		smime_describe(cert, want_secret ? key : NULL, info);
		ok = smime_check(info->cert.data, info->cert.len, address, err, errlen);
		if (!ok)
			smime_cert_info_free(info);
	}
	X509_free(cert);
	EVP_PKEY_free(key);
	return ok;
}

static bool
smime_add_ext(X509 *cert, int nid, const char *value)
{
	X509V3_CTX		ctx;
	X509_EXTENSION *ext;
	bool			ok;

	X509V3_set_ctx(&ctx, cert, cert, NULL, NULL, 0);
	ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
	ok = ext && X509_add_ext(cert, ext, -1) == 1;
	X509_EXTENSION_free(ext);
	return ok;
}

bool
smime_generate(const char *address, const char *type, int days, struct smime_cert_info *info, char *err,
			   size_t errlen)
{
	bool		  ec = strcmp(type, "ec") == 0;
	EVP_PKEY	 *key;
	X509		 *cert = X509_new();
	X509_NAME	 *name = X509_NAME_new();
	unsigned char serial[16];
	BIGNUM		 *bn;
	char		  san[400];
	bool		  ok;

	if (!ec && strcmp(type, "rsa3072") != 0)
	{
		snprintf(err, errlen, "-t %s: an S/MIME key is rsa3072 or ec", type);
		X509_free(cert);
		X509_NAME_free(name);
		return false;
	}
	key = ec ? EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256") : EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t) 3072);
	RAND_bytes(serial, sizeof(serial));
	serial[0] &= 0x7f;
	bn = BN_bin2bn(serial, sizeof(serial), NULL);
	snprintf(san, sizeof(san), "email:%s", address);
	ok = key && cert && name && bn && X509_set_version(cert, 2) == 1
		 && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert)) != NULL
		 && X509_gmtime_adj(X509_getm_notBefore(cert), -300) && X509_time_adj_ex(X509_getm_notAfter(cert), days > 0 ? days : 3650, 0, NULL)
		 && X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char *) address, -1, -1, 0) == 1
		 && X509_set_subject_name(cert, name) == 1 && X509_set_issuer_name(cert, name) == 1
		 && X509_set_pubkey(cert, key) == 1 && smime_add_ext(cert, NID_subject_alt_name, san)
		 && smime_add_ext(cert, NID_key_usage,
						  ec ? "critical,digitalSignature,keyAgreement" : "critical,digitalSignature,keyEncipherment")
		 && smime_add_ext(cert, NID_ext_key_usage, "emailProtection") && X509_sign(cert, key, EVP_sha256()) > 0;
	if (ok)
		smime_describe(cert, key, info);
	else
		smime_fail(err, errlen, "making the S/MIME certificate");
	BN_free(bn);
	X509_NAME_free(name);
	X509_free(cert);
	EVP_PKEY_free(key);
	return ok;
}

bool
smime_cert_pem(const void *der, size_t len, struct buf *out, char *err, size_t errlen)
{
	X509	*cert = smime_x509(der, len);
	BIO		*bio = BIO_new(BIO_s_mem());
	BUF_MEM *mem;
	bool	 ok = cert && bio && PEM_write_bio_X509(bio, cert) == 1;

	if (ok)
	{
		BIO_get_mem_ptr(bio, &mem);
		buf_append(out, mem->data, mem->length);
	}
	else
		smime_fail(err, errlen, "not an X.509 certificate");
	BIO_free(bio);
	X509_free(cert);
	return ok;
}

/* A memory BIO's bytes into out, without its MIME-Version line (the message has its own). */
static void
smime_take(BIO *bio, struct buf *out, bool drop_mime_version)
{
	BUF_MEM *mem;
	size_t	 i = 0;

	BIO_get_mem_ptr(bio, &mem);
	if (drop_mime_version && mem->length > 13 && strncasecmp(mem->data, "MIME-Version:", 13) == 0)
	{
		const char *nl = memchr(mem->data, '\n', mem->length);

		i = nl ? (size_t) (nl - mem->data) + 1 : 0;
	}
	buf_append(out, mem->data + i, mem->length - i);
}

bool
smime_sign(const struct buf *cert, const struct buf *key, const void *entity, size_t len, struct buf *out,
		   char *err, size_t errlen)
{
	X509			*x = smime_x509(cert->data, cert->len);
	EVP_PKEY		*pkey = smime_pkey(key);
	BIO				*in = BIO_new_mem_buf(entity, (int) len);
	BIO				*mime = BIO_new(BIO_s_mem());
	CMS_ContentInfo *cms = NULL;
	bool			 ok = false;

	if (x == NULL || pkey == NULL)
		smime_fail(err, errlen, "the signer's certificate or key does not load");
	/* Streamed: SMIME_write_CMS reads the entity, digests and signs it as it writes the multipart/signed. */
	else if ((cms = CMS_sign(x, pkey, NULL, in, CMS_DETACHED | CMS_BINARY | CMS_STREAM)) == NULL)
		smime_fail(err, errlen, "signing");
	else if (SMIME_write_CMS(mime, cms, in, CMS_DETACHED | CMS_BINARY | CMS_STREAM | SMIME_CRLFEOL) != 1)
		smime_fail(err, errlen, "writing the multipart/signed entity");
	else
	{
		smime_take(mime, out, true);
		ok = true;
	}
	CMS_ContentInfo_free(cms);
	BIO_free(in);
	BIO_free(mime);
	X509_free(x);
	EVP_PKEY_free(pkey);
	return ok;
}

bool
smime_encrypt(const struct buf *certs, size_t count, bool gcm, const void *entity, size_t len, struct buf *out,
			  char *err, size_t errlen)
{
	STACK_OF(X509) *stack = sk_X509_new_null();
	BIO				*in = BIO_new_mem_buf(entity, (int) len);
	BIO				*mime = BIO_new(BIO_s_mem());
	CMS_ContentInfo *cms = NULL;
	bool			 ok = false;

	for (size_t i = 0; i < count; i++)
	{
		X509 *x = smime_x509(certs[i].data, certs[i].len);

		if (x == NULL)
		{
			smime_fail(err, errlen, "a recipient's certificate does not load");
			goto done;
		}
		sk_X509_push(stack, x);
	}
	cms = CMS_encrypt(stack, in, gcm ? EVP_aes_256_gcm() : EVP_aes_256_cbc(), CMS_BINARY);
	if (cms == NULL)
		smime_fail(err, errlen, "encrypting");
	else if (SMIME_write_CMS(mime, cms, NULL, CMS_BINARY | SMIME_CRLFEOL) != 1)
		smime_fail(err, errlen, "writing the application/pkcs7-mime entity");
	else
	{
		smime_take(mime, out, true);
		ok = true;
	}
done:
	CMS_ContentInfo_free(cms);
	sk_X509_pop_free(stack, X509_free);
	BIO_free(in);
	BIO_free(mime);
	return ok;
}

/* Is type (a Content-Type value) application/pkcs7-mime or its x- form? */
static bool
smime_is_pkcs7_mime(const char *type)
{
	return type
		   && (strncasecmp(type, "application/pkcs7-mime", 22) == 0
			   || strncasecmp(type, "application/x-pkcs7-mime", 24) == 0);
}

bool
smime_is_encrypted(const char *headers, size_t hlen)
{
	char *type = header_get(headers, hlen, "Content-Type");
	bool  yes = smime_is_pkcs7_mime(type)
			   && (strcasestr(type, "enveloped-data") != NULL || strcasestr(type, "smime.p7m") != NULL);

	free(type);
	return yes;
}

bool
smime_is_signed(const void *entity, size_t len)
{
	const char *sep = memmem(entity, len, "\r\n\r\n", 4);
	size_t		hlen = sep ? (size_t) (sep - (const char *) entity) + 2 : len;
	char	   *type = header_get(entity, hlen, "Content-Type");
	bool		yes = type
			   && ((strncasecmp(type, "multipart/signed", 16) == 0 && strcasestr(type, "pkcs7-signature"))
				   || (smime_is_pkcs7_mime(type) && strcasestr(type, "signed-data")));

	free(type);
	return yes;
}

bool
smime_decrypt(const struct buf *cert, const struct buf *key, const void *message, size_t len, struct buf *out,
			  char *err, size_t errlen)
{
	X509			*x = smime_x509(cert->data, cert->len);
	EVP_PKEY		*pkey = smime_pkey(key);
	BIO				*in = BIO_new_mem_buf(message, (int) len);
	BIO				*plain = BIO_new(BIO_s_mem());
	CMS_ContentInfo *cms = NULL;
	bool			 ok = false;

	if (x == NULL || pkey == NULL)
		smime_fail(err, errlen, "the identity's certificate or key does not load");
	else if ((cms = SMIME_read_CMS(in, NULL)) == NULL)
		smime_fail(err, errlen, "the S/MIME body does not decode as CMS");
	else if (OBJ_obj2nid(CMS_get0_type(cms)) != NID_pkcs7_enveloped
			 && OBJ_obj2nid(CMS_get0_type(cms)) != NID_id_smime_ct_authEnvelopedData)
		snprintf(err, errlen, "the S/MIME body is not enveloped data");
	else if (CMS_decrypt(cms, pkey, x, NULL, plain, CMS_BINARY) != 1)
	{
		char fpr[65];
		char what[120];

		smime_fingerprint(x, fpr);
		snprintf(what, sizeof(what), "the message does not decrypt with certificate %s", fpr);
		smime_fail(err, errlen, what);
	}
	else
	{
		smime_take(plain, out, false);
		ok = true;
	}
	CMS_ContentInfo_free(cms);
	BIO_free(in);
	BIO_free(plain);
	X509_free(x);
	EVP_PKEY_free(pkey);
	return ok;
}

static STACK_OF(X509) * smime_stack(const struct buf *certs, size_t n)
{
	STACK_OF(X509) *stack = sk_X509_new_null();

	for (size_t i = 0; i < n; i++)
	{
		X509 *x = smime_x509(certs[i].data, certs[i].len);

		if (x)
			sk_X509_push(stack, x);
	}
	ERR_clear_error();
	return stack;
}

/* The signed content alone, unchecked (to pass on when the signature is not good). */
static void
smime_content(CMS_ContentInfo *cms, const struct buf *detached, struct buf *content)
{
	BIO *dcont = detached->len ? BIO_new_mem_buf(detached->data, (int) detached->len) : NULL;
	BIO *out = BIO_new(BIO_s_mem());

	buf_reset(content);
	if (CMS_verify(cms, NULL, NULL, dcont, out,
				   CMS_NO_SIGNER_CERT_VERIFY | CMS_NO_ATTR_VERIFY | CMS_NO_CONTENT_VERIFY | CMS_BINARY)
		== 1)
		smime_take(out, content, false);
	else if (detached->len)
		buf_append(content, detached->data, detached->len);
	ERR_clear_error();
	BIO_free(dcont);
	BIO_free(out);
}

/*
 * The content-encryption algorithms of SMIMECapabilities that
 * peer_key.smime_capabilities names: AES (RFC 8551 2.7); the older ones a
 * signer may list too (3DES, RC2) are never used, so not recorded.
 */
static const struct
{
	int			nid;
	const char *name;
} smime_cipher_names[] = {
	{NID_aes_256_gcm, "aes-256-gcm"},
	{NID_aes_192_gcm, "aes-192-gcm"},
	{NID_aes_128_gcm, "aes-128-gcm"},
	{NID_aes_256_cbc, "aes-256-cbc"},
	{NID_aes_192_cbc, "aes-192-cbc"},
	{NID_aes_128_cbc, "aes-128-cbc"},
};

/* The ciphers si's signed SMIMECapabilities attribute announces (RFC 8551 2.5.2), in its order, into caps. */
static void
smime_signer_capabilities(CMS_SignerInfo *si, struct buf *caps)
{
	int				idx = CMS_signed_get_attr_by_NID(si, NID_SMIMECapabilities, -1);
	X509_ATTRIBUTE *attr = idx >= 0 ? CMS_signed_get_attr(si, idx) : NULL;
	ASN1_TYPE	   *type = attr ? X509_ATTRIBUTE_get0_type(attr, 0) : NULL;
	X509_ALGORS	   *algs = NULL;

	if (type && type->type == V_ASN1_SEQUENCE)
	{
		const unsigned char *p = type->value.sequence->data;

		algs = d2i_X509_ALGORS(NULL, &p, type->value.sequence->length);
	}
	for (int i = 0; algs && i < sk_X509_ALGOR_num(algs); i++)
	{
		const ASN1_OBJECT *obj;
		int				   nid;

		X509_ALGOR_get0(&obj, NULL, NULL, sk_X509_ALGOR_value(algs, i));
		nid = OBJ_obj2nid(obj);
		for (size_t c = 0; c < sizeof(smime_cipher_names) / sizeof(smime_cipher_names[0]); c++)
			if (smime_cipher_names[c].nid == nid)
			{
				if (caps->len > 0)
					buf_append_char(caps, ',');
				buf_append_str(caps, smime_cipher_names[c].name);
			}
	}
	sk_X509_ALGOR_pop_free(algs, X509_ALGOR_free);
}

bool
smime_verify(const void *signed_, size_t len, const struct buf *cas, size_t ncas, const struct buf *extra,
			 size_t nextra, const char *from, struct buf *content, struct pgp_verdict *verdict, char *err,
			 size_t errlen)
{
	return smime_verify_signer(signed_, len, cas, ncas, extra, nextra, from, content, verdict, NULL, NULL, err,
							   errlen);
}

bool
smime_verify_signer(const void *signed_, size_t len, const struct buf *cas, size_t ncas, const struct buf *extra,
					size_t nextra, const char *from, struct buf *content, struct pgp_verdict *verdict,
					struct buf *signer_cert, struct buf *caps, char *err, size_t errlen)
{
	BIO				*in = BIO_new_mem_buf(signed_, (int) len);
	BIO				*bcont = NULL, *out = BIO_new(BIO_s_mem()), *dcont = NULL;
	CMS_ContentInfo *cms = SMIME_read_CMS(in, &bcont);
	STACK_OF(X509) *anchors = smime_stack(cas, ncas), *others = smime_stack(extra, nextra), *signers = NULL;
	X509_STORE *store = X509_STORE_new();
	struct buf	detached = BUF_INIT;
	bool		ok = false;

	memset(verdict, 0, sizeof(*verdict));
	if (cms == NULL || OBJ_obj2nid(CMS_get0_type(cms)) != NID_pkcs7_signed)
	{
		smime_fail(err, errlen, "not an S/MIME signature");
		goto done;
	}
	ok = true;
	verdict->signed_ = true;
	if (bcont)
	{
		char chunk[8192];
		int	 n;

		while ((n = BIO_read(bcont, chunk, sizeof(chunk))) > 0)
			buf_append(&detached, chunk, (size_t) n);
		dcont = BIO_new_mem_buf(detached.data ? detached.data : "", (int) detached.len);
	}
	for (int i = 0; i < sk_X509_num(anchors); i++)
		X509_STORE_add_cert(store, sk_X509_value(anchors, i));
	if (CMS_verify(cms, others, store, dcont, out, 0) != 1)
	{
		smime_fail(verdict->reason, sizeof(verdict->reason), "the signature does not verify against the trusted CAs");
		smime_content(cms, &detached, content);
		goto done;
	}
	smime_take(out, content, false);
	signers = CMS_get0_signers(cms);
	if (sk_X509_num(signers) < 1)
		snprintf(verdict->reason, sizeof(verdict->reason), "no signer certificate");
	else
	{
		X509 *signer = sk_X509_value(signers, 0);

		smime_fingerprint(signer, verdict->fingerprint);
		if (from == NULL || X509_check_email(signer, from, strlen(from), 0) != 1)
			snprintf(verdict->reason, sizeof(verdict->reason), "the signer's certificate does not name the sender %s",
					 from ? from : "(none)");
		else
			verdict->good = true;
		if (verdict->good && signer_cert)
		{
			unsigned char *der = NULL;
			int			   n = i2d_X509(signer, &der);

			if (n > 0)
				buf_append(signer_cert, der, (size_t) n);
			OPENSSL_free(der);
		}
		if (verdict->good && caps)
			smime_signer_capabilities(sk_CMS_SignerInfo_value(CMS_get0_SignerInfos(cms), 0), caps);
	}
done:
	sk_X509_free(signers);
	CMS_ContentInfo_free(cms);
	BIO_free(in);
	BIO_free(bcont);
	BIO_free(dcont);
	BIO_free(out);
	sk_X509_pop_free(anchors, X509_free);
	sk_X509_pop_free(others, X509_free);
	X509_STORE_free(store);
	buf_free(&detached);
	ERR_clear_error();
	return ok;
}
