/*
 * tls_policy.h: which TLS a delivery to one MX host must have, and what
 * it got.  Used by pepsi-stage-relay-to-internet through the SMTP client
 * (common/smtp/smtp_client.h); the policy data (TLSA records, MTA-STS policy)
 * comes from the resolver (common/dns/dns.h) and common/smtp/mta_sts.h.
 *
 *   opportunistic  the default: STARTTLS when offered, the certificate not
 *                  checked, delivery in clear when there is no STARTTLS;
 *   DANE           RFC 7672: the MX answer and the host's TLSA answer are
 *                  DNSSEC-validated; TLS is then mandatory and the peer
 *                  must match a usable TLSA record (OpenSSL's DANE:
 *                  SSL_dane_enable, SSL_dane_tlsa_add); TLSA records none
 *                  of which is usable leave TLS mandatory but
 *                  unauthenticated (RFC 7672 2.2); a bogus TLSA answer or
 *                  one that failed keeps delivery off that host;
 *   MTA-STS        RFC 8461, when DANE does not apply (RFC 8461 2): in
 *                  enforce mode the MX host must match the policy's mx
 *                  patterns and the peer must present a certificate valid
 *                  for it (WebPKI); in testing mode failures are only
 *                  logged (and reported for TLSRPT).
 *
 * The relay stage asks before connecting (tls_policy_for_mx), hands the
 * policy to the SMTP client, which calls tls_policy_prepare on each TLS
 * connection and tls_policy_check after the handshake; the outcome, with
 * an RFC 8460 result type on failure, goes into state and the delivery
 * log line.  A message with "TLS-Required: No" (RFC 8689 5) is delivered
 * opportunistically whatever the policy.
 */
#ifndef PEPSI_TLS_POLICY_H
#define PEPSI_TLS_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <openssl/ssl.h>

#include "dns/dns.h"

struct mta_sts_policy;

enum tls_policy_kind
{
	TLS_POLICY_OPPORTUNISTIC,
	TLS_POLICY_DANE,		 /* usable TLSA records: authenticated by them */
	TLS_POLICY_DANE_ENCRYPT, /* TLSA records, none usable: TLS without authentication */
	TLS_POLICY_STS_ENFORCE,
	TLS_POLICY_STS_TESTING
};

struct tls_policy_tlsa
{
	uint8_t		   usage;	 /* 0 PKIX-TA, 1 PKIX-EE, 2 DANE-TA, 3 DANE-EE */
	uint8_t		   selector; /* 0 certificate, 1 SubjectPublicKeyInfo */
	uint8_t		   mtype;	 /* 0 full, 1 SHA2-256, 2 SHA2-512 */
	unsigned char *data;
	size_t		   len;
};

struct tls_policy
{
	enum tls_policy_kind	kind;
	char					mx_host[256]; /* the name the peer is checked against */
	char					domain[256];  /* the recipient domain (MTA-STS, TLSRPT) */
	struct tls_policy_tlsa *tlsa;
	size_t					ntlsa;
	char					sts_id[64];		 /* the MTA-STS policy id, "" without one */
	bool					sts_mx_unlisted; /* testing: the policy does not list this MX */
	char					ca_file[512];	 /* WebPKI trust anchors for MTA-STS ("": the system's) */
	/*
	 * Set when the host must not be used at all (a bogus TLSA answer, an
	 * MX that an enforced MTA-STS policy does not list): the RFC 8460
	 * result type and the reason.
	 */
	char refused_result[48];
	char refused[300];
};

/* What the relay gives tls_policy_for_mx. */
struct tls_policy_request
{
	struct dns_resolver			*resolver;
	const char					*domain;		   /* the recipient domain */
	const char					*mx_host;		   /* the MX host (the domain for an implicit MX) */
	bool						 mx_secure;		   /* the MX answer was DNSSEC-validated */
	unsigned					 port;			   /* for the TLSA name _port._tcp.mx_host (25) */
	const struct mta_sts_policy *sts;			   /* the domain's MTA-STS policy, or NULL */
	const char					*sts_ca_file;	   /* see struct tls_policy */
	bool						 tls_not_required; /* the message says TLS-Required: No */
};

/* The policy for one MX host; out is cleared first (free it with tls_policy_free). */
void tls_policy_for_mx(const struct tls_policy_request *req, struct tls_policy *out);
void tls_policy_free(struct tls_policy *p);
/* A deep copy (to, uninitialised, is freed with tls_policy_free); do two policies ask the same? */
void tls_policy_copy(struct tls_policy *to, const struct tls_policy *from);
bool tls_policy_same(const struct tls_policy *a, const struct tls_policy *b);

/* Must the session have TLS (no delivery in clear)? */
bool tls_policy_requires_tls(const struct tls_policy *p);
/* "dane", "dane-encrypt", "sts enforce", "sts testing", "opportunistic". */
const char *tls_policy_name(const struct tls_policy *p);

/*
 * Before the handshake: DANE's TLSA records, or the name to check, on
 * ssl (whose context tls_policy_prepare_context prepared).  The peer's
 * certificate is never refused during the handshake: tls_policy_check
 * decides once it is done, so a testing policy can go on and report.
 */
bool tls_policy_prepare_context(SSL_CTX *ctx, const char *ca_file, char *err, size_t errlen);
bool tls_policy_prepare(const struct tls_policy *p, SSL *ssl, char *err, size_t errlen);

/*
 * After the handshake (ssl) or when there was no TLS (ssl NULL, with
 * starttls_offered saying why).  Writes outcome ("dane verified", ...),
 * and on failure result (an RFC 8460 result type) and reason; true when
 * the delivery may go on.
 */
bool tls_policy_check(const struct tls_policy *p, SSL *ssl, bool starttls_offered, bool *verified,
					  char *outcome, size_t outcome_len, char *result, size_t result_len,
					  char *reason, size_t reason_len);

/* Parse a TLSA record's rdata (RFC 6698 2.1); false when it is too short. */
bool tls_policy_parse_tlsa(const unsigned char *rdata, size_t len, struct tls_policy_tlsa *out);

#endif
