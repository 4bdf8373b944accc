/*
 * maildir.c: see maildir.h.  Links only to xalloc/buf/log, so that the
 * setuid helper that calls it carries no database or JSON code.
 */
#include "delivery/maildir.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/xalloc.h"

/* Maildir++: a maildirsize longer than this is recalculated and rewritten. */
#define MAILDIR_SIZE_FILE_MAX 5120

static unsigned long maildir_deliveries; /* the Q of unique names */
static int			 maildir_errno;		 /* the errno of the last failure described */

static void maildir_why(char *why, size_t whylen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void
maildir_why(char *why, size_t whylen, const char *fmt, ...)
{
	va_list ap;

	maildir_errno = errno;
	va_start(ap, fmt);
	vsnprintf(why, whylen, fmt, ap);
	va_end(ap);
}

/*
 * Names
 */

bool
maildir_name_is_safe(const char *name)
{
	size_t len = strlen(name);

	if (len == 0 || len > MAILDIR_NAME_MAX || name[0] == '.')
		return false;
	for (const char *p = name; *p; p++)
		if (*p == '/' || (unsigned char) *p < 0x20 || *p == 0x7f)
			return false;
	return true;
}

char *
maildir_mailbox_name(const char *address, bool localpart_only)
{
	const char *at = strrchr(address, '@');
	size_t		len = localpart_only && at ? (size_t) (at - address) : strlen(address);
	char	   *name;

	if (len == 0 || len > MAILDIR_NAME_MAX)
		return NULL;
	name = xstrndup(address, len);
	for (char *p = name; *p; p++)
		*p = (char) tolower((unsigned char) *p);
	if (!maildir_name_is_safe(name))
	{
		free(name);
		return NULL;
	}
	return name;
}

/*
 * Opening, one component at a time
 */

/* Open a directory below dirfd, never through a symbolic link; check its owner. */
static enum maildir_status
maildir_open_dir(int dirfd, const char *component, const char *shown, uid_t owner, bool check_owner,
				 bool create, int *out, char *why, size_t whylen)
{
	struct stat st;
	int			fd;

	fd = openat(dirfd, component, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT && create)
	{
		if (mkdirat(dirfd, component, 0700) != 0 && errno != EEXIST)
		{
			maildir_why(why, whylen, "cannot create %s: %s", shown, strerror(errno));
			return MAILDIR_IO_ERROR;
		}
		fd = openat(dirfd, component, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	}
	if (fd < 0)
	{
		int saved = errno;

		if (saved == ENOENT)
		{
			maildir_why(why, whylen, "%s does not exist", shown);
			return MAILDIR_NO_MAILBOX;
		}
		if (saved == ELOOP || saved == ENOTDIR)
		{
			maildir_why(why, whylen, "%s is a symbolic link or not a directory", shown);
			return MAILDIR_UNSAFE;
		}
		maildir_why(why, whylen, "cannot open %s: %s", shown, strerror(saved));
		return MAILDIR_IO_ERROR;
	}
	if (fstat(fd, &st) != 0)
	{
		maildir_why(why, whylen, "cannot stat %s: %s", shown, strerror(errno));
		close(fd);
		return MAILDIR_IO_ERROR;
	}
	if (check_owner && st.st_uid != owner)
	{
		maildir_why(why, whylen, "%s belongs to uid %ld, not to the mailbox's owner (uid %ld)",
					shown, (long) st.st_uid, (long) owner);
		close(fd);
		return MAILDIR_UNSAFE;
	}
	*out = fd;
	return MAILDIR_DELIVERED;
}

void
maildir_close(struct maildir *md)
{
	if (md->mailbox_fd >= 0)
		close(md->mailbox_fd);
	if (md->tmp_fd >= 0)
		close(md->tmp_fd);
	if (md->new_fd >= 0)
		close(md->new_fd);
	md->mailbox_fd = md->tmp_fd = md->new_fd = -1;
}

enum maildir_status
maildir_open(const char *root, const char *name, uid_t owner, bool create, struct maildir *md,
			 char *why, size_t whylen)
{
	static const char *const subdirs[] = {"tmp", "new", "cur"};
	enum maildir_status		 rc;
	char					*components = xstrdup(name);
	char					*save = NULL;
	char					*shown;
	int						 fd;
	int						 subfd;

	md->mailbox_fd = md->tmp_fd = md->new_fd = -1;
	/* The root is the operator's: it may be reached through links of theirs. */
	fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
	{
		maildir_why(why, whylen, "cannot open the mailbox root %s: %s", root, strerror(errno));
		free(components);
		return MAILDIR_IO_ERROR;
	}
	shown = xasprintf("%s", root);
	for (char *c = strtok_r(components, "/", &save); c; c = strtok_r(NULL, "/", &save))
	{
		char *next_shown = xasprintf("%s/%s", shown, c);
		char *rest = save && *save ? save : NULL;

		free(shown);
		shown = next_shown;
		if (strcmp(c, ".") == 0 || strcmp(c, "..") == 0)
		{
			maildir_why(why, whylen, "%s: a mailbox path has no \".\" or \"..\"", shown);
			rc = MAILDIR_UNSAFE;
			goto err;
		}
		/* The Maildir itself (the last component) is its owner's; what leads to it may be root's. */
		rc = maildir_open_dir(fd, c, shown, owner, rest == NULL, create && rest == NULL, &subfd,
							  why, whylen);
		if (rc == MAILDIR_NO_MAILBOX && rest == NULL)
			maildir_why(why, whylen, "mailbox %s does not exist", shown);
		if (rc != MAILDIR_DELIVERED)
			goto err;
		close(fd);
		fd = subfd;
	}
	md->mailbox_fd = fd;
	fd = -1;
	for (size_t i = 0; i < 3; i++)
	{
		char *sub_shown = xasprintf("%s/%s", shown, subdirs[i]);

		rc = maildir_open_dir(md->mailbox_fd, subdirs[i], sub_shown, owner, true, create, &subfd,
							  why, whylen);
		free(sub_shown);
		if (rc == MAILDIR_NO_MAILBOX)
			rc = MAILDIR_IO_ERROR; /* a mailbox without its tmp, new or cur is broken, not absent */
		if (rc != MAILDIR_DELIVERED)
			goto err;
		if (i == 0)
			md->tmp_fd = subfd;
		else if (i == 1)
			md->new_fd = subfd;
		else
			close(subfd);
	}
	free(shown);
	free(components);
	return MAILDIR_DELIVERED;

err:
	if (fd >= 0)
		close(fd);
	maildir_close(md);
	free(shown);
	free(components);
	return rc;
}

/*
 * Maildir++ quota
 */

/* The size a Maildir++ name carries (",S=<bytes>"), else -1. */
static long long
maildir_name_size(const char *name)
{
	const char *s = strstr(name, ",S=");
	char	   *end;
	long long	size;

	if (s == NULL)
		return -1;
	size = strtoll(s + 3, &end, 10);
	if (end == s + 3 || size < 0 || (*end != '\0' && *end != ',' && *end != ':'))
		return -1;
	return size;
}

/* Add the messages of one new/ or cur/ to the totals. */
static void
maildir_scan_dir(int parent_fd, const char *sub, long long *bytes, long long *count)
{
	int			   fd = openat(parent_fd, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR			  *dir;
	struct dirent *de;

	if (fd < 0 || (dir = fdopendir(fd)) == NULL)
	{
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((de = readdir(dir)) != NULL)
	{
		long long	size;
		struct stat st;

		if (de->d_name[0] == '.')
			continue;
		size = maildir_name_size(de->d_name);
		if (size < 0)
		{
			if (fstatat(dirfd(dir), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
				continue;
			size = (long long) st.st_size;
		}
		*bytes += size;
		(*count)++;
	}
	closedir(dir);
}

/* The use of the Maildir and of its Maildir++ folders (".Name"), counted afresh. */
static void
maildir_scan(int mailbox_fd, long long *bytes, long long *count)
{
	int			   fd = dup(mailbox_fd);
	DIR			  *dir;
	struct dirent *de;

	*bytes = *count = 0;
	maildir_scan_dir(mailbox_fd, "new", bytes, count);
	maildir_scan_dir(mailbox_fd, "cur", bytes, count);
	if (fd < 0 || (dir = fdopendir(fd)) == NULL)
	{
		if (fd >= 0)
			close(fd);
		return;
	}
	rewinddir(dir);
	while ((de = readdir(dir)) != NULL)
	{
		int sub;

		if (de->d_name[0] != '.' || strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		sub = openat(mailbox_fd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sub < 0)
			continue;
		maildir_scan_dir(sub, "new", bytes, count);
		maildir_scan_dir(sub, "cur", bytes, count);
		close(sub);
	}
	closedir(dir);
}

/* "10000000S,1000C": the limits of a maildirsize's first line. */
static void
maildir_quota_parse_limits(const char *line, struct maildir_quota *q)
{
	const char *p = line;

	while (*p)
	{
		char	 *end;
		long long value = strtoll(p, &end, 10);

		if (end == p)
			break;
		if (*end == 'S')
			q->max_bytes = value;
		else if (*end == 'C')
			q->max_count = value;
		p = end + (*end ? 1 : 0);
		p += strspn(p, ", ");
	}
}

/* Write maildirsize afresh (limits line and one total), through tmp/ and a rename. */
static bool
maildir_quota_rewrite(struct maildir *md, const char *limits, long long bytes, long long count,
					  char *why, size_t whylen)
{
	char	  *tmp_name = xasprintf("maildirsize.%ld.%d", (long) time(NULL), (int) getpid());
	struct buf text = BUF_INIT;
	int		   fd;
	bool	   ok = false;

	buf_printf(&text, "%s\n%lld %lld\n", limits, bytes, count);
	fd = openat(md->tmp_fd, tmp_name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		goto done;
	if (!fd_write_all(fd, text.data, text.len))
		goto done;
	if (fsync(fd) != 0 || close(fd) != 0)
	{
		fd = -1;
		goto done;
	}
	fd = -1;
	ok = renameat(md->tmp_fd, tmp_name, md->mailbox_fd, "maildirsize") == 0;
done:
	if (!ok)
	{
		maildir_why(why, whylen, "cannot write maildirsize: %s", strerror(errno));
		if (fd >= 0)
			close(fd);
		unlinkat(md->tmp_fd, tmp_name, 0);
	}
	free(tmp_name);
	buf_free(&text);
	return ok;
}

bool
maildir_quota_read(struct maildir *md, long long default_quota, const char *given, struct maildir_quota *q,
				   char *why, size_t whylen)
{
	char		limits[256];
	char		content[MAILDIR_SIZE_FILE_MAX + 1];
	struct stat st;
	ssize_t		n;
	int			fd;
	char	   *line;
	char	   *save = NULL;

	memset(q, 0, sizeof(*q));
	fd = openat(md->mailbox_fd, "maildirsize", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno != ENOENT)
	{
		maildir_why(why, whylen, "cannot open maildirsize: %s", strerror(errno));
		return false;
	}
	if (fd < 0)
	{
		if (given)
			snprintf(limits, sizeof(limits), "%s", given);
		else if (default_quota <= 0)
			return true; /* no quota */
		else
			snprintf(limits, sizeof(limits), "%lldS", default_quota);
		maildir_quota_parse_limits(limits, q);
		maildir_scan(md->mailbox_fd, &q->bytes, &q->count);
		return maildir_quota_rewrite(md, limits, q->bytes, q->count, why, whylen);
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
	{
		maildir_why(why, whylen, "maildirsize is not a regular file");
		close(fd);
		return false;
	}
	n = st.st_size > MAILDIR_SIZE_FILE_MAX ? 0 : read(fd, content, sizeof(content) - 1);
	close(fd);
	if (n < 0)
	{
		maildir_why(why, whylen, "cannot read maildirsize: %s", strerror(errno));
		return false;
	}
	content[n] = '\0';
	line = strtok_r(content, "\n", &save);
	snprintf(limits, sizeof(limits), "%s", line ? line : "");
	/* Limits given (the database's) that are not the file's: the file's line and count afresh, as Dovecot does. */
	if (given && strcmp(limits, given) != 0)
	{
		snprintf(limits, sizeof(limits), "%s", given);
		maildir_quota_parse_limits(limits, q);
		maildir_scan(md->mailbox_fd, &q->bytes, &q->count);
		return maildir_quota_rewrite(md, limits, q->bytes, q->count, why, whylen);
	}
	maildir_quota_parse_limits(limits, q);
	while ((line = strtok_r(NULL, "\n", &save)) != NULL)
	{
		long long bytes = 0;
		long long count = 0;

		if (sscanf(line, "%lld %lld", &bytes, &count) >= 1)
		{
			q->bytes += bytes;
			q->count += count;
		}
	}
	/* Too long to add up, or a limit reached by its count: count afresh (Maildir++). */
	if (st.st_size > MAILDIR_SIZE_FILE_MAX || (q->max_bytes > 0 && q->bytes >= q->max_bytes)
		|| (q->max_count > 0 && q->count >= q->max_count))
	{
		maildir_scan(md->mailbox_fd, &q->bytes, &q->count);
		if (limits[0] == '\0' && st.st_size > MAILDIR_SIZE_FILE_MAX)
			return true; /* an unreadable limits line: no quota */
		return maildir_quota_rewrite(md, limits, q->bytes, q->count, why, whylen);
	}
	return true;
}

bool
maildir_quota_recount(struct maildir *md, long long default_quota, const char *limits,
					  struct maildir_quota *q, char *why, size_t whylen)
{
	char line[256];

	if (!maildir_quota_read(md, default_quota, limits, q, why, whylen))
		return false;
	maildir_scan(md->mailbox_fd, &q->bytes, &q->count);
	if (q->max_bytes <= 0 && q->max_count <= 0)
		return true; /* no quota: no maildirsize to keep */
	if (limits)
		snprintf(line, sizeof(line), "%s", limits);
	else if (q->max_count > 0 && q->max_bytes > 0)
		snprintf(line, sizeof(line), "%lldS,%lldC", q->max_bytes, q->max_count);
	else if (q->max_count > 0)
		snprintf(line, sizeof(line), "%lldC", q->max_count);
	else
		snprintf(line, sizeof(line), "%lldS", q->max_bytes);
	return maildir_quota_rewrite(md, line, q->bytes, q->count, why, whylen);
}

/* Record a delivery in maildirsize, as Maildir++ does: one appended line. */
void
maildir_quota_count(struct maildir *md, const struct maildir_file *file)
{
	char line[64];
	int	 len;
	int	 fd;

	if (!file->quota_kept)
		return;
	len = snprintf(line, sizeof(line), "%zu 1\n", file->size);
	fd = openat(md->mailbox_fd, "maildirsize", O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return;
	(void) !write(fd, line, (size_t) len);
	close(fd);
}

/*
 * Delivery
 */

/* The host name with "/" and ":" escaped, as the names carry it (looked up once: a helper delivers message after message). */
static const char *
maildir_host(void)
{
	static char *host;

	if (host == NULL)
	{
		char	   name[256];
		struct buf safe = BUF_INIT;

		if (gethostname(name, sizeof(name)) != 0)
			snprintf(name, sizeof(name), "localhost");
		name[sizeof(name) - 1] = '\0';
		for (const char *p = name; *p; p++)
		{
			if (*p == '/')
				buf_append_str(&safe, "\\057");
			else if (*p == ':')
				buf_append_str(&safe, "\\072");
			else
				buf_append_char(&safe, *p);
		}
		host = safe.data ? safe.data : xstrdup("localhost");
	}
	return host;
}

/*
 * The unique name of the Maildir specification: time, then M (usec), P
 * (pid) and Q (deliveries by this process) make it unique on this host,
 * then the host name, then Maildir++'s size.
 */
static char *
maildir_unique_name(size_t size)
{
	struct timeval tv;

	gettimeofday(&tv, NULL);
	return xasprintf("%lld.M%ldP%dQ%lu.%s,S=%zu", (long long) tv.tv_sec, (long) tv.tv_usec,
					 (int) getpid(), ++maildir_deliveries, maildir_host(), size);
}

bool
maildir_stable_is_safe(const char *stable)
{
	const char *p = stable;

	if (strlen(stable) > MAILDIR_STABLE_MAX || !isdigit((unsigned char) *p))
		return false;
	while (isdigit((unsigned char) *p))
		p++;
	if (*p++ != '.' || *p == '\0')
		return false;
	for (; *p; p++)
		if (!isalnum((unsigned char) *p) && *p != '_')
			return false;
	return true;
}

/* The name in dir of stable's message ("<stable>." starts it), or NULL. */
static char *
maildir_find_in(int mailbox_fd, const char *dir_name, const char *stable)
{
	size_t		   len = strlen(stable);
	int			   fd = openat(mailbox_fd, dir_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR			  *dir;
	struct dirent *de;
	char		  *found = NULL;

	if (fd < 0 || (dir = fdopendir(fd)) == NULL)
	{
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	while (found == NULL && (de = readdir(dir)) != NULL)
		if (strncmp(de->d_name, stable, len) == 0 && de->d_name[len] == '.')
			found = xasprintf("%s/%s", dir_name, de->d_name);
	closedir(dir);
	return found;
}

bool
maildir_find(struct maildir *md, const char *stable, char **found)
{
	*found = maildir_find_in(md->mailbox_fd, "new", stable);
	if (*found == NULL)
		*found = maildir_find_in(md->mailbox_fd, "cur", stable);
	return *found != NULL;
}

int
maildir_input_getc(struct maildir_input *in)
{
	while (in->start == in->end)
	{
		ssize_t n = read(in->fd, in->data, sizeof(in->data));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		in->start = 0;
		in->end = (size_t) n;
	}
	return (unsigned char) in->data[in->start++];
}

/*
 * Copy exactly size bytes of in, what was read ahead first (out_fd -1:
 * drop them); -1 with errno on a write error, 0 on a short input.
 */
static int
maildir_copy(int out_fd, struct maildir_input *in, size_t size)
{
	while (size > 0)
	{
		size_t take;

		if (in->start == in->end)
		{
			ssize_t n = read(in->fd, in->data, sizeof(in->data));

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				return 0;
			in->start = 0;
			in->end = (size_t) n;
		}
		take = in->end - in->start < size ? in->end - in->start : size;
		if (out_fd >= 0 && !fd_write_all(out_fd, in->data + in->start, take))
			return -1;
		in->start += take;
		size -= take;
	}
	return 1;
}

bool
maildir_skip(struct maildir_input *in, size_t size)
{
	return maildir_copy(-1, in, size) == 1;
}

static void
maildir_file_reset(struct maildir_file *file)
{
	free(file->name);
	free(file->final);
	file->name = file->final = NULL;
	file->fd = -1;
}

void
maildir_discard(struct maildir *md, struct maildir_file *file)
{
	if (file->fd >= 0)
		close(file->fd);
	if (file->name)
		unlinkat(md->tmp_fd, file->name, 0);
	maildir_file_reset(file);
}

enum maildir_status
maildir_write(struct maildir *md, const char *stable, const char *prefix, size_t prefix_len,
			  struct maildir_input *in, size_t size, long long default_quota, const char *limits,
			  long long held_bytes, long long held_count, struct maildir_file *file,
			  struct maildir_quota *used, char *why, size_t whylen)
{
	struct maildir_quota quota;
	size_t				 total = prefix_len + size;
	enum maildir_status	 rc = MAILDIR_IO_ERROR;
	int					 copied;

	file->name = maildir_unique_name(total);
	file->final = stable ? xasprintf("%s.%s,S=%zu", stable, maildir_host(), total) : NULL;
	file->fd = -1;
	file->size = total;
	file->already = false;
	if (!maildir_quota_read(md, default_quota, limits, &quota, why, whylen))
		goto fail;
	file->quota_kept = quota.max_bytes > 0 || quota.max_count > 0;
	quota.bytes += held_bytes;
	quota.count += held_count;
	if (used)
		*used = quota;
	if ((quota.max_bytes > 0 && quota.bytes + (long long) total > quota.max_bytes)
		|| (quota.max_count > 0 && quota.count + 1 > quota.max_count))
	{
		maildir_why(why, whylen,
					"mailbox is full: %lld of %lld bytes and %lld of %lld messages used, "
					"this message has %zu bytes",
					quota.bytes, quota.max_bytes, quota.count, quota.max_count, total);
		rc = MAILDIR_OVER_QUOTA;
		goto fail;
	}
	file->fd = openat(md->tmp_fd, file->name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (file->fd < 0)
	{
		maildir_why(why, whylen, "cannot create a file in tmp/: %s", strerror(errno));
		goto fail;
	}
	if (!fd_write_all(file->fd, prefix, prefix_len))
	{
		maildir_why(why, whylen, "cannot write: %s", strerror(errno));
		goto fail;
	}
	copied = maildir_copy(file->fd, in, size);
	if (copied <= 0)
	{
		if (copied == 0)
		{
			maildir_why(why, whylen, "the message ended before its %zu bytes", size);
			rc = MAILDIR_SHORT_INPUT;
		}
		else
			maildir_why(why, whylen, "cannot write: %s", strerror(errno));
		goto fail;
	}
	/* Start the write-out now: the fsync of maildir_publish then mostly waits for what is under way. */
	(void) sync_file_range(file->fd, 0, 0, SYNC_FILE_RANGE_WRITE);
	return MAILDIR_DELIVERED;

fail:
	maildir_discard(md, file);
	errno = maildir_errno; /* ENOSPC, EDQUOT: the caller tells a full disk apart */
	return rc;
}

enum maildir_status
maildir_publish(struct maildir *md, struct maildir_file *file, char **delivered, char *why,
				size_t whylen)
{
	if (fsync(file->fd) != 0)
	{
		maildir_why(why, whylen, "cannot fsync: %s", strerror(errno));
		goto fail;
	}
	if (close(file->fd) != 0)
	{
		file->fd = -1;
		maildir_why(why, whylen, "cannot close: %s", strerror(errno));
		goto fail;
	}
	file->fd = -1;
	/*
	 * Never over another file: the name is unique, and a clash is refused,
	 * not replaced.  A stable name that is there already is this message,
	 * delivered by an attempt that died before it could say so: not twice.
	 */
	if (renameat2(md->tmp_fd, file->name, md->new_fd, file->final ? file->final : file->name,
				  RENAME_NOREPLACE)
		!= 0)
	{
		if (errno != EEXIST || file->final == NULL)
		{
			maildir_why(why, whylen, "cannot move the message into new/: %s", strerror(errno));
			goto fail;
		}
		unlinkat(md->tmp_fd, file->name, 0);
		file->already = true;
		file->quota_kept = false; /* counted when it was delivered */
	}
	if (delivered)
	{
		if (file->final)
		{
			*delivered = file->final;
			file->final = NULL;
		}
		else
		{
			*delivered = file->name;
			file->name = NULL;
		}
	}
	maildir_file_reset(file);
	return MAILDIR_DELIVERED;

fail:
	maildir_discard(md, file);
	errno = maildir_errno;
	return MAILDIR_IO_ERROR;
}

enum maildir_status
maildir_sync_new(struct maildir *md, char *why, size_t whylen)
{
	if (fsync(md->new_fd) == 0)
		return MAILDIR_DELIVERED;
	/* The file is in new/ already: it will be read; only its durability is in doubt. */
	maildir_why(why, whylen, "cannot fsync new/: %s", strerror(errno));
	errno = maildir_errno;
	return MAILDIR_IO_ERROR;
}
