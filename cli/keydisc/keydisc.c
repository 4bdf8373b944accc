/*
 * pepsi-keydisc: key discovery for the parked messages of
 * pepsi-stage-encrypt (docs/pepsi-keydisc.8.md).
 *
 *   pepsi-keydisc [-c CONFIG]
 *
 * For each open pepsi.key_request (oldest first, at most 1000 a
 * run), it asks, in the order of [keydisc] METHODS: WKD, the
 * advanced method (https://openpgpkey.DOMAIN/.well-known/openpgpkey/
 * DOMAIN/hu/HASH?l=LOCAL) and the direct one (https://DOMAIN/...), over
 * HTTPS with libcurl; DANE OPENPGPKEY (RFC 7929) and SMIMEA (RFC 8162) with
 * libunbound, recording whether the answer was DNSSEC-validated; and the
 * HKPS key servers of KEYSERVERS.  An answer is used only if it is a key
 * for the address (an OpenPGP key with a User ID of it, not revoked or
 * expired; an X.509 certificate naming it, valid now); one that is not a
 * key, is bigger than MAX_KEY_SIZE or is another address's is refused with
 * the reason (logged, and in key_request.methods_replied).  The first good
 * key goes into pepsi.peer_key with its source, DNSSEC flag, verdict and
 * cache deadline (CACHE), and pepsi.keydisc_release resumes the messages
 * waiting for it (NOTIFY); nothing found settles the request as the
 * negative cache for NEGATIVE_CACHE.  Every DNS lookup goes through
 * common/dns's resolver and waits at most [pepsi] DNS_TIMEOUT: a server
 * that vanished costs that, never a hang; a lookup left without an answer
 * is recorded as the method's failure and leaves the request open for the
 * next run (no answer is not a miss to cache).
 *
 * Where it connects is the DNS's to say, and so a hostile answer's: an
 * address that is not the public internet's (loopback, private, link-local
 * and the like: public_address.h) is refused unless [keydisc]
 * ALLOW_PRIVATE_ADDRESSES says otherwise, so a WKD lookup for mail from
 * anyone cannot be made to reach the machine itself or its network.  The
 * address is checked as the socket is opened (public_address_curl:
 * CURLOPT_OPENSOCKETFUNCTION), the one libcurl actually connects to, so no
 * second answer (DNS rebinding) gets around a check made before; and no
 * proxy is used, whose address would be the one checked instead.  The
 * refusal is logged and is the method's reason in key_request.methods_replied.
 *
 * A program run by its timer (pepsi-keydisc.timer, every minute) or by
 * hand rather than a daemon: a lookup is needed only when a message
 * parks, the work is a few HTTPS and DNS queries per address, and a
 * parked message has its own deadline
 * (KEYDISC_WAIT), so a resident process would mostly sleep; being run
 * anew also re-reads its configuration and keeps no state between runs
 * but the key store's.  It connects with [crypto] CONNINFO (pepsi_crypto).
 */
#include <ctype.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <libpq-fe.h>
#include <openssl/sha.h>

#include "base/buf.h"
#include "base/log.h"
#include "config/config.h"
#include "crypto/kek.h"
#include "crypto/openpgp.h"
#include "crypto/smime.h"
#include "crypto/wkd.h"
#include "dns/dns.h"
#include "dns/public_address.h"
#include "process/cli.h"
#include "runtime/db.h"

#define KEYDISC_SECTION "keydisc"

int pepsi_keydisc_main(int argc, char **argv);

struct keydisc
{
	struct pepsi_config *cfg;
	PGconn				*conn;
	struct dns_resolver *dns;
	double				 dns_timeout; /* seconds: [pepsi] DNS_TIMEOUT */
	long long			 max_size;
	long long			 timeout_ms;
	long				 port;
	const char			*ca_file;
	bool				 allow_private;
};

/* What a lookup found: the key, where from, and the verdict. */
struct keydisc_found
{
	const char *source;
	bool		dnssec;
	struct buf	data;
};

struct keydisc_fetch
{
	struct buf				   *out;
	size_t						max;
	bool						too_big;
	struct public_address_guard guard;
};

