/*
 * pepsi-stage-relay-to-maildir: deliver local recipients into Maildirs.
 *
 * One recipient per row (a row with several is split first).  The mailbox
 * of recipient local@domain is MAILDIR_ROOT/local@domain (the whole
 * address, lower-cased, so two local domains never share a mailbox; with
 * MAILBOX = localpart it is MAILDIR_ROOT/local).  The message is written as
 * Return-Path and Delivered-To, then the stored headers, CRLF and the body
 * (line ends as stored: CRLF), into tmp/ under a name unique per the
 * Maildir specification, fsynced, renamed into new/, and new/ fsynced: once
 * the row is finished the message is on disk.
 *
 * Options of its [stage-*] section (besides common/delivery.h's):
 *   MAILDIR_ROOT       the directory of the mailboxes (default [pepsi]
 *                      MAILDIR_ROOT, where ingress looks recipients up)
 *   MAILBOX            address (default) | localpart
 *   CREATE_MAILBOXES   yes: a missing mailbox is created (tmp, new, cur);
 *                      no (default): it is a permanent failure, 5.1.1
 * Errors of the file system (a full disk, permissions) are temporary.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "delivery.h"
#include "log.h"
#include "stage.h"
#include "xalloc.h"

int pepsi_stage_relay_to_maildir_main(int argc, char **argv);

static unsigned long maildir_deliveries; /* the Q of unique names */

/* The mailbox directory name for an address, or NULL when it cannot be one. */
static char *
maildir_mailbox_name(const char *address, bool localpart_only)
{
	const char *at = strrchr(address, '@');
	size_t		len = localpart_only && at ? (size_t) (at - address) : strlen(address);
	char	   *name;

	if (len == 0 || len > 255 || address[0] == '.')
		return NULL;
	name = xstrndup(address, len);
	for (char *p = name; *p; p++)
	{
		if (*p == '/' || (unsigned char) *p < 0x20 || *p == 0x7f)
		{
			free(name);
			return NULL;
		}
		*p = (char) tolower((unsigned char) *p);
	}
	return name;
}

