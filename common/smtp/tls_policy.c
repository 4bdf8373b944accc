/* tls_policy.c: see tls_policy.h. */
#include "smtp/tls_policy.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "smtp/mta_sts.h"

bool
tls_policy_parse_tlsa(const unsigned char *rdata, size_t len, struct tls_policy_tlsa *out)
{
	if (rdata == NULL || len < 4)
		return false;
	out->usage = rdata[0];
	out->selector = rdata[1];
	out->mtype = rdata[2];
	out->len = len - 3;
	out->data = xmalloc(out->len);
	memcpy(out->data, rdata + 3, out->len);
	return true;
}

/*
 * RFC 7672 3.1: for SMTP only DANE-TA(2) and DANE-EE(3) are usable, with
 * a known selector and a digest of the right length; anything else is
 * ignored (a record of an unknown usage is no reason to refuse).
 */
static bool
tls_policy_tlsa_usable(const struct tls_policy_tlsa *t)
{
	if (t->usage != 2 && t->usage != 3)
		return false;
	if (t->selector > 1)
		return false;
	switch (t->mtype)
	{
		case 0:
			return t->len > 0;
		case 1:
			return t->len == 32;
		case 2:
			return t->len == 64;
	}
	return false;
}

static void
tls_policy_refuse(struct tls_policy *out, const char *result, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void
tls_policy_refuse(struct tls_policy *out, const char *result, const char *fmt, ...)
{
	va_list ap;

	snprintf(out->refused_result, sizeof(out->refused_result), "%s", result);
	va_start(ap, fmt);
	vsnprintf(out->refused, sizeof(out->refused), fmt, ap);
	va_end(ap);
}

/*
 * RFC 7672 2.2.2: DANE applies to an MX host whose address records are
 * DNSSEC-secure too, not only its MX and TLSA records (a secure TLSA
 * record beside an address an attacker can forge would protect nothing).
 * 1: secure; 0: insecure, or no address (no DANE); -1: bogus (refused).
 */
static int
tls_policy_addresses_secure(const struct tls_policy_request *req, struct tls_policy *out)
{
	static const enum dns_type types[2] = {DNS_TYPE_A, DNS_TYPE_AAAA};
	bool					   secure = false;
	bool					   insecure = false;

	for (int t = 0; t < 2; t++)
	{
		struct dns_answer a;

		dns_resolve_sync(req->resolver, req->mx_host, types[t], &a);
		if (a.bogus)
		{
			tls_policy_refuse(out, "dnssec-invalid", "the address records of %s failed DNSSEC validation",
							  req->mx_host);
			dns_answer_free(&a);
			return -1;
		}
		if (a.status == DNS_OK && a.count > 0)
		{
			if (a.secure)
				secure = true;
			else
				insecure = true;
		}
		dns_answer_free(&a);
	}
	return secure && !insecure ? 1 : 0;
}

/* DANE for the host when its TLSA answer allows it; true when DANE decided (or refused). */
static bool
tls_policy_dane(const struct tls_policy_request *req, struct tls_policy *out)
{
	char			  name[300];
	struct dns_answer a;
	size_t			  usable = 0;
	int				  addresses = tls_policy_addresses_secure(req, out);

	if (addresses != 1)
		return addresses < 0;
	snprintf(name, sizeof(name), "_%u._tcp.%s", req->port ? req->port : 25, req->mx_host);
	dns_resolve_sync(req->resolver, name, DNS_TYPE_TLSA, &a);
	if (a.bogus)
	{
		tls_policy_refuse(out, "dnssec-invalid", "the TLSA answer for %s failed DNSSEC validation", name);
		dns_answer_free(&a);
		return true;
	}
	if (a.status == DNS_TEMPFAIL || a.status == DNS_TIMEOUT)
	{
		/* RFC 7672 2.2.3: a secure MX whose TLSA lookup fails is not delivered to. */
		tls_policy_refuse(out, "tlsa-invalid", "the TLSA lookup of %s failed (%s)", name,
						  a.status == DNS_TIMEOUT ? "timeout" : "server failure");
		dns_answer_free(&a);
		return true;
	}
	if (a.status != DNS_OK || !a.secure)
	{
		dns_answer_free(&a);
		return false;
	}
	for (size_t i = 0; i < a.count; i++)
	{
		struct tls_policy_tlsa t;

		if (a.records[i].type != DNS_TYPE_TLSA
			|| !tls_policy_parse_tlsa(a.records[i].rdata, a.records[i].rdata_len, &t))
			continue;
		if (!tls_policy_tlsa_usable(&t))
		{
			log_debug("TLSA %s: record %u %u %u is not usable for SMTP; ignored", name, t.usage,
					  t.selector, t.mtype);
			free(t.data);
			continue;
		}
		out->tlsa = xrealloc(out->tlsa, (out->ntlsa + 1) * sizeof(*out->tlsa));
		out->tlsa[out->ntlsa++] = t;
		usable++;
	}
	if (a.count == 0)
	{
		dns_answer_free(&a);
		return false;
	}
	out->kind = usable > 0 ? TLS_POLICY_DANE : TLS_POLICY_DANE_ENCRYPT;
	dns_answer_free(&a);
	return true;
}

void
tls_policy_for_mx(const struct tls_policy_request *req, struct tls_policy *out)
{
	memset(out, 0, sizeof(*out));
	out->kind = TLS_POLICY_OPPORTUNISTIC;
	snprintf(out->mx_host, sizeof(out->mx_host), "%s", req->mx_host);
	snprintf(out->domain, sizeof(out->domain), "%s", req->domain ? req->domain : "");
	snprintf(out->ca_file, sizeof(out->ca_file), "%s", req->sts_ca_file ? req->sts_ca_file : "");
	/* RFC 8689 5: the sender asked for delivery whatever the recipient's policy. */
	if (req->tls_not_required)
		return;
	if (req->mx_secure && req->resolver && tls_policy_dane(req, out))
		return;
	if (req->sts == NULL || req->sts->mode == MTA_STS_NONE)
		return;
	snprintf(out->sts_id, sizeof(out->sts_id), "%s", req->sts->id);
	out->kind = req->sts->mode == MTA_STS_ENFORCE ? TLS_POLICY_STS_ENFORCE : TLS_POLICY_STS_TESTING;
	if (!mta_sts_mx_matches(req->sts, req->mx_host))
	{
		if (out->kind == TLS_POLICY_STS_ENFORCE)
			tls_policy_refuse(out, "validation-failure",
							  "the MX host %s is not among the mx of %s's MTA-STS policy (enforce)",
							  req->mx_host, out->domain);
		else
			out->sts_mx_unlisted = true;
	}
}

void
tls_policy_free(struct tls_policy *p)
{
	for (size_t i = 0; i < p->ntlsa; i++)
		free(p->tlsa[i].data);
	free(p->tlsa);
	p->tlsa = NULL;
	p->ntlsa = 0;
}

void
tls_policy_copy(struct tls_policy *to, const struct tls_policy *from)
{
	*to = *from;
	to->tlsa = from->ntlsa ? xcalloc(from->ntlsa, sizeof(*to->tlsa)) : NULL;
	for (size_t i = 0; i < from->ntlsa; i++)
	{
		to->tlsa[i] = from->tlsa[i];
		to->tlsa[i].data = xmalloc(from->tlsa[i].len ? from->tlsa[i].len : 1);
		memcpy(to->tlsa[i].data, from->tlsa[i].data, from->tlsa[i].len);
	}
}

bool
tls_policy_same(const struct tls_policy *a, const struct tls_policy *b)
{
	if (a->kind != b->kind || a->ntlsa != b->ntlsa || a->sts_mx_unlisted != b->sts_mx_unlisted
		|| strcmp(a->mx_host, b->mx_host) != 0 || strcmp(a->ca_file, b->ca_file) != 0
		|| strcmp(a->sts_id, b->sts_id) != 0)
		return false;
	for (size_t i = 0; i < a->ntlsa; i++)
		if (a->tlsa[i].usage != b->tlsa[i].usage || a->tlsa[i].selector != b->tlsa[i].selector
			|| a->tlsa[i].mtype != b->tlsa[i].mtype || a->tlsa[i].len != b->tlsa[i].len
			|| memcmp(a->tlsa[i].data, b->tlsa[i].data, a->tlsa[i].len) != 0)
			return false;
	return true;
}

bool
tls_policy_requires_tls(const struct tls_policy *p)
{
	return p->kind == TLS_POLICY_DANE || p->kind == TLS_POLICY_DANE_ENCRYPT
		   || p->kind == TLS_POLICY_STS_ENFORCE;
}

const char *
tls_policy_name(const struct tls_policy *p)
{
	switch (p->kind)
	{
		case TLS_POLICY_OPPORTUNISTIC:
			return "opportunistic";
		case TLS_POLICY_DANE:
			return "dane";
		case TLS_POLICY_DANE_ENCRYPT:
			return "dane-encrypt";
		case TLS_POLICY_STS_ENFORCE:
			return "sts enforce";
		case TLS_POLICY_STS_TESTING:
			return "sts testing";
	}
	return "?";
}

bool
tls_policy_prepare_context(SSL_CTX *ctx, const char *ca_file, char *err, size_t errlen)
{
	/* Verification runs, but never stops the handshake: tls_policy_check decides. */
	SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
	if (SSL_CTX_dane_enable(ctx) <= 0)
	{
		snprintf(err, errlen, "cannot enable DANE: %s", ERR_reason_error_string(ERR_get_error()));
		return false;
	}
	if (ca_file && *ca_file == '\0')
		ca_file = NULL;
	if (ca_file ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL) != 1
				: SSL_CTX_set_default_verify_paths(ctx) != 1)
	{
		snprintf(err, errlen, "cannot load the trust anchors%s%s: %s", ca_file ? " from " : "",
				 ca_file ? ca_file : "", ERR_reason_error_string(ERR_get_error()));
		return false;
	}
	return true;
}