static size_t
keydisc_write(char *ptr, size_t size, size_t n, void *arg)
{
	struct keydisc_fetch *f = arg;

	if (f->out->len + size * n > f->max)
	{
		f->too_big = true;
		return 0;
	}
	buf_append(f->out, ptr, size * n);
	return size * n;
}

/*
 * Look name up for type, bounded by [pepsi] DNS_TIMEOUT (a server that
 * vanished costs that, never a hang): 1 an answer in a, 0 none (err says
 * why when it is not simply no such record), -2 no answer in time (err).
 */
static int
keydisc_resolve(struct keydisc *k, const char *name, int type, struct dns_answer *a, char *err, size_t errlen)
{
	dns_resolve_sync(k->dns, name, (enum dns_type) type, a);
	switch (a->status)
	{
		case DNS_OK:
			return a->count > 0 ? 1 : 0;
		case DNS_NXDOMAIN:
			return 0;
		case DNS_TIMEOUT:
			snprintf(err, errlen, "%s: no answer from the DNS within [pepsi] DNS_TIMEOUT (%gs)", name, k->dns_timeout);
			return -2;
		case DNS_TEMPFAIL:
		default:
			if (a->bogus)
				snprintf(err, errlen, "%s: the DNSSEC validation failed", name);
			else
				snprintf(err, errlen, "%s: the DNS failed (SERVFAIL or no server)", name);
			return a->bogus ? -1 : 0;
	}
}

/* The first address of host in the DNS (A, then AAAA) as text: 1, 0 if none, -2 no answer in time (err). */
static int
keydisc_address(struct keydisc *k, const char *host, char *out, size_t outlen, char *err, size_t errlen)
{
	for (int t = 0; t < 2; t++)
	{
		struct dns_answer a;
		int				  rc = keydisc_resolve(k, host, t == 0 ? DNS_TYPE_A : DNS_TYPE_AAAA, &a, err, errlen);
		bool			  ok = rc == 1
				  && inet_ntop(t == 0 ? AF_INET : AF_INET6, a.records[0].rdata, out, (socklen_t) outlen) != NULL;

		dns_answer_free(&a);
		if (ok)
			return 1;
		if (rc == -2)
			return -2;
	}
	return 0;
}

/*
 * GET url from host (resolved through our resolver when pin): 1 a key's
 * bytes in out, 0 nothing there (404, no such host), -1 refused (err), -2
 * the DNS did not answer in time (err).
 */
static int
keydisc_get(struct keydisc *k, const char *url, const char *host, bool pin, struct buf *out, char *err,
			size_t errlen)
{
	CURL				*curl = curl_easy_init();
	struct curl_slist	*resolve = NULL;
	struct keydisc_fetch f = {out, (size_t) k->max_size, false, {k->allow_private, "[keydisc] ALLOW_PRIVATE_ADDRESSES", ""}};
	char				 addr[64], entry[400];
	long				 status = 0;
	CURLcode			 rc;
	int					 result;

	buf_reset(out);
	if (pin)
	{
		int found = keydisc_address(k, host, addr, sizeof(addr), err, errlen);

		if (found != 1)
		{
			if (found == 0)
				snprintf(err, errlen, "%s: no address in the DNS", host);
			curl_easy_cleanup(curl);
			return found;
		}
		snprintf(entry, sizeof(entry), strchr(addr, ':') ? "%s:%ld:[%s]" : "%s:%ld:%s", host, k->port, addr);
		resolve = curl_slist_append(NULL, entry);
		curl_easy_setopt(curl, CURLOPT_RESOLVE, resolve);
	}
	curl_easy_setopt(curl, CURLOPT_URL, url);
	curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "https");
	curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long) k->timeout_ms);
	curl_easy_setopt(curl, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t) k->max_size);
	curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, keydisc_write);
	curl_easy_setopt(curl, CURLOPT_WRITEDATA, &f);
	curl_easy_setopt(curl, CURLOPT_USERAGENT, "pepsi-keydisc");
	public_address_curl(curl, &f.guard);
	if (k->ca_file)
		curl_easy_setopt(curl, CURLOPT_CAINFO, k->ca_file);
	rc = curl_easy_perform(curl);
	curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
	if (f.guard.refused[0])
	{
		snprintf(err, errlen, "%s: %s", url, f.guard.refused);
		result = -1;
	}
	else if (f.too_big || rc == CURLE_FILESIZE_EXCEEDED)
	{
		snprintf(err, errlen, "%s: the answer is bigger than [keydisc] MAX_KEY_SIZE (%lld bytes)", url, k->max_size);
		result = -1;
	}
	else if (rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_CONNECT || (rc == CURLE_OK && status == 404))
	{
		snprintf(err, errlen, "%s: %s", url, rc == CURLE_OK ? "404" : curl_easy_strerror(rc));
		result = 0;
	}
	else if (rc != CURLE_OK)
	{
		snprintf(err, errlen, "%s: %s", url, curl_easy_strerror(rc));
		result = -1;
	}
	else if (status != 200)
	{
		snprintf(err, errlen, "%s: HTTP status %ld", url, status);
		result = -1;
	}
	else
		result = out->len > 0 ? 1 : 0;
	curl_slist_free_all(resolve);
	curl_easy_cleanup(curl);
	return result;
}

