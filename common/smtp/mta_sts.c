/* mta_sts.c: see mta_sts.h. */
#include "smtp/mta_sts.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "dns/public_address.h"

const char *
mta_sts_mode_name(enum mta_sts_mode mode)
{
	switch (mode)
	{
		case MTA_STS_NONE:
			return "none";
		case MTA_STS_TESTING:
			return "testing";
		case MTA_STS_ENFORCE:
			return "enforce";
	}
	return "?";
}

void
mta_sts_policy_free(struct mta_sts_policy *p)
{
	for (size_t i = 0; i < p->nmx; i++)
		free(p->mx[i]);
	free(p->mx);
	p->mx = NULL;
	p->nmx = 0;
}

/* ---------------------------------------------------------------------------
 * The TXT record and the policy body
 * ------------------------------------------------------------------------- */

bool
mta_sts_parse_txt(const char *txt, size_t len, char *id, size_t idlen)
{
	const char *p = txt;
	const char *end = txt + len;
	bool		have_id = false;

	/* RFC 8461 3.1: "v=STSv1" first, then fields separated by ";". */
	if (len < 7 || strncmp(txt, "v=STSv1", 7) != 0 || (len > 7 && txt[7] != ';' && txt[7] != ' '))
		return false;
	p += 7;
	while (p < end)
	{
		const char *field;
		size_t		n;

		while (p < end && (*p == ';' || *p == ' ' || *p == '\t'))
			p++;
		field = p;
		while (p < end && *p != ';')
			p++;
		n = (size_t) (p - field);
		while (n > 0 && (field[n - 1] == ' ' || field[n - 1] == '\t'))
			n--;
		if (n > 3 && strncmp(field, "id=", 3) == 0)
		{
			size_t idn = n - 3;

			if (idn > 32 || idn + 1 > idlen)
				return false;
			for (size_t i = 0; i < idn; i++)
				if (!isalnum((unsigned char) field[3 + i]))
					return false;
			memcpy(id, field + 3, idn);
			id[idn] = '\0';
			have_id = true;
		}
	}
	return have_id;
}

/* A host name or a "*." pattern of one (RFC 8461 3.2 mx). */
static bool
mta_sts_valid_mx(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > 253)
		return false;
	if (strncmp(s, "*.", 2) == 0)
		s += 2;
	for (const char *p = s; *p; p++)
		if (!(isalnum((unsigned char) *p) || *p == '-' || *p == '.'))
			return false;
	return *s && *s != '.' && strstr(s, "..") == NULL;
}

