/*
 * test_privilege.c: which set-id files pepsi-dispatch runs (only the
 * programs make install installs set-id), and which configuration files a
 * set-id program trusts (privilege_path_trusted), on real files.
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

#include "process/privilege.h"

int main(void);

static char dir[64];
static char path[256];

static const char *
make_file(const char *name, mode_t mode)
{
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs("[pepsi]\n", f);
	fclose(f);
	assert_int_equal(chmod(path, mode), 0);
	return path;
}

static int
setup(void **state)
{
	snprintf(dir, sizeof(dir), "/tmp/pepsi-privilege-XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int
teardown(void **state)
{
	char command[128];

	snprintf(command, sizeof(command), "rm -rf '%s'", dir);
	return system(command) == 0 ? 0 : -1;
}

/* A set-id file beside the program is run only when it is one Pepsi installs set-id. */
static void
test_setid_programs(void **state)
{
	char  self[256];
	char *found;

	snprintf(self, sizeof(self), "%s", make_file("pepsi", 0755));
	make_file("pepsi-stage-evil", 02755);
	make_file("pepsi-stage-dot-forward", 02755);
	make_file("pepsi-stage-relay-to-maildir", 0755);
	assert_true(privilege_is_setid_program("pepsi-stage-dot-forward"));
	assert_true(privilege_is_setid_program("pepsi-stage-relay-to-maildir"));
	assert_true(privilege_is_setid_program("pepsi-quota"));
	assert_false(privilege_is_setid_program("pepsi-stage-evil"));
	assert_null(privilege_setid_program("pepsi-stage-evil", self));
	found = privilege_setid_program("pepsi-stage-dot-forward", self);
	assert_non_null(found);
	assert_non_null(strstr(found, "/pepsi-stage-dot-forward"));
	free(found);
	/* Listed, but without its bit: the multi-call binary runs it. */
	assert_null(privilege_setid_program("pepsi-stage-relay-to-maildir", self));
}

/* A configuration is trusted when only root (or the trusted user) can change it and the directories above it. */
static void
test_path_trusted(void **state)
{
	char why[512];
	char link[300];

	make_file("own.conf", 0644);
	assert_true(privilege_path_trusted(path, getuid(), why, sizeof(why)));
	if (getuid() != 0)
	{
		assert_false(privilege_path_trusted(path, 0, why, sizeof(why)));
		assert_non_null(strstr(why, "belongs to uid"));
	}
	make_file("open.conf", 0666);
	assert_false(privilege_path_trusted(path, getuid(), why, sizeof(why)));
	assert_non_null(strstr(why, "is writable by others"));
	snprintf(link, sizeof(link), "%s/link.conf", dir);
	make_file("own.conf", 0644);
	assert_int_equal(symlink(path, link), 0);
	assert_false(privilege_path_trusted(link, getuid(), why, sizeof(why)));
	assert_false(privilege_path_trusted("relative.conf", getuid(), why, sizeof(why)));
	assert_non_null(strstr(why, "not an absolute path"));
	assert_int_equal(chmod(dir, 0777), 0);
	make_file("own.conf", 0644);
	assert_false(privilege_path_trusted(path, getuid(), why, sizeof(why)));
	assert_non_null(strstr(why, "a directory on the way is writable by others"));
	assert_int_equal(chmod(dir, 0700), 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_setid_programs, setup, teardown),
		cmocka_unit_test_setup_teardown(test_path_trusted, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
