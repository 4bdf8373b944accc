/*
 * pepsi-helper-maildir-writer: deliver one message into a Maildir as the
 * mailbox's owner.  Installed set-user-id root and executable by one group
 * (CALLER_GROUP), the group pepsi-stage-relay-to-maildir is set-group-id
 * to; a standalone binary, never the multi-call one (the bit would reach
 * every program).  Without the bit (make run, most tests) it runs as its
 * caller, who then owns the mailboxes: the same code, nothing to drop.
 *
 * Its life, in order: a clean environment and no inherited descriptor;
 * the configuration from a file only root (or, unprivileged, its caller)
 * can write; the caller's group checked; the request read from standard
 * input (bounded) and checked; the mailbox resolved inside the configured
 * roots; then every id set to the owner's for good (setgroups, setresgid,
 * setresuid, verified), and only then the Maildir is opened and the
 * message copied from standard input (common/delivery/maildir.c).  One reply line
 * on standard output: an enhanced status code and a sentence.  Then the
 * next request, as long as it is for the same owner (for another it
 * answers "again" and the stage starts a new helper); any failure ends it.
 *
 * A batch: requests with "hold yes" are written into tmp/ and answered
 * together with the next request without it.  Then each file is fsynced
 * and renamed into new/, each new/ touched is fsynced once, and only then
 * are the batch's replies written, in order: a "2.0.0" is never given for
 * a message whose file or directory entry could still be lost, yet a
 * batch of files shares its journal commits.  A failure ends the helper
 * as before, after the batch's earlier messages are finished and
 * answered; the caller sends the requests left unanswered to a new one.
 * At the end of its input (the caller gone) a held batch is removed from
 * tmp/ unanswered: its rows are still to be delivered.
 *
 * The request (pepsi-helper-maildir-writer(8)): lines "key value", an
 * empty line, then exactly size bytes of message:
 *   section    the caller's [stage-<name>] (its MAILDIR_ROOT is the virtual
 *              root, its MAILBOXES, when set, says system or virtual)
 *   recipient  the envelope recipient (Delivered-To)
 *   sender     the envelope sender (Return-Path), may be empty
 *   mailbox    the virtual mailbox's directory name (one component)
 *   create     yes: make a missing virtual mailbox
 *   size       the message's size in bytes
 *   hold       yes: answer it with the next request without hold (a batch)
 *   stable     the message's stable name ("<seconds>.<unique part>",
 *              common/delivery/maildir.h): its file in new/ is named after it, and
 *              one of that name there already is this message, not
 *              delivered twice ("2.0.0 already delivered to ...")
 *   lookup     yes: an attempt after a crash: look for the stable name in
 *              new/ and cur/ first, and write nothing if it is there
 *   quota      the mailbox's limits from the database (pepsi.quota), as
 *              Maildir++ writes them ("10000000S,1000C"): they win over
 *              maildirsize's and QUOTA (a maildirsize with others is
 *              counted afresh and rewritten with these)
 *   recount    yes: write nothing (size 0): count the Maildir afresh,
 *              rewrite its maildirsize, and answer with the count
 *              (pepsi-quota recount)
 * A reply about a Maildir that keeps a quota ends with " quota=B/MB,C/MC":
 * the bytes and messages used (with this message, when delivered) and
 * the limits (0: none), which the stage records (pepsi.quota_record).
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "config/config.h"
#include "delivery/maildir.h"
#include "options.h"
#include "process/privilege.h"

#define WRITER_PROGRAM "pepsi-helper-maildir-writer"
#define WRITER_STAGE_PROGRAM "pepsi-stage-relay-to-maildir"
#define WRITER_SECTION "maildir-writer"
#define WRITER_REQUEST_MAX 8192
#define WRITER_USER_NAME_MAX 32
#define WRITER_SUPPLEMENT_MAX 1024
/* The most messages held in one batch: their replies fit a pipe's buffer, their descriptors the limit. */
#define WRITER_BATCH_MAX 64

int main(int argc, char **argv);

struct writer_request
{
	char  *section;
	char  *recipient;
	char  *sender;
	char  *mailbox;
	bool   create;
	size_t size;
	bool   have_size;
	bool   hold;
	char  *stable;
	bool   lookup;
	char  *quota;
	bool   recount;
};