bool
mta_sts_parse(const char *text, size_t len, struct mta_sts_policy *out, char *err, size_t errlen)
{
	const char *p = text;
	const char *end = text + len;
	bool		have_version = false;
	bool		have_mode = false;
	bool		have_max_age = false;

	memset(out, 0, sizeof(*out));
	if (memchr(text, '\0', len) != NULL)
	{
		snprintf(err, errlen, "the policy holds a NUL");
		return false;
	}
	while (p < end)
	{
		const char *line = p;
		const char *nl = memchr(p, '\n', (size_t) (end - p));
		const char *line_end = nl ? nl : end;
		const char *colon;
		char		key[32];
		char		value[256];
		size_t		klen;
		const char *v;
		size_t		vlen;

		p = nl ? nl + 1 : end;
		if (line_end > line && line_end[-1] == '\r')
			line_end--;
		if (line_end == line)
			continue;
		colon = memchr(line, ':', (size_t) (line_end - line));
		if (colon == NULL)
		{
			snprintf(err, errlen, "policy line \"%.*s\" is not \"key: value\"",
					 (int) (line_end - line > 60 ? 60 : line_end - line), line);
			goto err;
		}
		klen = (size_t) (colon - line);
		v = colon + 1;
		while (v < line_end && (*v == ' ' || *v == '\t'))
			v++;
		vlen = (size_t) (line_end - v);
		while (vlen > 0 && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t'))
			vlen--;
		if (klen == 0 || klen >= sizeof(key) || vlen >= sizeof(value))
		{
			snprintf(err, errlen, "policy line \"%.*s\" is too long or has no key",
					 (int) (line_end - line > 60 ? 60 : line_end - line), line);
			goto err;
		}
		memcpy(key, line, klen);
		key[klen] = '\0';
		memcpy(value, v, vlen);
		value[vlen] = '\0';
		if (strcmp(key, "version") == 0)
		{
			if (strcmp(value, "STSv1") != 0)
			{
				snprintf(err, errlen, "policy version \"%s\" is not STSv1", value);
				goto err;
			}
			have_version = true;
		}
		else if (strcmp(key, "mode") == 0)
		{
			if (strcmp(value, "enforce") == 0)
				out->mode = MTA_STS_ENFORCE;
			else if (strcmp(value, "testing") == 0)
				out->mode = MTA_STS_TESTING;
			else if (strcmp(value, "none") == 0)
				out->mode = MTA_STS_NONE;
			else
			{
				snprintf(err, errlen, "policy mode \"%s\" is not enforce, testing or none", value);
				goto err;
			}
			have_mode = true;
		}
		else if (strcmp(key, "max_age") == 0)
		{
			char *stop;
			long  age = strtol(value, &stop, 10);

			if (*value == '\0' || *stop || !isdigit((unsigned char) *value) || age < 0 || age > MTA_STS_MAX_AGE)
			{
				snprintf(err, errlen, "policy max_age \"%s\" is not a number of seconds up to %ld",
						 value, MTA_STS_MAX_AGE);
				goto err;
			}
			out->max_age = age;
			have_max_age = true;
		}
		else if (strcmp(key, "mx") == 0)
		{
			if (!mta_sts_valid_mx(value))
			{
				snprintf(err, errlen, "policy mx \"%s\" is not a host name or \"*.\" pattern", value);
				goto err;
			}
			if (out->nmx >= 100)
			{
				snprintf(err, errlen, "the policy lists more than 100 mx");
				goto err;
			}
			out->mx = xrealloc(out->mx, (out->nmx + 1) * sizeof(*out->mx));
			out->mx[out->nmx++] = xstrdup(value);
		}
		/* Other keys are extensions: ignored (RFC 8461 3.2). */
	}
	if (!have_version || !have_mode || !have_max_age)
	{
		snprintf(err, errlen, "the policy lacks %s", !have_version ? "version" : !have_mode ? "mode"
																							: "max_age");
		goto err;
	}
	if (out->nmx == 0 && out->mode != MTA_STS_NONE)
	{
		snprintf(err, errlen, "the %s policy lists no mx", mta_sts_mode_name(out->mode));
		goto err;
	}
	return true;
err:
	mta_sts_policy_free(out);
	return false;
}

bool
mta_sts_mx_matches(const struct mta_sts_policy *p, const char *mx_host)
{
	size_t hlen = strlen(mx_host);

	if (hlen > 0 && mx_host[hlen - 1] == '.')
		hlen--;
	for (size_t i = 0; i < p->nmx; i++)
	{
		const char *pattern = p->mx[i];

		if (strncmp(pattern, "*.", 2) == 0)
		{
			/* One label exactly: "*.example.com" matches "mx.example.com", not "a.b.example.com". */
			const char *dot = memchr(mx_host, '.', hlen);
			size_t		rest = dot ? hlen - (size_t) (dot - mx_host) : 0;

			if (dot && dot > mx_host && rest == strlen(pattern + 1)
				&& strncasecmp(dot, pattern + 1, rest) == 0)
				return true;
		}
		else if (strlen(pattern) == hlen && strncasecmp(pattern, mx_host, hlen) == 0)
			return true;
	}
	return false;
}

/* ---------------------------------------------------------------------------
 * The HTTPS fetch
 * ------------------------------------------------------------------------- */

struct mta_sts_download
{
	struct buf *body;
	bool		too_big;
};

static size_t
mta_sts_write(char *data, size_t size, size_t n, void *arg)
{
	struct mta_sts_download *d = arg;

	if (d->body->len + size * n > MTA_STS_MAX_BODY)
	{
		d->too_big = true;
		return 0; /* curl stops with CURLE_WRITE_ERROR */
	}
	buf_append(d->body, data, size * n);
	return size * n;
}

/* The address to fetch from, by our resolver (the system's may not see the same DNS). */
static bool
mta_sts_address(const struct mta_sts_options *o, const char *host, char *addr, size_t addrlen)
{
	static const enum dns_type types[] = {DNS_TYPE_A, DNS_TYPE_AAAA};

	for (size_t t = 0; t < 2; t++)
	{
		struct dns_answer a;

		dns_resolve_sync(o->resolver, host, types[t], &a);
		for (size_t i = 0; a.status == DNS_OK && i < a.count; i++)
		{
			const struct dns_record *r = &a.records[i];

			if (r->type == DNS_TYPE_A && r->rdata_len == 4)
			{
				inet_ntop(AF_INET, r->rdata, addr, (socklen_t) addrlen);
				dns_answer_free(&a);
				return true;
			}
			if (r->type == DNS_TYPE_AAAA && r->rdata_len == 16)
			{
				char text[INET6_ADDRSTRLEN];

				inet_ntop(AF_INET6, r->rdata, text, sizeof(text));
				snprintf(addr, addrlen, "[%s]", text);
				dns_answer_free(&a);
				return true;
			}
		}
		dns_answer_free(&a);
	}
	return false;
}

bool
mta_sts_fetch(const struct mta_sts_options *o, const char *domain, struct buf *body, char *err,
			  size_t errlen)
{
	char						host[300];
	char						url[400];
	char						resolve[400];
	char						addr[INET6_ADDRSTRLEN + 2];
	char						curl_error[CURL_ERROR_SIZE] = "";
	unsigned					port = o->https_port ? o->https_port : 443;
	struct mta_sts_download		d = {.body = body};
	struct public_address_guard guard = {o->allow_private,
										 "[pepsi-stage-relay-to-internet] MTA_STS_ALLOW_PRIVATE_ADDRESSES", ""};
	struct curl_slist		   *pinned = NULL;
	CURL					   *curl;
	CURLcode					rc;
	long						status = 0;
	char					   *content_type = NULL;
	bool						ok = false;

	snprintf(host, sizeof(host), "mta-sts.%s", domain);
	if (o->resolver && !mta_sts_address(o, host, addr, sizeof(addr)))
	{
		snprintf(err, errlen, "%s has no address", host);
		return false;
	}
	snprintf(url, sizeof(url), "https://%s:%u/.well-known/mta-sts.txt", host, port);
	curl = curl_easy_init();
	if (curl == NULL)
	{
		snprintf(err, errlen, "cannot start libcurl");
		return false;
	}
	if (o->resolver)
	{
		snprintf(resolve, sizeof(resolve), "%s:%u:%s", host, port, addr);
		pinned = curl_slist_append(NULL, resolve);
		curl_easy_setopt(curl, CURLOPT_RESOLVE, pinned);
	}
	curl_easy_setopt(curl, CURLOPT_URL, url);
	curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "https");
	/* RFC 8461 3.3: "HTTP 3xx redirects MUST NOT be followed". */
	curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 1L);
	curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 2L);
	if (o->ca_file)
		curl_easy_setopt(curl, CURLOPT_CAINFO, o->ca_file);
	curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, o->timeout_ms > 0 ? o->timeout_ms : 60000L);
	curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(curl, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t) MTA_STS_MAX_BODY);
	curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, mta_sts_write);
	curl_easy_setopt(curl, CURLOPT_WRITEDATA, &d);
	curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, curl_error);
	curl_easy_setopt(curl, CURLOPT_USERAGENT, "Pepsi MTA-STS");
	/* Where the DNS points the fetch is a hostile answer's to say: not at the machine or its network. */
	public_address_curl(curl, &guard);
	rc = curl_easy_perform(curl);
	if (rc != CURLE_OK)
	{
		if (guard.refused[0])
			snprintf(err, errlen, "fetching %s: %s", url, guard.refused);
		else if (d.too_big || rc == CURLE_FILESIZE_EXCEEDED)
			snprintf(err, errlen, "the policy at %s is larger than %d bytes", url, MTA_STS_MAX_BODY);
		else
			snprintf(err, errlen, "fetching %s: %s", url, curl_error[0] ? curl_error : curl_easy_strerror(rc));
		goto done;
	}
	curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
	if (status != 200)
	{
		snprintf(err, errlen, "fetching %s: HTTP status %ld%s", url, status,
				 status >= 300 && status < 400 ? " (a redirect, which MTA-STS forbids following)" : "");
		goto done;
	}
	curl_easy_getinfo(curl, CURLINFO_CONTENT_TYPE, &content_type);
	/* RFC 8461 3.3: the media type is text/plain. */
	if (content_type == NULL || strncasecmp(content_type, "text/plain", 10) != 0)
	{
		snprintf(err, errlen, "%s is served as %s, not text/plain", url, content_type ? content_type : "no type");
		goto done;
	}
	ok = true;
