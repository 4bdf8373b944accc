/* srs.c: see srs.h. */
#include "message/srs.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "base/base64.h"
#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"

#define SRS_MAX_SECRETS 16
#define SRS_TICKS 1024 /* two base32 characters of days */

static const char srs_base32[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
static const char srs_base64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Read the secrets: one per line, blank lines and #comments skipped. */
static bool
srs_read_secrets(const char *path, struct srs *srs, char *err, size_t errlen)
{
	int			fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	struct stat st;
	FILE	   *f;
	char		line[1024];

	if (fd < 0)
	{
		snprintf(err, errlen, "[srs] SECRET_FILE %s: %s", path, strerror(errno));
		return false;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (st.st_mode & (S_IRWXG | S_IRWXO)))
	{
		snprintf(err, errlen, "[srs] SECRET_FILE %s must be a regular file of mode 0600 or 0400 "
							  "(chmod go= %s)",
				 path, path);
		close(fd);
		return false;
	}
	f = fdopen(fd, "r");
	while (f && fgets(line, sizeof(line), f) && srs->nsecrets < SRS_MAX_SECRETS)
	{
		size_t len = strcspn(line, "\r\n");

		line[len] = '\0';
		if (len == 0 || line[0] == '#')
			continue;
		srs->secrets[srs->nsecrets++] = xstrdup(line);
	}
	explicit_bzero(line, sizeof(line));
	if (f)
		fclose(f);
	if (srs->nsecrets == 0)
	{
		snprintf(err, errlen, "[srs] SECRET_FILE %s holds no secret", path);
		return false;
	}
	return true;
}

bool
srs_from_config(const struct pepsi_config *cfg, struct srs *srs, char *err, size_t errlen)
{
	const char *domain = config_text(cfg, "srs", "DOMAIN");
	const char *secrets = config_text(cfg, "srs", "SECRET_FILE");
	const char *secret = config_text(cfg, "srs", "SECRET"); /* from secrets.d */

	memset(srs, 0, sizeof(*srs));
	if (domain == NULL && secrets == NULL && secret == NULL)
		return true;
	if (domain == NULL || (secrets == NULL && secret == NULL))
	{
		snprintf(err, errlen, "%s: [srs] needs both DOMAIN and SECRET (in secrets.d) or SECRET_FILE",
				 cfg->path);
		return false;
	}
	srs->secrets = xcalloc(SRS_MAX_SECRETS, sizeof(char *));
	/* SECRET signs; SECRET_FILE's then only verify (older secrets being retired). */
	if (secret)
		srs->secrets[srs->nsecrets++] = xstrdup(secret);
	srs->max_age = (unsigned) config_int(cfg, "srs", "MAX_AGE");
	srs->hash_length = (unsigned) config_int(cfg, "srs", "HASH_LENGTH");
	srs->separator = config_text(cfg, "srs", "SEPARATOR")[0];
	if (secrets && !srs_read_secrets(secrets, srs, err, errlen))
	{
		srs_free(srs);
		return false;
	}
	srs->domain = xstrdup(domain);
	return true;
}

void
srs_free(struct srs *srs)
{
	for (size_t i = 0; i < srs->nsecrets; i++)
	{
		explicit_bzero(srs->secrets[i], strlen(srs->secrets[i]));
		free(srs->secrets[i]);
	}
	free(srs->secrets);
	free(srs->domain);
	memset(srs, 0, sizeof(*srs));
}

/* base64(HMAC-SHA1(secret, lc(a) || lc(b) || lc(c))), the whole 27 characters. */
static void
srs_hash(const char *secret, const char *a, const char *b, const char *c, char out[32])
{
	struct buf	  data = BUF_INIT;
	unsigned char mac[EVP_MAX_MD_SIZE];
	unsigned	  maclen = 0;
	struct buf	  b64 = BUF_INIT;

	for (const char *const *part = (const char *const[]){a, b, c, NULL}; *part; part++)
		for (const char *p = *part; *p; p++)
			buf_append_char(&data, (char) tolower((unsigned char) *p));
	HMAC(EVP_sha1(), secret, (int) strlen(secret), (unsigned char *) data.data, data.len, mac, &maclen);
	base64_append(&b64, mac, maclen);
	memcpy(out, b64.data, 27);
	out[27] = '\0';
	buf_free(&b64);
	buf_free(&data);
}

/*
 * Does hash (any case, as a mail system may smash it) match one of the
 * secrets?  At least HASH_LENGTH characters, compared in constant time:
 * how far a guess matched must not show in how long the answer took.
 */
static bool
srs_hash_valid(const struct srs *srs, const char *hash, const char *a, const char *b, const char *c)
{
	size_t len = strlen(hash);
	char   given[32];
	bool   valid = false;

	if (len < srs->hash_length || len > 27)
		return false;
	for (size_t i = 0; i < len; i++)
		given[i] = (char) tolower((unsigned char) hash[i]);
	for (size_t i = 0; i < srs->nsecrets; i++)
	{
		char want[32];

		srs_hash(srs->secrets[i], a, b, c, want);
		for (size_t k = 0; k < len; k++)
			want[k] = (char) tolower((unsigned char) want[k]);
		valid |= CRYPTO_memcmp(want, given, len) == 0;
		explicit_bzero(want, sizeof(want));
	}
	return valid;
}

static unsigned
srs_today(time_t now)
{
	return (unsigned) ((now / 86400) % SRS_TICKS);
}

/* Within MAX_AGE days, counting through the wrap of the 1024-day cycle. */
static bool
srs_timestamp_valid(const struct srs *srs, const char *ts, time_t now)
{
	const char *hi, *lo;
	unsigned	then, today = srs_today(now);

	if (strlen(ts) != 2 || (hi = strchr(srs_base32, toupper((unsigned char) ts[0]))) == NULL
		|| (lo = strchr(srs_base32, toupper((unsigned char) ts[1]))) == NULL || !*hi || !*lo)
		return false;
	then = (unsigned) (hi - srs_base32) * 32 + (unsigned) (lo - srs_base32);
	while (today < then)
		today += SRS_TICKS;
	return today <= then + srs->max_age;
}

/* Does local start with tag ("SRS0") and a separator?  Returns what follows the tag. */
static const char *
srs_tagged(const char *local, const char *tag)
{
	if (strncasecmp(local, tag, 4) == 0 && local[4] && strchr("=+-", local[4]))
		return local + 4;
	return NULL;
}

char *
srs_forward(const struct srs *srs, const char *sender, time_t now)
{
	const char *at = strrchr(sender, '@');
	char	   *local, *host, *out = NULL;
	const char *rest;
	char		hash[32];

	if (srs->domain == NULL || at == NULL || at == sender || at[1] == '\0'
		|| strcasecmp(at + 1, srs->domain) == 0)
		return NULL;
	local = xstrndup(sender, (size_t) (at - sender));
	host = xstrdup(at + 1);
	if ((rest = srs_tagged(local, "SRS1")) != NULL)
	{
		/* Someone else's SRS1: keep its first hop and rest, re-sign them. */
		char *copy = xstrdup(rest + 1);
		char *first = strchr(copy, '=');
		char *tail = first ? strchr(first + 1, '=') : NULL;

		if (first && tail)
		{
			*first++ = '\0';
			*tail++ = '\0';
			srs_hash(srs->secrets[0], first, tail, "", hash);
			out = xasprintf("SRS1%c%.*s=%s=%s@%s", srs->separator, (int) srs->hash_length, hash,
							first, tail, srs->domain);
		}
		free(copy);
	}
	else if ((rest = srs_tagged(local, "SRS0")) != NULL)
	{
		/* Another forwarder's SRS0: wrap it, keeping its separator. */
		srs_hash(srs->secrets[0], host, rest, "", hash);
		out = xasprintf("SRS1%c%.*s=%s=%s@%s", srs->separator, (int) srs->hash_length, hash,
						host, rest, srs->domain);
	}
	if (out == NULL)
	{
		unsigned today = srs_today(now);
		char	 ts[3] = {srs_base32[(today >> 5) & 31], srs_base32[today & 31], '\0'};

		srs_hash(srs->secrets[0], ts, host, local, hash);
		out = xasprintf("SRS0%c%.*s=%s=%s=%s@%s", srs->separator, (int) srs->hash_length, hash,
						ts, host, local, srs->domain);
	}
	free(local);
	free(host);
	return out;
}

/* Split s at its first n-1 '=' into fields (s is modified). */
static bool
srs_split(char *s, char **fields, int n)
{
	for (int i = 0; i < n - 1; i++)
	{
		char *eq = strchr(s, '=');

		if (eq == NULL)
			return false;
		fields[i] = s;
		*eq = '\0';
		s = eq + 1;
	}
	fields[n - 1] = s;
	return true;
}

/*
 * The SRS0 part inside an SRS1 address (its separator, hash, timestamp,
 * host, user): well-formed and within MAX_AGE, as far as another
 * forwarder's address can be checked; when that forwarder is us (the
 * first hop is our SRS domain), its hash must verify too.
 */
static bool
srs_inner_valid(const struct srs *srs, const char *hop, const char *inner, time_t now)
{
	char *copy = xstrdup(inner + 1);
	char *f[4];
	bool  valid = inner[0] && strchr("=+-", inner[0]) && srs_split(copy, f, 4) && *f[0] && *f[2] && *f[3]
				 && strspn(f[0], srs_base64) == strlen(f[0]) && srs_timestamp_valid(srs, f[1], now)
				 && (strcasecmp(hop, srs->domain) != 0
					 || srs_hash_valid(srs, f[0], f[1], f[2], f[3]));

	free(copy);
	return valid;
}

enum srs_result
srs_reverse(const struct srs *srs, const char *address, time_t now, char *out, size_t outlen)
{
	const char	   *at = strrchr(address, '@');
	char		   *local;
	const char	   *rest;
	char		   *f[4];
	enum srs_result r = SRS_MALFORMED;

	if (srs->domain == NULL || at == NULL || strcasecmp(at + 1, srs->domain) != 0)
		return SRS_NOT_SRS;
	local = xstrndup(address, (size_t) (at - address));
	if ((rest = srs_tagged(local, "SRS1")) != NULL)
	{
		char *copy = xstrdup(rest + 1);

		/* hash, first hop, rest of the SRS0 (which starts with its separator) */
		if (srs_split(copy, f, 3) && *f[0] && *f[1] && *f[2] && !strchr(f[0], '.'))
		{
			if (!srs_hash_valid(srs, f[0], f[1], f[2], ""))
				r = SRS_BAD_HASH;
			else if (!srs_inner_valid(srs, f[1], f[2], now))
				r = SRS_MALFORMED;
			else if ((size_t) snprintf(out, outlen, "SRS0%s@%s", f[2], f[1]) < outlen)
				r = SRS_REVERSED;
		}
		free(copy);
	}
	else if ((rest = srs_tagged(local, "SRS0")) != NULL)
	{
		char *copy = xstrdup(rest + 1);

		/* hash, timestamp, host, user (which may hold '=' itself) */
		if (srs_split(copy, f, 4) && *f[0] && *f[2] && *f[3])
		{
			if (!srs_hash_valid(srs, f[0], f[1], f[2], f[3]))
				r = SRS_BAD_HASH;
			else if (!srs_timestamp_valid(srs, f[1], now))
				r = SRS_EXPIRED;
			else if ((size_t) snprintf(out, outlen, "%s@%s", f[3], f[2]) < outlen)
				r = SRS_REVERSED;
		}
		free(copy);
	}
	else
		r = SRS_NOT_SRS;
	free(local);
	return r;
}

const char *
srs_result_text(enum srs_result r)
{
	switch (r)
	{
		case SRS_NOT_SRS:
			return "not an SRS address";
		case SRS_REVERSED:
			return "reversed";
		case SRS_MALFORMED:
			return "malformed SRS address";
		case SRS_BAD_HASH:
			return "SRS address with an invalid hash";
		case SRS_EXPIRED:
			return "expired SRS address";
	}
	return "?";
}
