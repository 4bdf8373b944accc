/*
 * test_aliases.c: the aliases(5) parser and the recursive expansion of
 * pepsi-stage-aliases: refusals with file:line, what expands and to what,
 * loops, duplicates, and the limits that keep a bad file from running away.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/expect_error.h"

#include "base/buf.h"
#include "local/aliases.h"

#define DOMAINS "example.org, lists.example.org"

static char err[1024];

static struct alias_table *
parse_ok(const char *text)
{
	struct alias_table *table;

	err[0] = '\0';
	table = aliases_parse(text, "aliases", err, sizeof(err));
	if (table == NULL)
		fail_msg("refused: %s", err);
	return table;
}

static void
parse_refused(const char *text, const char *want_prefix, const char *want)
{
	struct alias_table *table;

	err[0] = '\0';
	table = aliases_parse(text, "aliases", err, sizeof(err));
	if (table != NULL)
	{
		aliases_free(table);
		fail_msg("accepted: %s", text);
	}
	expect_error(err, want_prefix, want);
}

/* Expand address and compare with the comma-joined want. */
static void
expands_to(const struct alias_table *table, const char *address, const char *want)
{
	char	 **out = NULL;
	size_t	   count = 0;
	struct buf got = BUF_INIT;

	if (!aliases_expand(table, address, DOMAINS, &out, &count, err, sizeof(err)))
		fail_msg("expanding %s failed: %s", address, err);
	for (size_t i = 0; i < count; i++)
	{
		buf_printf(&got, "%s%s", i ? "," : "", out[i]);
		free(out[i]);
	}
	free(out);
	if (strcmp(got.data ? got.data : "", want) != 0)
		fail_msg("%s expanded to \"%s\", want \"%s\"", address, got.data ? got.data : "", want);
	buf_free(&got);
}

/* Expansion that must fail, with err mentioning want. */
static void
expansion_refused(const struct alias_table *table, const char *address, const char *want)
{
	char **out = NULL;
	size_t count = 0;

	err[0] = '\0';
	if (aliases_expand(table, address, DOMAINS, &out, &count, err, sizeof(err)))
		fail_msg("expanding %s succeeded with %zu addresses", address, count);
	if (strstr(err, want) == NULL)
		fail_msg("error \"%s\" does not mention \"%s\"", err, want);
	for (size_t i = 0; i < count; i++)
		free(out[i]);
	free(out);
}

/* ---------------------------------------------------------------------------
 * Parsing
 * ------------------------------------------------------------------------- */

static void
test_parse_format(void **state)
{
	struct alias_table *table = parse_ok(
		"# aliases(5)\n"
		"\n"
		"postmaster: root\n"
		"Root:   alice@example.org ,bob\n"
		"team: alice,\n"
		"  bob,\n"
		"\tcarol@example.net\n"
		"# a comment between entries\n"
		"quoted: \"Some, One\"@example.net\n");

	assert_int_equal(aliases_count(table), 4);
	expands_to(table, "team@example.org", "alice@example.org,bob@example.org,carol@example.net");
	/* Names are case-insensitive. */
	expands_to(table, "ROOT@example.org", "alice@example.org,bob@example.org");
	expands_to(table, "quoted@example.org", "\"Some, One\"@example.net");
	aliases_free(table);

	table = parse_ok("");
	assert_int_equal(aliases_count(table), 0);
	expands_to(table, "a@example.org", "a@example.org");
	aliases_free(table);
}

static void
test_parse_no_colon(void **state)
{
	parse_refused("a: b\nthis line has none\n", "aliases:2: ", "expected \"name: address");
}

static void
test_parse_pipe_file_include_refused(void **state)
{
	parse_refused("a: b\nlog: /var/log/mail.copy\n", "aliases:2: ", "no pipes, files or includes");
	parse_refused("prog: someone, |/usr/bin/vacation\n", "aliases:1: ", "\"|/usr/bin/vacation\"");
	parse_refused("prog: \"|/usr/bin/procmail -f-\"\n", "aliases:1: ", "no pipes, files or includes");
	parse_refused("list: :include:/etc/mail/list\n", "aliases:1: ", "no pipes, files or includes");
	parse_refused("list: :INCLUDE:/etc/mail/list\n", "aliases:1: ", "not supported");
	/* On a continuation line, the entry's first line is the place. */
	parse_refused("\n\nx: a,\n  /tmp/file\n", "aliases:3: ", "\"/tmp/file\"");
}