done:
	curl_slist_free_all(pinned);
	curl_easy_cleanup(curl);
	return ok;
}

/* ---------------------------------------------------------------------------
 * The cache (pepsi.mta_sts_policy_get / _put) and the lookup
 * ------------------------------------------------------------------------- */

/* A cached policy (pepsi.mta_sts_policy's id and body) as out; false when it does not parse. */
static bool
mta_sts_cache_parse(const char *domain, const char *id, const char *policy, struct mta_sts_policy *out)
{
	char err[256];

	if (!mta_sts_parse(policy, strlen(policy), out, err, sizeof(err)))
	{
		log_warnx("MTA-STS cache of %s holds a policy that does not parse: %s", domain, err);
		return false;
	}
	snprintf(out->id, sizeof(out->id), "%s", id);
	return true;
}

/* The cached policy of domain, if it has not expired. */
static bool
mta_sts_cache_get(const struct mta_sts_options *o, const char *domain, struct mta_sts_policy *out)
{
	const char *params[1] = {domain};
	PGresult   *res;
	bool		found = false;

	if (o->cache_given)
		return o->cached_id && o->cached_policy && mta_sts_cache_parse(domain, o->cached_id, o->cached_policy, out);
	if (o->db == NULL)
		return false;
	res = PQexecParams(o->db, "SELECT policy_id, policy FROM pepsi.mta_sts_policy_get($1)", 1, NULL,
					   params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		log_warnx("MTA-STS cache of %s: %s", domain, PQerrorMessage(o->db));
	else if (PQntuples(res) == 1)
		found = mta_sts_cache_parse(domain, PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 1), out);
	PQclear(res);
	return found;
}

