/*
 * dns.c: the DNS records a Pepsi host needs published, from its
 * configuration: per mail domain MX, SPF, DKIM (each [dkim-key-*]),
 * DMARC, the MTA-STS TXT record and policy, TLSRPT; and the PTR record to
 * ask the address's owner for.  check looks each up through the resolver
 * (common/dns, [pepsi] DNS_*) and says, one line per record, whether it is
 * there as it should be.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "auth/keys.h"
#include "base/buf.h"
#include "base/xalloc.h"
#include "dns/dns.h"
#include "options.h"
#include "setup.h"

/* The record kinds checked by a prefix of their TXT text (NULL name: the domain itself). */
static const struct
{
	const char *label;	/* "_dmarc": the name is label.domain */
	const char *prefix; /* the TXT record starts with this */
	const char *format; /* the record to publish: %s is the domain */
} setup_txt_records[] = {
	{NULL, "v=spf1", "v=spf1 mx -all"},
	{"_dmarc", "v=DMARC1", "v=DMARC1; p=quarantine; rua=mailto:postmaster@%s"},
	{"_mta-sts", "v=STSv1", "v=STSv1; id=1"},
	{"_smtp._tls", "v=TLSRPTv1", "v=TLSRPTv1; rua=mailto:postmaster@%s"},
};

#define SETUP_TXT_COUNT (sizeof(setup_txt_records) / sizeof(setup_txt_records[0]))

static char *
setup_txt_name(size_t i, const char *domain)
{
	return setup_txt_records[i].label ? xasprintf("%s.%s", setup_txt_records[i].label, domain) : xstrdup(domain);
}

int
setup_dns_print(const struct pepsi_config *cfg)
{
	const char	  *host = config_hostname(cfg);
	const char	  *cursor = config_text(cfg, "pepsi", "LOCAL_DOMAINS");
	const char	  *item;
	size_t		   len;
	struct keyring ring = {0};
	char		   err[1024];
	int			   rc = 0;

	if (!keyring_from_config(cfg, &ring, err, sizeof(err)))
	{
		fprintf(stderr, "pepsi-setup dns: %s\n", err);
		return 78;
	}
	while ((item = option_list_next(&cursor, &len)) != NULL)
	{
		char *domain = strndup(item, len);

		if (strcasecmp(domain, "localhost") == 0)
		{
			free(domain);
			continue;
		}
		printf("; %s\n%s. MX 10 %s.\n", domain, domain, host);
		for (size_t i = 0; i < SETUP_TXT_COUNT; i++)
		{
			char *name = setup_txt_name(i, domain);

			printf("%s. TXT \"", name);
			printf(setup_txt_records[i].format, domain);
			printf("\"\n");
			free(name);
		}
		for (size_t k = 0; k < ring.count; k++)
		{
			struct signing_key *key = &ring.key[k];
			struct buf			record = BUF_INIT;

			if (strcasecmp(key->domain, domain) != 0)
				continue;
			if (!signing_key_ready(key, err, sizeof(err)))
			{
				printf("; %s._domainkey.%s: the private key cannot be loaded: %s\n", key->selector, domain, err);
				rc = 78;
				continue;
			}
			keys_public_record(key->pkey, key->algorithm, &record);
			printf("%s._domainkey.%s. TXT \"%s\"\n", key->selector, domain, record.data);
			buf_free(&record);
		}
		printf("; the MTA-STS policy, at https://mta-sts.%s/.well-known/mta-sts.txt:\n"
			   ";   version: STSv1\n;   mode: testing\n;   mx: %s\n;   max_age: 86400\n",
			   domain, host);
		free(domain);
	}
	printf("; ask the owner of %s's address for its PTR record: <address> PTR %s.\n", host, host);
	keyring_free(&ring);
	return rc;
}

