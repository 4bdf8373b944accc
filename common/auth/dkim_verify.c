/*
 * dkim_verify.c: see dkim_verify.h.  Three steps per message: the
 * signatures read, the key lookups (one per distinct <s>._domainkey.<d>,
 * all at once on the loop), then libopendkim over the whole message with
 * every key at hand.  libopendkim's handle is made once per process
 * (dkim_verify_library, under a lock: the first check may come from any
 * thread); libopendkim itself is thread-safe, one DKIM handle per message.
 */
#include "auth/dkim_verify.h"

#include <ctype.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <opendkim/dkim.h>

#include "auth/canon.h"
#include "auth/pubkey_cache.h"
#include "base/log.h"
#include "base/xalloc.h"

struct dkim_key
{
	struct dkim_verify *owner;
	char			   *domain;
	char			   *selector;
	struct dns_query   *query;
	bool				answered;
	enum dns_status		status;
	char			   *record; /* the TXT record (the first, if several) */
};

struct dkim_verify
{
	struct dns_resolver			*resolver;
	dkim_verify_done_fn			 done;
	void						*arg;
	const char					*message; /* the caller's, not a copy */
	size_t						 len;
	struct dkim_key				 keys[DKIM_VERIFY_MAX_SIGNATURES];
	size_t						 nkeys;
	size_t						 pending;
	ev_timer					 finish_timer;
	struct dkim_signature_result results[DKIM_VERIFY_MAX_SIGNATURES];
	size_t						 nresults;
	/*
	 * The signature fields libopendkim is not given (judged already, or
	 * beyond DKIM_VERIFY_MAX_SIGNATURES): offsets in the message, in
	 * order; it reads the message in pieces around them.
	 */
	struct
	{
		size_t start,
			end;
	} * left_out;
	size_t nleft_out;
};

static DKIM_LIB		 *dkim_verify_lib;
static pthread_once_t dkim_verify_once = PTHREAD_ONCE_INIT;

static DKIM_CBSTAT dkim_verify_key_lookup(DKIM *dkim, DKIM_SIGINFO *sig, unsigned char *buf,
										  size_t buflen);

static void
dkim_verify_library_init(void)
{
	unsigned int flags = DKIM_LIBFLAGS_BADSIGHANDLES;

	pubkey_cache_init(); /* libopendkim's key decoding, cached: pubkey_cache.h */
	if ((dkim_verify_lib = dkim_init(NULL, NULL)) == NULL)
		fatalx("libopendkim: cannot initialise");
	dkim_options(dkim_verify_lib, DKIM_OP_SETOPT, DKIM_OPTS_FLAGS, &flags, sizeof(flags));
	dkim_set_key_lookup(dkim_verify_lib, dkim_verify_key_lookup);
}

/* libopendkim, set up once: our key lookup instead of its own resolver. */
static DKIM_LIB *
dkim_verify_library(void)
{
	pthread_once(&dkim_verify_once, dkim_verify_library_init);
	return dkim_verify_lib;
}

/*
 * Tags
 */

