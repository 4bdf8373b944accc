/*
 * test_config.c: pepsi.conf as config.c reads it: the schema of sections
 * and options, the file:line of every refusal, the typed getters, and the
 * config_override overlay with its precedence and its refusals.
 */
#include <limits.h>
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

#include "config/config.h"

static char err[1024];

/* Parse text that must be accepted. */
static struct pepsi_config *
parse_ok(const char *text)
{
	struct pepsi_config *cfg;

	err[0] = '\0';
	cfg = config_parse_string(text, "pepsi.conf", err, sizeof(err));
	if (cfg == NULL)
		fail_msg("refused: %s", err);
	return cfg;
}

/* Parse text that must be refused, with err starting with want_prefix and containing want. */
static void
parse_refused(const char *text, const char *want_prefix, const char *want)
{
	struct pepsi_config *cfg;

	err[0] = '\0';
	cfg = config_parse_string(text, "pepsi.conf", err, sizeof(err));
	if (cfg != NULL)
	{
		config_free(cfg);
		fail_msg("accepted: %s", text);
	}
	expect_error(err, want_prefix, want);
}

/* ---------------------------------------------------------------------------
 * The schema and the file
 * ------------------------------------------------------------------------- */

static void
test_accepts_every_section_kind(void **state)
{
	struct pepsi_config *cfg = parse_ok(
		"# a comment\n"
		"[pepsi]\n"
		"HOSTNAME = mx.example.org\n"
		"ALLOW_FUSION = no\n"
		"\n"
		"[database]\n"
		"CONNINFO = host=/tmp port=5432 dbname=pepsi\n"
		"[dispatch]\n"
		"POLL_INTERVAL = 5s\n"
		"[ingress]\n"
		"AUTHSERV_ID = mx.example.org\n"
		"[listener-smtp]\n"
		"PORT = 25\n"
		"[stage-init]\n"
		"PROGRAM = pepsi-stage-if\n"
		"CONDITION = mail_from = \"\"\n"
		"THEN_STAGE = drop\n"
		"[stage-route]\n"
		"PROGRAM = pepsi-stage-route\n"
		"LOCAL_DOMAINS = example.org\n");
	const char *names[8];

	assert_string_equal(config_get(cfg, "pepsi", "HOSTNAME"), "mx.example.org");
	assert_string_equal(config_get(cfg, "database", "CONNINFO"), "host=/tmp port=5432 dbname=pepsi");
	/* A value keeps its own '=' signs and quotes. */
	assert_string_equal(config_get(cfg, "stage-init", "CONDITION"), "mail_from = \"\"");
	assert_null(config_get(cfg, "stage-init", "NEXT_STAGE"));
	assert_null(config_get(cfg, "stage-nowhere", "PROGRAM"));
	assert_int_equal(config_sections(cfg, "stage-", names, 8), 2);
	assert_string_equal(names[0], "stage-init");
	assert_string_equal(names[1], "stage-route");
	assert_int_equal(config_sections(cfg, "listener-", names, 8), 1);
	config_free(cfg);
}

static void
test_schema_lookups(void **state)
{
	assert_true(config_section_known("pepsi"));
	assert_true(config_section_known("stage-anything"));
	assert_true(config_section_known("listener-submission"));
	assert_false(config_section_known("stage-")); /* a prefix needs a name */
	assert_false(config_section_known("stages"));
	assert_false(config_section_known("Pepsi"));
	assert_true(config_option_known("pepsi", "ALLOW_FUSION"));
	assert_false(config_option_known("pepsi", "CONNINFO"));
	assert_true(config_option_known("stage-x", "ANY_UPPER_CASE_1"));
	assert_false(config_option_known("stage-x", "lower"));
	assert_false(config_option_known("stage-x", "1ST"));
	assert_true(config_section_overridable("pepsi"));
	assert_true(config_section_overridable("stage-x"));
	assert_false(config_section_overridable("database"));
	assert_false(config_section_overridable("listener-smtp"));
}

static void
test_unknown_section(void **state)
{
	parse_refused("[pepsi]\nHOSTNAME = a\n\n[stages-init]\nPROGRAM = x\n",
				  "pepsi.conf:5: ", "unknown section [stages-init]");
}