bool
tls_policy_prepare(const struct tls_policy *p, SSL *ssl, char *err, size_t errlen)
{
	struct in6_addr addr6;
	struct in_addr	addr4;
	bool			is_ip = inet_pton(AF_INET, p->mx_host, &addr4) == 1
				 || inet_pton(AF_INET6, p->mx_host, &addr6) == 1;

	if (p->kind == TLS_POLICY_DANE)
	{
		size_t added = 0;

		if (SSL_dane_enable(ssl, p->mx_host) <= 0)
		{
			snprintf(err, errlen, "cannot enable DANE for %s", p->mx_host);
			return false;
		}
		/* RFC 7672 3.1.3: DANE-EE(3) binds the key, not the name. */
		SSL_dane_set_flags(ssl, DANE_FLAG_NO_DANE_EE_NAMECHECKS);
		for (size_t i = 0; i < p->ntlsa; i++)
		{
			const struct tls_policy_tlsa *t = &p->tlsa[i];

			if (SSL_dane_tlsa_add(ssl, t->usage, t->selector, t->mtype, t->data, t->len) > 0)
				added++;
		}
		if (added == 0)
		{
			snprintf(err, errlen, "none of the TLSA records of %s could be used", p->mx_host);
			return false;
		}
		return true;
	}
	if (!is_ip)
	{
		SSL_set_tlsext_host_name(ssl, p->mx_host);
		/* Checked for enforce and testing; recorded for the others. */
		SSL_set1_host(ssl, p->mx_host);
	}
	return true;
}