struct writer_target
{
	uid_t uid;
	gid_t gid;
	char *root; /* trusted directory the walk starts from */
	char *name; /* the Maildir below it: "alice@example.org" or "alice/Maildir" */
	bool  create;
};

/* A message of the batch: written into tmp/, to be published and answered with the others. */
struct writer_held
{
	struct maildir		 md;
	struct maildir_file	 file;
	dev_t				 dev; /* the Maildir's, to count its held messages against its quota */
	ino_t				 ino;
	char				*recipient;
	char				*where; /* root/name, for the replies */
	char				*found; /* "new/NAME" or "cur/NAME": delivered before (lookup), nothing written */
	struct maildir_quota used;	/* the Maildir's quota before this message (maildir_write) */
};

/* Standard input, buffered (common/delivery/maildir.h), and the batch held so far. */
static struct maildir_input writer_in = {.fd = 0};
static struct writer_held	writer_batch[WRITER_BATCH_MAX];
static size_t				writer_batch_len;

static void writer_finish_batch(void);
static void writer_discard_batch(void);
static void writer_held_free(struct writer_held *held);

/*
 * One reply line per request: everything the caller learns.  After a
 * delivery the helper waits for the next request; after anything else it
 * ends, so that nothing of a refused request (its message) is ever read
 * as the next one.
 */
static void writer_reply(const char *status, const char *fmt, va_list ap)
	__attribute__((format(printf, 2, 0)));
static void writer_reply_exit(const char *status, const char *fmt, ...)
	__attribute__((noreturn, format(printf, 2, 3)));

static void
writer_reply(const char *status, const char *fmt, va_list ap)
{
	char text[1024];

	vsnprintf(text, sizeof(text), fmt, ap);
	for (char *p = text; *p; p++)
		if ((unsigned char) *p < 0x20)
			*p = ' ';
	if (status[0] == '4' || status[0] == '5')
		log_warnx("%s %s", status, text);
	printf("%s %s\n", status, text);
	fflush(stdout);
}

static void
writer_reply_exit(const char *status, const char *fmt, ...)
{
	va_list ap;

	/* The batch's earlier messages are good: finished and answered first, in order. */
	writer_finish_batch();
	va_start(ap, fmt);
	writer_reply(status, fmt, ap);
	va_end(ap);
	exit(status[0] == '2' ? 0 : 1);
}

/* A request value: printable, no CR, LF or other control character. */
static bool
writer_value_clean(const char *value)
{
	for (const unsigned char *p = (const unsigned char *) value; *p; p++)
		if (*p < 0x20 || *p == 0x7f)
			return false;
	return true;
}

/* Maildir++ limits: "<digits>S" and/or "<digits>C", comma separated, at most 64 bytes. */
static bool
writer_quota_ok(const char *value)
{
	const char *p = value;

	if (strlen(value) > 64 || *p == '\0')
		return false;
	while (*p)
	{
		if (!isdigit((unsigned char) *p))
			return false;
		while (isdigit((unsigned char) *p))
			p++;
		if (*p != 'S' && *p != 'C')
			return false;
		p++;
		if (*p == ',' && p[1] != '\0')
			p++;
		else if (*p)
			return false;
	}
	return true;
}

/*
 * Read the request's lines up to the empty one, a byte at a time (the
 * message follows); false when the caller closed the pipe instead of
 * sending one (it has no more).
 */
