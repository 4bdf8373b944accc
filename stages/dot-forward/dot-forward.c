/*
 * pepsi-stage-dot-forward: a local user's ~/.forward, as sendmail and
 * Postfix local(8) honour it (docs/pepsi-stage-dot-forward.8.md).
 *
 * A recipient of one of LOCAL_DOMAINS whose local part is a system user
 * is looked up through pepsi-helper-dot-forward, the setuid-root helper
 * that reads the file as its owner (this stage runs setgid to the one
 * group that may run the helper; spec 22.2).  A row with several such
 * recipients is split first, one per row, since each gets its own
 * Delivered-To.  What the .forward says:
 *   addresses   the message goes on to them at FORWARD_STAGE (through
 *               SRS and ARC in the sample graph), with "Delivered-To:
 *               <recipient>" prepended;
 *   \user       a local copy: the recipient (or that user) goes on to
 *               NEXT_STAGE untouched, as if there were no .forward;
 *   |command    run as the user with a clean environment, when
 *   /path       ALLOW_FORWARD_PIPES / ALLOW_FORWARD_FILES say so; else the
 *               entry bounces (5.7.1) and the others still happen.
 * Several outcomes at once are one fan_out: the local copy and a bounce
 * for refused entries are siblings, the row itself becomes the forward.
 * A recipient already named by a Delivered-To field is a forwarding loop:
 * it bounces with 5.4.6.  No user, no .forward, or one that is not safe
 * (owned by someone else, group- or world-writable: logged, as sendmail
 * does): the row goes on to NEXT_STAGE as it is.  A command that fails
 * temporarily defers the row; those already run are remembered in
 * state.dot_forward_done and not run again.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "delivery/delivery.h"
#include "local/local.h"
#include "message/header.h"
#include "process/helper_call.h"
#include "process/privilege.h"
#include "runtime/stage.h"

int pepsi_stage_dot_forward_main(int argc, char **argv);

#define FORWARD_HELPER_NAME "pepsi-helper-dot-forward"
/* The most a helper may answer (a .forward is at most 64 KiB). */
#define FORWARD_MAX_ANSWER (1024 * 1024)

/* What one recipient's .forward comes to. */
struct forward_plan
{
	char	  **forwards; /* addresses the message is forwarded to */
	size_t		nforwards;
	char	  **locals; /* recipients delivered here without .forward */
	size_t		nlocals;
	struct buf	refused; /* why entries bounce, "; " separated */
	const char *refused_status;
	struct buf	deferred;  /* why a command must be tried again */
	json_t	   *done;	   /* "pipe COMMAND" / "file PATH" delivered, this pass or before */
	size_t		delivered; /* commands and files delivered */
};

/* The helper: HELPER, else beside this program (common/process/helper_call.h). */
static char *
forward_helper_path(struct pepsi_ctx *ctx)
{
	return helper_call_path(pepsi_option_text(ctx, "HELPER"), FORWARD_HELPER_NAME);
}

/* Run the helper (common/process/helper_call.h). */
static bool
forward_call_helper(const char *path, const char *const *argv, const struct buf *input,
					struct buf *answer, char *err, size_t errlen)
{
	return helper_call(path, argv, input, FORWARD_MAX_ANSWER, answer, err, errlen);
}

/*
 * Whether user is a system user, the answer kept for
 * FORWARD_PASSWD_TTL_SECONDS.  Every row asks (forward_can_fuse, and
 * again in its pass when it stays), and a burst to one mailbox asks for
 * the same name at every row.  A name that is no system user, a virtual
 * mailbox's, is the costly answer: Debian 12's nsswitch.conf ends the
 * passwd line with systemd, whose module looks through every userdb
 * directory before it says no, about 150 us of CPU a lookup here (12 us
 * for a user /etc/passwd has), a tenth of what a burst's message cost the
 * whole machine through make run's graph.  A user added or removed is
 * seen within the TTL; the helper looks the user up again before it
 * reads a .forward, so a stale yes only costs a pass that finds no file.
 */
#define FORWARD_PASSWD_TTL_SECONDS 1.0
#define FORWARD_PASSWD_CACHE 16

