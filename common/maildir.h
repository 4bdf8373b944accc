/*
 * maildir.h: writing one message into a Maildir (the maildir(5)
 * specification and Maildir++ quotas), the one copy of that code.
 * pepsi-helper-maildir-writer calls it once it has become the mailbox's
 * owner; pepsi-stage-relay-to-maildir only names the mailbox (with
 * maildir_mailbox_name) and hands the message to the helper.
 *
 * Nothing here follows a symbolic link below the root it is given: each
 * component is opened with openat(O_NOFOLLOW) and checked with fstat, so
 * a link planted in a mailbox cannot send a write elsewhere.
 */
#ifndef PEPSI_MAILDIR_H
#define PEPSI_MAILDIR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The longest mailbox (directory) name: one file name component. */
#define MAILDIR_NAME_MAX 255

/*
 * The directory name of an address's mailbox (lower case; the local part
 * only when localpart_only), or NULL when it cannot be one: empty, longer
 * than MAILDIR_NAME_MAX, starting with a dot ("." and ".." and every name
 * that starts so), holding "/" or a control character.  Never a path.
 */
char *maildir_mailbox_name(const char *address, bool localpart_only);
/* Is name already such a directory name (what the helper checks again)? */
bool maildir_name_is_safe(const char *name);

enum maildir_status
{
	MAILDIR_DELIVERED,
	MAILDIR_NO_MAILBOX,	 /* the mailbox does not exist (and was not to be created) */
	MAILDIR_OVER_QUOTA,	 /* Maildir++ quota (maildirsize) would be exceeded */
	MAILDIR_UNSAFE,		 /* a symbolic link, a non-directory or a wrong owner on the way */
	MAILDIR_SHORT_INPUT, /* the message ended before its announced size */
	MAILDIR_IO_ERROR	 /* the file system said no (errno in the message) */
};

/* A Maildir, opened: the directory descriptors delivery works with. */
struct maildir
{
	int mailbox_fd;
	int tmp_fd;
	int new_fd;
};

/*
 * Open the Maildir name below root (an absolute directory; name may hold
 * several components, as "alice/Maildir", none of them "." or ".."),
 * following no symbolic link below root, and check that the Maildir and
 * its tmp, new and cur are directories owned by owner.  create: make a
 * missing Maildir (0700, with tmp, new and cur) and missing
 * subdirectories.  On failure a sentence in why.
 */
enum maildir_status maildir_open(const char *root, const char *name, uid_t owner, bool create,
								 struct maildir *md, char *why, size_t whylen);
void				maildir_close(struct maildir *md);

/*
 * Deliver: prefix (the Return-Path and Delivered-To lines), then exactly
 * size bytes read from in_fd, into tmp/ under a unique name; fsync the
 * file, rename it into new/ and fsync new/.  Quota first: a maildirsize
 * is honoured (Maildir++), and default_quota (bytes, 0: none) starts one
 * where there is none.  On success the file's name in new/ goes to
 * delivered (when not NULL, freed by the caller).  Nothing is left in new/
 * unless the whole message is there; tmp/ is cleaned on failure.
 */
enum maildir_status maildir_deliver(struct maildir *md, const char *prefix, size_t prefix_len,
									int in_fd, size_t size, long long default_quota,
									char **delivered, char *why, size_t whylen);

/*
 * Maildir++ quota of an open Maildir: the limits of maildirsize (0 when
 * none) and the use it records, recalculated from new/ and cur/ when the
 * file is missing or too long.  For the tests and the helper's checks.
 */
struct maildir_quota
{
	long long max_bytes;
	long long max_count;
	long long bytes;
	long long count;
};
bool maildir_quota_read(struct maildir *md, long long default_quota, struct maildir_quota *q,
						char *why, size_t whylen);

#endif