/*
 * The first record of type at name: 1 found (rdata, *dnssec), 0 none, -1 a
 * bogus or oversized answer (err), -2 no answer in time (err).
 */
static int
keydisc_dns(struct keydisc *k, const char *name, int type, struct buf *out, bool *dnssec, char *err, size_t errlen)
{
	struct dns_answer a;
	int				  rc;

	buf_reset(out);
	rc = keydisc_resolve(k, name, type, &a, err, errlen);
	if (rc == 1 && (long long) a.records[0].rdata_len > k->max_size)
	{
		snprintf(err, errlen, "%s: the record is bigger than [keydisc] MAX_KEY_SIZE (%lld bytes)", name, k->max_size);
		rc = -1;
	}
	else if (rc == 1)
	{
		buf_append(out, a.records[0].rdata, a.records[0].rdata_len);
		*dnssec = a.secure;
	}
	dns_answer_free(&a);
	return rc;
}

/* The DANE owner name of address under label (_openpgpkey, _smimecert): SHA-256 of the local part, 28 octets. */
static void
keydisc_dane_name(const char *address, const char *label, char *out, size_t outlen)
{
	const char	 *at = strrchr(address, '@');
	unsigned char md[SHA256_DIGEST_LENGTH];
	char		  hex[57];

	SHA256((const unsigned char *) address, (size_t) (at - address), md);
	for (int i = 0; i < 28; i++)
		snprintf(hex + 2 * i, 3, "%02x", md[i]);
	snprintf(out, outlen, "%s.%s.%s", hex, label, at + 1);
}

/*
 * Ask method for address's key: 1 found (into f), 0 nothing there, -1 an
 * answer refused (err).
 */
static int
keydisc_ask(struct keydisc *k, const char *method, const char *address, struct keydisc_found *f, char *err,
			size_t errlen)
{
	const char *at = strrchr(address, '@');
	const char *domain = at + 1;
	char		hash[40], url[1200], host[300], name[400];

	wkd_hash(address, (size_t) (at - address), hash);
	f->source = method;
	f->dnssec = false;
	if (strcmp(method, "wkd-advanced") == 0 || strcmp(method, "wkd-direct") == 0)
	{
		bool advanced = method[4] == 'a';

		snprintf(host, sizeof(host), "%s%s", advanced ? "openpgpkey." : "", domain);
		snprintf(url, sizeof(url), "https://%s:%ld/.well-known/openpgpkey/%s%shu/%s?l=%.*s", host, k->port,
				 advanced ? domain : "", advanced ? "/" : "", hash, (int) (at - address), address);
		return keydisc_get(k, url, host, true, &f->data, err, errlen);
	}
	if (strcmp(method, "openpgpkey") == 0 || strcmp(method, "smimea") == 0)
	{
		bool smimea = method[0] == 's';
		int	 rc;

		keydisc_dane_name(address, smimea ? "_smimecert" : "_openpgpkey", name, sizeof(name));
		rc = keydisc_dns(k, name, smimea ? 53 : 61, &f->data, &f->dnssec, err, errlen);
		if (rc == 1 && smimea)
		{
			/* Usage, selector, matching type: only a whole certificate (selector 0, matching 0) is a key. */
			if (f->data.len < 4 || f->data.data[1] != 0 || f->data.data[2] != 0)
			{
				snprintf(err, errlen, "%s: the SMIMEA record does not hold a whole certificate", name);
				return -1;
			}
			buf_consume(&f->data, 3);
			if (!smime_is_der_certificate(f->data.data, f->data.len))
			{
				snprintf(err, errlen, "smimea: the SMIMEA record holds no X.509 certificate (%zu bytes that are not one)",
						 f->data.len);
				return -1;
			}
		}
		return rc;
	}
	if (strcmp(method, "keyserver") == 0)
	{
		const char *servers = config_get(k->cfg, KEYDISC_SECTION, "KEYSERVERS");
		char		list[1000];
		char	   *save = NULL;

		snprintf(list, sizeof(list), "%s", servers ? servers : "");
		for (char *s = strtok_r(list, " ,", &save); s; s = strtok_r(NULL, " ,", &save))
		{
			char *escaped = curl_easy_escape(NULL, address, 0);
			int	  rc;

			snprintf(url, sizeof(url), "%s/pks/lookup?op=get&options=mr&search=%s", s, escaped ? escaped : "");
			curl_free(escaped);
			rc = keydisc_get(k, url, NULL, false, &f->data, err, errlen);
			if (rc != 0)
				return rc;
		}
		return 0;
	}
	snprintf(err, errlen, "[keydisc] METHODS: %s is not a method", method);
	return -1;
}