static bool
maildir_is_dir(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool
maildir_create(const char *mailbox)
{
	static const char *const subdirs[] = {"", "/tmp", "/new", "/cur"};

	for (size_t i = 0; i < 4; i++)
	{
		char *path = xasprintf("%s%s", mailbox, subdirs[i]);
		int	  rc = mkdir(path, 0700);

		free(path);
		if (rc != 0 && errno != EEXIST)
			return false;
	}
	return true;
}

static bool
maildir_write_all(int fd, const char *data, size_t len)
{
	while (len > 0)
	{
		ssize_t n = write(fd, data, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		data += n;
		len -= (size_t) n;
	}
	return true;
}

static bool
maildir_fsync_dir(const char *path)
{
	int	 fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	bool ok;

	if (fd < 0)
		return false;
	ok = fsync(fd) == 0;
	close(fd);
	return ok;
}

/*
 * The unique name of the Maildir specification: time, then M (usec), P
 * (pid) and Q (deliveries by this process) make it unique on this host,
 * then the host name with "/" and ":" escaped.
 */
static char *
maildir_unique_name(void)
{
	struct timeval tv;
	char		   host[256];
	struct buf	   safe = BUF_INIT;
	char		  *name;

	gettimeofday(&tv, NULL);
	if (gethostname(host, sizeof(host)) != 0)
		snprintf(host, sizeof(host), "localhost");
	host[sizeof(host) - 1] = '\0';
	for (const char *p = host; *p; p++)
	{
		if (*p == '/')
			buf_append_str(&safe, "\\057");
		else if (*p == ':')
			buf_append_str(&safe, "\\072");
		else
			buf_append_char(&safe, *p);
	}
	name = xasprintf("%lld.M%ldP%dQ%lu.%s", (long long) tv.tv_sec, (long) tv.tv_usec,
					 (int) getpid(), ++maildir_deliveries, safe.data ? safe.data : "localhost");
	buf_free(&safe);
	return name;
}

/* Write the message into mailbox; false with errno set on a file-system error. */
static bool
maildir_deliver(const char *mailbox, const struct buf *prefix, const struct buf *headers,
				const struct buf *body, char **delivered_as)
{
	char *unique = maildir_unique_name();
	char *tmp_path = xasprintf("%s/tmp/%s", mailbox, unique);
	char *new_dir = xasprintf("%s/new", mailbox);
	char *new_path = xasprintf("%s/new/%s", mailbox, unique);
	int	  fd = -1;
	int	  saved;
	bool  ok = false;

	fd = open(tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		goto done;
	if (!maildir_write_all(fd, prefix->data, prefix->len)
		|| !maildir_write_all(fd, headers->data, headers->len)
		|| !maildir_write_all(fd, "\r\n", 2)
		|| !maildir_write_all(fd, body->data ? body->data : "", body->len)
		|| fsync(fd) != 0)
		goto done;
	if (close(fd) != 0)
	{
		fd = -1;
		goto done;
	}
	fd = -1;
	if (rename(tmp_path, new_path) != 0 || !maildir_fsync_dir(new_dir))
		goto done;
	*delivered_as = new_path;
	new_path = NULL;
	ok = true;
done:
	saved = errno;
	if (fd >= 0)
		close(fd);
	if (!ok)
		unlink(tmp_path);
	free(unique);
	free(tmp_path);
	free(new_dir);
	free(new_path);
	errno = saved;
	return ok;
}

/* The choices of MAILBOX (common/options.def), in order. */
enum maildir_mailbox
{
	MAILDIR_MAILBOX_ADDRESS,
	MAILDIR_MAILBOX_LOCALPART
};

/* The section's MAILDIR_ROOT (section_root), else [pepsi]'s: one place for ingress and delivery. */
static const char *
maildir_root(const struct pepsi_config *cfg, const char *section_root)
{
	return section_root ? section_root : config_text(cfg, "pepsi", "MAILDIR_ROOT");
}

static int
maildir_run(struct pepsi_ctx *ctx)
{
	const char			  *root = maildir_root(pepsi_config(ctx), pepsi_option(ctx, "MAILDIR_ROOT"));
	bool				   localpart = pepsi_option_enum(ctx, "MAILBOX") == MAILDIR_MAILBOX_LOCALPART;
	bool				   create = pepsi_option_bool(ctx, "CREATE_MAILBOXES");
	const struct buf	  *headers;
	const struct buf	  *body;
	const char			  *rcpt;
	char				  *name = NULL;
	char				  *mailbox = NULL;
	char				  *delivered_as = NULL;
	struct buf			   prefix = BUF_INIT;
	struct buf			   diagnostic = BUF_INIT;
	struct delivery_report report = {.relay = "local"};
	int					   rc;

	if (pepsi_rcpt_count(ctx) > 1 && pepsi_split_to_one_per_row(ctx) < 0)
		return -1;
	if ((headers = pepsi_headers(ctx)) == NULL || (body = pepsi_body(ctx)) == NULL)
		return -1;
	rcpt = pepsi_rcpt(ctx, 0);
	if (root == NULL)
		return pepsi_error(ctx, "[stage-%s] has no MAILDIR_ROOT", pepsi_stage_name(ctx));

	if ((name = maildir_mailbox_name(rcpt, localpart)) == NULL)
	{
		buf_printf(&diagnostic, "X-Pepsi; <%s> cannot name a mailbox", rcpt);
		report.status = "5.1.3";
		report.diagnostic = diagnostic.data;
		rc = delivery_bounced(ctx, &report);
		goto done;
	}
	mailbox = xasprintf("%s/%s", root, name);
	errno = 0;
	if (!maildir_is_dir(mailbox))
	{
		bool missing = errno == ENOENT || errno == ENOTDIR || errno == 0;

		if (create && !maildir_create(mailbox))
		{
			buf_printf(&diagnostic, "X-Pepsi; cannot create the mailbox of <%s>: %s", rcpt,
					   strerror(errno));
			report.status = "4.2.0";
			report.diagnostic = diagnostic.data;
			rc = delivery_deferred(ctx, &report);
			goto done;
		}
		if (!create && missing)
		{
			buf_printf(&diagnostic, "X-Pepsi; mailbox <%s> does not exist", rcpt);
			report.status = "5.1.1";
			report.diagnostic = diagnostic.data;
			rc = delivery_bounced(ctx, &report);
			goto done;
		}
	}

	buf_printf(&prefix, "Return-Path: <%s>\r\nDelivered-To: %s\r\n", pepsi_mail_from(ctx), rcpt);
	if (!maildir_deliver(mailbox, &prefix, headers, body, &delivered_as))
	{
		/* A full disk, permissions, I/O: the operator can fix it; retry. */
		int saved = errno;

		buf_printf(&diagnostic, "X-Pepsi; cannot write to mailbox %s: %s", mailbox, strerror(saved));
		report.status = saved == ENOSPC || saved == EDQUOT ? "4.2.2" : "4.3.0";
		report.diagnostic = diagnostic.data;
		rc = delivery_deferred(ctx, &report);
		goto done;
	}
	log_debug("row %lld: <%s> delivered to %s", pepsi_id(ctx), rcpt, delivered_as);
	buf_printf(&diagnostic, "X-Pepsi; delivered to maildir");
	report.status = "2.0.0";
	report.diagnostic = diagnostic.data;
	rc = delivery_succeeded(ctx, "delivered", &report, false);
done:
	free(name);
	free(mailbox);
	free(delivered_as);
	buf_free(&prefix);
	buf_free(&diagnostic);
	return rc;
}

/* A row with several recipients is split, which a fused pass cannot do. */
static bool
maildir_can_fuse(struct pepsi_ctx *ctx)
{
	return pepsi_rcpt_count(ctx) <= 1;
}

/* What the schema cannot say alone: that there is a MAILDIR_ROOT, and that it is a directory. */
static bool
maildir_check_config(const struct pepsi_config *cfg, const char *section, char *err, size_t errlen)
{
	const char *root = maildir_root(cfg, config_get(cfg, section, "MAILDIR_ROOT"));

	if (root == NULL)
	{
		snprintf(err, errlen, "%s: [%s] needs MAILDIR_ROOT (the directory of the mailboxes)",
				 cfg->path, section);
		return false;
	}
	if (!maildir_is_dir(root))
	{
		snprintf(err, errlen, "%s: [%s] MAILDIR_ROOT %s is not a directory", cfg->path, section, root);
		return false;
	}
	return true;
}

const struct pepsi_stage pepsi_stage_relay_to_maildir_stage = {
	.program = "pepsi-stage-relay-to-maildir",
	.load = PEPSI_LOAD_FULL,
	.run = maildir_run,
	.can_fuse = maildir_can_fuse,
	.check_config = maildir_check_config,
};

int
pepsi_stage_relay_to_maildir_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_relay_to_maildir_stage, argc, argv);
}
