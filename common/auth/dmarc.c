/*
 * dmarc.c: see dmarc.h.  Policy discovery (RFC 7489 6.6.3) is at most
 * two TXT lookups, _dmarc.<From domain> then _dmarc.<organizational
 * domain>, one after the other on the loop.
 */
#include "auth/dmarc.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <libpsl.h>

#include "base/log.h"
#include "base/xalloc.h"

enum dmarc_step
{
	DMARC_STEP_DOMAIN,		 /* _dmarc.<from> */
	DMARC_STEP_ORGANIZATION, /* _dmarc.<organizational domain> */
	DMARC_STEP_DONE
};

struct dmarc_check
{
	struct dns_resolver *resolver;
	struct dns_budget	*budget;
	struct dns_query	*query;
	dmarc_done_fn		 done;
	void				*arg;
	char				*from_domain;
	char				*org_domain;
	enum dmarc_step		 step;
	bool				 found;
	bool				 at_organization; /* the record is the organizational domain's */
	bool				 temperror;
	const char			*problem;
	struct dmarc_record	 record;
};

static const psl_ctx_t *
dmarc_psl(void)
{
	static const psl_ctx_t *psl;
	static bool				tried;

	if (!tried)
	{
		tried = true;
		/* The list Debian keeps current (publicsuffix), else the one built in. */
		if ((psl = psl_latest(NULL)) == NULL)
			psl = psl_builtin();
		if (psl == NULL)
			log_warnx("dmarc: no public suffix list; the organizational domain is the domain");
	}
	return psl;
}

char *
dmarc_organizational_domain(const char *domain)
{
	const psl_ctx_t *psl = dmarc_psl();
	const char		*registrable = psl ? psl_registrable_domain(psl, domain) : NULL;

	return xstrdup(registrable ? registrable : domain);
}

/*
 * The From domain
 */

/* The value of each From field; how many there were. */
static size_t
dmarc_from_fields(const char *h, size_t len, const char **value, size_t *value_len)
{
	size_t pos = 0,
		   count = 0;

	while (pos < len)
	{
		size_t start = pos,
			   end;

		if (h[pos] == '\r' || h[pos] == '\n')
			break;
		for (end = pos; end < len; end++)
			if (h[end] == '\n' && (end + 1 >= len || (h[end + 1] != ' ' && h[end + 1] != '\t')))
				break;
		pos = end < len ? end + 1 : len;
		if (end - start >= 5 && strncasecmp(h + start, "From", 4) == 0)
		{
			size_t colon = start + 4;

			while (colon < end && (h[colon] == ' ' || h[colon] == '\t'))
				colon++;
			if (colon < end && h[colon] == ':')
			{
				if (count++ == 0)
				{
					*value = h + colon + 1;
					*value_len = end - colon - 1;
				}
			}
		}
	}
	return count;
}

char *
dmarc_from_domain(const char *headers, size_t len, const char **why)
{
	const char *value = NULL;
	size_t		vlen = 0;
	size_t		fields = dmarc_from_fields(headers, len, &value, &vlen);
	char		clean[1024];
	size_t		n = 0;
	int			depth = 0;
	bool		quoted = false;
	size_t		addresses = 1;
	char	   *at;
	char	   *angle;
	char	   *domain;
	size_t		dlen;

	if (fields == 0)
	{
		*why = "no From field";
		return NULL;
	}
	if (fields > 1)
	{
		*why = "more than one From field";
		return NULL;
	}
	/* Comments and quoted strings out; count the addresses. */
	for (size_t i = 0; i < vlen && n < sizeof(clean) - 1; i++)
	{
		char c = value[i];

		if (quoted)
		{
			if (c == '\\' && i + 1 < vlen)
				i++;
			else if (c == '"')
				quoted = false;
			continue;
		}
		if (depth > 0)
		{
			if (c == '\\' && i + 1 < vlen)
				i++;
			else if (c == '(')
				depth++;
			else if (c == ')')
				depth--;
			continue;
		}
		if (c == '"')
			quoted = true;
		else if (c == '(')
			depth = 1;
		else if (c == ',')
			addresses++;
		else if (c != '\r' && c != '\n')
			clean[n++] = c;
	}
	clean[n] = '\0';
	if (addresses > 1)
	{
		*why = "more than one From address";
		return NULL;
	}
	if ((angle = strrchr(clean, '<')) != NULL)
	{
		char *close = strchr(angle, '>');

		if (close)
			*close = '\0';
		memmove(clean, angle + 1, strlen(angle + 1) + 1);
	}
	if ((at = strrchr(clean, '@')) == NULL)
	{
		*why = "no domain in the From address";
		return NULL;
	}
	domain = at + 1;
	while (*domain == ' ' || *domain == '\t')
		domain++;
	dlen = strcspn(domain, " \t>;");
	while (dlen > 0 && domain[dlen - 1] == '.')
		dlen--;
	if (dlen == 0 || dlen > 253)
	{
		*why = "no domain in the From address";
		return NULL;
	}
	for (size_t i = 0; i < dlen; i++)
	{
		if (!isalnum((unsigned char) domain[i]) && domain[i] != '-' && domain[i] != '.'
			&& domain[i] != '_')
		{
			*why = "the From domain is not a host name";
			return NULL;
		}
		domain[i] = (char) tolower((unsigned char) domain[i]);
	}
	*why = NULL;
	return xstrndup(domain, dlen);
}