static bool
writer_read_request(struct writer_request *req)
{
	char   line[WRITER_REQUEST_MAX];
	size_t total = 0;
	size_t len = 0;

	memset(req, 0, sizeof(*req));
	for (;;)
	{
		int c = maildir_input_getc(&writer_in);

		if (c < 0 && total == 0)
			return false;
		if (c < 0)
		{
			writer_discard_batch(); /* the caller is gone: nothing it was not told of is kept */
			writer_reply_exit("4.3.0", "the request ended before its empty line");
		}
		if (++total > WRITER_REQUEST_MAX)
			writer_reply_exit("4.3.0", "the request is longer than %d bytes", WRITER_REQUEST_MAX);
		if (c == '\0')
			writer_reply_exit("5.1.3", "the request holds a NUL byte");
		if (c != '\n')
		{
			line[len++] = (char) c;
			continue;
		}
		line[len] = '\0';
		if (len == 0)
			break;
		{
			char  *space = strchr(line, ' ');
			char  *value = space ? space + 1 : line + len;
			char **field = NULL;

			if (space)
				*space = '\0';
			if (!writer_value_clean(value))
				writer_reply_exit("5.1.3", "the request's %s holds a control character", line);
			if (strcmp(line, "section") == 0)
				field = &req->section;
			else if (strcmp(line, "recipient") == 0)
				field = &req->recipient;
			else if (strcmp(line, "sender") == 0)
				field = &req->sender;
			else if (strcmp(line, "mailbox") == 0)
				field = &req->mailbox;
			else if (strcmp(line, "create") == 0)
				req->create = strcmp(value, "yes") == 0;
			else if (strcmp(line, "hold") == 0)
				req->hold = strcmp(value, "yes") == 0;
			else if (strcmp(line, "stable") == 0)
				field = &req->stable;
			else if (strcmp(line, "lookup") == 0)
				req->lookup = strcmp(value, "yes") == 0;
			else if (strcmp(line, "recount") == 0)
				req->recount = strcmp(value, "yes") == 0;
			else if (strcmp(line, "quota") == 0)
			{
				if (!writer_quota_ok(value))
					writer_reply_exit("4.3.0", "the request's quota \"%.64s\" is not Maildir++ limits "
											   "(\"<bytes>S,<count>C\")",
									  value);
				field = &req->quota;
			}
			else if (strcmp(line, "size") == 0)
			{
				char			  *end;
				unsigned long long size;

				errno = 0;
				size = strtoull(value, &end, 10);
				if (errno || end == value || *end || value[0] == '-')
					writer_reply_exit("4.3.0", "the request's size is not a number");
				req->size = (size_t) size;
				req->have_size = true;
			}
			else
				writer_reply_exit("4.3.0", "the request has an unknown line \"%.64s\"", line);
			if (field)
			{
				free(*field);
				*field = xstrdup(value);
			}
		}
		len = 0;
	}
	if (req->section == NULL || req->recipient == NULL || !req->have_size)
		writer_reply_exit("4.3.0", "the request lacks its section, recipient or size");
	if (req->stable && !maildir_stable_is_safe(req->stable))
		writer_reply_exit("4.3.0", "the request's stable name is not digits, a dot and a unique part");
	if (req->recount && req->size != 0)
		writer_reply_exit("4.3.0", "a recount request has no message: its size must be 0");
	if (req->sender == NULL)
		req->sender = xstrdup("");
	return true;
}

static void
writer_request_free(struct writer_request *req)
{
	free(req->section);
	free(req->recipient);
	free(req->sender);
	free(req->mailbox);
	free(req->stable);
	free(req->quota);
}

/* Is dir (absolute, no "." or ".." component) one of the space/comma separated roots, or below one? */
static char *
writer_root_of(const char *dir, const char *roots)
{
	const char *cursor = roots;
	const char *p;
	size_t		n;

	if (dir[0] != '/' || strstr(dir, "/../") || strstr(dir, "/./") || strstr(dir, "//"))
		return NULL;
	while ((p = option_list_next(&cursor, &n)) != NULL)
	{
		while (n > 1 && p[n - 1] == '/')
			n--;
		if (p[0] == '/' && strncmp(dir, p, n) == 0 && dir[n] == '/' && dir[n + 1] != '\0')
			return xstrndup(p, n);
	}
	return NULL;
}

/* A user name that can be looked up: [a-z0-9._-], not starting with "-" or ".". */
static bool
writer_user_name_ok(const char *name)
{
	size_t len = strlen(name);

	if (len == 0 || len > WRITER_USER_NAME_MAX || name[0] == '-' || name[0] == '.')
		return false;
	for (const char *p = name; *p; p++)
		if (!(islower((unsigned char) *p) || isdigit((unsigned char) *p) || *p == '.' || *p == '_'
			  || *p == '-'))
			return false;
	return true;
}

