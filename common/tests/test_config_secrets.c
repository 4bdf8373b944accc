/*
 * test_config_secrets.c: the secrets.d fragments config_load includes
 * beside pepsi.conf (config.h): read in name order, refused with the
 * fragment and the reason when not owned or protected as they must be,
 * holding secrets only, and a secret refused in pepsi.conf itself; and
 * the drop-ins of pepsi.conf.d, which replace the file's options.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/expect_error.h"

#include "config/config.h"

static char err[1024];
static char dir[64];
static char conf[128];
static char secrets[128];

static void
write_file(const char *path, const char *text, mode_t mode)
{
	FILE *f;

	unlink(path);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	assert_int_equal(chmod(path, mode), 0);
}

static char *
fragment(const char *name)
{
	static char path[256];

	snprintf(path, sizeof(path), "%s/%s", secrets, name);
	return path;
}

static int
setup(void **state)
{
	snprintf(dir, sizeof(dir), "/tmp/test_secrets.XXXXXX");
	assert_non_null(mkdtemp(dir));
	snprintf(conf, sizeof(conf), "%s/pepsi.conf", dir);
	snprintf(secrets, sizeof(secrets), "%s/secrets.d", dir);
	assert_int_equal(mkdir(secrets, 0755), 0);
	write_file(conf, "[srs]\nDOMAIN = srs.example\n[stage-relay]\nPROGRAM = pepsi-stage-relay-to-smarthost\n"
					 "AUTH_USER = relay\n",
			   0644);
	return 0;
}

static int
teardown(void **state)
{
	char *command = NULL;

	assert_true(asprintf(&command, "rm -rf '%s'", dir) > 0);
	assert_int_equal(system(command), 0);
	free(command);
	return 0;
}

static struct pepsi_config *
load_ok(void)
{
	struct pepsi_config *cfg = config_load(conf, err, sizeof(err));

	if (cfg == NULL)
		fail_msg("refused: %s", err);
	return cfg;
}

static void
load_refused(const char *want_prefix, const char *want)
{
	struct pepsi_config *cfg = config_load(conf, err, sizeof(err));

	if (cfg != NULL)
	{
		config_free(cfg);
		fail_msg("accepted");
	}
	expect_error(err, want_prefix, want);
}

/* The fragments are read after the file, a stage's secret checked with its PROGRAM from the file. */
static void
test_fragments_included(void **state)
{
	struct pepsi_config *cfg;
	char				 origin[256];
	char				 want[512];

	write_file(fragment("srs.conf"), "[srs]\nSECRET = s3cret\n", 0640);
	write_file(fragment("relay.conf"), "[stage-relay]\nAUTH_PASSWORD = pw\n", 0600);
	write_file(fragment("README"), "not a fragment: no .conf\n", 0644);
	cfg = load_ok();
	assert_string_equal(config_text(cfg, "srs", "SECRET"), "s3cret");
	assert_string_equal(config_get(cfg, "stage-relay", "AUTH_PASSWORD"), "pw");
	/* Name order: relay.conf before srs.conf. */
	assert_int_equal(cfg->fragment_count, 2);
	assert_string_equal(cfg->fragments[0], fragment("relay.conf"));
	snprintf(want, sizeof(want), "%s:2", fragment("srs.conf"));
	assert_string_equal(config_origin(cfg, "srs", "SECRET", origin, sizeof(origin)), want);
	config_free(cfg);
}

/* No secrets.d: the file alone, as before. */
static void
test_no_directory(void **state)
{
	struct pepsi_config *cfg;

	assert_int_equal(rmdir(secrets), 0);
	cfg = load_ok();
	assert_null(config_text(cfg, "srs", "SECRET"));
	config_free(cfg);
}

static void
test_secret_refused_in_file(void **state)
{
	char want[512];

	write_file(conf, "[srs]\nDOMAIN = srs.example\nSECRET = s3cret\n", 0644);
	snprintf(want, sizeof(want), "%s:3: ", conf);
	load_refused(want, "[srs] SECRET is a secret: set it in a fragment of");
	/* The value is not repeated. */
	assert_null(strstr(err, "s3cret"));
	/* A stage program's secret too, by its PROGRAM. */
	write_file(conf, "[stage-relay]\nAUTH_PASSWORD = pw\nPROGRAM = pepsi-stage-relay-to-smarthost\n", 0644);
	snprintf(want, sizeof(want), "%s:2: ", conf);
	load_refused(want, "[stage-relay] AUTH_PASSWORD is a secret");
	/* The same from a string (pepsi-config's validation). */
	assert_null(config_parse_string("[srs]\nSECRET = x\n", "pepsi.conf", err, sizeof(err)));
	expect_error(err, "pepsi.conf:2: ", "is a secret");
}