static void
test_control_character(void **state)
{
	parse_refused("[pepsi]\nHOSTNAME = a\x1b[2Jb\n", "pepsi.conf:2: ",
				  "[pepsi] HOSTNAME: the value has a control character");
}

static void
test_unknown_option(void **state)
{
	parse_refused("[pepsi]\nHOSTNAME = a\nCONNINFO = dbname=x\n",
				  "pepsi.conf:3: ", "[pepsi] has no option CONNINFO");
	parse_refused("[listener-smtp]\nPORT = 25\nPROGRAM = x\n",
				  "pepsi.conf:3: ", "[listener-smtp] has no option PROGRAM");
}

static void
test_lower_case_option(void **state)
{
	parse_refused("[stage-init]\nPROGRAM = pepsi-stage-if\nnext_stage = b\n",
				  "pepsi.conf:3: ", "upper case");
	parse_refused("[pepsi]\nHostName = a\n", "pepsi.conf:2: ", "upper case");
}

static void
test_set_twice(void **state)
{
	parse_refused("[stage-a]\nPROGRAM = x\n# comment\nPROGRAM = y\n",
				  "pepsi.conf:4: ", "set twice (first at line 2)");
	/* Also when the section is opened a second time. */
	parse_refused("[pepsi]\nHOSTNAME = a\n[database]\nCONNINFO = x\n[pepsi]\nHOSTNAME = b\n",
				  "pepsi.conf:6: ", "first at line 2");
}

static void
test_malformed_line(void **state)
{
	parse_refused("[pepsi]\nHOSTNAME = a\nthis is not an option\n",
				  "pepsi.conf:3: ", "malformed line");
	parse_refused("[pepsi\nHOSTNAME = a\n", "pepsi.conf:1: ", "malformed line");
}

static void
test_option_outside_section(void **state)
{
	parse_refused("HOSTNAME = a\n[pepsi]\n", "pepsi.conf:1: ", "outside any section");
}

/* The first refusal is the one reported, with its own line, even when later lines are bad too. */
static void
test_first_error_wins(void **state)
{
	parse_refused("[bogus]\nA = 1\nB = 2\nC = 3\n", "pepsi.conf:2: ", "unknown section [bogus]");
	parse_refused("[pepsi]\nnot a line\nlower = 1\n", "pepsi.conf:2: ", "malformed line");
	parse_refused("[pepsi]\nlower = 1\nnot a line\n", "pepsi.conf:2: ", "upper case");
}

/* A long value may go on over indented lines; a line longer than the parser takes is refused. */
static void
test_long_values(void **state)
{
	struct pepsi_config *cfg = parse_ok("[stage-route]\n"
										"LOCAL_DOMAINS = a.example, b.example,\n"
										"    c.example\n"
										"PROGRAM = pepsi-stage-route\n");
	char				 text[600];

	assert_string_equal(config_get(cfg, "stage-route", "LOCAL_DOMAINS"),
						"a.example, b.example, c.example");
	config_free(cfg);

	snprintf(text, sizeof(text), "[pepsi]\nHOSTNAME = %0300d\nALLOW_FUSION = yes\n", 7);
	parse_refused(text, "pepsi.conf:2: ", "too long");
	/* The line after a refused one is not misnumbered: the error stays on its line. */
	snprintf(text, sizeof(text), "[pepsi]\nHOSTNAME = %0150d\nMAIL_LOG = yes\nbad\n", 7);
	parse_refused(text, "pepsi.conf:4: ", "malformed");
}

static void
test_load_file(void **state)
{
	char				 path[] = "/tmp/test_config.XXXXXX";
	int					 fd = mkstemp(path);
	FILE				*f;
	struct pepsi_config *cfg;

	assert_true(fd >= 0);
	f = fdopen(fd, "w");
	fputs("[pepsi]\nHOSTNAME = mx\n[stage-x]\nPROGRAM = p\nprogram = q\n", f);
	fclose(f);
	cfg = config_load(path, err, sizeof(err));
	assert_null(cfg);
	{
		char *want = NULL;

		assert_true(asprintf(&want, "%s:5: ", path) > 0);
		assert_true(strncmp(err, want, strlen(want)) == 0);
		free(want);
	}

	f = fopen(path, "w");
	fputs("[pepsi]\nHOSTNAME = mx\n[stage-x]\nPROGRAM = p\n", f);
	fclose(f);
	cfg = config_load(path, err, sizeof(err));
	assert_non_null(cfg);
	assert_string_equal(config_get(cfg, "stage-x", "PROGRAM"), "p");
	assert_string_equal(cfg->path, path);
	config_free(cfg);
	unlink(path);

	assert_null(config_load(path, err, sizeof(err)));
	assert_non_null(strstr(err, path));
	assert_non_null(strstr(err, "No such file"));
}