/*
 * Records
 */

struct dmarc_parse
{
	struct dmarc_record *r;
	int					 index;
	bool				 version_ok;
	bool				 have_p;
	bool				 have_sp;
	bool				 have_rua;
	bool				 bad_p;
};

static bool
dmarc_value_is(const char *value, size_t len, const char *word)
{
	return strlen(word) == len && strncasecmp(value, word, len) == 0;
}

static bool
dmarc_disposition(const char *value, size_t len, enum dmarc_disposition *out)
{
	if (dmarc_value_is(value, len, "none"))
		*out = DMARC_NONE;
	else if (dmarc_value_is(value, len, "quarantine"))
		*out = DMARC_QUARANTINE;
	else if (dmarc_value_is(value, len, "reject"))
		*out = DMARC_REJECT;
	else
		return false;
	return true;
}

static void
dmarc_tag(void *arg, const char *tag, size_t taglen, const char *value, size_t len)
{
	struct dmarc_parse *p = arg;

	if (p->index++ == 0)
	{
		/* RFC 7489 6.4: v=DMARC1 first, exactly. */
		p->version_ok = taglen == 1 && tag[0] == 'v' && len == 6 && strncmp(value, "DMARC1", 6) == 0;
		return;
	}
	if (taglen == 1 && tag[0] == 'p')
	{
		p->have_p = true;
		p->bad_p = !dmarc_disposition(value, len, &p->r->p);
	}
	else if (taglen == 2 && strncmp(tag, "sp", 2) == 0)
		p->have_sp = dmarc_disposition(value, len, &p->r->sp);
	else if (taglen == 5 && strncmp(tag, "adkim", 5) == 0)
		p->r->strict_dkim = dmarc_value_is(value, len, "s");
	else if (taglen == 4 && strncmp(tag, "aspf", 4) == 0)
		p->r->strict_spf = dmarc_value_is(value, len, "s");
	else if (taglen == 3 && strncmp(tag, "pct", 3) == 0)
	{
		int	   pct = 0;
		size_t i;

		for (i = 0; i < len && i < 4 && isdigit((unsigned char) value[i]); i++)
			pct = pct * 10 + (value[i] - '0');
		if (i == len && len > 0 && pct <= 100)
			p->r->pct = pct;
	}
	else if (taglen == 3 && strncmp(tag, "rua", 3) == 0)
		p->have_rua = true;
}

bool
dmarc_record_parse(const char *text, size_t len, struct dmarc_record *r, const char **why)
{
	struct dmarc_parse p = {.r = r};

	memset(r, 0, sizeof(*r));
	r->pct = 100;
	if (!dkim_tag_list_parse(text, len, dmarc_tag, &p) || !p.version_ok)
	{
		*why = "not a DMARC record";
		return false;
	}
	/* RFC 7489 6.6.3: a bad or missing p= with rua= is p=none; without, no record. */
	if (!p.have_p || p.bad_p)
	{
		if (!p.have_rua)
		{
			*why = "no valid p=";
			return false;
		}
		r->p = DMARC_NONE;
	}
	if (!p.have_sp)
		r->sp = r->p;
	*why = NULL;
	return true;
}

/*
 * Discovery
 */

static void dmarc_on_answer(void *arg, const struct dns_answer *a);

static void
dmarc_lookup(struct dmarc_check *c, const char *domain)
{
	char *name = xasprintf("_dmarc.%s", domain);

	c->query = dns_resolve(c->resolver, name, DNS_TYPE_TXT, c->budget, dmarc_on_answer, c);
	free(name);
}

static void
dmarc_finish(struct dmarc_check *c)
{
	c->step = DMARC_STEP_DONE;
	c->done(c->arg);
}