/* Store f's key for address once it proves to be one: 1 stored, -1 refused (err) or not stored. */
static int
keydisc_store(struct keydisc *k, const char *address, struct keydisc_found *f, char *fpr_out, char *err,
			  size_t errlen)
{
	bool				   smime = strcmp(f->source, "smimea") == 0;
	struct pgp_key_info	   info;
	struct smime_cert_info cert;
	char				   expires[32] = "", cache[32], why[512];
	const struct buf	  *key;
	const char			  *fpr;
	time_t				   exp;
	PGresult			  *res;
	int					   rc = 1;

	memset(&info, 0, sizeof(info));
	memset(&cert, 0, sizeof(cert));
	if (smime ? !smime_inspect(f->data.data, f->data.len, NULL, address, false, &cert, why, sizeof(why))
			  : !pgp_inspect(f->data.data, f->data.len, address, false, &info, why, sizeof(why)))
	{
		snprintf(err, errlen, "%s: %s", f->source, why);
		return -1;
	}
	key = smime ? &cert.cert : &info.public_key;
	fpr = smime ? cert.fingerprint : info.fingerprint;
	exp = smime ? cert.expires : info.expires;
	if (exp)
		snprintf(expires, sizeof(expires), "%lld", (long long) exp);
	snprintf(cache, sizeof(cache), "%lld", config_duration_ms(k->cfg, KEYDISC_SECTION, "CACHE") / 1000);
	{
		const char *values[] = {address, smime ? "smime" : "openpgp", fpr, key->data, f->source, f->dnssec ? "t" : "f",
								expires[0] ? expires : NULL, cache};
		const int	lengths[] = {0, 0, 0, (int) key->len, 0, 0, 0, 0};
		const int	formats[] = {0, 0, 0, 1, 0, 0, 0, 0};

		res = PQexecParams(k->conn,
						   "INSERT INTO pepsi.peer_key (address, protocol, fingerprint, key_data, source, dnssec,"
						   " verdict, expires_at, cache_until)"
						   " VALUES ($1, $2, $3, $4, $5, $6, 'valid', to_timestamp($7::bigint),"
						   " now() + make_interval(secs => $8::bigint))"
						   " ON CONFLICT (address, protocol, fingerprint) DO UPDATE SET key_data = EXCLUDED.key_data,"
						   " source = EXCLUDED.source, dnssec = EXCLUDED.dnssec, verdict = 'valid',"
						   " verdict_reason = NULL, expires_at = EXCLUDED.expires_at, fetched_at = now(),"
						   " cache_until = EXCLUDED.cache_until",
						   8, NULL, values, lengths, formats, 0);
		if (PQresultStatus(res) != PGRES_COMMAND_OK)
		{
			snprintf(err, errlen, "storing the key of %s: %s", address, PQresultErrorMessage(res));
			rc = -1;
		}
		else
			snprintf(fpr_out, 65, "%s", fpr);
		PQclear(res);
	}
	pgp_key_info_free(&info);
	smime_cert_info_free(&cert);
	return rc;
}