static void
mta_sts_cache_put(PGconn *db, const char *domain, const char *id, const struct buf *body,
				  const struct mta_sts_policy *p)
{
	char		max_age[32];
	const char *params[5];
	PGresult   *res;

	if (db == NULL)
		return;
	snprintf(max_age, sizeof(max_age), "%ld", p->max_age);
	params[0] = domain;
	params[1] = id;
	params[2] = mta_sts_mode_name(p->mode);
	params[3] = body->data ? body->data : "";
	params[4] = max_age;
	res = PQexecParams(db, "SELECT pepsi.mta_sts_policy_put($1, $2, $3, $4, $5::integer)", 5, NULL,
					   params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		log_warnx("MTA-STS cache of %s: %s", domain, PQerrorMessage(db));
	PQclear(res);
}

/* The _mta-sts TXT record's id; false when there is none (or more than one: RFC 8461 3.1). */
static bool
mta_sts_txt_id(const struct mta_sts_options *o, const char *domain, char *id, size_t idlen)
{
	char			  name[300];
	struct dns_answer a;
	size_t			  found = 0;

	snprintf(name, sizeof(name), "_mta-sts.%s", domain);
	dns_resolve_sync(o->resolver, name, DNS_TYPE_TXT, &a);
	for (size_t i = 0; a.status == DNS_OK && i < a.count; i++)
	{
		const struct dns_record *r = &a.records[i];
		char					 candidate[33];

		if (r->type == DNS_TYPE_TXT && r->text
			&& mta_sts_parse_txt(r->text, r->len, candidate, sizeof(candidate)))
		{
			snprintf(id, idlen, "%s", candidate);
			found++;
		}
	}
	dns_answer_free(&a);
	return found == 1;
}

enum mta_sts_status
mta_sts_lookup(const struct mta_sts_options *o, const char *domain, struct mta_sts_policy *out,
			   char *result, size_t result_len, char *err, size_t errlen)
{
	char				  id[33] = "";
	bool				  announced = mta_sts_txt_id(o, domain, id, sizeof(id));
	struct mta_sts_policy cached;
	bool				  have_cached = mta_sts_cache_get(o, domain, &cached);
	struct buf			  body = BUF_INIT;

	memset(out, 0, sizeof(*out));
	result[0] = err[0] = '\0';
	/* A cached policy stays in force until it expires, whatever DNS says meanwhile (RFC 8461 5.1). */
	if (have_cached && (!announced || strcmp(cached.id, id) == 0))
	{
		*out = cached;
		return MTA_STS_FOUND;
	}
	if (!announced)
		return MTA_STS_NO_POLICY;
	if (!mta_sts_fetch(o, domain, &body, err, errlen))
		snprintf(result, result_len, "sts-policy-fetch-error");
	else if (!mta_sts_parse(body.data ? body.data : "", body.len, out, err, errlen))
		snprintf(result, result_len, "sts-policy-invalid");
	else
	{
		snprintf(out->id, sizeof(out->id), "%s", id);
		mta_sts_cache_put(o->db, domain, id, &body, out);
		buf_free(&body);
		if (have_cached)
			mta_sts_policy_free(&cached);
		return MTA_STS_FOUND;
	}
	buf_free(&body);
	log_warnx("MTA-STS policy of %s: %s", domain, err);
	/* A failed refresh leaves the policy we had in force. */
	if (have_cached)
	{
		*out = cached;
		return MTA_STS_FOUND;
	}
	return MTA_STS_FAILED;
}