/* A relative path below a home: components that are names, none "." or "..". */
static bool
writer_relative_path_ok(const char *path)
{
	char *copy = xstrdup(path);
	char *save = NULL;
	bool  ok = path[0] != '/' && path[0] != '\0';

	for (char *c = strtok_r(copy, "/", &save); ok && c; c = strtok_r(NULL, "/", &save))
		ok = maildir_name_is_safe(c);
	free(copy);
	return ok;
}

/* The recipient's system account: ~/MAILDIR_PATH of a user whose home is in HOME_ROOTS. */
static void
writer_resolve_system(const struct pepsi_config *cfg, const struct writer_request *req,
					  struct writer_target *t)
{
	const char	  *at = strrchr(req->recipient, '@');
	size_t		   len = at ? (size_t) (at - req->recipient) : strlen(req->recipient);
	const char	  *maildir_path = config_text(cfg, WRITER_SECTION, "MAILDIR_PATH");
	long long	   min_uid = config_int(cfg, WRITER_SECTION, "MIN_UID");
	char		   user[WRITER_USER_NAME_MAX + 1];
	struct passwd *pw;

	if (len == 0 || len > WRITER_USER_NAME_MAX)
		writer_reply_exit("5.1.3", "<%s> cannot name a system user", req->recipient);
	for (size_t i = 0; i < len; i++)
		user[i] = (char) tolower((unsigned char) req->recipient[i]);
	user[len] = '\0';
	if (!writer_user_name_ok(user))
		writer_reply_exit("5.1.3", "<%s> cannot name a system user", req->recipient);
	if (!writer_relative_path_ok(maildir_path))
		writer_reply_exit("4.3.5", "[%s] MAILDIR_PATH %s is not a relative path of names",
						  WRITER_SECTION, maildir_path);
	errno = 0;
	if ((pw = getpwnam(user)) == NULL)
		writer_reply_exit(errno ? "4.3.0" : "5.1.1", "mailbox <%s> does not exist: no user %s",
						  req->recipient, user);
	if ((long long) pw->pw_uid < min_uid || pw->pw_uid == 0)
		writer_reply_exit("5.7.1", "delivery as %s (uid %ld) is refused: below [%s] MIN_UID %lld",
						  user, (long) pw->pw_uid, WRITER_SECTION, min_uid);
	t->root = writer_root_of(pw->pw_dir, config_text(cfg, WRITER_SECTION, "HOME_ROOTS"));
	if (t->root == NULL)
		writer_reply_exit("5.7.1", "delivery to %s's home %s is refused: not below [%s] HOME_ROOTS",
						  user, pw->pw_dir, WRITER_SECTION);
	t->name = xasprintf("%s/%s", pw->pw_dir + strlen(t->root) + 1, maildir_path);
	t->uid = pw->pw_uid;
	t->gid = pw->pw_gid;
	t->create = true; /* the account exists: its Maildir is made on first delivery */
}

/* A virtual mailbox: <root>/<mailbox>, owned by VIRTUAL_USER (unprivileged: by the caller). */
static void
writer_resolve_virtual(const struct pepsi_config *cfg, const struct writer_request *req,
					   bool privileged, struct writer_target *t)
{
	const char *root = config_text(cfg, req->section, "MAILDIR_ROOT");
	const char *user = config_text(cfg, WRITER_SECTION, "VIRTUAL_USER");

	if (root == NULL)
		root = config_text(cfg, "pepsi", "MAILDIR_ROOT");
	if (root == NULL || root[0] != '/')
		writer_reply_exit("4.3.5", "[%s] has no MAILDIR_ROOT", req->section);
	if (req->mailbox == NULL || !maildir_name_is_safe(req->mailbox))
		writer_reply_exit("5.1.3", "<%s> cannot name a mailbox", req->recipient);
	if (user)
	{
		/* Looked up once: every request of this helper names the same user (its configuration). */
		static uid_t virtual_uid;
		static gid_t virtual_gid;
		static bool	 looked_up;

		if (!looked_up)
		{
			struct passwd *pw = getpwnam(user);

			if (pw == NULL)
				writer_reply_exit("4.3.5", "[%s] VIRTUAL_USER %s: no such user", WRITER_SECTION, user);
			virtual_uid = pw->pw_uid;
			virtual_gid = pw->pw_gid;
			looked_up = true;
		}
		t->uid = virtual_uid;
		t->gid = virtual_gid;
	}
	else if (privileged)
		writer_reply_exit("4.3.5", "[%s] VIRTUAL_USER is not set: whose are the virtual mailboxes?",
						  WRITER_SECTION);
	else
	{
		t->uid = getuid();
		t->gid = getgid();
	}
	if (t->uid == 0)
		writer_reply_exit("5.7.1", "delivery as root is refused: set [%s] VIRTUAL_USER to another user",
						  WRITER_SECTION);
	t->root = xstrdup(root);
	t->name = xstrdup(req->mailbox);
	t->create = req->create;
}