/* ---------------------------------------------------------------------------
 * Typed getters
 * ------------------------------------------------------------------------- */

static void
test_get_int(void **state)
{
	struct pepsi_config *cfg = parse_ok("[stage-a]\n"
										"PARALLELISM = 4\n"
										"BAD = 12x\n"
										"EMPTY = \n");

	assert_int_equal(config_int(cfg, "stage-a", "PARALLELISM"), 4);
	assert_int_equal(config_int(cfg, "stage-a", "QUEUE_LIMIT"), 16); /* the schema's default */
	/* A program the schema does not know keeps its own options unchecked. */
	assert_string_equal(config_get(cfg, "stage-a", "BAD"), "12x");
	config_free(cfg);
}

/* Values the schema refuses, each at its place and with the reason. */
static void
test_value_refusals(void **state)
{
	static const struct
	{
		const char *text;
		const char *place;
		const char *reason;
	} refused[] = {
		{"[stage-a]\nPARALLELISM = 4\nQUEUE_LIMIT = 0\n", "pepsi.conf:3: ",
		 "QUEUE_LIMIT is a whole number from 1 to 1024"},
		{"[stage-a]\nMAX_MESSAGES = 12x\n", "pepsi.conf:2: ", "[stage-a] MAX_MESSAGES = 12x"},
		{"[stage-a]\nMAX_MESSAGES = \n", "pepsi.conf:2: ", "MAX_MESSAGES is a whole number"},
		{"[stage-a]\nMAX_MESSAGES = 99999999999999999999999\n", "pepsi.conf:2: ", "whole number"},
		{"[ingress]\nBATCH_SIZE = 2048\n", "pepsi.conf:2: ", "from 1 to 1024"},
		{"[listener-smtp]\nMODE = lmtp\n", "pepsi.conf:2: ",
		 "MODE is one of \"smtp\", \"submission\" or \"smtps\"."},
		{"[listener-smtp]\nMAX_SIZE = 10 MB\n", "pepsi.conf:2: ", "MAX_SIZE is a size"},
		{"[pepsi]\nHOSTNAME = mx..example.org\n", "pepsi.conf:2: ", "HOSTNAME is a domain name"},
		{"[pepsi]\nLOCAL_DOMAINS = example.org, -bad.example\n", "pepsi.conf:2: ",
		 "\"-bad.example\" is not one"},
		{"[ingress]\nCREDENTIALS = relative/path\n", "pepsi.conf:2: ", "absolute path"},
	};

	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
		parse_refused(refused[i].text, refused[i].place, refused[i].reason);
}

static void
test_get_bool(void **state)
{
	static const char *const yes[] = {"yes", "YES", "true", "On", "1"};
	static const char *const no[] = {"no", "False", "off", "0"};
	struct pepsi_config		*cfg;
	char					 text[128];

	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
	{
		snprintf(text, sizeof(text), "[pepsi]\nALLOW_FUSION = %s\n", yes[i]);
		cfg = parse_ok(text);
		assert_true(config_bool(cfg, "pepsi", "ALLOW_FUSION"));
		config_free(cfg);
	}
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
	{
		snprintf(text, sizeof(text), "[pepsi]\nALLOW_FUSION = %s\n", no[i]);
		cfg = parse_ok(text);
		assert_false(config_bool(cfg, "pepsi", "ALLOW_FUSION"));
		config_free(cfg);
	}
	parse_refused("[pepsi]\nHOSTNAME = x\n\nALLOW_FUSION = maybe\n", "pepsi.conf:4: ",
				  "[pepsi] ALLOW_FUSION = maybe: ALLOW_FUSION is a boolean");
	cfg = parse_ok("[pepsi]\nHOSTNAME = x\n");
	assert_false(config_bool(cfg, "pepsi", "MAIL_LOG"));	/* the default: no */
	assert_true(config_bool(cfg, "pepsi", "ALLOW_FUSION")); /* the default: yes */
	config_free(cfg);

	/*
	 * Every stage's ORIGINATE_SUCCESS_DSN is read with the one parser: "on"
	 * is true at run time as it was at start (it used to be accepted, then
	 * read as off).
	 */
	cfg = parse_ok("[stage-deliver]\nPROGRAM = pepsi-stage-relay-to-smarthost\n"
				   "ORIGINATE_SUCCESS_DSN = on\n");
	assert_true(config_bool_for(cfg, "stage-deliver", "ORIGINATE_SUCCESS_DSN", NULL, "a@example.org"));
	config_free(cfg);
}