static void
test_fragment_holds_only_secrets(void **state)
{
	char want[512];

	write_file(fragment("a.conf"), "[srs]\nSECRET = s\nMAX_AGE = 3\n", 0640);
	snprintf(want, sizeof(want), "%s:3: ", fragment("a.conf"));
	load_refused(want, "[srs] MAX_AGE is not a secret");
	write_file(fragment("a.conf"), "[srs]\nSECRET = s\n", 0640);
	write_file(fragment("b.conf"), "[srs]\nSECRET = t\n", 0640);
	snprintf(want, sizeof(want), "%s:2: ", fragment("b.conf"));
	load_refused(want, "set twice");
	assert_non_null(strstr(err, fragment("a.conf")));
	unlink(fragment("b.conf"));
	write_file(fragment("a.conf"), "[nowhere]\nSECRET = s\n", 0640);
	snprintf(want, sizeof(want), "%s:2: ", fragment("a.conf"));
	load_refused(want, "unknown section");
}

static void
test_fragment_mode_refused(void **state)
{
	char want[512];

	write_file(fragment("srs.conf"), "[srs]\nSECRET = s\n", 0644);
	snprintf(want, sizeof(want), "%s: refused: ", fragment("srs.conf"));
	load_refused(want, "mode 0644 gives more than 0640");
	write_file(fragment("srs.conf"), "[srs]\nSECRET = s\n", 0660);
	load_refused(want, "mode 0660");
	write_file(fragment("srs.conf"), "[srs]\nSECRET = s\n", 0740);
	load_refused(want, "mode 0740");
	/* A symbolic link is refused, wherever it points. */
	write_file(fragment("srs.conf"), "[srs]\nSECRET = s\n", 0600);
	assert_int_equal(symlink("srs.conf", fragment("z.conf")), 0);
	snprintf(want, sizeof(want), "%s: refused: ", fragment("z.conf"));
	load_refused(want, "not a regular file");
	unlink(fragment("z.conf"));
}

/* Only root (or this account) may write the directory. */
static void
test_directory_mode_refused(void **state)
{
	char want[512];

	assert_int_equal(chmod(secrets, 0777), 0);
	snprintf(want, sizeof(want), "%s: refused: ", secrets);
	load_refused(want, "only root may write");
	assert_int_equal(chmod(secrets, 0755), 0);
}

/* Another account's fragment is skipped, not refused: its secrets are not this program's. */
static void
test_unreadable_fragment_skipped(void **state)
{
	struct pepsi_config *cfg;

	if (geteuid() == 0)
		skip(); /* root reads every fragment */
	write_file(fragment("other.conf"), "[srs]\nSECRET = s\n", 0200);
	cfg = load_ok();
	assert_null(config_text(cfg, "srs", "SECRET"));
	assert_int_equal(cfg->fragment_count, 0);
	config_free(cfg);
	/* So is a directory this account may not read (root:GROUP, mode 0750). */
	write_file(fragment("other.conf"), "[srs]\nSECRET = s\n", 0600);
	assert_int_equal(chmod(secrets, 0300), 0);
	cfg = load_ok();
	assert_int_equal(cfg->fragment_count, 0);
	config_free(cfg);
	assert_int_equal(chmod(secrets, 0755), 0);
}

/* pepsi.conf.d: drop-ins read after the file, replacing its options, readable by all, holding no secret. */
static void
test_dropins(void **state)
{
	char				 dropins[160];
	char				 path[256];
	char				 want[300];
	struct pepsi_config *cfg;

	snprintf(dropins, sizeof(dropins), "%s/pepsi.conf.d", dir);
	assert_int_equal(mkdir(dropins, 0755), 0);
	snprintf(path, sizeof(path), "%s/a.conf", dropins);
	write_file(path, "[srs]\nDOMAIN = a.example\nMAX_AGE = 7\n", 0644);
	snprintf(path, sizeof(path), "%s/b.conf", dropins);
	write_file(path, "[srs]\nDOMAIN = b.example\n", 0644);
	cfg = load_ok();
	assert_string_equal(config_get(cfg, "srs", "DOMAIN"), "b.example");
	assert_string_equal(config_get(cfg, "srs", "MAX_AGE"), "7");
	assert_string_equal(config_get(cfg, "stage-relay", "AUTH_USER"), "relay");
	config_free(cfg);

	snprintf(want, sizeof(want), "%s: refused: ", path);
	write_file(path, "[srs]\nDOMAIN = b.example\n", 0664);
	load_refused(want, "mode 0664 gives more than 0644");
	write_file(path, "[srs]\nSECRET = not here\n", 0644);
	snprintf(want, sizeof(want), "%s:2: ", path);
	load_refused(want, "[srs] SECRET is a secret: set it in a fragment of");
	write_file(path, "[srs]\nDOMAIN = b.example\nDOMAIN = c.example\n", 0644);
	snprintf(want, sizeof(want), "%s:3: ", path);
	load_refused(want, "set twice");
	assert_int_equal(chmod(dropins, 0775), 0);
	snprintf(want, sizeof(want), "%s: refused: ", dropins);
	load_refused(want, "it must be a directory owned by root that only root may write");
	assert_int_equal(chmod(dropins, 0755), 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_fragments_included, setup, teardown),
		cmocka_unit_test_setup_teardown(test_no_directory, setup, teardown),
		cmocka_unit_test_setup_teardown(test_secret_refused_in_file, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fragment_holds_only_secrets, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fragment_mode_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_directory_mode_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unreadable_fragment_skipped, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dropins, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
