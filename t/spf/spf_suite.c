/*
 * pepsi-test-spf-suite: the SPF evaluator (common/auth/spf.c), the real
 * one, run over the OpenSPF RFC 7208 test suite.  Its zones are served by
 * a DNS backend in this program (dns_resolver_new_backend) that answers
 * from the suite's data, from the event loop, as libunbound would; a name
 * marked TIMEOUT never answers, so the resolver's own timeout fires.
 *
 * Input: the JSON of t/spf/rfc7208_to_json.py.  Output, one line per test:
 * "name<TAB>result<TAB>explanation or DEFAULT<TAB>reason".
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "auth/spf.h"
#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "dns/dns.h"

#define SUITE_LOOKUP_TIMEOUT 0.05

struct fake_query
{
	struct dns_query  *query;
	struct dns_answer  answer;
	bool			   silent;
	ev_timer		   timer;
	struct fake_query *next;
};

static json_t			 *zone;
static struct fake_query *pending;
static struct ev_loop	 *loop;

/* Dotted name to wire format; false if a label cannot be encoded. */
static bool
wire_name(const char *name, struct buf *out)
{
	const char *p = name;

	while (*p)
	{
		size_t len = strcspn(p, ".");

		if (len == 0 || len > 63)
			return len == 0 && p[0] == '.' && p[1] == '\0';
		buf_append_char(out, (char) len);
		buf_append(out, p, len);
		p += len;
		if (*p == '.')
			p++;
	}
	buf_append_char(out, 0);
	return true;
}

static enum dns_type
type_named(const char *t)
{
	if (strcmp(t, "A") == 0)
		return DNS_TYPE_A;
	if (strcmp(t, "AAAA") == 0)
		return DNS_TYPE_AAAA;
	if (strcmp(t, "MX") == 0)
		return DNS_TYPE_MX;
	if (strcmp(t, "TXT") == 0)
		return DNS_TYPE_TXT;
	if (strcmp(t, "PTR") == 0)
		return DNS_TYPE_PTR;
	if (strcmp(t, "CNAME") == 0)
		return DNS_TYPE_CNAME;
	return 0;
}

static void
add_record(struct dns_answer *a, enum dns_type type, json_t *value)
{
	struct buf	  rdata = BUF_INIT;
	unsigned char addr[16];

	switch (type)
	{
		case DNS_TYPE_A:
			if (inet_pton(AF_INET, json_string_value(value), addr) == 1)
				dns_answer_add(a, type, addr, 4);
			return;
		case DNS_TYPE_AAAA:
			if (inet_pton(AF_INET6, json_string_value(value), addr) == 1)
				dns_answer_add(a, type, addr, 16);
			return;
		case DNS_TYPE_TXT:
			{
				size_t	i;
				json_t *s;

				json_array_foreach (value, i, s)
				{
					const char *text = json_string_value(s);
					size_t		len = json_string_length(s);

					/* Character-strings of at most 255 octets (one empty one for ""). */
					do
					{
						size_t n = len > 255 ? 255 : len;

						buf_append_char(&rdata, (char) n);
						buf_append(&rdata, text, n);
						text += n;
						len -= n;
					} while (len > 0);
				}
				break;
			}
		case DNS_TYPE_MX:
			{
				int pref = (int) json_integer_value(json_array_get(value, 0));

				buf_append_char(&rdata, (char) (pref >> 8));
				buf_append_char(&rdata, (char) (pref & 0xff));
				if (!wire_name(json_string_value(json_array_get(value, 1)), &rdata))
				{
					buf_free(&rdata);
					return;
				}
				break;
			}
		default:
			if (!wire_name(json_string_value(value), &rdata))
			{
				buf_free(&rdata);
				return;
			}
			break;
	}
	dns_answer_add(a, type, rdata.data ? rdata.data : "", rdata.len);
	buf_free(&rdata);
}

static bool
is_timeout(json_t *value)
{
	return (json_is_string(value) && strcmp(json_string_value(value), "TIMEOUT") == 0)
		   || (json_is_array(value) && json_array_size(value) == 1
			   && json_is_string(json_array_get(value, 0))
			   && strcmp(json_string_value(json_array_get(value, 0)), "TIMEOUT") == 0);
}