static void
test_parse_duplicate(void **state)
{
	parse_refused("abuse: root\nroot: alice\n\nAbuse: bob\n", "aliases:4: ",
				  "\"Abuse\" is defined twice (first at line 1)");
}

static void
test_parse_continuation_first(void **state)
{
	parse_refused("# header\n  bob@example.org\na: b\n", "aliases:2: ",
				  "continuation line with no alias before it");
}

static void
test_parse_bad_names(void **state)
{
	parse_refused("a: b\n: nobody\n", "aliases:2: ", "not an alias name");
	parse_refused("a@example.org: b\n", "aliases:1: ", "not an alias name");
	parse_refused("empty:\n", "aliases:1: ", "has no address");
	parse_refused("empty: , ,\n", "aliases:1: ", "has no address");
}

static void
test_load_file(void **state)
{
	char				path[] = "/tmp/test_aliases.XXXXXX";
	int					fd = mkstemp(path);
	FILE			   *f;
	struct alias_table *table;
	char				want[64];

	assert_true(fd >= 0);
	f = fdopen(fd, "w");
	fputs("a: b\n\nc d: e\n", f);
	fclose(f);
	assert_null(aliases_load(path, err, sizeof(err)));
	snprintf(want, sizeof(want), "%s:3: ", path);
	assert_true(strncmp(err, want, strlen(want)) == 0);

	f = fopen(path, "w");
	fputs("a: b\n", f);
	fclose(f);
	table = aliases_load(path, err, sizeof(err));
	assert_non_null(table);
	expands_to(table, "a@example.org", "b@example.org");
	aliases_free(table);
	unlink(path);
	assert_null(aliases_load(path, err, sizeof(err)));
	assert_non_null(strstr(err, "No such file"));
}

/* ---------------------------------------------------------------------------
 * Expansion
 * ------------------------------------------------------------------------- */

static void
test_expand_simple(void **state)
{
	struct alias_table *table = parse_ok("postmaster: alice@example.net\n");

	expands_to(table, "postmaster@example.org", "alice@example.net");
	/* Not an alias: delivered as is. */
	expands_to(table, "alice@example.org", "alice@example.org");
	/* A bare local part (no domain) is looked up too. */
	expands_to(table, "postmaster", "alice@example.net");
	aliases_free(table);
}

static void
test_expand_recursive(void **state)
{
	struct alias_table *table = parse_ok("abuse: security\n"
										 "security: alice, ops\n"
										 "ops: bob@example.net, carol\n");

	expands_to(table, "abuse@example.org",
			   "alice@example.org,bob@example.net,carol@example.org");
	aliases_free(table);
}

/* A target without a domain takes the domain of the address it came from. */
static void
test_expand_bare_name_takes_domain(void **state)
{
	struct alias_table *table = parse_ok("staff: alice, bob@example.net\n");

	expands_to(table, "staff@lists.example.org", "alice@lists.example.org,bob@example.net");
	expands_to(table, "Staff@Example.ORG", "alice@Example.ORG,bob@example.net");
	/* With no domain to take, it stays bare. */
	expands_to(table, "staff", "alice,bob@example.net");
	aliases_free(table);
}

/* Only the listed domains are ours: elsewhere the same local part is someone else. */
static void
test_expand_domain_not_listed(void **state)
{
	struct alias_table *table = parse_ok("root: alice\nalice: carol@example.org\n");

	expands_to(table, "root@example.com", "root@example.com");
	expands_to(table, "root@sub.example.org", "root@sub.example.org");
	/* A target in another domain is not looked up further either. */
	aliases_free(table);
	table = parse_ok("root: alice@example.com\nalice: carol@example.org\n");
	expands_to(table, "root@example.org", "alice@example.com");
	aliases_free(table);
}

/* An alias that lists itself keeps a copy: the name is delivered as itself. */
static void
test_expand_self_reference(void **state)
{
	struct alias_table *table = parse_ok("alice: alice, alice-archive@example.net\n");

	expands_to(table, "alice@example.org", "alice@example.org,alice-archive@example.net");
	aliases_free(table);
}

static void
test_expand_loop_terminates(void **state)
{
	struct alias_table *table = parse_ok("a: b\nb: a\n"
										 "x: y, z\ny: x, w\nz: y\n");

	expands_to(table, "a@example.org", "a@example.org");
	expands_to(table, "b@example.org", "b@example.org");
	expands_to(table, "x@example.org", "x@example.org,w@example.org");
	aliases_free(table);
}

