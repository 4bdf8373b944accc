/*
 * test_secret.c: reading the first line of a credential file
 * (secret_file_first_line), as relay-to-smarthost and
 * pepsi-helper-token-refresh do, on real 0600 files.
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

#include "process/secret.h"

int main(void);

static char dir[64];
static char path[256];

/* A 0600 file in dir holding length bytes of content. */
static const char *
make_secret(const char *content, size_t length)
{
	FILE *f;

	snprintf(path, sizeof(path), "%s/secret", dir);
	f = fopen(path, "w");
	assert_non_null(f);
	assert_int_equal(fwrite(content, 1, length, f), length);
	fclose(f);
	assert_int_equal(chmod(path, 0600), 0);
	return path;
}

/* The first line of the file made of content, or NULL with err. */
static char *
first_line(const char *content, size_t length, char *err, size_t errlen)
{
	const char *file = make_secret(content, length);
	FILE	   *f = secret_file_open(file, err, errlen);

	assert_non_null(f);
	return secret_file_first_line(f, file, err, errlen);
}

static int
setup(void **state)
{
	snprintf(dir, sizeof(dir), "/tmp/pepsi-secret-XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int
teardown(void **state)
{
	char command[128];

	snprintf(command, sizeof(command), "rm -rf '%s'", dir);
	return system(command) == 0 ? 0 : -1;
}

/* The first line without its end (LF or CRLF); the lines after it are not read. */
static void
test_first_line(void **state)
{
	char  err[512] = "";
	char *value;

	value = first_line("hunter2\nsecond\n", 15, err, sizeof(err));
	assert_string_equal(value, "hunter2");
	free(value);
	value = first_line("token-value\r\n", 13, err, sizeof(err));
	assert_string_equal(value, "token-value");
	free(value);
	value = first_line("no line end", 11, err, sizeof(err));
	assert_string_equal(value, "no line end");
	free(value);
	value = first_line("", 0, err, sizeof(err));
	assert_string_equal(value, "");
	free(value);
	assert_string_equal(err, "");
}

/* A line of SECRET_LINE_MAX bytes is read whole; one byte more is refused, not cut short. */
static void
test_line_limit(void **state)
{
	char  content[SECRET_LINE_MAX + 3];
	char  err[512] = "";
	char  expected[512];
	char *value;

	memset(content, 'a', sizeof(content));
	content[SECRET_LINE_MAX] = '\n';
	value = first_line(content, SECRET_LINE_MAX + 1, err, sizeof(err));
	assert_non_null(value);
	assert_int_equal(strlen(value), SECRET_LINE_MAX);
	free(value);
	content[SECRET_LINE_MAX] = '\r';
	content[SECRET_LINE_MAX + 1] = '\n';
	value = first_line(content, SECRET_LINE_MAX + 2, err, sizeof(err));
	assert_non_null(value);
	assert_int_equal(strlen(value), SECRET_LINE_MAX);
	free(value);

	memset(content, 'a', sizeof(content));
	content[SECRET_LINE_MAX + 1] = '\n';
	assert_null(first_line(content, SECRET_LINE_MAX + 2, err, sizeof(err)));
	snprintf(expected, sizeof(expected), "%s: first line longer than %d bytes", path,
			 SECRET_LINE_MAX);
	assert_string_equal(err, expected);
	err[0] = '\0';
	assert_null(first_line(content, SECRET_LINE_MAX + 1, err, sizeof(err)));
	assert_string_equal(err, expected);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_first_line, setup, teardown),
		cmocka_unit_test_setup_teardown(test_line_limit, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