static bool
dkim_is_wsp(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

bool
dkim_tag_list_parse(const char *text, size_t len, dkim_tag_fn each, void *arg)
{
	size_t pos = 0;

	while (pos < len)
	{
		size_t tag_start,
			tag_end,
			value_start,
			value_end;

		while (pos < len && dkim_is_wsp(text[pos]))
			pos++;
		if (pos == len)
			break; /* a trailing ';' */
		tag_start = pos;
		while (pos < len && (isalnum((unsigned char) text[pos]) || text[pos] == '_'))
			pos++;
		tag_end = pos;
		if (tag_end == tag_start || !isalpha((unsigned char) text[tag_start]))
			return false;
		while (pos < len && dkim_is_wsp(text[pos]))
			pos++;
		if (pos == len || text[pos] != '=')
			return false;
		pos++;
		while (pos < len && dkim_is_wsp(text[pos]))
			pos++;
		value_start = pos;
		while (pos < len && text[pos] != ';')
		{
			if ((unsigned char) text[pos] < 0x09 || text[pos] == 0x7f)
				return false;
			pos++;
		}
		value_end = pos;
		while (value_end > value_start && dkim_is_wsp(text[value_end - 1]))
			value_end--;
		each(arg, text + tag_start, tag_end - tag_start, text + value_start,
			 value_end - value_start);
		if (pos < len)
			pos++; /* the ';' */
	}
	return true;
}

struct dkim_signature_tags
{
	struct dkim_signature_result *r;
};

/* A value without its folding whitespace (b= is folded freely). */
static char *
dkim_unfolded(const char *value, size_t len, size_t max)
{
	char  *out = xmalloc(len + 1);
	size_t n = 0;

	for (size_t i = 0; i < len && n < max; i++)
		if (!dkim_is_wsp(value[i]))
			out[n++] = value[i];
	out[n] = '\0';
	return out;
}

static void
dkim_signature_tag(void *arg, const char *tag, size_t taglen, const char *value, size_t valuelen)
{
	struct dkim_signature_result *r = arg;
	char						**slot = NULL;
	size_t						  max = 255;

	if (taglen != 1)
		return;
	switch (tag[0])
	{
		case 'd':
			slot = &r->domain;
			break;
		case 's':
			slot = &r->selector;
			break;
		case 'i':
			slot = &r->identity;
			break;
		case 'a':
			slot = &r->algorithm;
			break;
		case 'b':
			slot = &r->b;
			max = 8; /* RFC 6008: enough to tell signatures apart */
			break;
	}
	if (slot == NULL)
		return;
	free(*slot);
	*slot = dkim_unfolded(value, valuelen, max);
}

/* A name that can be a DNS label sequence: what d= and s= may be. */
static bool
dkim_name_valid(const char *name)
{
	if (*name == '\0' || strlen(name) > 253)
		return false;
	for (const char *p = name; *p; p++)
		if (!isalnum((unsigned char) *p) && *p != '-' && *p != '.' && *p != '_')
			return false;
	return true;
}

/*
 * Key lookups
 */

static struct dkim_key *
dkim_find_key(struct dkim_verify *d, const char *domain, const char *selector)
{
	for (size_t i = 0; i < d->nkeys; i++)
		if (strcasecmp(d->keys[i].domain, domain) == 0
			&& strcasecmp(d->keys[i].selector, selector) == 0)
			return &d->keys[i];
	return NULL;
}

static DKIM_CBSTAT
dkim_verify_key_lookup(DKIM *dkim, DKIM_SIGINFO *sig, unsigned char *buf, size_t buflen)
{
	struct dkim_verify *d = dkim_get_user_context(dkim);
	const char		   *domain = (const char *) dkim_sig_getdomain(sig);
	const char		   *selector = (const char *) dkim_sig_getselector(sig);
	struct dkim_key	   *k;

	if (d == NULL || domain == NULL || selector == NULL
		|| (k = dkim_find_key(d, domain, selector)) == NULL)
		return DKIM_CBSTAT_NOTFOUND;
	if (k->status == DNS_TEMPFAIL || k->status == DNS_TIMEOUT)
		return DKIM_CBSTAT_TRYAGAIN;
	if (k->record == NULL)
		return DKIM_CBSTAT_NOTFOUND;
	if (strlen(k->record) >= buflen)
		return DKIM_CBSTAT_ERROR;
	strcpy((char *) buf, k->record);
	return DKIM_CBSTAT_CONTINUE;
}

static void
dkim_on_key(void *arg, const struct dns_answer *a)
{
	struct dkim_key	   *k = arg;
	struct dkim_verify *d = k->owner;

	k->query = NULL;
	k->answered = true;
	k->status = a->status;
	for (size_t i = 0; i < a->count; i++)
		if (a->records[i].type == DNS_TYPE_TXT
			&& memchr(a->records[i].text, '\0', a->records[i].len) == NULL)
		{
			k->record = xstrdup(a->records[i].text);
			break;
		}
	if (--d->pending == 0)
		ev_timer_start(dns_resolver_loop(d->resolver), &d->finish_timer);
}

/*
 * Verification
 */

/*
 * Each DKIM-Signature field of the header block to each(arg, msg, start,
 * end): the field runs from start to end, its line end included.
 */
static void
dkim_each_signature(const char *msg, size_t len, void (*each)(void *, const char *, size_t, size_t),
					void *arg)
{
	size_t pos = 0;

	while (pos < len)
	{
		size_t start = pos,
			   end;

		if (msg[pos] == '\r' || msg[pos] == '\n')
			break; /* the empty line: the headers are over */
		/* A field runs to a line end not followed by folding whitespace. */
		for (end = pos; end < len; end++)
			if (msg[end] == '\n' && (end + 1 >= len || (msg[end + 1] != ' ' && msg[end + 1] != '\t')))
				break;
		pos = end < len ? end + 1 : len;
		if (end - start > 15 && strncasecmp(msg + start, "DKIM-Signature:", 15) == 0)
			each(arg, msg, start, pos);
	}
}

static void
dkim_result(struct dkim_signature_result *r, const char *result, const char *reason)
{
	r->result = result;
	free(r->reason);
	r->reason = reason ? xstrdup(reason) : NULL;
}

/* A signature's tags: ours, and the count of names its h= has. */
struct dkim_signature_scan
{
	struct dkim_signature_result *r;
	size_t						  h_names;
};

static void
dkim_signature_scan_tag(void *arg, const char *tag, size_t taglen, const char *value,
						size_t valuelen)
{
	struct dkim_signature_scan *scan = arg;

	if (taglen == 1 && tag[0] == 'h')
		scan->h_names = canon_names_count(value, valuelen);
	dkim_signature_tag(scan->r, tag, taglen, value, valuelen);
}

/* Keep the field [start, end) from libopendkim. */
static void
dkim_leave_out(struct dkim_verify *d, size_t start, size_t end)
{
	d->left_out = xrealloc(d->left_out, (d->nleft_out + 1) * sizeof(*d->left_out));
	d->left_out[d->nleft_out].start = start;
	d->left_out[d->nleft_out].end = end;
	d->nleft_out++;
}

/*
 * One DKIM-Signature field.  A signature judged here (too long, h= naming
 * more than CANON_MAX_SIGNED_FIELDS fields, malformed) and one beyond
 * DKIM_VERIFY_MAX_SIGNATURES are left out of what libopendkim reads, so
 * it spends nothing on them (its header selection costs the product of
 * h='s names and the header's fields).  A signature that signs such a
 * field (h= naming dkim-signature) then fails: only a sender making both
 * loses by it.
 */
static void
dkim_take_signature(void *arg, const char *msg, size_t start, size_t end)
{
	struct dkim_verify			 *d = arg;
	struct dkim_signature_result *r;
	struct dkim_signature_scan	  scan;
	const char					 *value = msg + start + 15;
	size_t						  len = end - start - 15;

	if (d->nresults >= DKIM_VERIFY_MAX_SIGNATURES)
	{
		dkim_leave_out(d, start, end);
		return;
	}
	r = &d->results[d->nresults++];
	memset(r, 0, sizeof(*r));
	scan = (struct dkim_signature_scan){.r = r};
	if (end - start > CANON_MAX_SIGNATURE_FIELD)
		dkim_result(r, "permerror", "signature field too long (over 16384 octets)");
	else if (!dkim_tag_list_parse(value, len, dkim_signature_scan_tag, &scan))
		dkim_result(r, "permerror", "malformed signature");
	else if (scan.h_names > CANON_MAX_SIGNED_FIELDS)
		dkim_result(r, "permerror", "h= names more than 128 fields");
	else if (r->domain == NULL || r->selector == NULL || !dkim_name_valid(r->domain)
			 || !dkim_name_valid(r->selector))
		dkim_result(r, "permerror", "no valid d= or s=");
	if (r->result)
	{
		dkim_leave_out(d, start, end);
		return;
	}
	if (dkim_find_key(d, r->domain, r->selector) == NULL)
	{
		struct dkim_key *k = &d->keys[d->nkeys++];

		k->owner = d;
		k->domain = xstrdup(r->domain);
		k->selector = xstrdup(r->selector);
	}
}

static void
dkim_key_type_tag(void *arg, const char *tag, size_t taglen, const char *value, size_t valuelen)
{
	char *type = arg;

	if (taglen == 1 && tag[0] == 'k')
		snprintf(type, 16, "%.*s", (int) (valuelen < 15 ? valuelen : 15), value);
}

/*
 * Does the key record's type (k=, RSA by default) fit the signature's
 * algorithm?  libopendkim goes by a= alone, so an Ed25519 key published
 * as k=rsa would verify: RFC 6376 3.6.1 makes it an error.
 */
static bool
dkim_key_type_fits(const struct dkim_key *key, const char *algorithm)
{
	char   type[16] = "rsa";
	size_t len;

	if (key == NULL || key->record == NULL || algorithm == NULL)
		return true;
	dkim_tag_list_parse(key->record, strlen(key->record), dkim_key_type_tag, type);
	len = strlen(type);
	return strncasecmp(algorithm, type, len) == 0 && algorithm[len] == '-';
}

/* Our result for one of libopendkim's signatures. */
static void
dkim_judge(DKIM *dkim, DKIM_SIGINFO *sig, const struct dkim_key *key,
		   struct dkim_signature_result *r)
{
	int		error = dkim_sig_geterror(sig);
	ssize_t msglen = 0,
			canonlen = 0,
			signlen = -1;

	if (!dkim_key_type_fits(key, r->algorithm))
	{
		dkim_result(r, "permerror", "the key's type does not match the signature's algorithm");
		return;
	}
	if (error != DKIM_SIGERROR_NOKEY && error != DKIM_SIGERROR_KEYFAIL
		&& dkim_sig_getbh(sig) == DKIM_SIGBH_MISMATCH)
	{
		dkim_result(r, "fail", "body hash did not verify");
		return;
	}
	if (DKIM_SIG_CHECK(sig))
	{
		/*
		 * l= (RFC 6376 8.2): a body longer than what was signed carries
		 * content nobody vouched for.  That is not a pass.
		 */
		if (dkim_sig_getcanonlen(dkim, sig, &msglen, &canonlen, &signlen) == DKIM_STAT_OK
			&& signlen >= 0 && msglen > canonlen)
			dkim_result(r, "policy", "l= leaves body content unsigned");
		else
			dkim_result(r, "pass", NULL);
		return;
	}
	switch (error)
	{
		case DKIM_SIGERROR_NOKEY:
		case DKIM_SIGERROR_KEYFAIL:
			if (key && (key->status == DNS_TEMPFAIL || key->status == DNS_TIMEOUT))
				dkim_result(r, "temperror", "key lookup failed");
			else
				dkim_result(r, "permerror", "no key");
			return;
		case DKIM_SIGERROR_EXPIRED:
			dkim_result(r, "fail", "signature expired");
			return;
		case DKIM_SIGERROR_FUTURE:
			dkim_result(r, "fail", "signature in the future");
			return;
		case DKIM_SIGERROR_BADSIG:
			dkim_result(r, "fail", "signature did not verify");
			return;
		case DKIM_SIGERROR_OK:
		case DKIM_SIGERROR_UNKNOWN:
			dkim_result(r, "fail", "signature did not verify");
			return;
		default:
			dkim_result(r, "permerror", dkim_sig_geterrorstr(error));
			return;
	}
}

/* Match one of libopendkim's signatures to ours, by d=, s= and b=, first unused. */
static struct dkim_signature_result *
dkim_match(struct dkim_verify *d, DKIM_SIGINFO *sig, bool *used)
{
	const char					 *domain = (const char *) dkim_sig_getdomain(sig);
	const char					 *selector = (const char *) dkim_sig_getselector(sig);
	char						 *b = NULL;
	unsigned char				 *bvalue = dkim_sig_gettagvalue(sig, false, (unsigned char *) "b");
	struct dkim_signature_result *found = NULL;

	if (bvalue)
		b = dkim_unfolded((const char *) bvalue, strlen((const char *) bvalue), 8);
	for (size_t i = 0; i < d->nresults && found == NULL; i++)
	{
		struct dkim_signature_result *r = &d->results[i];

		if (used[i] || r->result != NULL || r->domain == NULL || domain == NULL
			|| selector == NULL || strcasecmp(r->domain, domain) != 0
			|| strcasecmp(r->selector, selector) != 0
			|| (b && r->b && strcmp(b, r->b) != 0))
			continue;
		used[i] = true;
		found = r;
	}
	free(b);
	return found;
}

void
dkim_verify_check(struct dkim_verify *d)
{
	DKIM_STAT	   status;
	DKIM		  *dkim;
	DKIM_SIGINFO **sigs = NULL;
	int			   nsigs = 0;
	bool		   used[DKIM_VERIFY_MAX_SIGNATURES] = {false};
	bool		   any_pending = false;

	for (size_t i = 0; i < d->nresults; i++)
		if (d->results[i].result == NULL)
			any_pending = true;
	if (!any_pending)
		return;
	dkim = dkim_verify(dkim_verify_library(), (const unsigned char *) "pepsi", NULL, &status);
	if (dkim == NULL)
	{
		for (size_t i = 0; i < d->nresults; i++)
			if (d->results[i].result == NULL)
				dkim_result(&d->results[i], "temperror", "libopendkim refused the message");
		return;
	}
	dkim_set_user_context(dkim, d);
	/* The message in pieces, around the signatures left out. */
	status = DKIM_STAT_OK;
	for (size_t i = 0, from = 0; i <= d->nleft_out && status == DKIM_STAT_OK; i++)
	{
		size_t to = i < d->nleft_out ? d->left_out[i].start : d->len;

		if (to > from)
			/* libopendkim only reads it; its prototype says otherwise. */
			status = dkim_chunk(dkim, (unsigned char *) (uintptr_t) (d->message + from), to - from);
		if (i < d->nleft_out)
			from = d->left_out[i].end;
	}
	if (status == DKIM_STAT_OK)
		status = dkim_chunk(dkim, NULL, 0);
	if (status == DKIM_STAT_OK)
		status = dkim_eom(dkim, NULL);
	if (dkim_getsiglist(dkim, &sigs, &nsigs) == DKIM_STAT_OK)
		for (int i = 0; i < nsigs; i++)
		{
			struct dkim_signature_result *r = dkim_match(d, sigs[i], used);
			const char					 *domain = (const char *) dkim_sig_getdomain(sigs[i]);
			const char					 *selector = (const char *) dkim_sig_getselector(sigs[i]);

			if (r == NULL)
				continue;
			dkim_judge(dkim, sigs[i], domain && selector ? dkim_find_key(d, domain, selector) : NULL,
					   r);
		}
	/* What libopendkim did not report on, it could not parse. */
	for (size_t i = 0; i < d->nresults; i++)
		if (d->results[i].result == NULL)
			dkim_result(&d->results[i], "permerror",
						status == DKIM_STAT_OK ? "signature not processed" : dkim_geterror(dkim) ? dkim_geterror(dkim)
																								 : "signature not processed");
	dkim_free(dkim);
}

static void
dkim_verify_on_finish(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct dkim_verify *d = w->data;

	d->done(d->arg);
}

struct dkim_verify *
dkim_verify_new(const char *message, size_t len)
{
	struct dkim_verify *d = xcalloc(1, sizeof(*d));

	ev_timer_init(&d->finish_timer, dkim_verify_on_finish, 0, 0);
	d->finish_timer.data = d;
	d->message = message;
	d->len = len;
	dkim_each_signature(message, len, dkim_take_signature, d);
	return d;
}

void
dkim_verify_lookup(struct dkim_verify *d, struct dns_resolver *r, struct dns_budget *budget,
				   dkim_verify_done_fn done, void *arg)
{
	d->resolver = r;
	d->done = done;
	d->arg = arg;
	for (size_t i = 0; i < d->nkeys; i++)
	{
		struct dkim_key *k = &d->keys[i];
		char			*name = xasprintf("%s._domainkey.%s", k->selector, k->domain);

		d->pending++;
		k->query = dns_resolve(r, name, DNS_TYPE_TXT, budget, dkim_on_key, k);
		free(name);
	}
	if (d->pending == 0)
		ev_timer_start(dns_resolver_loop(r), &d->finish_timer);
}

size_t
dkim_verify_results(const struct dkim_verify *d, const struct dkim_signature_result **out)
{
	*out = d->results;
	return d->nresults;
}

void
dkim_verify_free(struct dkim_verify *d)
{
	if (d->resolver)
		ev_timer_stop(dns_resolver_loop(d->resolver), &d->finish_timer);
	for (size_t i = 0; i < d->nkeys; i++)
	{
		if (d->keys[i].query)
			dns_cancel(d->keys[i].query);
		free(d->keys[i].domain);
		free(d->keys[i].selector);
		free(d->keys[i].record);
	}
	for (size_t i = 0; i < d->nresults; i++)
	{
		free(d->results[i].domain);
		free(d->results[i].selector);
		free(d->results[i].identity);
		free(d->results[i].algorithm);
		free(d->results[i].b);
		free(d->results[i].reason);
	}
	free(d->left_out);
	free(d);
}
