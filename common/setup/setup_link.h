/*
 * setup_link.h: the one-time link to pepsi-httpd's setup page.
 *
 * pepsi-setup init --web makes a random token, prints it in a link, and
 * writes to a file ([httpd] SETUP_TOKEN) only its SHA-256 digest, when it
 * expires, and where the plan puts things (the --root and whether it ran
 * as root, which the web setup cannot know).  pepsi-httpd takes the link
 * once: a token whose digest matches and that has not expired deletes the
 * file, so the same link, or a second request racing the first, finds
 * nothing.  The file is the only state: a database backup holds no link.
 */
#ifndef PEPSI_SETUP_LINK_H
#define PEPSI_SETUP_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The token: 32 random bytes in hex. */
#define SETUP_LINK_TOKEN_LEN 64

/*
 * Make a token valid for lifetime_s seconds and write its file at path
 * (mode 0600, its directory made 0700 if missing; both given to uid and
 * gid when they are not -1), replacing an older one.  false with err.
 */
bool setup_link_create(const char *path, const char *root, bool as_root, long lifetime_s, uid_t uid,
					   gid_t gid, char token[SETUP_LINK_TOKEN_LEN + 1], char *err, size_t errlen);

enum setup_link_result
{
	SETUP_LINK_TAKEN,	/* it was valid; the file is gone; *root is allocated */
	SETUP_LINK_INVALID, /* no file (none made, or used), or another token */
	SETUP_LINK_EXPIRED,
	SETUP_LINK_ERROR, /* the file cannot be read or deleted: err */
};

/* len bytes as 2 * len hex digits and a NUL. */
void setup_link_hex(const unsigned char *in, size_t len, char *out);

/* Take the link of token, once. */
enum setup_link_result setup_link_take(const char *path, const char *token, char **root, bool *as_root,
									   char *err, size_t errlen);

#endif
