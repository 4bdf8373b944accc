/*
 * spf.c: see spf.h.  One check is a stack of frames, one per record being
 * evaluated (the top domain, then each include; a redirect replaces its
 * frame), and one function, spf_advance, that walks the current frame's
 * terms until it needs an answer from the DNS (it starts the lookup and
 * returns; the answer calls it again) or knows the result.  At most one
 * lookup of a check is in flight, so cancelling is one dns_cancel.
 *
 * A record is parsed whole (spf_parse.c) before any of it is evaluated
 * (RFC 7208 4.6: a syntax error anywhere is a permerror), and every answer
 * is hostile: record text is checked for ASCII, name lists are cut at the
 * RFC's limits, and the lookup and void-lookup limits bound the whole
 * tree.  Macros are expanded in spf_expand.c.
 */
#include "auth/spf.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth/spf_internal.h"
#include "base/log.h"
#include "base/xalloc.h"

static void spf_advance(struct spf_check *c);
static void spf_term_next(struct spf_check *c, bool matched);
static bool spf_expand_explanation(struct spf_check *c);

const char *
spf_result_name(enum spf_result r)
{
	static const char *const names[] = {
		"none", "neutral", "pass", "fail", "softfail", "temperror", "permerror"};

	return names[r];
}

/*
 * Addresses
 */

bool
spf_ip_parse(const char *text, struct spf_ip *ip)
{
	memset(ip, 0, sizeof(*ip));
	if (inet_pton(AF_INET, text, ip->addr) == 1)
	{
		ip->family = 4;
		return true;
	}
	if (inet_pton(AF_INET6, text, ip->addr) != 1)
		return false;
	ip->family = 6;
	if (IN6_IS_ADDR_V4MAPPED((struct in6_addr *) ip->addr))
	{
		memmove(ip->addr, ip->addr + 12, 4);
		memset(ip->addr + 4, 0, 12);
		ip->family = 4;
	}
	return true;
}

static bool
spf_prefix_match(const unsigned char *a, const unsigned char *b, int bits)
{
	int bytes = bits / 8,
		rest = bits % 8;

	if (memcmp(a, b, (size_t) bytes) != 0)
		return false;
	if (rest == 0)
		return true;
	return ((a[bytes] ^ b[bytes]) & (0xff << (8 - rest))) == 0;
}

/* Does an A or AAAA answer hold the client's address, within the prefix? */
static bool
spf_answer_matches(const struct spf_check *c, const struct dns_answer *a, int cidr4, int cidr6)
{
	for (size_t i = 0; i < a->count; i++)
	{
		const struct dns_record *r = &a->records[i];

		if (c->ip.family == 4 && r->type == DNS_TYPE_A && r->len == 4
			&& spf_prefix_match(r->rdata, c->ip.addr, cidr4))
			return true;
		if (c->ip.family == 6 && r->type == DNS_TYPE_AAAA && r->len == 16
			&& spf_prefix_match(r->rdata, c->ip.addr, cidr6))
			return true;
	}
	return false;
}

static enum dns_type
spf_address_type(const struct spf_check *c)
{
	return c->ip.family == 4 ? DNS_TYPE_A : DNS_TYPE_AAAA;
}

/*
 * Names
 */

/* A name that can be looked up: labels of 1 to 63 octets. */
static bool
spf_name_valid(const char *name)
{
	size_t label = 0;

	if (*name == '\0' || strlen(name) > SPF_NAME_MAX + 1)
		return false;
	for (const char *p = name; *p; p++)
	{
		if (*p == '.')
		{
			if (label == 0)
				return false;
			label = 0;
		}
		else if (++label > 63)
			return false;
	}
	return true;
}

/* RFC 7208 4.3: a domain that is no FQDN gives "none". */
static bool
spf_domain_checkable(const char *domain)
{
	const char *last;
	size_t		len = strlen(domain);

	if (len == 0 || domain[0] == '[' || !spf_name_valid(domain))
		return false;
	if (domain[len - 1] == '.')
		len--;
	last = memrchr(domain, '.', len);
	if (last == NULL)
		return false; /* a single label */
	return true;
}

static bool
spf_name_equal(const char *a, const char *b)
{
	size_t la = strlen(a),
		   lb = strlen(b);

	if (la && a[la - 1] == '.')
		la--;
	if (lb && b[lb - 1] == '.')
		lb--;
	return la == lb && strncasecmp(a, b, la) == 0;
}