/*
 * Become the mailbox's owner for good, in OpenSMTPD's order, and check
 * that no id is left that could lead back: real, effective and saved
 * user and group ids, supplementary groups.
 */
static void
writer_become(const struct writer_target *t, bool privileged)
{
	uid_t ruid, euid, suid;
	gid_t rgid, egid, sgid;
	gid_t groups[WRITER_SUPPLEMENT_MAX];
	int	  ngroups;

	if (chdir("/") != 0)
		writer_reply_exit("4.3.0", "chdir /: %s", strerror(errno));
	if (privileged && setgroups(1, &t->gid) != 0)
		writer_reply_exit("4.3.0", "setgroups: %s", strerror(errno));
	if (setresgid(t->gid, t->gid, t->gid) != 0)
		writer_reply_exit("4.3.0", "setresgid %ld: %s", (long) t->gid, strerror(errno));
	if (setresuid(t->uid, t->uid, t->uid) != 0)
		writer_reply_exit("4.3.0", "setresuid %ld: %s", (long) t->uid, strerror(errno));
	if (getresuid(&ruid, &euid, &suid) != 0 || getresgid(&rgid, &egid, &sgid) != 0
		|| ruid != t->uid || euid != t->uid || suid != t->uid || rgid != t->gid || egid != t->gid
		|| sgid != t->gid)
		writer_reply_exit("4.3.0", "the ids did not all change to %ld:%ld", (long) t->uid,
						  (long) t->gid);
	if (privileged)
	{
		ngroups = getgroups(WRITER_SUPPLEMENT_MAX, groups);
		if (ngroups < 0 || ngroups > 1 || (ngroups == 1 && groups[0] != t->gid))
			writer_reply_exit("4.3.0", "supplementary groups are left after setgroups");
	}
	if (setuid(0) == 0 || seteuid(0) == 0)
		writer_reply_exit("4.3.0", "root could be regained after dropping privileges");
}

/* What no request may ask, whoever the owner. */
static void
writer_check_request(const struct pepsi_config *cfg, const struct writer_request *req)
{
	const char *program = config_text(cfg, req->section, "PROGRAM");
	long long	max_size = config_size(cfg, WRITER_SECTION, "MAX_MESSAGE_SIZE");

	if (strncmp(req->section, "stage-", 6) != 0 || program == NULL
		|| strcmp(strrchr(program, '/') ? strrchr(program, '/') + 1 : program, WRITER_STAGE_PROGRAM) != 0)
		writer_reply_exit("4.3.5", "[%s] is not a section of %s", req->section, WRITER_STAGE_PROGRAM);
	if (max_size > 0 && req->size > (unsigned long long) max_size)
		writer_reply_exit("5.3.4", "the message has %zu bytes, more than [%s] MAX_MESSAGE_SIZE %lld",
						  req->size, WRITER_SECTION, max_size);
	if (strpbrk(req->recipient, "<>") || strpbrk(req->sender, "<>"))
		writer_reply_exit("5.1.3", "an envelope address holds \"<\" or \">\"");
}

/*
 * Are the caller stage's mailboxes system users' (else virtual)?  Its own
 * section's MAILBOXES, else [maildir-writer]'s: so one installation can
 * have a stage for system accounts and another for virtual mailboxes.
 * Both come from the helper's own file, never from the caller.
 */
