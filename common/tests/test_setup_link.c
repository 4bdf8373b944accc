/*
 * test_setup_link.c: the one-time link of the web setup
 * (common/setup/setup_link.h): its file holds the digest, not the token,
 * mode 0600; a wrong token and an expired one are refused and leave the
 * file; the right one is taken once, with the layout it was made for, and
 * the file is gone, so a second take is refused.
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

#include "base/buf.h"
#include "base/xalloc.h"
#include "setup/setup_link.h"

static char err[1024];

static char *
scratch_path(void)
{
	char template[] = "/tmp/test_setup_link.XXXXXX";
	char *dir = mkdtemp(template);

	assert_non_null(dir);
	/* (setup_link_create makes the last directory.) */
	return xasprintf("%s/setup/token", dir);
}

/* The link's file is gone: its two directories go too. */
static void
scratch_remove(char *path)
{
	unlink(path);
	*strrchr(path, '/') = '\0';
	assert_int_equal(rmdir(path), 0);
	*strrchr(path, '/') = '\0';
	assert_int_equal(rmdir(path), 0);
	free(path);
}

static char *
file_text(const char *path)
{
	struct buf b = BUF_INIT;

	assert_true(buf_append_file(&b, path, 65536, err, sizeof(err)));
	buf_append(&b, "", 1);
	return b.data;
}

static void
test_taken_once(void **state)
{
	char		token[SETUP_LINK_TOKEN_LEN + 1];
	char		wrong[SETUP_LINK_TOKEN_LEN + 1];
	char	   *path = scratch_path();
	char	   *root = NULL;
	char	   *text;
	bool		as_root = true;
	struct stat st;

	assert_true(setup_link_create(path, "/srv/tree", false, 3600, (uid_t) -1, (gid_t) -1, token, err, sizeof(err)));
	assert_int_equal(strlen(token), SETUP_LINK_TOKEN_LEN);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	text = file_text(path);
	assert_null(strstr(text, token));
	assert_non_null(strstr(text, "root /srv/tree\n"));
	free(text);

	memcpy(wrong, token, sizeof(wrong));
	wrong[0] = wrong[0] == 'a' ? 'b' : 'a';
	assert_int_equal(setup_link_take(path, wrong, &root, &as_root, err, sizeof(err)), SETUP_LINK_INVALID);
	assert_int_equal(setup_link_take(path, "short", &root, &as_root, err, sizeof(err)), SETUP_LINK_INVALID);
	assert_int_equal(access(path, F_OK), 0);

	assert_int_equal(setup_link_take(path, token, &root, &as_root, err, sizeof(err)), SETUP_LINK_TAKEN);
	assert_string_equal(root, "/srv/tree");
	assert_false(as_root);
	free(root);
	assert_int_not_equal(access(path, F_OK), 0);
	assert_int_equal(setup_link_take(path, token, &root, &as_root, err, sizeof(err)), SETUP_LINK_INVALID);
	assert_null(root);
	scratch_remove(path);
}

static void
test_expired_and_replaced(void **state)
{
	char  first[SETUP_LINK_TOKEN_LEN + 1];
	char  token[SETUP_LINK_TOKEN_LEN + 1];
	char *path = scratch_path();
	char *root = NULL;
	bool  as_root = false;

	assert_true(setup_link_create(path, "", true, -1, (uid_t) -1, (gid_t) -1, token, err, sizeof(err)));
	assert_int_equal(setup_link_take(path, token, &root, &as_root, err, sizeof(err)), SETUP_LINK_EXPIRED);
	assert_int_equal(access(path, F_OK), 0);

	/* A new link replaces the old one. */
	assert_true(setup_link_create(path, "", true, 3600, (uid_t) -1, (gid_t) -1, first, err, sizeof(err)));
	assert_true(setup_link_create(path, "", true, 3600, (uid_t) -1, (gid_t) -1, token, err, sizeof(err)));
	assert_int_equal(setup_link_take(path, first, &root, &as_root, err, sizeof(err)), SETUP_LINK_INVALID);
	assert_int_equal(setup_link_take(path, token, &root, &as_root, err, sizeof(err)), SETUP_LINK_TAKEN);
	assert_string_equal(root, "");
	assert_true(as_root);
	free(root);

	assert_false(setup_link_create(path, "/a\nroot /b", false, 3600, (uid_t) -1, (gid_t) -1, token, err,
								   sizeof(err)));
	assert_non_null(strstr(err, "newline"));
	scratch_remove(path);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_taken_once),
		cmocka_unit_test(test_expired_and_replaced),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