/* Is name domain, or a subdomain of it? */
static bool
spf_name_within(const char *name, const char *domain)
{
	size_t ln = strlen(name),
		   ld = strlen(domain);

	if (ln && name[ln - 1] == '.')
		ln--;
	if (ld && domain[ld - 1] == '.')
		ld--;
	if (ln == ld)
		return strncasecmp(name, domain, ln) == 0;
	return ln > ld && name[ln - ld - 1] == '.' && strncasecmp(name + ln - ld, domain, ld) == 0;
}

/*
 * The check
 */

static void
spf_free(struct spf_check *c)
{
	for (size_t i = 0; i < c->depth; i++)
	{
		free(c->frames[i].domain);
		spf_record_free(&c->frames[i].record);
	}
	for (size_t i = 0; i < c->name_count; i++)
		free(c->names[i]);
	free(c->names);
	for (size_t i = 0; i < c->p_count; i++)
		free(c->p_names[i]);
	free(c->p_names);
	free(c->p_value);
	free(c->p_found);
	free(c->target);
	free(c->ip_text);
	free(c->sender);
	free(c->local_part);
	free(c->sender_domain);
	free(c->helo);
	free(c->receiver);
	free(c->explanation);
	free(c->exp_text);
	free(c);
}

static void
spf_on_finish(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct spf_check *c = w->data;

	c->verdict.explanation = c->explanation;
	c->verdict.reason = c->reason;
	c->verdict.domain = c->sender_domain;
	c->done(c->arg, &c->verdict);
	spf_free(c);
}