static bool
writer_system_mailboxes(const struct pepsi_config *cfg, const char *section)
{
	enum
	{
		WRITER_MAILBOXES_SYSTEM = 1 /* the index of "system" in "virtual|system" */
	};

	if (config_get(cfg, section, "MAILBOXES") != NULL)
		return config_enum(cfg, section, "MAILBOXES") == WRITER_MAILBOXES_SYSTEM;
	return config_enum(cfg, WRITER_SECTION, "MAILBOXES") == WRITER_MAILBOXES_SYSTEM;
}

/*
 * Open the Maildir and write the message into its tmp/, held for the end
 * of the batch; anything else is a reply and the end.
 */
static void
writer_write(const struct pepsi_config *cfg, const struct writer_request *req,
			 const struct writer_target *target)
{
	struct writer_held *held = &writer_batch[writer_batch_len];
	struct buf			prefix = BUF_INIT;
	char				why[1024] = "";
	long long			held_bytes = 0;
	long long			held_count = 0;
	struct stat			st;
	enum maildir_status rc;

	rc = maildir_open(target->root, target->name, target->uid, target->create, &held->md, why,
					  sizeof(why));
	if (rc == MAILDIR_NO_MAILBOX)
		writer_reply_exit("5.1.1", "mailbox <%s> does not exist", req->recipient);
	if (rc == MAILDIR_UNSAFE)
		writer_reply_exit("4.2.0", "mailbox of <%s> refused: %s", req->recipient, why);
	if (rc != MAILDIR_DELIVERED || fstat(held->md.mailbox_fd, &st) != 0)
	{
		if (rc == MAILDIR_DELIVERED)
		{
			snprintf(why, sizeof(why), "fstat: %s", strerror(errno));
			maildir_close(&held->md);
		}
		writer_reply_exit("4.3.0", "cannot write to mailbox %s/%s: %s", target->root, target->name, why);
	}
	held->dev = st.st_dev;
	held->ino = st.st_ino;
	if (req->recount)
	{
		struct maildir_quota q;

		if (!maildir_quota_recount(&held->md, config_size(cfg, WRITER_SECTION, "QUOTA"), req->quota, &q,
								   why, sizeof(why)))
		{
			maildir_close(&held->md);
			writer_reply_exit("4.3.0", "cannot count mailbox %s/%s: %s", target->root, target->name, why);
		}
		maildir_close(&held->md);
		writer_finish_batch();
		printf("2.0.0 counted %s/%s quota=%lld/%lld,%lld/%lld\n", target->root, target->name, q.bytes,
			   q.max_bytes, q.count, q.max_count);
		fflush(stdout);
		return;
	}
	/* After a crash: delivered already by the attempt that died?  Then answered as delivered. */
	if (req->stable && req->lookup && maildir_find(&held->md, req->stable, &held->found))
	{
		if (!maildir_skip(&writer_in, req->size))
		{
			writer_held_free(held);
			writer_discard_batch(); /* the caller is gone: nothing it was not told of is kept */
			writer_reply_exit("4.3.0", "the message ended before its %zu bytes", req->size);
		}
		held->file.fd = -1;
		held->recipient = xstrdup(req->recipient);
		held->where = xasprintf("%s/%s", target->root, target->name);
		writer_batch_len++;
		return;
	}
	/* The batch's messages to this Maildir count against its quota before they are in new/. */
	for (size_t i = 0; i < writer_batch_len; i++)
		if (writer_batch[i].dev == held->dev && writer_batch[i].ino == held->ino)
		{
			held_bytes += (long long) writer_batch[i].file.size;
			held_count++;
		}
	buf_printf(&prefix, "Return-Path: <%s>\r\nDelivered-To: %s\r\n", req->sender, req->recipient);
	rc = maildir_write(&held->md, req->stable, prefix.data, prefix.len, &writer_in, req->size,
					   config_size(cfg, WRITER_SECTION, "QUOTA"), req->quota, held_bytes, held_count,
					   &held->file, &held->used, why, sizeof(why));
	buf_free(&prefix);
	if (rc == MAILDIR_DELIVERED)
	{
		held->recipient = xstrdup(req->recipient);
		held->where = xasprintf("%s/%s", target->root, target->name);
		writer_batch_len++;
		return;
	}
	maildir_close(&held->md);
	switch (rc)
	{
		case MAILDIR_OVER_QUOTA:
			writer_reply_exit("5.2.2", "mailbox of <%s> is over quota: %s quota=%lld/%lld,%lld/%lld",
							  req->recipient, why, held->used.bytes, held->used.max_bytes,
							  held->used.count, held->used.max_count);
		case MAILDIR_SHORT_INPUT:
			writer_discard_batch(); /* the caller is gone: nothing it was not told of is kept */
			writer_reply_exit("4.3.0", "%s", why);
		case MAILDIR_NO_MAILBOX:
		case MAILDIR_UNSAFE:
			writer_reply_exit("4.2.0", "mailbox of <%s> refused: %s", req->recipient, why);
		case MAILDIR_DELIVERED:
		case MAILDIR_IO_ERROR:
			break;
	}
	writer_reply_exit(errno == ENOSPC || errno == EDQUOT ? "4.2.2" : "4.3.0",
					  "cannot write to mailbox %s/%s: %s", target->root, target->name, why);
}

