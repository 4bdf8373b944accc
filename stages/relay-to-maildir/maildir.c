/*
 * pepsi-stage-relay-to-maildir: deliver local recipients into Maildirs.
 *
 * One recipient per row (a row with several is split first).  The stage
 * names the mailbox (MAILBOX: the whole address, lower-cased, so two local
 * domains never share a mailbox, or its local part) and hands the message
 * on a pipe to pepsi-helper-maildir-writer(8), which writes it as the
 * mailbox's owner (common/delivery/maildir.c: Return-Path and Delivered-To, then the
 * stored headers, CRLF and the body, into tmp/, fsynced, renamed into new/,
 * new/ fsynced) and answers with one status line.  Installed, the helper is
 * set-user-id root and this stage set-group-id to its caller group; in a
 * development tree neither has a bit and the helper runs as this stage's
 * user: the same pipe, the same code.
 *
 * The rows waiting for a worker come as a batch (batch_max): prepare hands
 * them all to the helper, which writes every file, then fsyncs and
 * publishes them and fsyncs each new/ once before it answers; run then
 * concludes each row from its reply, and the rows commit after that.
 * Each file's name in new/ is stable, from the row (maildir_job_init), so
 * a worker killed after the helper published a batch and before the rows
 * committed does not have the retry deliver them twice: the helper finds
 * the name in new/ at its rename, and for a row a crash sent back
 * (pepsi_crash_retry) also in cur/ before it writes (the man page says
 * what is not covered).
 * In the multi-call binary the stage also runs fused after one that loaded
 * less (late_load), vacation: the rows going on to it have their bodies
 * loaded in that pass and are delivered as one batch the same way.
 *
 * Options of its [stage-*] section (besides common/delivery/delivery.h's):
 *   MAILDIR_ROOT           the directory of the virtual mailboxes (default
 *                          [pepsi] MAILDIR_ROOT, where ingress looks
 *                          recipients up); the helper reads it itself
 *   MAILBOX                address (default) | localpart
 *   CREATE_MAILBOXES       yes: a missing mailbox is created (tmp, new, cur);
 *                          no (default): it is a permanent failure, 5.1.1
 *   MAILDIR_WRITER         the helper (default, and always when this stage
 *                          runs set-group-id: the one beside this program)
 *   MAILDIR_WRITER_CONFIG  the file it reads (default: this stage's own)
 *   OVER_QUOTA_STATUS      5.2.2 (bounce, default) or 4.2.2 (retry)
 *   QUOTA_WARNING          the percentages of the quota at which the owner
 *                          is warned, once per crossing (quota.c)
 *   QUOTA_WARNING_STAGE    where the warning starts (default init)
 * A helper that dies, or a file-system error, is a temporary failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "delivery/delivery.h"
#include "delivery/maildir.h"
#include "process/privilege.h"
#include "quota.h"
#include "runtime/stage.h"

int pepsi_stage_relay_to_maildir_main(int argc, char **argv);

extern char **environ;

#define MAILDIR_REPLY_MAX 2048
/* The most rows delivered as one batch: the helper holds at most as many (WRITER_BATCH_MAX). */
#define MAILDIR_BATCH_MAX 64

/* What the helper answered: its status code and sentence, or why there was none. */
struct maildir_reply
{
	char status[16];
	char text[MAILDIR_REPLY_MAX];
};

