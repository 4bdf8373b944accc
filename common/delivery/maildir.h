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
 * The helper's standard input, read through a buffer: the request lines a
 * byte at a time without a system call each, and the message after them
 * from what was read ahead first.
 */
#define MAILDIR_INPUT_BUFFER 65536
struct maildir_input
{
	int	   fd;
	size_t start; /* data[start .. end) is read ahead, not yet taken */
	size_t end;
	char   data[MAILDIR_INPUT_BUFFER];
};
/* The next byte, or -1 at the end of the input (or on an error). */
int maildir_input_getc(struct maildir_input *in);

/*
 * A message written into tmp/ and not yet in new/: maildir_write makes it,
 * maildir_publish moves it into new/ (or maildir_discard removes it).
 */
struct maildir_file
{
	char  *name;  /* in tmp/ */
	char  *final; /* in new/, when the message has a stable name; else name */
	int	   fd;
	size_t size;
	bool   quota_kept; /* a maildirsize to add the delivery to */
	bool   already;	   /* maildir_publish found its stable name in new/: not delivered twice */
};

/*
 * Maildir++ quota of an open Maildir (maildir_quota_read): the limits of
 * maildirsize (0 when none; limits given win, and the file is rewritten
 * with them) and the use it records, recalculated from new/ and cur/ (and
 * the folders') when the file is missing, too long, or at a limit.
 */
struct maildir_quota
{
	long long max_bytes;
	long long max_count;
	long long bytes;
	long long count;
};

/*
 * A message's stable name: "<seconds>.<unique part>" (MAILDIR_STABLE_MAX
 * bytes at most), the same on every attempt to deliver it, so that an
 * attempt after a crash can find what an earlier one delivered.  The
 * caller makes it (relay-to-maildir: the row's received time, id and
 * recipient); this checks its form: digits, a dot, then letters, digits
 * and "_" only.
 */
#define MAILDIR_STABLE_MAX 96
bool maildir_stable_is_safe(const char *stable);

/*
 * Is a message of this stable name in new/ or cur/ already (in cur/ with
 * the ":2," flags a reader added, or a host name since changed)?  Its
 * "new/NAME" or "cur/NAME" in found (freed by the caller).  Reads both
 * directories: for an attempt after a crash only, never the normal path.
 */
bool maildir_find(struct maildir *md, const char *stable, char **found);
/* Read and drop size bytes of in (a message not written after all); false when it ends first. */
bool maildir_skip(struct maildir_input *in, size_t size);

/*
 * Write prefix (the Return-Path and Delivered-To lines), then exactly size
 * bytes of in, into tmp/ under a unique name (to be published under
 * stable's "<stable>.<host>,S=<size>" when stable is not NULL), and start writing it out to
 * disk (no fsync yet: a batch's files then share the journal commit of
 * the first one's).  Quota first: a maildirsize is honoured (Maildir++),
 * and default_quota (bytes, 0: none) starts one where there is none;
 * limits, when not NULL (Maildir++'s "<bytes>S,<count>C", from the
 * database's pepsi.quota), win over both: a maildirsize with other limits
 * is counted afresh and rewritten with these;
 * held_bytes and held_count are this Maildir's messages written but not
 * yet published, counted as used.  The use and limits found (before this
 * message) go to used when not NULL, also when over quota.  On failure
 * nothing is left in tmp/.
 */
enum maildir_status maildir_write(struct maildir *md, const char *stable, const char *prefix,
								  size_t prefix_len, struct maildir_input *in, size_t size,
								  long long default_quota, const char *limits,
								  long long held_bytes, long long held_count,
								  struct maildir_file *file, struct maildir_quota *used, char *why,
								  size_t whylen);
/*
 * fsync the file and rename it into new/ (never over another file: a
 * stable name already there is this message delivered before, and the
 * file is removed from tmp/ with already set); new/
 * itself is not fsynced: maildir_sync_new, once for all the files of a
 * batch, before any of them is reported delivered.  On success the file's
 * name in new/ goes to delivered (when not NULL, freed by the caller); on
 * failure the file is removed from tmp/.
 */
enum maildir_status maildir_publish(struct maildir *md, struct maildir_file *file,
									char **delivered, char *why, size_t whylen);
/* A written file not to be delivered after all: removed from tmp/. */
void maildir_discard(struct maildir *md, struct maildir_file *file);
/* fsync new/: what makes the renames into it durable. */
enum maildir_status maildir_sync_new(struct maildir *md, char *why, size_t whylen);
/* Record a published delivery in maildirsize (when the file's Maildir keeps one). */
void maildir_quota_count(struct maildir *md, const struct maildir_file *file);

bool maildir_quota_read(struct maildir *md, long long default_quota, const char *limits,
						struct maildir_quota *q, char *why, size_t whylen);
/* The use counted afresh from disk (pepsi-quota recount), and maildirsize rewritten with it. */
bool maildir_quota_recount(struct maildir *md, long long default_quota, const char *limits,
						   struct maildir_quota *q, char *why, size_t whylen);

#endif