/* One TXT record: is there one starting with prefix at name? */
static bool
setup_check_txt(struct dns_resolver *resolver, const char *name, const char *prefix, char *verdict,
				size_t verdictlen)
{
	struct dns_answer answer;
	bool			  ok = false;

	dns_resolve_sync(resolver, name, DNS_TYPE_TXT, &answer);
	snprintf(verdict, verdictlen, "%s", answer.status == DNS_NXDOMAIN ? "no such name" : answer.status != DNS_OK ? "the lookup failed"
																												 : "no record");
	for (size_t i = 0; answer.status == DNS_OK && i < answer.count && !ok; i++)
		if (answer.records[i].type == DNS_TYPE_TXT && answer.records[i].text
			&& strncasecmp(answer.records[i].text, prefix, strlen(prefix)) == 0)
		{
			ok = true;
			snprintf(verdict, verdictlen, "ok (\"%.200s\")", answer.records[i].text);
		}
	dns_answer_free(&answer);
	return ok;
}

static bool
setup_check_mx(struct dns_resolver *resolver, const char *domain, const char *host, char *verdict,
			   size_t verdictlen)
{
	struct dns_answer answer;
	bool			  ok = false;

	dns_resolve_sync(resolver, domain, DNS_TYPE_MX, &answer);
	snprintf(verdict, verdictlen, "%s", answer.status == DNS_NXDOMAIN ? "no such name" : answer.status != DNS_OK ? "the lookup failed"
																												 : "no MX record names");
	for (size_t i = 0; answer.status == DNS_OK && i < answer.count && !ok; i++)
		if (answer.records[i].type == DNS_TYPE_MX && answer.records[i].text
			&& strcasecmp(answer.records[i].text, host) == 0)
			ok = true;
	if (ok)
		snprintf(verdict, verdictlen, "ok");
	else if (answer.status == DNS_OK)
		snprintf(verdict, verdictlen, "no MX record names %s", host);
	dns_answer_free(&answer);
	return ok;
}

/* A line of check: standard output, or the task's (its log too) when ctx is given. */
static void __attribute__((format(printf, 2, 3)))
setup_check_line(struct setup_ctx *ctx, const char *fmt, ...)
{
	char	line[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (ctx)
		setup_say(ctx, "%s", line);
	else
		printf("%s\n", line);
}

int
setup_dns_check(const struct pepsi_config *cfg, const char *only_domain, struct setup_ctx *ctx)
{
	const char			*host = config_hostname(cfg);
	const char			*cursor = config_text(cfg, "pepsi", "LOCAL_DOMAINS");
	const char			*item;
	size_t				 len;
	struct keyring		 ring = {0};
	struct dns_config	 dns = {0};
	struct dns_resolver *resolver;
	char				 err[1024];
	char				 verdict[1024];
	int					 rc = 0;

	if (!keyring_from_config(cfg, &ring, err, sizeof(err)) || !dns_config_load(cfg, &dns, err, sizeof(err)))
	{
		fprintf(stderr, "pepsi-setup check: %s\n", err);
		keyring_free(&ring);
		return 78;
	}
	resolver = dns_resolver_new(NULL, &dns, err, sizeof(err));
	dns_config_free(&dns);
	if (resolver == NULL)
	{
		fprintf(stderr, "pepsi-setup check: %s\n", err);
		keyring_free(&ring);
		return 78;
	}
	while ((item = option_list_next(&cursor, &len)) != NULL)
	{
		char *domain = strndup(item, len);

		if (strcasecmp(domain, "localhost") == 0 || (only_domain && strcasecmp(domain, only_domain) != 0))
		{
			free(domain);
			continue;
		}
		if (!setup_check_mx(resolver, domain, host, verdict, sizeof(verdict)))
			rc = 65;
		setup_check_line(ctx, "%s MX: %s", domain, verdict);
		for (size_t i = 0; i < SETUP_TXT_COUNT; i++)
		{
			char *name = setup_txt_name(i, domain);

			if (!setup_check_txt(resolver, name, setup_txt_records[i].prefix, verdict, sizeof(verdict)))
				rc = 65;
			setup_check_line(ctx, "%s TXT %s: %s", name, setup_txt_records[i].prefix, verdict);
			free(name);
		}
		for (size_t k = 0; k < ring.count; k++)
		{
			char name[512];

			if (strcasecmp(ring.key[k].domain, domain) != 0)
				continue;
			if (!keys_check_published(resolver, &ring.key[k], name, sizeof(name), verdict, sizeof(verdict)))
				rc = 65;
			setup_check_line(ctx, "%s TXT DKIM: %s", name, verdict);
		}
		free(domain);
	}
	dns_resolver_free(resolver);
	keyring_free(&ring);
	return rc;
}