static void
writer_held_free(struct writer_held *held)
{
	maildir_close(&held->md);
	free(held->recipient);
	free(held->where);
	free(held->found);
	memset(held, 0, sizeof(*held));
}

/*
 * The batch's files into new/: each fsynced and renamed, then each new/
 * fsynced once, then one reply each, in order.  A failure is that
 * message's 4.x reply; the others are delivered all the same.
 */
static void
writer_finish_batch(void)
{
	static bool finishing; /* a reply that ends the helper finishes the batch: not twice */
	size_t		n = writer_batch_len;
	char	  **delivered;
	char	  **failed;
	char		why[1024];

	if (finishing || n == 0)
		return;
	finishing = true;
	delivered = xcalloc(n, sizeof(*delivered));
	failed = xcalloc(n, sizeof(*failed));
	for (size_t i = 0; i < n; i++)
		if (writer_batch[i].found)
			delivered[i] = xstrdup(writer_batch[i].found);
		else if (maildir_publish(&writer_batch[i].md, &writer_batch[i].file, &delivered[i], why, sizeof(why))
				 != MAILDIR_DELIVERED)
			failed[i] = xasprintf("%s cannot write to mailbox %s: %s",
								  errno == ENOSPC || errno == EDQUOT ? "4.2.2" : "4.3.0",
								  writer_batch[i].where, why);
	for (size_t i = 0; i < n; i++)
	{
		bool synced = false;

		if (failed[i])
			continue;
		for (size_t j = 0; j < i && !synced; j++)
			synced = delivered[j] && writer_batch[j].dev == writer_batch[i].dev
					 && writer_batch[j].ino == writer_batch[i].ino;
		if (synced)
			continue;
		if (maildir_sync_new(&writer_batch[i].md, why, sizeof(why)) != MAILDIR_DELIVERED)
			/* Every message of this Maildir: none is known durable. */
			for (size_t j = i; j < n; j++)
				if (!failed[j] && writer_batch[j].dev == writer_batch[i].dev
					&& writer_batch[j].ino == writer_batch[i].ino)
				{
					failed[j] = xasprintf("4.3.0 cannot write to mailbox %s: %s", writer_batch[j].where, why);
					free(delivered[j]);
					delivered[j] = NULL;
				}
	}
	for (size_t i = 0; i < n; i++)
	{
		if (failed[i] == NULL)
			maildir_quota_count(&writer_batch[i].md, &writer_batch[i].file);
		if (failed[i])
		{
			log_warnx("%s", failed[i]);
			printf("%s\n", failed[i]);
		}
		else if (writer_batch[i].found)
			printf("2.0.0 already delivered to %s/%s\n", writer_batch[i].where, delivered[i]);
		else if (writer_batch[i].file.quota_kept)
			printf("2.0.0 delivered to %s/new/%s quota=%lld/%lld,%lld/%lld\n", writer_batch[i].where,
				   delivered[i], writer_batch[i].used.bytes + (long long) writer_batch[i].file.size,
				   writer_batch[i].used.max_bytes, writer_batch[i].used.count + 1,
				   writer_batch[i].used.max_count);
		else
			printf("2.0.0 %sdelivered to %s/new/%s\n", writer_batch[i].file.already ? "already " : "",
				   writer_batch[i].where, delivered[i]);
		free(failed[i]);
		free(delivered[i]);
		free(writer_batch[i].file.name);
		writer_held_free(&writer_batch[i]);
	}
	fflush(stdout);
	free(failed);
	free(delivered);
	writer_batch_len = 0;
	finishing = false;
}