static bool
forward_is_system_user(const char *user)
{
	static struct
	{
		char   name[33];
		bool   exists;
		double at;
	} cache[FORWARD_PASSWD_CACHE];
	struct timespec ts;
	double			now;
	int				oldest = 0;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
	for (int i = 0; i < FORWARD_PASSWD_CACHE; i++)
	{
		if (cache[i].at > 0 && now - cache[i].at < FORWARD_PASSWD_TTL_SECONDS
			&& strcmp(cache[i].name, user) == 0)
			return cache[i].exists;
		if (cache[i].at < cache[oldest].at)
			oldest = i;
	}
	snprintf(cache[oldest].name, sizeof(cache[oldest].name), "%s", user);
	cache[oldest].exists = getpwnam(user) != NULL;
	cache[oldest].at = now;
	return cache[oldest].exists;
}

/* The user a local part names, if it can name one (the helper checks again). */
static char *
forward_user_of(const char *address)
{
	const char *at = strrchr(address, '@');
	size_t		len = at ? (size_t) (at - address) : strlen(address);
	char	   *user;

	if (len == 0 || len > 32)
		return NULL;
	user = xstrndup(address, len);
	for (char *p = user; *p; p++)
	{
		*p = (char) tolower((unsigned char) *p);
		if (!(islower((unsigned char) *p) || isdigit((unsigned char) *p) || strchr("_.-", *p)))
		{
			free(user);
			return NULL;
		}
	}
	if (!(islower((unsigned char) user[0]) || user[0] == '_') || !forward_is_system_user(user))
	{
		free(user);
		return NULL;
	}
	return user;
}

/* The user whose .forward recipient would have: in one of LOCAL_DOMAINS, a system user. */
static char *
forward_candidate(struct pepsi_ctx *ctx, const char *recipient)
{
	const char *domains = local_domains(pepsi_config(ctx), pepsi_section(ctx));

	return local_address_is_local(domains, recipient) ? forward_user_of(recipient) : NULL;
}

/* May any recipient of the row have a .forward? */
static bool
forward_any_candidate(struct pepsi_ctx *ctx)
{
	for (size_t i = 0; i < pepsi_rcpt_count(ctx); i++)
	{
		char *user = forward_candidate(ctx, pepsi_rcpt(ctx, i));

		if (user != NULL)
		{
			free(user);
			return true;
		}
	}
	return false;
}

/* Is address named by a Delivered-To field of headers? */
static bool
forward_delivered_to(const struct buf *headers, const char *address)
{
	struct buf values = BUF_INIT;
	bool	   found = false;
	char	  *save = NULL;

	header_get_all(headers->data, headers->len, "Delivered-To", &values);
	if (values.data)
		for (char *v = strtok_r(values.data, ",", &save); v && !found; v = strtok_r(NULL, ",", &save))
		{
			size_t len;

			while (*v == ' ' || *v == '\t' || *v == '<')
				v++;
			len = strlen(v);
			while (len > 0 && strchr(" \t>", v[len - 1]))
				len--;
			found = len == strlen(address) && strncasecmp(v, address, len) == 0;
		}
	buf_free(&values);
	return found;
}

static void
forward_list_add(char ***list, size_t *count, const char *address)
{
	for (size_t i = 0; i < *count; i++)
		if (strcasecmp((*list)[i], address) == 0)
			return;
	*list = xrealloc(*list, (*count + 1) * sizeof(char *));
	(*list)[(*count)++] = xstrdup(address);
}

static void
forward_plan_free(struct forward_plan *plan)
{
	for (size_t i = 0; i < plan->nforwards; i++)
		free(plan->forwards[i]);
	for (size_t i = 0; i < plan->nlocals; i++)
		free(plan->locals[i]);
	free(plan->forwards);
	free(plan->locals);
	buf_free(&plan->refused);
	buf_free(&plan->deferred);
	json_decref(plan->done);
}

static bool
forward_already_done(const struct forward_plan *plan, const char *entry)
{
	size_t	i;
	json_t *v;

	json_array_foreach (plan->done, i, v)
	{
		if (json_is_string(v) && strcmp(json_string_value(v), entry) == 0)
			return true;
	}
	return false;
}

static void
forward_refuse(struct forward_plan *plan, const char *status, const char *fmt, const char *what)
{
	if (plan->refused.len)
		buf_append_str(&plan->refused, "; ");
	buf_printf(&plan->refused, fmt, what);
	if (plan->refused_status == NULL)
		plan->refused_status = status;
}