static void
test_expand_duplicates_removed(void **state)
{
	struct alias_table *table = parse_ok("all: sales, support, alice\n"
										 "sales: alice, bob\n"
										 "support: bob, Alice@example.org, carol\n");

	expands_to(table, "all@example.org", "alice@example.org,bob@example.org,carol@example.org");
	aliases_free(table);
}

/* Expansion appends to what is already there, and does not repeat it. */
static void
test_expand_appends(void **state)
{
	struct alias_table *table = parse_ok("a: x, y\nb: y, z\n");
	char			  **out = NULL;
	size_t				count = 0;

	assert_true(aliases_expand(table, "a@example.org", DOMAINS, &out, &count, err, sizeof(err)));
	assert_true(aliases_expand(table, "b@example.org", DOMAINS, &out, &count, err, sizeof(err)));
	assert_int_equal(count, 3);
	assert_string_equal(out[0], "x@example.org");
	assert_string_equal(out[1], "y@example.org");
	assert_string_equal(out[2], "z@example.org");
	for (size_t i = 0; i < count; i++)
		free(out[i]);
	free(out);
	aliases_free(table);
}

/* A chain deeper than the limit is refused; one within it expands. */
static void
test_expand_depth_limit(void **state)
{
	struct buf			text = BUF_INIT;
	struct alias_table *table;

	for (int i = 0; i < 40; i++)
		buf_printf(&text, "level%d: level%d\n", i, i + 1);
	table = parse_ok(text.data);
	expansion_refused(table, "level0@example.org", "deeper than");
	expands_to(table, "level10@example.org", "level40@example.org");
	aliases_free(table);
	buf_free(&text);
}

/* More addresses than the limit is refused. */
static void
test_expand_size_limit(void **state)
{
	struct buf			text = BUF_INIT;
	struct alias_table *table;

	/* everyone: team0..team10, each team 1,000 members: 11,000 addresses. */
	buf_append_str(&text, "everyone: ");
	for (int t = 0; t <= 10; t++)
		buf_printf(&text, "%steam%d", t ? ", " : "", t);
	buf_append_str(&text, "\n");
	for (int t = 0; t <= 10; t++)
	{
		buf_printf(&text, "team%d: ", t);
		for (int m = 0; m < 1000; m++)
			buf_printf(&text, "%su%d.%d", m ? "," : "", t, m);
		buf_append_str(&text, "\n");
	}
	table = parse_ok(text.data);
	expansion_refused(table, "everyone@example.org", "more than");
	/* One team is well within the limit. */
	{
		char **out = NULL;
		size_t count = 0;

		assert_true(aliases_expand(table, "team3@example.org", DOMAINS, &out, &count, err, sizeof(err)));
		assert_int_equal(count, 1000);
		for (size_t i = 0; i < count; i++)
			free(out[i]);
		free(out);
	}
	aliases_free(table);
	buf_free(&text);
}

/*
 * Every alias names the next twice: few distinct addresses, but the walk
 * doubles at each level (2^30 lookups).  It must be refused, and quickly,
 * not walked.
 */
static void
test_expand_walk_limit(void **state)
{
	struct buf			text = BUF_INIT;
	struct alias_table *table;

	for (int i = 0; i < 30; i++)
		buf_printf(&text, "d%d: d%d, d%d@example.org\n", i, i + 1, i + 1);
	table = parse_ok(text.data);
	expansion_refused(table, "d0@example.org", "more than");
	aliases_free(table);
	buf_free(&text);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_format),
		cmocka_unit_test(test_parse_no_colon),
		cmocka_unit_test(test_parse_pipe_file_include_refused),
		cmocka_unit_test(test_parse_duplicate),
		cmocka_unit_test(test_parse_continuation_first),
		cmocka_unit_test(test_parse_bad_names),
		cmocka_unit_test(test_load_file),
		cmocka_unit_test(test_expand_simple),
		cmocka_unit_test(test_expand_recursive),
		cmocka_unit_test(test_expand_bare_name_takes_domain),
		cmocka_unit_test(test_expand_domain_not_listed),
		cmocka_unit_test(test_expand_self_reference),
		cmocka_unit_test(test_expand_loop_terminates),
		cmocka_unit_test(test_expand_duplicates_removed),
		cmocka_unit_test(test_expand_appends),
		cmocka_unit_test(test_expand_depth_limit),
		cmocka_unit_test(test_expand_size_limit),
		cmocka_unit_test(test_expand_walk_limit),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
