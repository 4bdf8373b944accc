/*
 * smime.h: S/MIME (RFC 8551) through OpenSSL CMS (pepsi-crypto), beside
 * OpenPGP (openpgp.h, pgpsession.h) behind the same shapes: a key's
 * description for the key store, encrypt and sign for the encrypt stage,
 * decrypt and verify for the decrypt stage.
 *
 * In the key store an S/MIME identity's public_key and a correspondent's
 * key_data are the X.509 certificate in DER, private_wrapped the sealed
 * PKCS#8 DER private key, the fingerprint the certificate's SHA-256 in
 * upper-case hex.  RSA and EC keys both encrypt (key transport, ECDH key
 * agreement) and sign.
 */
#ifndef PEPSI_SMIME_H
#define PEPSI_SMIME_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "base/buf.h"
#include "crypto/openpgp.h"

/* An S/MIME entity or message is at most this big (a DER or base64 body). */
#define SMIME_MAX (64 * 1024 * 1024)

struct smime_cert_info
{
	char	   fingerprint[65];
	char	   algorithm[32];
	time_t	   expires;
	bool	   has_secret;
	bool	   can_sign;
	bool	   can_encrypt;
	struct buf cert; /* DER */
	struct buf key;	 /* PKCS#8 DER when has_secret; wipe it */
};

void smime_cert_info_free(struct smime_cert_info *info);

/* Does data look like an X.509 certificate or PKCS#12 (rather than an OpenPGP key)? */
bool smime_looks_like(const void *data, size_t len);

/* Is der exactly one X.509 certificate in DER, nothing after it? */
bool smime_is_der_certificate(const void *der, size_t len);

/*
 * Read a certificate (PEM or DER, with its PEM private key after it) or a
 * PKCS#12 bundle (password, "" when none) and check it is one address may
 * use (smime_check); when want_secret, with a private key that matches.
 */
bool smime_inspect(const void *data, size_t len, const char *password, const char *address, bool want_secret,
				   struct smime_cert_info *info, char *err, size_t errlen);

/*
 * A certificate (DER) address may use now: in its validity period, with
 * address as an rfc822Name or emailAddress, and a key usage and extended
 * key usage that allow e-mail protection.  The reason otherwise.
 */
bool smime_check(const void *der, size_t len, const char *address, char *err, size_t errlen);

/* A self-signed certificate and key for address: type "rsa3072" or "ec" (P-256), valid days (0: 3650). */
bool smime_generate(const char *address, const char *type, int days, struct smime_cert_info *info, char *err,
					size_t errlen);

/* The PEM form of a DER certificate. */
bool smime_cert_pem(const void *der, size_t len, struct buf *out, char *err, size_t errlen);

/*
 * Sign entity (a MIME entity, CRLF) with cert and key (DER): the
 * multipart/signed entity (RFC 8551 3.5.3), detached signature, into out.
 */
bool smime_sign(const struct buf *cert, const struct buf *key, const void *entity, size_t len, struct buf *out,
				char *err, size_t errlen);

/*
 * Encrypt entity to the certificates certs (DER): AES-256-GCM
 * (authEnveloped-data) when gcm, else AES-256-CBC (enveloped-data).  out
 * is the application/pkcs7-mime entity: its Content-* fields, a blank
 * line, the base64 body.
 */
bool smime_encrypt(const struct buf *certs, size_t count, bool gcm, const void *entity, size_t len, struct buf *out,
				   char *err, size_t errlen);

/* Is this header block an S/MIME encrypted (enveloped or authEnveloped) message's? */
bool smime_is_encrypted(const char *headers, size_t hlen);

/* Is this MIME entity (headers and body) S/MIME signed (multipart/signed or signed-data)? */
bool smime_is_signed(const void *entity, size_t len);

/*
 * Decrypt message (the whole message: headers, blank line, body), which
 * must be encrypted to cert, with key (DER): the entity into out.
 */
bool smime_decrypt(const struct buf *cert, const struct buf *key, const void *message, size_t len,
				   struct buf *out, char *err, size_t errlen);

/*
 * Verify signed (an S/MIME signed entity): good when the signer's
 * certificate chains to one of cas (DER), is valid now and names from;
 * the signed content into content (also when not good); false when it is
 * not a signature at all.  extra: certificates (DER) that may complete
 * the chain (the sender's as the key store has it).
 */
bool smime_verify(const void *signed_, size_t len, const struct buf *cas, size_t ncas, const struct buf *extra,
				  size_t nextra, const char *from, struct buf *content, struct pgp_verdict *verdict, char *err,
				  size_t errlen);

/*
 * smime_verify, and for learning the sender's certificate from it: when
 * the signature is good (verdict->good), the signer's certificate (DER) is
 * appended to signer_cert and the ciphers its SMIMECapabilities attribute
 * announces, comma-separated in its order ("aes-256-gcm,aes-256-cbc":
 * peer_key.smime_capabilities's names), to caps (either may be NULL).
 */
bool smime_verify_signer(const void *signed_, size_t len, const struct buf *cas, size_t ncas, const struct buf *extra,
						 size_t nextra, const char *from, struct buf *content, struct pgp_verdict *verdict,
						 struct buf *signer_cert, struct buf *caps, char *err, size_t errlen);

#endif