/* The message as a command or a mailbox file sees it: Return-Path, Delivered-To, LF line ends. */
static void
forward_unix_message(struct pepsi_ctx *ctx, const char *recipient, struct buf *out)
{
	const struct buf *headers = pepsi_headers(ctx);
	const struct buf *body = pepsi_body(ctx);
	struct buf		  crlf = BUF_INIT;

	buf_printf(&crlf, "Return-Path: <%s>\r\nDelivered-To: %s\r\n", pepsi_mail_from(ctx), recipient);
	buf_append(&crlf, headers->data, headers->len);
	buf_append_str(&crlf, "\r\n");
	if (body->len)
		buf_append(&crlf, body->data, body->len);
	for (size_t i = 0; i < crlf.len; i++)
		if (!(crlf.data[i] == '\r' && i + 1 < crlf.len && crlf.data[i + 1] == '\n'))
			buf_append_char(out, crlf.data[i]);
	buf_free(&crlf);
}

/* Deliver one command or file entry through the helper. */
static void
forward_deliver_entry(struct pepsi_ctx *ctx, struct forward_plan *plan, const char *helper,
					  const char *user, const char *recipient, const char *kind, const char *target,
					  const struct buf *message)
{
	char		seconds[32];
	char		err[512];
	struct buf	answer = BUF_INIT;
	char	   *entry = xasprintf("%s %s", kind, target);
	const char *argv[12];
	size_t		n = 0;

	snprintf(seconds, sizeof(seconds), "%lld",
			 (long long) (pepsi_option_seconds(ctx, "COMMAND_TIME_LIMIT") + 0.999));
	argv[n++] = FORWARD_HELPER_NAME;
	argv[n++] = "-c";
	argv[n++] = pepsi_config(ctx)->path;
	argv[n++] = "-s";
	argv[n++] = pepsi_section(ctx);
	argv[n++] = kind;
	argv[n++] = user;
	argv[n++] = pepsi_mail_from(ctx);
	argv[n++] = recipient;
	if (strcmp(kind, "pipe") == 0)
		argv[n++] = seconds;
	argv[n++] = target;
	argv[n] = NULL;
	if (!forward_call_helper(helper, argv, message, &answer, err, sizeof(err)))
	{
		if (plan->deferred.len)
			buf_append_str(&plan->deferred, "; ");
		buf_printf(&plan->deferred, "%s", err);
	}
	else if (strncmp(answer.data, "ok", 2) == 0)
	{
		log_info("%s: row %lld: <%s>: delivered to %s %s as %s", pepsi_queue_id(ctx), pepsi_id(ctx), recipient,
				 kind, target, user);
		json_array_append_new(plan->done, json_string(entry));
		plan->delivered++;
	}
	else
	{
		bool  temporary = strncmp(answer.data, "temporary ", 10) == 0;
		char *why = strchr(answer.data, ' ');
		char *nl;

		why = why ? why + 1 : answer.data;
		if ((nl = strchr(why, '\n')) != NULL)
			*nl = '\0';
		log_warnx("%s: row %lld: <%s>: %s %s: %s", pepsi_queue_id(ctx), pepsi_id(ctx), recipient, kind, target, why);
		if (temporary)
		{
			if (plan->deferred.len)
				buf_append_str(&plan->deferred, "; ");
			buf_printf(&plan->deferred, "%s %s: %s", kind, target, why);
		}
		else
		{
			char *what = xasprintf("%s %s: %s", kind, target, why);

			forward_refuse(plan, "5.3.0", "%s", what);
			free(what);
		}
	}
	free(entry);
	buf_free(&answer);
}

/*
 * Turn the helper's answer into a plan.  Returns false when the row goes
 * on as it is (no usable .forward).
 */
