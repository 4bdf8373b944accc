/*
 * pepsi-test-resolve: the resolver layer (common/dns/dns.c) driven from the
 * command line, for the TAP tests: each argument TYPE:NAME is looked up,
 * all at once on one event loop (or one after the other with -s, the
 * blocking form), and the answers printed one line each, in argument
 * order: "NAME TYPE STATUS [secure] record...".  -c names a pepsi.conf
 * whose [pepsi] DNS_* options configure the resolver.  -a asks every
 * name again once all are answered (from the resolver's cache, the
 * loop's or with -s the blocking form's), printing a second set of lines
 * and then "cache N": the lookups the cache answered.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "dns/dns.h"

struct lookup
{
	const char	 *name;
	const char	 *type_name;
	enum dns_type type;
	char		 *line;
};

static const char *const status_names[] = {"ok", "nxdomain", "tempfail", "timeout"};

static char *
describe(const struct lookup *l, const struct dns_answer *a)
{
	struct buf line = BUF_INIT;

	buf_printf(&line, "%s %s %s%s", l->name, l->type_name, status_names[a->status],
			   a->secure ? " secure" : "");
	for (size_t i = 0; i < a->count; i++)
	{
		const struct dns_record *r = &a->records[i];
		char					 ip[INET6_ADDRSTRLEN];

		if (r->type == DNS_TYPE_A)
			buf_printf(&line, " %s", inet_ntop(AF_INET, r->rdata, ip, sizeof(ip)));
		else if (r->type == DNS_TYPE_AAAA)
			buf_printf(&line, " %s", inet_ntop(AF_INET6, r->rdata, ip, sizeof(ip)));
		else if (r->type == DNS_TYPE_MX)
			buf_printf(&line, " %u:%s", r->preference, r->text ? r->text : "(bad)");
		else if (r->type == DNS_TYPE_TXT)
			buf_printf(&line, " \"%s\"(%zu)", r->text, r->len);
		else
			buf_printf(&line, " %s", r->text ? r->text : "(bad)");
	}
	return line.data;
}

static void
answered(void *arg, const struct dns_answer *a)
{
	struct lookup *l = arg;

	l->line = describe(l, a);
}

static enum dns_type
type_by_name(const char *name)
{
	static const struct
	{
		const char	 *name;
		enum dns_type type;
	} types[] = {
		{"A", DNS_TYPE_A}, {"AAAA", DNS_TYPE_AAAA}, {"MX", DNS_TYPE_MX}, {"TXT", DNS_TYPE_TXT}, {"PTR", DNS_TYPE_PTR}, {"CNAME", DNS_TYPE_CNAME}, {"TLSA", DNS_TYPE_TLSA}};

	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
		if (strcmp(types[i].name, name) == 0)
			return types[i].type;
	fatalx("unknown type %s", name);
}

int
main(int argc, char **argv)
{
	struct pepsi_config *cfg;
	struct dns_config	 dc;
	struct dns_resolver *r;
	struct lookup		*lookups;
	const char			*conf = NULL;
	bool				 sync = false;
	bool				 again = false;
	char				 err[1024];
	int					 opt;
	int					 n;

	log_init("pepsi-test-resolve", false);
	while ((opt = getopt(argc, argv, "ac:s")) != -1)
		if (opt == 'c')
			conf = optarg;
		else if (opt == 's')
			sync = true;
		else if (opt == 'a')
			again = true;
		else
			return 64;
	cfg = conf ? config_load(conf, err, sizeof(err)) : config_parse_string("", "empty", err, sizeof(err));
	if (cfg == NULL || !dns_config_load(cfg, &dc, err, sizeof(err)))
		fatalx("%s", err);
	if ((r = dns_resolver_new(sync ? NULL : EV_DEFAULT, &dc, err, sizeof(err))) == NULL)
		fatalx("%s", err);
	n = argc - optind;
	lookups = xcalloc((size_t) n + 1, sizeof(*lookups));
	for (int i = 0; i < n; i++)
	{
		char *arg = argv[optind + i];
		char *colon = strchr(arg, ':');

		if (colon == NULL)
			fatalx("%s: not TYPE:NAME", arg);
		*colon = '\0';
		lookups[i].type_name = arg;
		lookups[i].type = type_by_name(arg);
		lookups[i].name = colon + 1;
		if (sync)
		{
			struct dns_answer a;

			dns_resolve_sync(r, lookups[i].name, lookups[i].type, &a);
			lookups[i].line = describe(&lookups[i], &a);
			dns_answer_free(&a);
		}
		else
			dns_resolve(r, lookups[i].name, lookups[i].type, NULL, answered, &lookups[i]);
	}
	if (!sync)
		while (dns_in_flight(r) > 0)
			ev_run(EV_DEFAULT, EVRUN_ONCE);
	for (int i = 0; i < n; i++)
		printf("%s\n", lookups[i].line);
	if (again)
	{
		for (int i = 0; i < n; i++)
		{
			free(lookups[i].line);
			if (sync)
			{
				struct dns_answer a;

				dns_resolve_sync(r, lookups[i].name, lookups[i].type, &a);
				lookups[i].line = describe(&lookups[i], &a);
				dns_answer_free(&a);
			}
			else
				dns_resolve(r, lookups[i].name, lookups[i].type, NULL, answered, &lookups[i]);
		}
		while (!sync && dns_in_flight(r) > 0)
			ev_run(EV_DEFAULT, EVRUN_ONCE);
		for (int i = 0; i < n; i++)
			printf("%s\n", lookups[i].line);
		printf("cache %zu\n", dns_cache_answered(r));
	}
	dns_resolver_free(r);
	config_free(cfg);
	dns_config_free(&dc);
	return 0;
}