/* Answer name/type from the zone; false if the name must never answer. */
static bool
fake_answer(const char *name, enum dns_type type, struct dns_answer *a, int depth)
{
	char	key[300];
	size_t	len = strlen(name);
	json_t *rrs;
	json_t *rr;
	size_t	i;
	bool	seen = false;

	if (len >= sizeof(key))
		len = sizeof(key) - 1;
	for (size_t j = 0; j < len; j++)
		key[j] = (char) tolower((unsigned char) name[j]);
	key[len] = '\0';
	if (len && key[len - 1] == '.')
		key[len - 1] = '\0';
	rrs = json_object_get(zone, key);
	if (rrs == NULL)
	{
		if (strncmp(key, "error.", 6) == 0)
			return false;
		if (depth == 0)
			a->status = DNS_NXDOMAIN;
		return true;
	}
	json_array_foreach (rrs, i, rr)
	{
		const char	 *tname = json_string_value(json_array_get(rr, 0));
		json_t		 *value = json_array_get(rr, 1);
		enum dns_type rtype;

		if (strcmp(tname, "TIMEOUT") == 0)
			return seen;
		rtype = type_named(tname);
		if (rtype == type)
			seen = true;
		if (is_timeout(value))
		{
			if (rtype == type)
				return false;
			continue;
		}
		if (rtype == type)
			add_record(a, type, value);
		else if (rtype == DNS_TYPE_CNAME && depth < 8)
		{
			if (!fake_answer(json_string_value(value), type, a, depth + 1))
				return false;
		}
	}
	return true;
}

static void
fake_deliver(struct ev_loop *l, ev_timer *w, int revents)
{
	struct fake_query *f = w->data;

	dns_query_answer(f->query, &f->answer);
	/* dns_query_answer freed the query; ours goes on the next cancel-free sweep */
	f->query = NULL;
}

static void
fake_start(void *data, struct dns_query *q, const char *name, enum dns_type type)
{
	struct fake_query *f = xcalloc(1, sizeof(*f));

	f->query = q;
	f->next = pending;
	pending = f;
	if (!fake_answer(name, type, &f->answer, 0))
	{
		f->silent = true;
		return;
	}
	ev_timer_init(&f->timer, fake_deliver, 0, 0);
	f->timer.data = f;
	ev_timer_start(loop, &f->timer);
}

static void
fake_cancel(void *data, struct dns_query *q)
{
	for (struct fake_query *f = pending; f; f = f->next)
		if (f->query == q)
		{
			ev_timer_stop(loop, &f->timer);
			f->query = NULL;
		}
}

static void
fake_sweep(void)
{
	while (pending)
	{
		struct fake_query *f = pending;

		pending = f->next;
		ev_timer_stop(loop, &f->timer);
		dns_answer_free(&f->answer);
		free(f);
	}
}

struct outcome
{
	bool			done;
	enum spf_result result;
	char		   *explanation;
	char		   *reason;
};

static void
check_done(void *arg, const struct spf_verdict *v)
{
	struct outcome *o = arg;

	o->done = true;
	o->result = v->result;
	o->explanation = v->explanation ? xstrdup(v->explanation) : NULL;
	o->reason = xstrdup(v->reason ? v->reason : "");
}

int
main(int argc, char **argv)
{
	json_error_t		 error;
	json_t				*suite;
	json_t				*scenario;
	size_t				 i;
	struct dns_backend	 backend = {fake_start, fake_cancel, NULL};
	struct dns_resolver *resolver;

	log_init("pepsi-test-spf-suite", false);
	if (argc != 2)
		fatalx("usage: pepsi-test-spf-suite suite.json");
	if ((suite = json_load_file(argv[1], JSON_ALLOW_NUL, &error)) == NULL)
		fatalx("%s: %s", argv[1], error.text);
	loop = EV_DEFAULT;
	resolver = dns_resolver_new_backend(loop, &backend, SUITE_LOOKUP_TIMEOUT);
	json_array_foreach (suite, i, scenario)
	{
		json_t *test;
		size_t	j;

		zone = json_object_get(scenario, "zone");
		json_array_foreach (json_object_get(scenario, "tests"), j, test)
		{
			const char	  *mailfrom = json_string_value(json_object_get(test, "mailfrom"));
			const char	  *helo = json_string_value(json_object_get(test, "helo"));
			struct outcome o = {0};

			spf_check_start(resolver, NULL, json_string_value(json_object_get(test, "host")),
							*mailfrom ? mailfrom : helo, helo, "receiver.example.org",
							check_done, &o);
			while (!o.done)
				ev_run(loop, EVRUN_ONCE);
			fake_sweep();
			printf("%s\t%s\t%s\t%s\n", json_string_value(json_object_get(test, "name")),
				   spf_result_name(o.result), o.explanation ? o.explanation : "DEFAULT",
				   o.reason);
			free(o.explanation);
			free(o.reason);
		}
	}
	dns_resolver_free(resolver);
	json_decref(suite);
	return 0;
}