static bool
forward_plan_entries(struct pepsi_ctx *ctx, struct forward_plan *plan, const char *helper,
					 const char *user, const char *recipient, char *answer)
{
	const char *domain = strrchr(recipient, '@');
	struct buf	message = BUF_INIT;
	bool		any = false;
	char	   *save = NULL;
	json_t	   *done = json_object_get(pepsi_state(ctx), "dot_forward_done");

	plan->done = json_is_array(done) ? json_deep_copy(done) : json_array();
	for (char *line = strtok_r(answer, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
	{
		char *value = strchr(line, ' ');

		if (value == NULL)
			continue;
		*value++ = '\0';
		if (strcmp(line, "bad") == 0)
		{
			log_warnx("%s: row %lld: <%s>: ~%s/.forward line %s (entry skipped)", pepsi_queue_id(ctx), pepsi_id(ctx),
					  recipient, user, value);
			continue;
		}
		any = true;
		if (strcmp(line, "address") == 0 || strcmp(line, "local") == 0)
		{
			bool  keep_copy = strcmp(line, "local") == 0;
			char *address = strchr(value, '@') ? xstrdup(value)
											   : xasprintf("%s%s", value, domain ? domain : "");

			/* Forwarding to oneself is a local copy, not a loop. */
			if (strcasecmp(address, recipient) == 0 || keep_copy)
				forward_list_add(&plan->locals, &plan->nlocals, address);
			else
				forward_list_add(&plan->forwards, &plan->nforwards, address);
			free(address);
		}
		else if (strcmp(line, "pipe") == 0 || strcmp(line, "file") == 0)
		{
			bool  pipe = strcmp(line, "pipe") == 0;
			char *entry = xasprintf("%s %s", line, value);

			if (forward_already_done(plan, entry))
				plan->delivered++;
			else if (!pepsi_option_bool(ctx, pipe ? "ALLOW_FORWARD_PIPES" : "ALLOW_FORWARD_FILES"))
			{
				log_warnx("%s: row %lld: <%s>: ~%s/.forward: %s %s refused: %s is off", pepsi_queue_id(ctx), pepsi_id(ctx),
						  recipient, user, pipe ? "command" : "file", value,
						  pipe ? "ALLOW_FORWARD_PIPES" : "ALLOW_FORWARD_FILES");
				forward_refuse(plan, "5.7.1",
							   pipe ? "mail to commands is not allowed here (|%s)"
									: "mail to files is not allowed here (%s)",
							   value);
			}
			else
			{
				if (message.len == 0)
					forward_unix_message(ctx, recipient, &message);
				forward_deliver_entry(ctx, plan, helper, user, recipient, line, value, &message);
			}
			free(entry);
		}
	}
	buf_free(&message);
	return any;
}

/* state.dsn with its rcpt array n copies of the recipient's, for a group of new addresses. */
static json_t *
forward_dsn_for(struct pepsi_ctx *ctx, size_t n)
{
	json_t *dsn = json_object_get(pepsi_state(ctx), "dsn");
	json_t *rcpt = json_object_get(dsn, "rcpt");
	json_t *copy;
	json_t *array = json_array();

	if (!json_is_object(dsn))
	{
		json_decref(array);
		return NULL;
	}
	copy = json_deep_copy(dsn);
	for (size_t i = 0; i < n; i++)
		json_array_append(array, json_is_array(rcpt) && json_array_size(rcpt) > 0
									 ? json_array_get(rcpt, 0)
									 : json_null());
	json_object_set_new(copy, "rcpt", array);
	return copy;
}

/* Carry out the plan for the row's one recipient. */
static int
forward_conclude(struct pepsi_ctx *ctx, struct forward_plan *plan, const char *recipient)
{
	const char			  *next_stage = pepsi_option(ctx, "NEXT_STAGE");
	const char			  *forward_stage = pepsi_option(ctx, "FORWARD_STAGE");
	const char			  *bounce_stage = pepsi_option(ctx, "BOUNCE_STAGE");
	struct delivery_report report = {.relay = "local"};
	struct buf			   diagnostic = BUF_INIT;
	json_t				  *groups = json_array();
	bool				   keep_self = plan->nlocals == 1 && strcasecmp(plan->locals[0], recipient) == 0;
	int					   rc;

	if (plan->refused.len)
	{
		buf_printf(&diagnostic, "X-Pepsi; %s", plan->refused.data);
		report.status = plan->refused_status;
		report.diagnostic = diagnostic.data;
	}
	if (plan->nforwards == 0 && plan->nlocals == 0)
	{
		/* Commands and files only: the row is done, or bounces for what failed. */
		if (plan->refused.len)
			rc = delivery_bounced(ctx, &report);
		else
		{
			/* Not advanced: the recipient's mail went where the .forward said, not to the mailbox. */
			log_info("%s: row %lld: <%s> delivered by .forward (%zu command(s) or file(s))",
					 pepsi_queue_id(ctx), pepsi_id(ctx), recipient, plan->delivered);
			rc = pepsi_finish(ctx);
		}
		goto done;
	}
	/* The refused entries bounce as a sibling (never for the null sender: a bounce is not bounced). */
	if (plan->refused.len && bounce_stage && pepsi_mail_from(ctx)[0] != '\0')
		json_array_append_new(groups, json_pack("{s:s,s:[s],s:{s:o,s:s}}", "stage", bounce_stage,
												"rcpt_to", recipient, "state", "bounce",
												delivery_bounce_json(ctx, "permanent", &report),
												"last_error", diagnostic.data));
	if (plan->nforwards > 0 && plan->nlocals > 0)
	{
		json_t *addresses = json_array();
		json_t *state = json_object();
		json_t *dsn = forward_dsn_for(ctx, plan->nlocals);

		for (size_t i = 0; i < plan->nlocals; i++)
			json_array_append_new(addresses, json_string(plan->locals[i]));
		if (dsn)
			json_object_set_new(state, "dsn", dsn);
		json_array_append_new(groups, json_pack("{s:s,s:o,s:o}", "stage", next_stage, "rcpt_to",
												addresses, "state", state));
	}
	/* The siblings first: after the split the row itself becomes the forward or the local copy. */
	if (json_array_size(groups) > 0)
	{
		int keep = 1;

		if (pepsi_fan_out(ctx, &keep, 1, groups) < 0)
		{
			rc = -1;
			goto done;
		}
	}
	if (plan->nforwards > 0)
	{
		const struct buf *headers = pepsi_headers(ctx);
		struct buf		  stamped = BUF_INIT;
		json_t			 *state = json_deep_copy(pepsi_state(ctx));
		json_t			 *dsn = forward_dsn_for(ctx, plan->nforwards);

		if (dsn)
			json_object_set_new(state, "dsn", dsn);
		json_object_del(state, "dot_forward_done");
		buf_printf(&stamped, "Delivered-To: %s\r\n", recipient);
		buf_append(&stamped, headers->data, headers->len);
		pepsi_set_headers(ctx, stamped.data, stamped.len);
		pepsi_set_rcpt_to(ctx, (const char *const *) plan->forwards, plan->nforwards);
		pepsi_set_state(ctx, state);
		json_decref(state);
		buf_free(&stamped);
		log_info("%s: row %lld: <%s> forwarded by .forward to %zu address(es)", pepsi_queue_id(ctx), pepsi_id(ctx), recipient,
				 plan->nforwards);
		rc = forward_stage ? pepsi_advance_to(ctx, forward_stage) : pepsi_advance(ctx);
	}
	else if (keep_self)
		rc = pepsi_advance(ctx);
	else
	{
		json_t *state = json_deep_copy(pepsi_state(ctx));
		json_t *dsn = forward_dsn_for(ctx, plan->nlocals);

		if (dsn)
			json_object_set_new(state, "dsn", dsn);
		rc = pepsi_rewrite_recipients(ctx, (const char *const *) plan->locals, plan->nlocals, state);
		json_decref(state);
	}
done:
	json_decref(groups);
	buf_free(&diagnostic);
	return rc;
}

static int
forward_run(struct pepsi_ctx *ctx)
{
	struct forward_plan plan = {.refused = BUF_INIT, .deferred = BUF_INIT};
	char			   *helper = NULL;
	char			   *user = NULL;
	const char		   *recipient;
	struct buf			answer = BUF_INIT;
	char				err[512];
	const char		   *argv[4];
	int					rc;

	if (pepsi_rcpt_count(ctx) > 1)
	{
		/* One row per recipient if any of them may have a .forward: each gets its own Delivered-To. */
		if (!forward_any_candidate(ctx))
			return pepsi_advance(ctx);
		if (pepsi_split_to_one_per_row(ctx) < 0)
			return -1;
	}
	recipient = pepsi_rcpt(ctx, 0);
	if ((user = forward_candidate(ctx, recipient)) == NULL)
		return pepsi_advance(ctx);
	if (pepsi_loaded(ctx) < PEPSI_LOAD_FULL)
	{
		/*
		 * Fused as a row to pass on, but the user appeared between
		 * forward_can_fuse and now (a passwd change): this pass has
		 * neither the message nor the helper's group.  Retry soon, at
		 * this stage, in one of its own workers.
		 */
		struct delivery_report report = {.status = "4.3.0", .relay = "local", .diagnostic = "X-Pepsi; the recipient became a local user: retried"};

		free(user);
		return delivery_deferred(ctx, &report);
	}
	if (pepsi_headers(ctx) == NULL || pepsi_body(ctx) == NULL)
	{
		free(user);
		return -1;
	}
	helper = forward_helper_path(ctx);
	argv[0] = FORWARD_HELPER_NAME;
	argv[1] = "read";
	argv[2] = user;
	argv[3] = NULL;
	if (!forward_call_helper(helper, argv, NULL, &answer, err, sizeof(err)))
	{
		struct buf			   diagnostic = BUF_INIT;
		struct delivery_report report = {.status = "4.3.0", .relay = "local"};

		log_warnx("%s: row %lld: <%s>: cannot read ~%s/.forward: %s", pepsi_queue_id(ctx), pepsi_id(ctx), recipient, user, err);
		buf_printf(&diagnostic, "X-Pepsi; cannot read the .forward of %s: %s", user, err);
		report.diagnostic = diagnostic.data;
		rc = delivery_deferred(ctx, &report);
		buf_free(&diagnostic);
		goto done;
	}
	if (strncmp(answer.data, "forward\n", 8) != 0)
	{
		char *nl = strchr(answer.data, '\n');

		if (nl)
			*nl = '\0';
		if (strncmp(answer.data, "ignored ", 8) == 0)
			log_warnx("%s: row %lld: <%s>: ~%s/.forward ignored: %s", pepsi_queue_id(ctx), pepsi_id(ctx), recipient, user,
					  answer.data + 8);
		else if (strncmp(answer.data, "temporary ", 10) == 0)
		{
			struct buf			   diagnostic = BUF_INIT;
			struct delivery_report report = {.status = "4.3.0", .relay = "local"};

			buf_printf(&diagnostic, "X-Pepsi; the .forward of %s: %s", user, answer.data + 10);
			report.diagnostic = diagnostic.data;
			rc = delivery_deferred(ctx, &report);
			buf_free(&diagnostic);
			goto done;
		}
		rc = pepsi_advance(ctx);
		goto done;
	}
	/* The loop check comes first: nothing of a looping message is run or sent. */
	if (forward_delivered_to(pepsi_headers(ctx), recipient))
	{
		struct buf			   diagnostic = BUF_INIT;
		struct delivery_report report = {.status = "5.4.6", .relay = "local"};

		log_warnx("%s: row %lld: <%s>: mail forwarding loop (Delivered-To: %s already present)",
				  pepsi_queue_id(ctx), pepsi_id(ctx), recipient, recipient);
		buf_printf(&diagnostic, "X-Pepsi; mail forwarding loop for %s", recipient);
		report.diagnostic = diagnostic.data;
		rc = delivery_bounced(ctx, &report);
		buf_free(&diagnostic);
		goto done;
	}
	if (!forward_plan_entries(ctx, &plan, helper, user, recipient, answer.data + 8))
	{
		rc = pepsi_advance(ctx);
		goto done;
	}
	if (plan.deferred.len)
	{
		struct buf			   diagnostic = BUF_INIT;
		struct delivery_report report = {.status = "4.3.0", .relay = "local"};
		json_t				  *merge = json_pack("{s:O}", "dot_forward_done", plan.done);

		pepsi_merge_state(ctx, merge);
		json_decref(merge);
		buf_printf(&diagnostic, "X-Pepsi; %s", plan.deferred.data);
		report.diagnostic = diagnostic.data;
		rc = delivery_deferred(ctx, &report);
		buf_free(&diagnostic);
		goto done;
	}
	rc = forward_conclude(ctx, &plan, recipient);
done:
	forward_plan_free(&plan);
	buf_free(&answer);
	free(helper);
	free(user);
	return rc;
}

/*
 * A row none of whose recipients may have a .forward is only passed on:
 * it runs fused after its predecessor (fuses_passing_on), with neither
 * its body loaded nor the helper's group, which its pass never needs.  A
 * row it may split, or whose outcome is a fan-out, is not fused: it is
 * committed for this stage's own workers.
 */
static bool
forward_can_fuse(struct pepsi_ctx *ctx)
{
	return !forward_any_candidate(ctx);
}

/* Untouched recipients and local copies must go somewhere else than back here. */
static bool
forward_check_config(const struct pepsi_config *cfg, const char *section, char *err, size_t errlen)
{
	if (config_get(cfg, section, "NEXT_STAGE") == NULL)
	{
		snprintf(err, errlen, "%s: [%s] needs NEXT_STAGE (where local copies and other recipients go)",
				 cfg->path, section);
		return false;
	}
	return true;
}

const struct pepsi_stage pepsi_stage_dot_forward_stage = {
	.program = "pepsi-stage-dot-forward",
	.load = PEPSI_LOAD_FULL,
	.run = forward_run,
	.can_fuse = forward_can_fuse,
	.check_config = forward_check_config,
	.fuses_passing_on = true,
};

int
pepsi_stage_dot_forward_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_dot_forward_stage, argc, argv);
}