static bool
maildir_is_dir(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/*
 * The helper to run: a path as given (only pepsi.conf can give one), else
 * the program of that name beside this one, never a search of PATH.  Set
 * group-id, only pepsi-helper-maildir-writer beside us, whatever the
 * configuration says: the group's right must not pass to another program.
 */
static char *
maildir_writer_path(const char *program)
{
	char	path[PATH_MAX];
	ssize_t n;
	char   *slash;

	if (privilege_running_setid())
		program = "pepsi-helper-maildir-writer";
	else if (strchr(program, '/'))
		return xstrdup(program);
	n = readlink("/proc/self/exe", path, sizeof(path) - 1);
	if (n <= 0)
		return NULL;
	path[n] = '\0';
	slash = strrchr(path, '/');
	if (slash)
		*slash = '\0';
	slash = strrchr(program, '/');
	return xasprintf("%s/%s", path, slash ? slash + 1 : program);
}

/*
 * The helper of this worker: one process serves request after request for
 * as long as they are the same owner's (all of them, for virtual
 * mailboxes), so a delivery costs no exec and no reading of the
 * configuration.  It ends after anything but a delivery.  Its replies are
 * read through a buffer, not a byte per system call.
 */
static struct
{
	pid_t  pid; /* 0: none */
	int	   to_fd;
	int	   from_fd;
	char  *writer;
	char  *config_path;
	char   input[4096];
	size_t start; /* input[start .. end): read, not yet taken */
	size_t end;
} maildir_writer = {.pid = 0, .to_fd = -1, .from_fd = -1};

/* Close the pipes and reap the helper; its wait status, or -1. */
static int
maildir_writer_end(void)
{
	int status = -1;

	if (maildir_writer.to_fd >= 0)
		close(maildir_writer.to_fd);
	if (maildir_writer.from_fd >= 0)
		close(maildir_writer.from_fd);
	while (maildir_writer.pid > 0 && waitpid(maildir_writer.pid, &status, 0) < 0)
		if (errno != EINTR)
		{
			status = -1;
			break;
		}
	free(maildir_writer.writer);
	free(maildir_writer.config_path);
	maildir_writer.pid = 0;
	maildir_writer.to_fd = maildir_writer.from_fd = -1;
	maildir_writer.writer = maildir_writer.config_path = NULL;
	maildir_writer.start = maildir_writer.end = 0;
	return status;
}

static bool
maildir_writer_start(const char *writer, const char *config_path, struct maildir_reply *reply)
{
	posix_spawn_file_actions_t actions;
	posix_spawnattr_t		   attr;
	sigset_t				   defaults;
	int						   to_writer[2] = {-1, -1};
	int						   from_writer[2] = {-1, -1};
	char					  *config_copy = xstrdup(config_path);
	char					   program_name[] = "pepsi-helper-maildir-writer";
	char					   config_flag[] = "-c";
	char					  *argv[] = {program_name, config_flag, config_copy, NULL};
	char					  *envp[] = {NULL};
	pid_t					   pid;
	int						   rc;

	signal(SIGPIPE, SIG_IGN); /* a helper that refuses early closes its input */
	if (pipe2(to_writer, O_CLOEXEC) != 0 || pipe2(from_writer, O_CLOEXEC) != 0)
	{
		snprintf(reply->text, sizeof(reply->text), "pipe: %s", strerror(errno));
		rc = -1;
		goto done;
	}
	posix_spawn_file_actions_init(&actions);
	posix_spawn_file_actions_adddup2(&actions, to_writer[0], 0);
	posix_spawn_file_actions_adddup2(&actions, from_writer[1], 1);
	posix_spawnattr_init(&attr);
	sigemptyset(&defaults);
	sigaddset(&defaults, SIGPIPE);
	posix_spawnattr_setsigdefault(&attr, &defaults);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
	/* Set-group-id: the group taken up for this one execution, then set aside again. */
	if (!privilege_exec_group(true, reply->text, sizeof(reply->text)))
		rc = EPERM;
	else
	{
		rc = posix_spawn(&pid, writer, &actions, &attr, argv, envp);
		if (!privilege_exec_group(false, reply->text, sizeof(reply->text)))
			fatalx("%s", reply->text);
		if (rc != 0)
			snprintf(reply->text, sizeof(reply->text), "cannot run the maildir writer %s: %s", writer,
					 strerror(rc));
	}
	posix_spawn_file_actions_destroy(&actions);
	posix_spawnattr_destroy(&attr);
done:
	free(config_copy);
	if (rc != 0)
	{
		for (int i = 0; i < 2; i++)
		{
			if (to_writer[i] >= 0)
				close(to_writer[i]);
			if (from_writer[i] >= 0)
				close(from_writer[i]);
		}
		return false;
	}
	close(to_writer[0]);
	close(from_writer[1]);
	maildir_writer.pid = pid;
	maildir_writer.to_fd = to_writer[1];
	maildir_writer.from_fd = from_writer[0];
	maildir_writer.writer = xstrdup(writer);
	maildir_writer.config_path = xstrdup(config_path);
	maildir_writer.start = maildir_writer.end = 0;
	return true;
}

/* One line from the helper (without its newline); false at its end. */
static bool
maildir_writer_read_line(char *line, size_t size)
{
	size_t got = 0;

	for (;;)
	{
		char  *nl;
		size_t take;

		if (maildir_writer.start == maildir_writer.end)
		{
			ssize_t n = read(maildir_writer.from_fd, maildir_writer.input, sizeof(maildir_writer.input));

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				return false;
			maildir_writer.start = 0;
			maildir_writer.end = (size_t) n;
		}
		nl = memchr(maildir_writer.input + maildir_writer.start, '\n',
					maildir_writer.end - maildir_writer.start);
		take = (nl ? (size_t) (nl - maildir_writer.input) : maildir_writer.end) - maildir_writer.start;
		/* What does not fit the line is dropped: the reply is checked, never trusted to be short. */
		if (got + take >= size)
			take = got + 1 < size ? size - 1 - got : 0;
		memcpy(line + got, maildir_writer.input + maildir_writer.start, take);
		got += take;
		maildir_writer.start = nl ? (size_t) (nl - maildir_writer.input) + 1 : maildir_writer.end;
		if (nl)
		{
			line[got] = '\0';
			return true;
		}
	}
}

/* One row of a batch for the helper: its request, and what the helper answered. */
struct maildir_job
{
	struct pepsi_ctx		 *ctx;
	char					 *name; /* the mailbox */
	struct buf				  request;
	bool					  answered;
	struct maildir_reply	  reply;
	bool					  quota_parsed; /* the reply's use, taken off its text into quota */
	struct maildir_quota_item quota;
};

/* Why the helper answered no more: its end, in a sentence, as every unanswered row's reply. */
static void
maildir_writer_lost(struct maildir_job *jobs, size_t n)
{
	int	 status = maildir_writer_end();
	char text[256];

	if (status != -1 && WIFSIGNALED(status))
		snprintf(text, sizeof(text), "the maildir writer was killed by signal %d", WTERMSIG(status));
	else
		snprintf(text, sizeof(text), "the maildir writer gave no answer (exit status %d)",
				 status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	for (size_t i = 0; i < n; i++)
		if (!jobs[i].answered)
		{
			snprintf(jobs[i].reply.status, sizeof(jobs[i].reply.status), "4.3.0");
			snprintf(jobs[i].reply.text, sizeof(jobs[i].reply.text), "%s", text);
			jobs[i].answered = true;
		}
}

/* Send the unanswered jobs' requests, each with its message, the batch's last without "hold". */
static void
maildir_writer_send(struct maildir_job *jobs, size_t n)
{
	struct buf head = BUF_INIT;
	size_t	   last = n;

	for (size_t i = 0; i < n; i++)
		if (!jobs[i].answered)
			last = i;
	for (size_t i = 0; i < n; i++)
	{
		const struct buf *headers;
		const struct buf *body;
		bool			  sent;

		if (jobs[i].answered)
			continue;
		headers = pepsi_headers(jobs[i].ctx);
		body = pepsi_body(jobs[i].ctx);
		/* The request, its end and the headers in one write; the body straight from the row. */
		buf_append(&head, jobs[i].request.data, jobs[i].request.len);
		buf_append_str(&head, i == last ? "\n" : "hold yes\n\n");
		buf_append(&head, headers->data ? headers->data : "", headers->len);
		buf_append_str(&head, "\r\n");
		sent = fd_write_all(maildir_writer.to_fd, head.data, head.len)
			   && fd_write_all(maildir_writer.to_fd, body->data ? body->data : "", body->len);
		buf_reset(&head);
		/* A write the helper did not wait for (it refused, and ended) shows in its answers. */
		if (!sent)
			break;
	}
	buf_free(&head);
}

/*
 * Have the helper deliver the jobs (all of the same writer and
 * configuration): every request and message down its standard input, the
 * batch's replies back, in order.  A helper that ends after a refusal or
 * an "again" (another owner) leaves the requests after it unanswered:
 * they go to a new helper, for as long as each one answers some.  Every
 * job has its reply at the end, a 4.3.0 when the helper could not run or
 * ended without answering.
 */
static void
maildir_writer_deliver(struct maildir_job *jobs, size_t n, const char *writer, const char *config_path)
{
	struct maildir_reply cannot = {.status = ""};
	size_t				 waiting = 0;

	for (size_t i = 0; i < n; i++)
		waiting += !jobs[i].answered;
	if (waiting == 0)
		return; /* answered without the helper (a quota) */

	/* A helper of another program or file is not ours to reuse. */
	if (maildir_writer.pid > 0
		&& (strcmp(maildir_writer.writer, writer) != 0 || strcmp(maildir_writer.config_path, config_path) != 0))
		maildir_writer_end();
	for (;;)
	{
		size_t answered = 0;
		size_t left = 0;
		bool   ended = false;

		if (maildir_writer.pid == 0 && !maildir_writer_start(writer, config_path, &cannot))
		{
			for (size_t i = 0; i < n; i++)
				if (!jobs[i].answered)
				{
					snprintf(jobs[i].reply.status, sizeof(jobs[i].reply.status), "4.3.0");
					memcpy(jobs[i].reply.text, cannot.text, sizeof(jobs[i].reply.text));
					jobs[i].answered = true;
				}
			return;
		}
		maildir_writer_send(jobs, n);
		for (size_t i = 0; i < n && !ended; i++)
		{
			char  answer[MAILDIR_REPLY_MAX + 32];
			char *space;

			if (jobs[i].answered)
				continue;
			if (!maildir_writer_read_line(answer, sizeof(answer)))
				break;
			answered++;
			/* Another owner than the one the helper became: a new helper for it and the rest. */
			if (strncmp(answer, "again ", 6) == 0)
			{
				ended = true;
				break;
			}
			space = strchr(answer, ' ');
			jobs[i].answered = true;
			if (space == NULL || space - answer >= (long) sizeof(jobs[i].reply.status) || answer[1] != '.'
				|| (answer[0] != '2' && answer[0] != '4' && answer[0] != '5'))
			{
				snprintf(jobs[i].reply.status, sizeof(jobs[i].reply.status), "4.3.0");
				snprintf(jobs[i].reply.text, sizeof(jobs[i].reply.text),
						 "the maildir writer answered \"%.100s\"", answer);
				ended = true;
				continue;
			}
			*space = '\0';
			memcpy(jobs[i].reply.status, answer, (size_t) (space - answer) + 1);
			snprintf(jobs[i].reply.text, sizeof(jobs[i].reply.text), "%s", space + 1);
			/* Anything but a delivery ends the helper. */
			if (answer[0] != '2')
				ended = true;
		}
		for (size_t i = 0; i < n; i++)
			left += !jobs[i].answered;
		if (left == 0 && !ended)
			return;
		if (answered == 0)
		{
			maildir_writer_lost(jobs, n); /* killed, or gone without a word: no second try now */
			return;
		}
		maildir_writer_end();
		if (left == 0)
			return;
	}
}

/* The choices of MAILBOX (schema/options.def), in order. */
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

/* The choices of OVER_QUOTA_STATUS (schema/options.def), in order. */
enum maildir_over_quota
{
	MAILDIR_OVER_QUOTA_BOUNCE,
	MAILDIR_OVER_QUOTA_RETRY
};

/* The helper and the file it reads, for this row's section. */
static void
maildir_writer_for(struct pepsi_ctx *ctx, char **writer, const char **config_path)
{
	const char *config = pepsi_option_text(ctx, "MAILDIR_WRITER_CONFIG");

	*writer = maildir_writer_path(pepsi_option_text(ctx, "MAILDIR_WRITER"));
	*config_path = config ? config : pepsi_config(ctx)->path;
}

/*
 * The request for a row of one recipient whose mailbox has a name (the
 * helper's lines, without the empty one).  Its stable name: the row's
 * received time (seconds, then M and the microseconds), then K, the row's
 * id and the recipient's index, the same on every attempt (the time
 * keeps it unique when a restored or renumbered queue reuses an id).  A
 * file of that name in new/ is this delivery made already; after a crash
 * (pepsi_crash_retry) the helper also looks in new/ and cur/ first.
 */
static void
maildir_job_init(struct pepsi_ctx *ctx, char *name, struct maildir_job *job)
{
	const struct buf *headers = pepsi_headers(ctx);
	const struct buf *body = pepsi_body(ctx);
	long long		  received = pepsi_received_us(ctx);

	memset(job, 0, sizeof(*job));
	job->ctx = ctx;
	job->name = name;
	buf_printf(&job->request,
			   "section stage-%s\nrecipient %s\nsender %s\nmailbox %s\ncreate %s\nsize %zu\n"
			   "stable %lld.M%06lldK%lld_0\n%s",
			   pepsi_stage_name(ctx), pepsi_rcpt(ctx, 0), pepsi_mail_from(ctx), name,
			   pepsi_option_bool(ctx, "CREATE_MAILBOXES") ? "yes" : "no",
			   (headers ? headers->len : 0) + 2 + (body ? body->len : 0), received / 1000000,
			   received % 1000000, pepsi_id(ctx), pepsi_crash_retry(ctx) ? "lookup yes\n" : "");
}

/*
 * The quota in force for the job's recipient (answer: its part of
 * maildir_quota_lookup's, NULL when the database could not answer), or
 * no delivery at all today: the job is then answered without the helper.
 */
static void
maildir_job_quota(struct maildir_job *job, const json_t *answer)
{
	if (answer != NULL && maildir_quota_apply(answer, pepsi_rcpt(job->ctx, 0), &job->request, job->reply.text, sizeof(job->reply.text)))
		return;
	job->answered = true;
	snprintf(job->reply.status, sizeof(job->reply.status), answer != NULL ? "5.2.2" : "4.3.0");
	if (answer == NULL)
		snprintf(job->reply.text, sizeof(job->reply.text), "the mailbox's quota cannot be read");
}

static void
maildir_job_free(struct maildir_job *job)
{
	free(job->name);
	buf_free(&job->request);
}

/* The batch the helper delivered before the passes (maildir_prepare); run concludes each row from it. */
static struct maildir_job *maildir_batch;
static size_t			   maildir_batch_len;

static void
maildir_batch_free(void)
{
	for (size_t i = 0; i < maildir_batch_len; i++)
		maildir_job_free(&maildir_batch[i]);
	free(maildir_batch);
	maildir_batch = NULL;
	maildir_batch_len = 0;
}

/*
 * Deliver the batch's rows at once: one helper, their files written, then
 * fsynced and renamed, their new/ fsynced once, before any row commits.
 * The rows of one recipient and a mailbox name, of the first row's helper
 * and configuration; run delivers any other alone.
 */
/* The batch's quotas with one statement, then its uses recorded with one more after the helper answered. */
static void
maildir_batch_quota_before(void)
{
	const char **rcpts = xcalloc(maildir_batch_len, sizeof(*rcpts));
	json_t		*answers;

	for (size_t i = 0; i < maildir_batch_len; i++)
		rcpts[i] = pepsi_rcpt(maildir_batch[i].ctx, 0);
	answers = maildir_quota_lookup(maildir_batch[0].ctx, rcpts, maildir_batch_len);
	for (size_t i = 0; i < maildir_batch_len; i++)
		maildir_job_quota(&maildir_batch[i], json_array_get(answers, i));
	json_decref(answers);
	free(rcpts);
}

static void
maildir_batch_quota_after(void)
{
	struct maildir_quota_item *items = xcalloc(maildir_batch_len, sizeof(*items));
	size_t					   n = 0;

	for (size_t i = 0; i < maildir_batch_len; i++)
	{
		struct maildir_job *job = &maildir_batch[i];

		job->quota.ctx = job->ctx;
		job->quota.rcpt = pepsi_rcpt(job->ctx, 0);
		job->quota_parsed = maildir_quota_parse(job->reply.status, job->reply.text, &job->quota.use);
		if (job->quota_parsed)
			items[n++] = job->quota;
	}
	maildir_quota_record(items, n);
	n = 0;
	for (size_t i = 0; i < maildir_batch_len; i++)
		if (maildir_batch[i].quota_parsed)
			maildir_batch[i].quota = items[n++];
	free(items);
}

/*
 * Deliver the batch's rows at once: one helper, their files written, then
 * fsynced and renamed, their new/ fsynced once, before any row commits.
 * The rows of one recipient and a mailbox name, of the first row's helper
 * and configuration; run delivers any other alone.  Their quotas are read
 * with one statement before, and their uses recorded with one after.
 */
static void
maildir_prepare(struct pepsi_ctx *const *ctxs, size_t count)
{
	char	   *writer = NULL;
	const char *config_path = NULL;

	maildir_batch_free();
	maildir_batch = xcalloc(count, sizeof(*maildir_batch));
	for (size_t i = 0; i < count; i++)
	{
		struct pepsi_ctx *ctx = ctxs[i];
		const char		 *root = maildir_root(pepsi_config(ctx), pepsi_option(ctx, "MAILDIR_ROOT"));
		char			 *name;
		char			 *row_writer;
		const char		 *row_config;

		if (pepsi_rcpt_count(ctx) != 1 || root == NULL || pepsi_headers(ctx) == NULL
			|| pepsi_body(ctx) == NULL)
			continue;
		if ((name = maildir_mailbox_name(pepsi_rcpt(ctx, 0), pepsi_option_enum(ctx, "MAILBOX") == MAILDIR_MAILBOX_LOCALPART)) == NULL)
			continue;
		maildir_writer_for(ctx, &row_writer, &row_config);
		if (row_writer == NULL || (writer && (strcmp(row_writer, writer) != 0 || strcmp(row_config, config_path) != 0)))
		{
			free(row_writer);
			free(name);
			continue;
		}
		if (writer == NULL)
		{
			writer = row_writer;
			config_path = row_config;
		}
		else
			free(row_writer);
		maildir_job_init(ctx, name, &maildir_batch[maildir_batch_len++]);
	}
	if (maildir_batch_len > 0)
	{
		maildir_batch_quota_before();
		maildir_writer_deliver(maildir_batch, maildir_batch_len, writer, config_path);
		maildir_batch_quota_after();
	}
	free(writer);
}

static int
maildir_run(struct pepsi_ctx *ctx)
{
	const struct pepsi_config *cfg = pepsi_config(ctx);
	const char				  *root = maildir_root(cfg, pepsi_option(ctx, "MAILDIR_ROOT"));
	bool					   localpart = pepsi_option_enum(ctx, "MAILBOX") == MAILDIR_MAILBOX_LOCALPART;
	const char				  *rcpt;
	char					  *name = NULL;
	char					  *writer = NULL;
	const char				  *config_path;
	struct maildir_job		   alone;
	struct maildir_job		  *job = NULL;
	struct buf				   diagnostic = BUF_INIT;
	struct maildir_reply	  *reply;
	struct delivery_report	   report = {.relay = "local"};
	int						   rc;

	if (pepsi_rcpt_count(ctx) > 1 && pepsi_split_to_one_per_row(ctx) < 0)
		return -1;
	if (pepsi_headers(ctx) == NULL || pepsi_body(ctx) == NULL)
		return -1;
	rcpt = pepsi_rcpt(ctx, 0);
	if (root == NULL)
		return pepsi_error(ctx, "[stage-%s] has no MAILDIR_ROOT", pepsi_stage_name(ctx));

	for (size_t i = 0; i < maildir_batch_len && job == NULL; i++)
		if (maildir_batch[i].ctx == ctx && maildir_batch[i].answered)
		{
			job = &maildir_batch[i];
			job->ctx = NULL; /* this pass's reply: not again for a later hop of the same row */
		}
	if (job == NULL)
	{
		/* Never a path: "/", "..", control characters and over-long names stop here (and in the helper). */
		if ((name = maildir_mailbox_name(rcpt, localpart)) == NULL)
		{
			buf_printf(&diagnostic, "X-Pepsi; <%s> cannot name a mailbox", rcpt);
			report.status = "5.1.3";
			report.diagnostic = diagnostic.data;
			rc = delivery_bounced(ctx, &report);
			goto done;
		}
		maildir_writer_for(ctx, &writer, &config_path);
		if (writer == NULL)
		{
			free(name);
			return pepsi_error(ctx, "cannot find my own executable");
		}
		maildir_job_init(ctx, name, &alone);
		{
			json_t *answers = maildir_quota_lookup(ctx, &rcpt, 1);

			maildir_job_quota(&alone, json_array_get(answers, 0));
			json_decref(answers);
		}
		maildir_writer_deliver(&alone, 1, writer, config_path);
		job = &alone;
	}
	reply = &job->reply;
	if (job->quota_parsed)
		maildir_quota_warn_after(ctx, &job->quota); /* recorded with the batch's */
	else
		maildir_quota_after(ctx, rcpt, reply->status, reply->text);
	buf_printf(&diagnostic, "X-Pepsi; %s", reply->text);
	report.status = reply->status;
	report.diagnostic = diagnostic.data;
	if (reply->status[0] == '2')
	{
		/* The file's name is for the debug log; the delivery log says where, not which file. */
		log_debug("%s: row %lld: <%s> %s", pepsi_queue_id(ctx), pepsi_id(ctx), rcpt, reply->text);
		buf_reset(&diagnostic);
		buf_printf(&diagnostic, "X-Pepsi; delivered to maildir");
		report.diagnostic = diagnostic.data;
		rc = delivery_succeeded(ctx, "delivered", &report, false);
	}
	else if (strcmp(reply->status, "5.2.2") == 0)
	{
		bool retry = pepsi_option_enum(ctx, "OVER_QUOTA_STATUS") == MAILDIR_OVER_QUOTA_RETRY;

		report.status = retry ? "4.2.2" : "5.2.2";
		rc = retry ? delivery_deferred(ctx, &report) : delivery_bounced(ctx, &report);
	}
	else if (reply->status[0] == '5')
		rc = delivery_bounced(ctx, &report);
	else
		rc = delivery_deferred(ctx, &report); /* a full disk, permissions, a killed helper: retry */
	if (job == &alone)
		maildir_job_free(&alone);
done:
	free(writer);
	buf_free(&diagnostic);
	return rc;
}

/*
 * A row with several recipients is split, which a fused pass cannot do.
 * Loaded late, only after a stage that loaded the headers (vacation, one
 * batch of rows for a few mailboxes), not after a body-free route: its
 * batches are long and its workers few, and the deliveries of a route
 * to local mail would all go through them.
 */
static bool
maildir_can_fuse(struct pepsi_ctx *ctx)
{
	return pepsi_rcpt_count(ctx) <= 1 && pepsi_loaded(ctx) >= PEPSI_LOAD_HEADERS;
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
	.batch_max = MAILDIR_BATCH_MAX,
	.prepare = maildir_prepare,
	.late_load = true,
};

int
pepsi_stage_relay_to_maildir_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_relay_to_maildir_stage, argc, argv);
}