/* The verdict is known: report it from the loop. */
static void
spf_conclude(struct spf_check *c, enum spf_result result, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void
spf_conclude(struct spf_check *c, enum spf_result result, const char *fmt, ...)
{
	va_list ap;

	c->verdict.result = result;
	va_start(ap, fmt);
	vsnprintf(c->reason, sizeof(c->reason), fmt, ap);
	va_end(ap);
	c->wait = SPF_WAIT_NOTHING;
	ev_timer_init(&c->finish_timer, spf_on_finish, 0, 0);
	c->finish_timer.data = c;
	ev_timer_start(dns_resolver_loop(c->resolver), &c->finish_timer);
}

static void spf_on_answer(void *arg, const struct dns_answer *a);

static void
spf_lookup(struct spf_check *c, const char *name, enum dns_type type, enum spf_wait wait)
{
	c->wait = wait;
	c->query = dns_resolve(c->resolver, name, type, c->budget, spf_on_answer, c);
}

static void
spf_clear_names(struct spf_check *c)
{
	for (size_t i = 0; i < c->name_count; i++)
		free(c->names[i]);
	free(c->names);
	c->names = NULL;
	c->name_count = c->name_index = 0;
}

/* Count a lookup against the limit; false (and permerror) past it. */
static bool
spf_count_lookup(struct spf_check *c)
{
	if (++c->lookups > SPF_LOOKUP_LIMIT)
	{
		spf_conclude(c, SPF_PERMERROR, "more than %d DNS-querying terms", SPF_LOOKUP_LIMIT);
		return false;
	}
	return true;
}

/* An answer with nothing (NXDOMAIN or no record): count it; false (permerror) past the limit. */
static bool
spf_count_void(struct spf_check *c, const struct dns_answer *a, size_t useful)
{
	if ((a->status == DNS_NXDOMAIN || (a->status == DNS_OK && useful == 0))
		&& ++c->voids > SPF_VOID_LIMIT)
	{
		spf_conclude(c, SPF_PERMERROR, "more than %d lookups found nothing", SPF_VOID_LIMIT);
		return false;
	}
	return true;
}

static size_t
spf_count_type(const struct dns_answer *a, enum dns_type type)
{
	size_t n = 0;

	for (size_t i = 0; i < a->count; i++)
		if (a->records[i].type == type)
			n++;
	return n;
}

static struct spf_frame *
spf_frame(struct spf_check *c)
{
	return &c->frames[c->depth - 1];
}

/* Start evaluating domain in a frame (pushed, or the current one for a redirect). */
static void
spf_start_frame(struct spf_check *c, struct spf_frame *f, const char *domain)
{
	free(f->domain);
	spf_record_free(&f->record);
	f->domain = xstrdup(domain);
	f->parsed = false;
	f->next = 0;
	spf_lookup(c, domain, DNS_TYPE_TXT, SPF_WAIT_RECORD);
}

/*
 * Expand the current term's domain (or the frame's domain); false if the
 * check waits for %{p} (it resumes by itself) or concluded.
 */
static bool
spf_target(struct spf_check *c, const char *spec, char **out)
{
	struct spf_frame *f = spf_frame(c);

	if (spec == NULL)
	{
		*out = xstrdup(f->domain);
		return true;
	}
	if (spf_expand(c, spec, f->domain, out) == SPF_EXPAND_NEED_P)
	{
		char name[128];

		if (!dns_reverse_name(c->ip_text, name, sizeof(name)))
		{
			c->p_value = xstrdup("unknown");
			return spf_target(c, spec, out);
		}
		spf_lookup(c, name, DNS_TYPE_PTR, SPF_WAIT_P_PTR);
		return false;
	}
	spf_truncate_name(*out);
	return true;
}

/* A fail with exp=: look the explanation up (best effort: trouble gives the default). */
static void
spf_explain(struct spf_check *c)
{
	char *name;

	c->explaining = true;
	if (!spf_target(c, spf_frame(c)->record.exp, &name))
		return; /* %{p} first; spf_next_p_name comes back */
	free(c->target);
	c->target = name;
	spf_lookup(c, name, DNS_TYPE_TXT, SPF_WAIT_EXP);
}

/* A frame's result: pop it into its parent, or conclude the check. */
static void
spf_frame_result(struct spf_check *c, enum spf_result result, const char *why)
{
	struct spf_frame *f = spf_frame(c);

	if (result == SPF_TEMPERROR || result == SPF_PERMERROR)
	{
		spf_conclude(c, result, "%s", why);
		return;
	}
	if (f->kind == SPF_FRAME_TOP)
	{
		struct spf_record *r = &f->record;

		if (result == SPF_FAIL && r->exp)
		{
			snprintf(c->fail_reason, sizeof(c->fail_reason), "%s", why);
			spf_explain(c);
			return;
		}
		spf_conclude(c, result, "%s", why);
		return;
	}
	/* An include: the parent's term matches on pass only; none is an error. */
	free(f->domain);
	f->domain = NULL;
	spf_record_free(&f->record);
	c->depth--;
	if (result == SPF_NONE)
	{
		spf_conclude(c, SPF_PERMERROR, "include:%s has no SPF record", c->target ? c->target : "");
		return;
	}
	spf_term_next(c, result == SPF_PASS);
}

/* The current term's result if it matched, else the next term. */
static void
spf_term_next(struct spf_check *c, bool matched)
{
	struct spf_frame *f = spf_frame(c);

	if (matched)
	{
		const struct spf_term *t = &f->record.terms[f->next];

		spf_frame_result(c, t->qualifier, t->text);
		return;
	}
	f->next++;
	spf_advance(c);
}

/* The current term matched (or not); go on. */
static void
spf_term_done(struct spf_check *c, bool matched)
{
	spf_clear_names(c);
	spf_term_next(c, matched);
}

/* Walk the current frame's terms until one needs the DNS or the result is known. */
static void
spf_advance(struct spf_check *c)
{
	struct spf_frame *f = spf_frame(c);

	while (f->next < f->record.count)
	{
		const struct spf_term *t = &f->record.terms[f->next];
		char				  *target = NULL;

		switch (t->mechanism)
		{
			case SPF_MECH_ALL:
				spf_frame_result(c, t->qualifier, t->text);
				return;
			case SPF_MECH_IP4:
			case SPF_MECH_IP6:
				if ((t->mechanism == SPF_MECH_IP4 && c->ip.family == 4
					 && spf_prefix_match(t->network, c->ip.addr, t->cidr4))
					|| (t->mechanism == SPF_MECH_IP6 && c->ip.family == 6
						&& spf_prefix_match(t->network, c->ip.addr, t->cidr6)))
				{
					spf_frame_result(c, t->qualifier, t->text);
					return;
				}
				f->next++;
				continue;
			default:
				break;
		}
		/* The rest ask the DNS: count, expand, look up. */
		if (!spf_target(c, t->domain_spec, &target))
			return;
		if (!spf_count_lookup(c))
		{
			free(target);
			return;
		}
		free(c->target);
		c->target = target;
		switch (t->mechanism)
		{
			case SPF_MECH_INCLUDE:
				if (c->depth >= SPF_DEPTH_MAX)
				{
					spf_conclude(c, SPF_PERMERROR, "includes nested too deep");
					return;
				}
				c->depth++;
				memset(spf_frame(c), 0, sizeof(struct spf_frame));
				spf_frame(c)->kind = SPF_FRAME_INCLUDE;
				spf_start_frame(c, spf_frame(c), target);
				return;
			case SPF_MECH_A:
				spf_lookup(c, target, spf_address_type(c), SPF_WAIT_A);
				return;
			case SPF_MECH_MX:
				spf_lookup(c, target, DNS_TYPE_MX, SPF_WAIT_MX);
				return;
			case SPF_MECH_PTR:
				{
					char name[128];

					if (!dns_reverse_name(c->ip_text, name, sizeof(name)))
					{
						spf_term_done(c, false);
						return;
					}
					spf_lookup(c, name, DNS_TYPE_PTR, SPF_WAIT_PTR);
					return;
				}
			case SPF_MECH_EXISTS:
				spf_lookup(c, target, DNS_TYPE_A, SPF_WAIT_EXISTS);
				return;
			default:
				break;
		}
	}
	/* No term matched. */
	if (f->record.redirect)
	{
		char *target;

		if (!spf_target(c, f->record.redirect, &target))
			return;
		if (!spf_count_lookup(c))
		{
			free(target);
			return;
		}
		free(c->target);
		c->target = xstrdup(target);
		f->redirected = true;
		spf_start_frame(c, f, target);
		free(target);
		return;
	}
	spf_frame_result(c, SPF_NEUTRAL, "no term matched");
}

/* Pick the next name of c->names worth an address lookup (ptr: within the target). */
static void
spf_next_ptr_name(struct spf_check *c)
{
	while (c->name_index < c->name_count)
	{
		if (spf_name_within(c->names[c->name_index], c->target))
		{
			spf_lookup(c, c->names[c->name_index], spf_address_type(c), SPF_WAIT_PTR_ADDRESS);
			return;
		}
		c->name_index++;
	}
	spf_term_done(c, false);
}

/* %{p}: the next PTR name to validate, or the value settled. */
static void
spf_next_p_name(struct spf_check *c)
{
	if (c->p_index < c->p_count && c->p_rank < 3)
	{
		spf_lookup(c, c->p_names[c->p_index], spf_address_type(c), SPF_WAIT_P_ADDRESS);
		return;
	}
	c->p_value = c->p_found ? c->p_found : xstrdup("unknown");
	c->p_found = NULL;
	/* Resume whatever needed it. */
	c->wait = SPF_WAIT_NOTHING;
	if (c->exp_text)
		spf_expand_explanation(c);
	else if (c->explaining)
		spf_explain(c);
	else
		spf_advance(c);
}

/* Take the names of a PTR answer, at most limit. */
static char **
spf_ptr_names(const struct dns_answer *a, size_t limit, size_t *count)
{
	char **names = xcalloc(limit + 1, sizeof(*names));
	size_t n = 0;

	for (size_t i = 0; i < a->count && n < limit; i++)
		if (a->records[i].type == DNS_TYPE_PTR && a->records[i].text)
			names[n++] = xstrdup(a->records[i].text);
	*count = n;
	return names;
}

/* The explanation TXT: exactly one record, expanded; anything else is the default. */
static void
spf_take_explanation(struct spf_check *c, const struct dns_answer *a)
{
	const struct dns_record *r = NULL;
	char					 reason[128];

	if (a->status != DNS_OK || spf_count_type(a, DNS_TYPE_TXT) != 1)
		return;
	for (size_t i = 0; i < a->count; i++)
		if (a->records[i].type == DNS_TYPE_TXT)
			r = &a->records[i];
	for (size_t i = 0; i < r->len; i++)
		if ((unsigned char) r->text[i] < 0x20 || (unsigned char) r->text[i] > 0x7e)
			return;
	if (!spf_macro_valid(r->text, r->text + r->len, true, reason, sizeof(reason)))
		return;
	c->exp_text = xstrndup(r->text, r->len);
}

/* Expand the explanation text and conclude; false if %{p} must be looked up first. */
static bool
spf_expand_explanation(struct spf_check *c)
{
	char name[128];

	if (c->exp_text && spf_expand(c, c->exp_text, spf_frame(c)->domain, &c->explanation) == SPF_EXPAND_NEED_P)
	{
		if (dns_reverse_name(c->ip_text, name, sizeof(name)))
		{
			spf_lookup(c, name, DNS_TYPE_PTR, SPF_WAIT_P_PTR);
			return false;
		}
		c->p_value = xstrdup("unknown");
		spf_expand(c, c->exp_text, spf_frame(c)->domain, &c->explanation);
	}
	spf_conclude(c, SPF_FAIL, "%s", c->fail_reason);
	return true;
}

static void
spf_on_answer(void *arg, const struct dns_answer *a)
{
	struct spf_check *c = arg;
	struct spf_frame *f = spf_frame(c);
	bool			  error = a->status == DNS_TEMPFAIL || a->status == DNS_TIMEOUT;

	c->query = NULL;
	switch (c->wait)
	{
		case SPF_WAIT_NOTHING:
			break;
		case SPF_WAIT_RECORD:
			{
				const struct dns_record *found = NULL;
				size_t					 n = 0;
				char					 reason[200];

				if (error)
				{
					spf_conclude(c, SPF_TEMPERROR, "DNS error looking up %s TXT", f->domain);
					return;
				}
				for (size_t i = 0; i < a->count; i++)
					if (a->records[i].type == DNS_TYPE_TXT
						&& spf_is_record(a->records[i].text, a->records[i].len))
					{
						found = &a->records[i];
						n++;
					}
				if (n > 1)
				{
					spf_conclude(c, SPF_PERMERROR, "%s has %zu SPF records", f->domain, n);
					return;
				}
				if (n == 0)
				{
					if (f->kind == SPF_FRAME_TOP && !f->redirected)
						spf_conclude(c, SPF_NONE, "%s has no SPF record", f->domain);
					else
						spf_conclude(c, SPF_PERMERROR, "%s%s has no SPF record",
									 f->redirected ? "redirect=" : "include:", f->domain);
					return;
				}
				if (!spf_parse(found->text, found->len, &f->record, reason, sizeof(reason)))
				{
					spf_conclude(c, SPF_PERMERROR, "%s: %s", f->domain, reason);
					return;
				}
				f->parsed = true;
				f->next = 0;
				spf_advance(c);
				return;
			}
		case SPF_WAIT_A:
			if (error)
			{
				spf_conclude(c, SPF_TEMPERROR, "DNS error looking up %s", c->target);
				return;
			}
			if (!spf_count_void(c, a, spf_count_type(a, spf_address_type(c))))
				return;
			spf_term_done(c, spf_answer_matches(c, a, f->record.terms[f->next].cidr4,
												f->record.terms[f->next].cidr6));
			return;
		case SPF_WAIT_EXISTS:
			if (error)
			{
				spf_conclude(c, SPF_TEMPERROR, "DNS error looking up %s", c->target);
				return;
			}
			if (!spf_count_void(c, a, spf_count_type(a, DNS_TYPE_A)))
				return;
			spf_term_done(c, spf_count_type(a, DNS_TYPE_A) > 0);
			return;
		case SPF_WAIT_MX:
			if (error)
			{
				spf_conclude(c, SPF_TEMPERROR, "DNS error looking up %s MX", c->target);
				return;
			}
			if (!spf_count_void(c, a, spf_count_type(a, DNS_TYPE_MX)))
				return;
			if (spf_count_type(a, DNS_TYPE_MX) > SPF_MX_LIMIT)
			{
				spf_conclude(c, SPF_PERMERROR, "%s has more than %d MX records", c->target,
							 SPF_MX_LIMIT);
				return;
			}
			spf_clear_names(c);
			c->names = xcalloc(a->count + 1, sizeof(*c->names));
			for (size_t i = 0; i < a->count; i++)
				/* A null MX (".") names no host. */
				if (a->records[i].type == DNS_TYPE_MX && a->records[i].text
					&& strcmp(a->records[i].text, ".") != 0)
					c->names[c->name_count++] = xstrdup(a->records[i].text);
			if (c->name_count == 0)
			{
				spf_term_done(c, false);
				return;
			}
			spf_lookup(c, c->names[0], spf_address_type(c), SPF_WAIT_MX_ADDRESS);
			return;
		case SPF_WAIT_MX_ADDRESS:
			if (error)
			{
				spf_conclude(c, SPF_TEMPERROR, "DNS error looking up %s",
							 c->names[c->name_index]);
				return;
			}
			if (spf_answer_matches(c, a, f->record.terms[f->next].cidr4,
								   f->record.terms[f->next].cidr6))
			{
				spf_term_done(c, true);
				return;
			}
			if (++c->name_index < c->name_count)
			{
				spf_lookup(c, c->names[c->name_index], spf_address_type(c),
						   SPF_WAIT_MX_ADDRESS);
				return;
			}
			spf_term_done(c, false);
			return;
		case SPF_WAIT_PTR:
			/* RFC 7208 5.5: a DNS error here is no match, not an error. */
			if (error)
			{
				spf_term_done(c, false);
				return;
			}
			if (!spf_count_void(c, a, spf_count_type(a, DNS_TYPE_PTR)))
				return;
			spf_clear_names(c);
			c->names = spf_ptr_names(a, SPF_PTR_LIMIT, &c->name_count);
			spf_next_ptr_name(c);
			return;
		case SPF_WAIT_PTR_ADDRESS:
			if (!error && spf_answer_matches(c, a, 32, 128))
			{
				spf_term_done(c, true);
				return;
			}
			c->name_index++;
			spf_next_ptr_name(c);
			return;
		case SPF_WAIT_P_PTR:
			if (!error)
				c->p_names = spf_ptr_names(a, SPF_PTR_LIMIT, &c->p_count);
			c->p_index = 0;
			c->p_rank = 0;
			spf_next_p_name(c);
			return;
		case SPF_WAIT_P_ADDRESS:
			if (!error && spf_answer_matches(c, a, 32, 128))
			{
				/* RFC 7208 7.3: the domain itself, else a subdomain, else any. */
				const char *name = c->p_names[c->p_index];
				int			rank = spf_name_equal(name, f->domain)	  ? 3
								   : spf_name_within(name, f->domain) ? 2
																	  : 1;

				if (rank > c->p_rank)
				{
					free(c->p_found);
					c->p_found = xstrdup(name);
					c->p_rank = rank;
				}
			}
			c->p_index++;
			spf_next_p_name(c);
			return;
		case SPF_WAIT_EXP:
			spf_take_explanation(c, a);
			spf_expand_explanation(c);
			return;
	}
}

struct spf_check *
spf_check_start(struct dns_resolver *r, struct dns_budget *budget, const char *ip,
				const char *sender, const char *helo, const char *receiver,
				spf_done_fn done, void *arg)
{
	struct spf_check *c = xcalloc(1, sizeof(*c));
	const char		 *at = strrchr(sender, '@');

	c->resolver = r;
	c->budget = budget;
	c->done = done;
	c->arg = arg;
	c->ip_text = xstrdup(ip);
	c->helo = helo ? xstrdup(helo) : NULL;
	c->receiver = receiver ? xstrdup(receiver) : NULL;
	if (at)
	{
		c->local_part = at == sender ? xstrdup("postmaster") : xstrndup(sender, (size_t) (at - sender));
		c->sender_domain = xstrdup(at + 1);
	}
	else
	{
		/* A bare domain (the HELO identity given alone). */
		c->local_part = xstrdup("postmaster");
		c->sender_domain = xstrdup(sender);
	}
	c->sender = xasprintf("%s@%s", c->local_part, c->sender_domain);
	c->depth = 1;
	c->frames[0].kind = SPF_FRAME_TOP;
	if (!spf_ip_parse(ip, &c->ip))
	{
		spf_conclude(c, SPF_PERMERROR, "\"%s\" is not an IP address", ip);
		return c;
	}
	if (!spf_domain_checkable(c->sender_domain))
	{
		spf_conclude(c, SPF_NONE, "\"%s\" is not a domain SPF can check", c->sender_domain);
		return c;
	}
	spf_start_frame(c, &c->frames[0], c->sender_domain);
	return c;
}

void
spf_check_cancel(struct spf_check *c)
{
	if (c->query)
		dns_cancel(c->query);
	ev_timer_stop(dns_resolver_loop(c->resolver), &c->finish_timer);
	spf_free(c);
}