/* Settle address's request (found or not) and resume its messages; false after saying why. */
static bool
keydisc_release(struct keydisc *k, const char *address, bool found, const struct buf *replied)
{
	char		negative[32];
	const char *values[] = {address, found ? "t" : "f", negative, replied->data ? replied->data : "{}"};
	PGresult   *res;
	bool		ok;

	snprintf(negative, sizeof(negative), "%lld", config_duration_ms(k->cfg, KEYDISC_SECTION, "NEGATIVE_CACHE") / 1000);
	res = PQexecParams(k->conn, "SELECT pepsi.keydisc_release($1, $2::boolean, $3::integer, $4::text[])", 4, NULL,
					   values, NULL, NULL, 0);
	ok = PQresultStatus(res) == PGRES_TUPLES_OK;
	if (ok)
		printf("%s %s, %s message%s released\n", address, found ? "found" : "not found", PQgetvalue(res, 0, 0),
			   strcmp(PQgetvalue(res, 0, 0), "1") == 0 ? "" : "s");
	else
		log_warnx("keydisc_release(%s): %s", address, PQresultErrorMessage(res));
	PQclear(res);
	return ok;
}

/* Record address's lookup that failed without settling it; false after saying why. */
static bool
keydisc_unsettled(struct keydisc *k, const char *address, const struct buf *replied)
{
	const char *values[] = {address, replied->data};
	PGresult   *res = PQexecParams(k->conn,
								   "UPDATE pepsi.key_request SET methods_replied = $2::text[] WHERE address = lower($1)", 2,
								   NULL, values, NULL, NULL, 0);
	bool		ok = PQresultStatus(res) == PGRES_COMMAND_OK;

	if (ok)
		printf("%s not settled, the DNS did not answer: asked again next run\n", address);
	else
		log_warnx("recording the lookup of %s: %s", address, PQresultErrorMessage(res));
	PQclear(res);
	return ok;
}

/* Look address up by every method until a key is found; false on a database error. */
static bool
keydisc_lookup(struct keydisc *k, const char *address)
{
	const char			*methods = config_get(k->cfg, KEYDISC_SECTION, "METHODS");
	char				 list[300], err[700], fpr[65] = "";
	char				*save = NULL;
	struct buf			 replied = BUF_INIT;
	struct keydisc_found f = {NULL, false, BUF_INIT};
	bool				 found = false, failed = false, ok;

	snprintf(list, sizeof(list), "%s", methods ? methods : "wkd-advanced wkd-direct openpgpkey smimea keyserver");
	buf_append_str(&replied, "{");
	for (char *m = strtok_r(list, " ,", &save); m && !found; m = strtok_r(NULL, " ,", &save))
	{
		int rc;

		err[0] = '\0';
		rc = keydisc_ask(k, m, address, &f, err, sizeof(err));

		if (rc == 1)
			rc = keydisc_store(k, address, &f, fpr, err, sizeof(err));
		if (rc == -2)
		{
			failed = true;
			log_warnx("%s: %s: failed: %s", address, m, err);
		}
		else if (rc < 0)
			log_warnx("%s: refused: %s", address, err);
		else if (rc == 0)
			log_info("%s: %s: nothing%s%s", address, m, err[0] ? ": " : "", err);
		else if (rc == 1)
		{
			found = true;
			log_info("%s: key %s from %s%s", address, fpr, m, f.dnssec ? " (DNSSEC)" : "");
		}
		buf_printf(&replied, "%s\"%s:%s", replied.len > 1 ? "," : "", m,
				   rc == 1 ? "found" : rc == 0 ? "none"
								   : rc == -2  ? "failed: "
											   : "refused: ");
		/* A refusal's or failure's reason, in the array's quotes. */
		for (const char *p = err; rc < 0 && *p && p - err < 300; p++)
			buf_printf(&replied, "%s%c", *p == '"' || *p == '\\' ? "\\" : "", *p);
		buf_append_str(&replied, "\"");
	}
	buf_append_str(&replied, "}");
	/*
	 * A lookup the DNS did not answer in time proves nothing: not a miss to
	 * cache.  The request stays open (asked again by the next run), its
	 * messages parked within their KEYDISC_WAIT, the failure recorded.
	 */
	ok = !found && failed ? keydisc_unsettled(k, address, &replied) : keydisc_release(k, address, found, &replied);
	buf_free(&replied);
	buf_free(&f.data);
	return ok;
}