static void
test_get_duration(void **state)
{
	static const struct
	{
		const char *text;
		long		ms;
	} good[] = {
		{"30", 30000},
		{"30s", 30000},
		{"250ms", 250},
		{"5m", 300000},
		{"5min", 300000},
		{"2h", 7200000},
		{"1d", 86400000},
		{"1.5s", 1500},
		{"0", 0},
	};
	static const char *const bad[] = {"5 parsecs", "5w", "-1s", "s", "nan", "inf", "1e300d", "",
									  "0x10", "1.", ".5s"};
	struct pepsi_config		*cfg;
	char					 text[128];

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
	{
		snprintf(text, sizeof(text), "[ingress]\nDISPATCH_WAKE_INTERVAL = %s\n", good[i].text);
		cfg = parse_ok(text);
		if (config_duration_ms(cfg, "ingress", "DISPATCH_WAKE_INTERVAL") != good[i].ms)
			fail_msg("\"%s\" gave %lld ms, not %ld", good[i].text,
					 config_duration_ms(cfg, "ingress", "DISPATCH_WAKE_INTERVAL"), good[i].ms);
		config_free(cfg);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
	{
		snprintf(text, sizeof(text), "[ingress]\nDISPATCH_WAKE_INTERVAL = %s\n", bad[i]);
		parse_refused(text, "pepsi.conf:2: [ingress] DISPATCH_WAKE_INTERVAL = ", "is a duration");
	}
	/* The minimum, and the default when unset. */
	parse_refused("[dispatch]\nPOLL_INTERVAL = 5ms\n", "pepsi.conf:2: ", "at least 10 ms");
	cfg = parse_ok("[dispatch]\nPOLL_INTERVAL = 10ms\n");
	assert_int_equal(config_duration_ms(cfg, "dispatch", "POLL_INTERVAL"), 10);
	assert_int_equal(config_duration_ms(cfg, "dispatch", "FAIR_HALF_LIFE"), 60000);
	config_free(cfg);
}

static void
test_get_size_enum_text(void **state)
{
	struct pepsi_config *cfg = parse_ok("[listener-smtp]\nMAX_SIZE = 10M\nMODE = Submission\n"
										"[stage-b]\nPROGRAM = /usr/libexec/pepsi-stage-bounce\n"
										"RETURN_SIZE_LIMIT = 2048\n");

	assert_int_equal(config_size(cfg, "listener-smtp", "MAX_SIZE"), 10 * 1024 * 1024);
	assert_int_equal(config_enum(cfg, "listener-smtp", "MODE"), 1); /* smtp|submission|smtps */
	assert_int_equal(config_size(cfg, "stage-b", "RETURN_SIZE_LIMIT"), 2048);
	assert_string_equal(config_text(cfg, "sendmail", "INIT_STAGE"), "init"); /* the default */
	assert_null(config_text(cfg, "ingress", "AUTHSERV_ID"));				 /* no default */
	config_free(cfg);
}

/* A stage section takes the options of every stage and those of its PROGRAM, wherever PROGRAM is. */
static void
test_stage_program_options(void **state)
{
	struct pepsi_config *cfg = parse_ok("[stage-relay]\nTLS = may\nSMARTHOST = [192.0.2.1]:2525\n"
										"PROGRAM = pepsi-stage-relay-to-smarthost\n"
										"[stage-third]\nPROGRAM = someone-elses-stage\nANY_OPTION = x\n");

	assert_int_equal(config_enum(cfg, "stage-relay", "TLS"), 2); /* verify|no-verify|may|none */
	assert_int_equal(config_int(cfg, "stage-relay", "REUSE_MESSAGES"), 1000);
	assert_string_equal(config_get(cfg, "stage-third", "ANY_OPTION"), "x");
	config_free(cfg);

	parse_refused("[stage-relay]\nSMARTHOTS = mx.example.org\nPROGRAM = pepsi-stage-relay-to-smarthost\n",
				  "pepsi.conf:2: ", "[stage-relay] has no option SMARTHOTS (neither every stage nor "
									"its PROGRAM pepsi-stage-relay-to-smarthost takes it)");
	parse_refused("[stage-relay]\nPROGRAM = pepsi-stage-relay-to-smarthost\nTLS = sometimes\n",
				  "pepsi.conf:3: ", "TLS is one of");
	/* Another program's option is not this one's. */
	parse_refused("[stage-drop]\nPROGRAM = pepsi-stage-discard\nSMARTHOST = mx.example.org\n",
				  "pepsi.conf:3: ", "has no option SMARTHOST");
}

/* ---------------------------------------------------------------------------
 * The overlay
 * ------------------------------------------------------------------------- */

static void
add_override(struct pepsi_config *cfg, const char *scope, const char *section,
			 const char *option, const char *value)
{
	if (!config_add_override(cfg, scope, section, option, value, err, sizeof(err)))
		fail_msg("override refused: %s", err);
}

static void
test_overlay_precedence(void **state)
{
	struct pepsi_config *cfg = parse_ok("[stage-relay]\nPROGRAM = p\nMAX_SIZE = file\n");
	char				 origin[128];

	assert_string_equal(config_get_for(cfg, "stage-relay", "MAX_SIZE", NULL, "a@example.org"), "file");
	assert_string_equal(config_origin(cfg, "stage-relay", "MAX_SIZE", origin, sizeof(origin)),
						"pepsi.conf:3");

	add_override(cfg, "global", "stage-relay", "MAX_SIZE", "global");
	assert_string_equal(config_get(cfg, "stage-relay", "MAX_SIZE"), "global");
	assert_string_equal(config_origin(cfg, "stage-relay", "MAX_SIZE", origin, sizeof(origin)),
						"override global");

	add_override(cfg, "domain:example.org", "stage-relay", "MAX_SIZE", "domain");
	add_override(cfg, "address:a@example.org", "stage-relay", "MAX_SIZE", "address");
	/* Added in reverse order of precedence above; the order of the rows must not matter. */
	add_override(cfg, "domain:example.net", "stage-relay", "MAX_SIZE", "other domain");

	assert_string_equal(config_get_for(cfg, "stage-relay", "MAX_SIZE", NULL, "a@example.org"), "address");
	assert_string_equal(config_get_for(cfg, "stage-relay", "MAX_SIZE", NULL, "b@example.org"), "domain");
	assert_string_equal(config_get_for(cfg, "stage-relay", "MAX_SIZE", "example.org", NULL), "domain");
	assert_string_equal(config_get_for(cfg, "stage-relay", "MAX_SIZE", NULL, "c@example.com"), "global");
	assert_string_equal(config_get_for(cfg, "stage-relay", "MAX_SIZE", NULL, "d@example.net"), "other domain");
	/* Domains and addresses compare case-insensitively. */
	assert_string_equal(config_get_for(cfg, "stage-relay", "MAX_SIZE", NULL, "b@EXAMPLE.org"), "domain");
	assert_string_equal(config_get(cfg, "stage-relay", "MAX_SIZE"), "global");
	/* The file's other options are untouched. */
	assert_string_equal(config_get_for(cfg, "stage-relay", "PROGRAM", NULL, "a@example.org"), "p");
	config_free(cfg);

	/* Highest first this time. */
	cfg = parse_ok("[stage-r]\nPROGRAM = pepsi-stage-discard\nNEXT_STAGE = file\n");
	add_override(cfg, "address:x@d.example", "stage-r", "NEXT_STAGE", "address");
	add_override(cfg, "domain:d.example", "stage-r", "NEXT_STAGE", "domain");
	add_override(cfg, "global", "stage-r", "NEXT_STAGE", "global");
	assert_string_equal(config_get_for(cfg, "stage-r", "NEXT_STAGE", NULL, "x@d.example"), "address");
	assert_string_equal(config_get_for(cfg, "stage-r", "NEXT_STAGE", NULL, "y@d.example"), "domain");
	assert_string_equal(config_get(cfg, "stage-r", "NEXT_STAGE"), "global");
	/* The typed getters read the same value in force. */
	assert_string_equal(config_text_for(cfg, "stage-r", "NEXT_STAGE", NULL, "y@d.example"), "domain");
	config_free(cfg);
}

/* The overlay may set an option the file leaves unset, in any overridable section. */
static void
test_overlay_adds(void **state)
{
	struct pepsi_config *cfg = parse_ok("[pepsi]\nHOSTNAME = mx\n");

	add_override(cfg, "global", "stage-new", "PROGRAM", "pepsi-stage-discard");
	add_override(cfg, "global", "dispatch", "POLL_INTERVAL", "2s");
	assert_string_equal(config_get(cfg, "stage-new", "PROGRAM"), "pepsi-stage-discard");
	assert_string_equal(config_get(cfg, "dispatch", "POLL_INTERVAL"), "2s");
	config_free(cfg);
}

static void
test_overlay_refusals(void **state)
{
	struct pepsi_config *cfg = parse_ok("[database]\nCONNINFO = dbname=pepsi\n[listener-smtp]\nPORT = 25\n");

	assert_false(config_add_override(cfg, "global", "database", "CONNINFO", "host=evil", err, sizeof(err)));
	assert_non_null(strstr(err, "[database] is never read from the database"));
	assert_false(config_add_override(cfg, "global", "listener-smtp", "PORT", "2525", err, sizeof(err)));
	assert_non_null(strstr(err, "never read from the database"));
	assert_false(config_add_override(cfg, "address:a@b", "listener-new", "ADDRESS", "0.0.0.0", err, sizeof(err)));
	assert_false(config_add_override(cfg, "global", "pepsi", "CONNINFO", "x", err, sizeof(err)));
	assert_non_null(strstr(err, "[pepsi] has no option CONNINFO"));
	/* The schema's scopes: a process-wide option has no domain scope, a file-only one none. */
	assert_false(config_add_override(cfg, "domain:example.org", "pepsi", "HOSTNAME", "x", err, sizeof(err)));
	assert_non_null(strstr(err, "read once by a process"));
	assert_false(config_add_override(cfg, "global", "ingress", "USER", "root", err, sizeof(err)));
	assert_non_null(strstr(err, "read from pepsi.conf only"));
	/* The value, checked as the file's is. */
	assert_false(config_add_override(cfg, "global", "dispatch", "POLL_INTERVAL", "5 parsecs", err, sizeof(err)));
	assert_non_null(strstr(err, "POLL_INTERVAL is a duration"));
	/* From the database a PROGRAM is a name, never a path; no value holds a control character. */
	assert_false(config_add_override(cfg, "global", "stage-x", "PROGRAM", "/bin/sh", err, sizeof(err)));
	assert_non_null(strstr(err, "never a path"));
	assert_false(config_add_override(cfg, "global", "stage-x", "NEXT_STAGE", "a\nb", err, sizeof(err)));
	assert_false(config_add_override(cfg, "global", "stage-x", "lower", "x", err, sizeof(err)));
	assert_false(config_add_override(cfg, "global", "nosuch", "A", "x", err, sizeof(err)));
	assert_false(config_add_override(cfg, "everyone", "pepsi", "HOSTNAME", "x", err, sizeof(err)));
	assert_non_null(strstr(err, "bad scope"));
	assert_false(config_add_override(cfg, "domain:", "pepsi", "HOSTNAME", "x", err, sizeof(err)));
	assert_false(config_add_override(cfg, "address:", "pepsi", "HOSTNAME", "x", err, sizeof(err)));
	/* The database cannot run code or redirect mail. */
	assert_false(config_add_override(cfg, "global", "stage-relay", "PROGRAM", "/bin/sh", err, sizeof(err)));
	assert_non_null(strstr(err, "PROGRAM names a program: from the database it is a program name, never a path"));
	assert_false(config_add_override(cfg, "global", "stage-relay", "PROGRAM", "../x", err, sizeof(err)));
	assert_true(config_add_override(cfg, "global", "stage-relay", "PROGRAM", "pepsi-stage-relay-to-smarthost",
									err, sizeof(err)));
	/* A declared option is file-only by its scope in schema/options.def ... */
	assert_false(config_add_override(cfg, "global", "stage-relay", "SMARTHOST", "evil.example", err, sizeof(err)));
	assert_non_null(strstr(err, "SMARTHOST is read from pepsi.conf only"));
	/* ... a third-party program's by its name. */
	assert_false(config_add_override(cfg, "global", "stage-other", "SMARTHOST", "evil.example", err, sizeof(err)));
	assert_non_null(strstr(err, "where mail is sent is read only from the file"));
	assert_false(config_add_override(cfg, "global", "stage-other", "SPOOL_FILE", "/tmp/x", err, sizeof(err)));
	assert_false(config_add_override(cfg, "domain:a.example", "stage-relay", "AUTH_PASSWORD_FILE", "/etc/shadow",
									 err, sizeof(err)));
	assert_false(config_add_override(cfg, "global", "stage-box", "MAILDIR_ROOT", "/tmp", err, sizeof(err)));
	assert_false(config_add_override(cfg, "global", "stage-relay", "TLS", "none", err, sizeof(err)));
	assert_false(config_add_override(cfg, "global", "ingress", "TRUSTED_NETWORKS", "0.0.0.0/0", err, sizeof(err)));
	assert_false(config_add_override(cfg, "global", "pepsi", "HOSTNAME", "a\r\nb", err, sizeof(err)));
	assert_non_null(strstr(err, "control character"));
	/* Nothing refused has changed a value. */
	assert_string_equal(config_get(cfg, "database", "CONNINFO"), "dbname=pepsi");
	assert_string_equal(config_get_for(cfg, "listener-smtp", "PORT", NULL, "a@b"), "25");
	assert_null(config_get(cfg, "pepsi", "HOSTNAME"));
	config_free(cfg);
}

/* Where mail goes and whom relaying trusts are the file's: no override sets them, and each refusal names the option. */
static void
test_overlay_file_only_routes(void **state)
{
	struct pepsi_config *cfg = parse_ok("[stage-filter]\nPROGRAM = pepsi-stage-milter\nMILTERS = inet:127.0.0.1:11332\n"
										"[stage-internet]\nPROGRAM = pepsi-stage-relay-to-internet\n"
										"[stage-route]\nPROGRAM = pepsi-stage-route\n"
										"[stage-srs]\nPROGRAM = pepsi-stage-srs\n"
										"[stage-forward]\nPROGRAM = pepsi-stage-dot-forward\n");
	const char *const	 refused[][3] = {
		   {"stage-filter", "MILTERS", "inet:192.0.2.1:11332"},
		   {"stage-internet", "DANE", "no"},
		   {"stage-internet", "MTA_STS", "no"},
		   {"ingress", "ARC_TRUSTED_SEALERS", "evil.example"},
		   {"pepsi", "LOCAL_DOMAINS", "evil.example"},
		   {"stage-route", "LOCAL_DOMAINS", "evil.example"},
		   {"stage-srs", "LOCAL_DOMAINS", "evil.example"},
		   {"stage-forward", "LOCAL_DOMAINS", "evil.example"},
	   };

	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
	{
		char expected[128];

		assert_false(config_add_override(cfg, "global", refused[i][0], refused[i][1], refused[i][2], err, sizeof(err)));
		snprintf(expected, sizeof(expected), "%s is read from pepsi.conf only", refused[i][1]);
		assert_non_null(strstr(err, expected));
	}
	assert_string_equal(config_get(cfg, "stage-filter", "MILTERS"), "inet:127.0.0.1:11332");
	config_free(cfg);
}

/* No override routes mail around a milter or the signer (options.def UNSKIPPABLE). */
static void
test_overlay_unskippable_stages(void **state)
{
	struct pepsi_config *cfg = parse_ok("[dispatch]\nINIT_STAGE = filter\n"
										"[stage-filter]\nPROGRAM = pepsi-stage-milter\nMILTERS = inet:127.0.0.1:11332\n"
										"NEXT_STAGE = route\n"
										"[stage-route]\nPROGRAM = pepsi-stage-route\nLOCAL_STAGE = maildir\n"
										"REMOTE_STAGE = sign\nBOUNCE_STAGE = bounce\n"
										"[stage-sign]\nPROGRAM = pepsi-stage-dkim-sign\nNEXT_STAGE = internet\n"
										"[stage-other-sign]\nPROGRAM = pepsi-stage-dkim-sign\nNEXT_STAGE = smarthost\n"
										"[stage-internet]\nPROGRAM = pepsi-stage-relay-to-internet\nBOUNCE_STAGE = bounce\n"
										"[stage-smarthost]\nPROGRAM = pepsi-stage-relay-to-smarthost\n"
										"[stage-maildir]\nPROGRAM = pepsi-stage-relay-to-maildir\n"
										"[stage-bounce]\nPROGRAM = pepsi-stage-bounce\nNEXT_STAGE = route\n");

	/* Past the signer, per address or for everyone. */
	assert_false(config_add_override(cfg, "address:a@evil.example", "stage-route", "REMOTE_STAGE", "internet",
									 err, sizeof(err)));
	assert_non_null(strstr(err, "REMOTE_STAGE = internet refused: mail to stage internet could skip [stage-sign] "
								"(pepsi-stage-dkim-sign)"));
	assert_false(config_add_override(cfg, "global", "stage-route", "REMOTE_STAGE", "smarthost", err, sizeof(err)));
	assert_non_null(strstr(err, "[stage-sign]"));
	/* Past the milter: at the start, or by the milter stage's own program. */
	assert_false(config_add_override(cfg, "global", "dispatch", "INIT_STAGE", "route", err, sizeof(err)));
	assert_non_null(strstr(err, "INIT_STAGE = route refused: mail to stage route could skip [stage-filter] "
								"(pepsi-stage-milter)"));
	assert_false(config_add_override(cfg, "global", "stage-filter", "PROGRAM", "pepsi-stage-route", err, sizeof(err)));
	assert_non_null(strstr(err, "[stage-filter] runs pepsi-stage-milter in the file"));
	/* Unset in the file, it is whatever the stage's other routes are. */
	assert_false(config_add_override(cfg, "address:a@evil.example", "stage-sign", "BOUNCE_STAGE", "internet", err,
									 sizeof(err)));
	assert_false(config_add_override(cfg, "address:a@evil.example", "stage-filter", "BOUNCE_STAGE", "internet",
									 err, sizeof(err)));
	assert_non_null(strstr(err, "[stage-sign]"));
	/* Another signing stage, or the same route, will do. */
	assert_true(config_add_override(cfg, "domain:b.example", "stage-route", "REMOTE_STAGE", "other-sign", err,
									sizeof(err)));
	assert_true(config_add_override(cfg, "address:c@b.example", "stage-route", "REMOTE_STAGE", "sign", err, sizeof(err)));
	/* A stage whose route has no such stage may go anywhere. */
	assert_true(config_add_override(cfg, "address:c@b.example", "stage-route", "LOCAL_STAGE", "internet", err,
									sizeof(err)));
	assert_string_equal(config_get_for(cfg, "stage-route", "REMOTE_STAGE", NULL, "a@evil.example"), "sign");
	config_free(cfg);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_accepts_every_section_kind),
		cmocka_unit_test(test_schema_lookups),
		cmocka_unit_test(test_unknown_section),
		cmocka_unit_test(test_control_character),
		cmocka_unit_test(test_unknown_option),
		cmocka_unit_test(test_lower_case_option),
		cmocka_unit_test(test_set_twice),
		cmocka_unit_test(test_malformed_line),
		cmocka_unit_test(test_option_outside_section),
		cmocka_unit_test(test_first_error_wins),
		cmocka_unit_test(test_long_values),
		cmocka_unit_test(test_load_file),
		cmocka_unit_test(test_get_int),
		cmocka_unit_test(test_value_refusals),
		cmocka_unit_test(test_get_bool),
		cmocka_unit_test(test_get_duration),
		cmocka_unit_test(test_get_size_enum_text),
		cmocka_unit_test(test_stage_program_options),
		cmocka_unit_test(test_overlay_precedence),
		cmocka_unit_test(test_overlay_adds),
		cmocka_unit_test(test_overlay_refusals),
		cmocka_unit_test(test_overlay_file_only_routes),
		cmocka_unit_test(test_overlay_unskippable_stages),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