/* The held batch removed from tmp/, unanswered. */
static void
writer_discard_batch(void)
{
	for (size_t i = 0; i < writer_batch_len; i++)
	{
		maildir_discard(&writer_batch[i].md, &writer_batch[i].file);
		writer_held_free(&writer_batch[i]);
	}
	writer_batch_len = 0;
}

static void
usage(void)
{
	fprintf(stderr, "usage: %s [-c CONFIG] < request\n"
					"  CONFIG defaults to %s; it must be root's (see %s(8)).\n",
			WRITER_PROGRAM, PEPSI_CONFIG_DEFAULT_PATH, WRITER_PROGRAM);
}

int
main(int argc, char **argv)
{
	const char			 *config_path = PEPSI_CONFIG_DEFAULT_PATH;
	bool				  privileged;
	uid_t				  caller = getuid();
	struct pepsi_config	 *cfg;
	struct writer_request req;
	const char			 *group_name;
	char				  why[1024] = "";
	bool				  became = false;
	uid_t				  owner_uid = 0;
	gid_t				  owner_gid = 0;
	int					  opt;

	privilege_sanitize_process();
	log_init(WRITER_PROGRAM, false);
	while ((opt = getopt(argc, argv, "c:h")) != -1)
		switch (opt)
		{
			case 'c':
				config_path = optarg;
				break;
			case 'h':
				usage();
				return 0;
			default:
				usage();
				return 2;
		}
	if (optind != argc)
	{
		usage();
		return 2;
	}
	privileged = geteuid() == 0;

	/*
	 * The configuration: root's (unprivileged, also the caller's, who can
	 * do no more than it); root calling needs no protection from itself.
	 */
	if (caller != 0 && !privilege_path_trusted(config_path, privileged ? 0 : caller, why, sizeof(why)))
		writer_reply_exit("4.3.5", "refusing the configuration: %s", why);
	if ((cfg = config_load(config_path, why, sizeof(why))) == NULL)
		writer_reply_exit("4.3.5", "%s", why);

	/* Only the caller group may have root deliver for it. */
	group_name = config_text(cfg, WRITER_SECTION, "CALLER_GROUP");
	if (privileged && caller != 0)
	{
		struct group *gr = group_name ? getgrnam(group_name) : NULL;

		if (group_name == NULL)
			writer_reply_exit("4.3.5", "[%s] CALLER_GROUP is not set: refusing every caller",
							  WRITER_SECTION);
		if (gr == NULL)
			writer_reply_exit("4.3.5", "[%s] CALLER_GROUP %s: no such group", WRITER_SECTION,
							  group_name);
		if (!privilege_caller_in_group(gr->gr_gid))
			writer_reply_exit("4.3.5", "uid %ld is not in group %s: refused", (long) caller,
							  group_name);
	}

	/* One request after another, for as long as they are the same owner's. */
	while (writer_read_request(&req))
	{
		struct writer_target target = {0};

		writer_check_request(cfg, &req);
		if (writer_system_mailboxes(cfg, req.section))
			writer_resolve_system(cfg, &req, &target);
		else
			writer_resolve_virtual(cfg, &req, privileged, &target);
		if (!privileged && target.uid != caller)
			writer_reply_exit("4.3.5", "only the set-user-id helper can deliver as uid %ld",
							  (long) target.uid);
		if (!became)
		{
			writer_become(&target, privileged);
			/* From here on: the mailbox owner, nothing more. */
			became = true;
			owner_uid = target.uid;
			owner_gid = target.gid;
		}
		else if (target.uid != owner_uid || target.gid != owner_gid)
			writer_reply_exit("again", "another owner's mailbox: ask a new helper");
		writer_write(cfg, &req, &target);
		if (!req.hold || writer_batch_len == WRITER_BATCH_MAX)
			writer_finish_batch();
		writer_request_free(&req);
		free(target.root);
		free(target.name);
	}
	writer_discard_batch(); /* held, then no request to end the batch: the caller is gone */
	return 0;
}