int
pepsi_keydisc_main(int argc, char **argv)
{
	const char		 *config_path = NULL;
	struct keydisc	  k;
	struct dns_config dns;
	char			  err[512];
	PGresult		 *res;
	int				  c, rc = CLI_EX_OK;

	memset(&k, 0, sizeof(k));
	if (argc > 1 && cli_is_help(argv[1]))
	{
		printf("usage: pepsi-keydisc [-c CONFIG]\n");
		return CLI_EX_OK;
	}
	while ((c = getopt(argc, argv, "c:")) != -1)
		if (c == 'c')
			config_path = optarg;
		else
		{
			fprintf(stderr, "usage: pepsi-keydisc [-c CONFIG]\n");
			return CLI_EX_USAGE;
		}
	if (optind != argc)
	{
		fprintf(stderr, "usage: pepsi-keydisc [-c CONFIG]\n");
		return CLI_EX_USAGE;
	}
	if ((k.cfg = config_load(cli_config_path(config_path), err, sizeof(err))) == NULL)
	{
		fprintf(stderr, "pepsi-keydisc: %s\n", err);
		return CLI_EX_CONFIG;
	}
	k.max_size = config_size(k.cfg, KEYDISC_SECTION, "MAX_KEY_SIZE");
	k.timeout_ms = config_duration_ms(k.cfg, KEYDISC_SECTION, "HTTPS_TIMEOUT");
	k.port = (long) config_int(k.cfg, KEYDISC_SECTION, "HTTPS_PORT");
	k.ca_file = config_get(k.cfg, KEYDISC_SECTION, "TLS_CA_FILE");
	k.allow_private = config_bool(k.cfg, KEYDISC_SECTION, "ALLOW_PRIVATE_ADDRESSES");
	if (!dns_config_load(k.cfg, &dns, err, sizeof(err)))
	{
		fprintf(stderr, "pepsi-keydisc: %s\n", err);
		config_free(k.cfg);
		return CLI_EX_CONFIG;
	}
	k.dns_timeout = dns.timeout;
	k.dns = dns_resolver_new(NULL, &dns, err, sizeof(err));
	dns_config_free(&dns);
	if (k.dns == NULL)
	{
		fprintf(stderr, "pepsi-keydisc: the resolver: %s\n", err);
		rc = CLI_EX_CONFIG;
		goto done;
	}
	k.conn = db_connect_as(k.cfg, "crypto", "CONNINFO", "pepsi-keydisc", err, sizeof(err));
	if (k.conn == NULL)
	{
		fprintf(stderr, "pepsi-keydisc: %s\n", err);
		rc = CLI_EX_TEMPFAIL;
		goto done;
	}
	curl_global_init(CURL_GLOBAL_DEFAULT);
	res = PQexecParams(k.conn,
					   "UPDATE pepsi.key_request SET methods_asked = string_to_array($1, ' ')"
					   " WHERE address IN (SELECT address FROM pepsi.key_request WHERE settled_at IS NULL"
					   " ORDER BY requested_at LIMIT 1000) RETURNING address",
					   1, NULL,
					   (const char *const[]){config_get(k.cfg, KEYDISC_SECTION, "METHODS")
												 ? config_get(k.cfg, KEYDISC_SECTION, "METHODS")
												 : "wkd-advanced wkd-direct openpgpkey smimea keyserver"},
					   NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		fprintf(stderr, "pepsi-keydisc: reading key_request: %s", PQresultErrorMessage(res));
		rc = CLI_EX_TEMPFAIL;
	}
	else
		for (int i = 0; i < PQntuples(res); i++)
			if (!keydisc_lookup(&k, PQgetvalue(res, i, 0)))
				rc = CLI_EX_TEMPFAIL;
	PQclear(res);
	curl_global_cleanup();
done:
	if (k.dns)
		dns_resolver_free(k.dns);
	if (k.conn)
		PQfinish(k.conn);
	config_free(k.cfg);
	return rc;
}