static void
dmarc_on_answer(void *arg, const struct dns_answer *a)
{
	struct dmarc_check		*c = arg;
	size_t					 records = 0;
	const struct dns_record *found = NULL;

	c->query = NULL;
	if (a->status == DNS_TEMPFAIL || a->status == DNS_TIMEOUT)
	{
		c->temperror = true;
		dmarc_finish(c);
		return;
	}
	for (size_t i = 0; i < a->count; i++)
		if (a->records[i].type == DNS_TYPE_TXT && a->records[i].len >= 8
			&& strncmp(a->records[i].text, "v=DMARC1", 8) == 0)
		{
			records++;
			found = &a->records[i];
		}
	/* RFC 7489 6.6.3: more than one record is as good as none. */
	if (records == 1 && dmarc_record_parse(found->text, found->len, &c->record, &c->problem))
	{
		c->found = true;
		c->at_organization = c->step == DMARC_STEP_ORGANIZATION;
		dmarc_finish(c);
		return;
	}
	if (c->step == DMARC_STEP_DOMAIN && strcmp(c->org_domain, c->from_domain) != 0)
	{
		c->step = DMARC_STEP_ORGANIZATION;
		dmarc_lookup(c, c->org_domain);
		return;
	}
	dmarc_finish(c);
}

struct dmarc_check *
dmarc_check_start(struct dns_resolver *r, struct dns_budget *budget, const char *from_domain,
				  dmarc_done_fn done, void *arg)
{
	struct dmarc_check *c = xcalloc(1, sizeof(*c));

	c->resolver = r;
	c->budget = budget;
	c->done = done;
	c->arg = arg;
	c->from_domain = xstrdup(from_domain);
	c->org_domain = dmarc_organizational_domain(from_domain);
	c->step = DMARC_STEP_DOMAIN;
	dmarc_lookup(c, from_domain);
	return c;
}

/* RFC 7489 3.1: strict is the same name, relaxed the same organizational domain. */
static bool
dmarc_aligned(const char *domain, const char *from_domain, const char *from_org, bool strict)
{
	char  *org;
	bool   same;
	char   lowered[256];
	size_t len = strlen(domain);

	if (len == 0 || len >= sizeof(lowered))
		return false;
	for (size_t i = 0; i <= len; i++)
		lowered[i] = (char) tolower((unsigned char) domain[i]);
	if (len && lowered[len - 1] == '.')
		lowered[len - 1] = '\0';
	if (strcmp(lowered, from_domain) == 0)
		return true;
	if (strict)
		return false;
	org = dmarc_organizational_domain(lowered);
	same = strcmp(org, from_org) == 0;
	free(org);
	return same;
}

static const char *
dmarc_disposition_name(enum dmarc_disposition d)
{
	return d == DMARC_REJECT ? "reject" : d == DMARC_QUARANTINE ? "quarantine"
																: "none";
}

void
dmarc_check_evaluate(struct dmarc_check *c, enum spf_result spf, const char *spf_domain,
					 const struct dkim_signature_result *sigs, size_t nsigs,
					 struct dmarc_verdict *out)
{
	bool				   aligned = false;
	enum dmarc_disposition policy;

	memset(out, 0, sizeof(*out));
	out->from_domain = c->from_domain;
	if (c->temperror)
	{
		out->result = "temperror";
		out->reason = "DNS error looking up the policy";
		return;
	}
	if (!c->found)
	{
		out->result = "none";
		return;
	}
	policy = c->at_organization && strcmp(c->from_domain, c->org_domain) != 0 ? c->record.sp
																			  : c->record.p;
	out->policy = dmarc_disposition_name(policy);
	out->policy_domain = c->at_organization ? c->org_domain : c->from_domain;
	out->dkim_reported = nsigs > 0 ? 0 : -1;
	if (spf == SPF_PASS && spf_domain
		&& dmarc_aligned(spf_domain, c->from_domain, c->org_domain, c->record.strict_spf))
		out->spf_aligned = true;
	for (size_t i = 0; i < nsigs && !out->dkim_aligned; i++)
		if (sigs[i].result && strcmp(sigs[i].result, "pass") == 0 && sigs[i].domain
			&& dmarc_aligned(sigs[i].domain, c->from_domain, c->org_domain,
							 c->record.strict_dkim))
		{
			out->dkim_aligned = true;
			out->dkim_reported = (int) i;
		}
	aligned = out->spf_aligned || out->dkim_aligned;
	if (aligned)
		out->reason = out->spf_aligned ? "SPF aligned" : "DKIM aligned";
	if (aligned)
	{
		out->result = "pass";
		out->disposition = DMARC_NONE;
		return;
	}
	out->result = "fail";
	out->reason = "neither SPF nor DKIM aligned and passed";
	out->disposition = policy;
	/* pct (RFC 7489 6.6.4): outside the sample, one step milder. */
	if (c->record.pct < 100 && (random() % 100) >= c->record.pct)
		out->disposition = policy == DMARC_REJECT ? DMARC_QUARANTINE : DMARC_NONE;
}

void
dmarc_check_free(struct dmarc_check *c)
{
	if (c->query)
		dns_cancel(c->query);
	free(c->from_domain);
	free(c->org_domain);
	free(c);
}
