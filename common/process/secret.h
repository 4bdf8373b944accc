/*
 * secret.h: opening a file that holds credentials (the ingress
 * credentials file, a smarthost password file) and reading its line.  Such a file is refused
 * unless it is a regular file that only its owner may read or write: one
 * others can read leaks the secret, one others can write lets them choose
 * it.  The check is made on the open descriptor (fstat), so the file
 * cannot be swapped between the check and the read.
 */
#ifndef PEPSI_SECRET_H
#define PEPSI_SECRET_H

#include <stddef.h>
#include <stdio.h>

/* The file open for reading; NULL with the reason in err ("PATH: ..."). */
FILE *secret_file_open(const char *path, char *err, size_t errlen);

/*
 * A TLS private key, the same way but for two things.  Its group may
 * read it: a daemon reads its key again at each reload, by then as its
 * own user, so the key is that user's or root's with the user's group
 * (mode 0640), rather than root's alone.  A symbolic link is followed:
 * certbot's live/ directory is made of them.
 */
FILE *secret_key_open(const char *path, char *err, size_t errlen);

/*
 * A credential one group reads and one program writes: an OAuth access
 * token, root:pepsi-token mode 0640, which pepsi-helper-token-refresh
 * replaces and the set-group-id relay-to-smarthost reads.  Others may not
 * read it, the group may not change it, and a symbolic link is refused.
 */
FILE *secret_group_file_open(const char *path, char *err, size_t errlen);

/* The longest first line secret_file_first_line takes: access tokens (JWTs) run to a few kilobytes. */
#define SECRET_LINE_MAX 8190

/*
 * The first line of a credential file opened by one of the above (a
 * password, a refresh token, an access token), without its line end, in
 * a new string; f is closed and the buffer it was read through wiped.
 * NULL with err ("PATH: ...") if the line is longer than SECRET_LINE_MAX,
 * rather than a secret cut short.  An empty file gives "".
 */
char *secret_file_first_line(FILE *f, const char *path, char *err, size_t errlen);

#endif