/* The RFC 8460 result type of a failed verification. */
static const char *
tls_policy_result_type(const struct tls_policy *p, long verify_result)
{
	switch (verify_result)
	{
		case X509_V_ERR_CERT_HAS_EXPIRED:
		case X509_V_ERR_CERT_NOT_YET_VALID:
			return "certificate-expired";
		case X509_V_ERR_HOSTNAME_MISMATCH:
			return "certificate-host-mismatch";
		case X509_V_ERR_DANE_NO_MATCH:
			return "validation-failure";
	}
	return p->kind == TLS_POLICY_DANE ? "validation-failure" : "certificate-not-trusted";
}

bool
tls_policy_check(const struct tls_policy *p, SSL *ssl, bool starttls_offered, bool *verified,
				 char *outcome, size_t outcome_len, char *result, size_t result_len, char *reason,
				 size_t reason_len)
{
	const char *name = tls_policy_name(p);
	long		vr;

	*verified = false;
	result[0] = reason[0] = '\0';
	if (ssl == NULL)
	{
		if (tls_policy_requires_tls(p) || p->kind == TLS_POLICY_STS_TESTING)
		{
			snprintf(result, result_len, "starttls-not-supported");
			snprintf(reason, reason_len, "%s offers no STARTTLS", p->mx_host);
			snprintf(outcome, outcome_len, "%s failed: starttls-not-supported%s", name,
					 tls_policy_requires_tls(p) ? "" : " (delivered in clear)");
			if (!tls_policy_requires_tls(p))
				log_warnx("MTA-STS testing policy of %s: %s; delivered anyway", p->domain, reason);
			return !tls_policy_requires_tls(p);
		}
		snprintf(outcome, outcome_len, "%s cleartext%s", name,
				 starttls_offered ? "" : " (no STARTTLS offered)");
		return true;
	}
	vr = SSL_get_verify_result(ssl);
	switch (p->kind)
	{
		case TLS_POLICY_DANE:
			{
				uint8_t usage = 0;

				if (vr == X509_V_OK && SSL_get0_dane_tlsa(ssl, &usage, NULL, NULL, NULL, NULL) >= 0)
				{
					*verified = true;
					snprintf(outcome, outcome_len, "dane verified (usage %u)", usage);
					return true;
				}
				break;
			}
		case TLS_POLICY_DANE_ENCRYPT:
			snprintf(outcome, outcome_len, "dane-encrypt unauthenticated (no usable TLSA record)");
			return true;
		case TLS_POLICY_STS_ENFORCE:
		case TLS_POLICY_STS_TESTING:
			if (vr == X509_V_OK && !p->sts_mx_unlisted)
			{
				*verified = true;
				snprintf(outcome, outcome_len, "%s verified", name);
				return true;
			}
			if (p->kind == TLS_POLICY_STS_TESTING)
			{
				snprintf(result, result_len, "%s",
						 p->sts_mx_unlisted ? "validation-failure" : tls_policy_result_type(p, vr));
				snprintf(reason, reason_len, "%s",
						 p->sts_mx_unlisted ? "the MX host is not in the policy" : X509_verify_cert_error_string(vr));
				snprintf(outcome, outcome_len, "sts testing failed: %s (delivered anyway)", result);
				log_warnx("MTA-STS testing policy of %s: %s: %s; delivered anyway", p->domain,
						  p->mx_host, reason);
				return true;
			}
			break;
		case TLS_POLICY_OPPORTUNISTIC:
			*verified = vr == X509_V_OK;
			snprintf(outcome, outcome_len, "opportunistic %s", *verified ? "verified" : "unverified");
			return true;
	}
	snprintf(result, result_len, "%s", tls_policy_result_type(p, vr));
	snprintf(reason, reason_len, "the certificate of %s: %s", p->mx_host,
			 vr == X509_V_OK ? "matches no TLSA record" : X509_verify_cert_error_string(vr));
	snprintf(outcome, outcome_len, "%s failed: %s", name, result);
	return false;
}
