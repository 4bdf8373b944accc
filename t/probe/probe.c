/*
 * pepsi-test-probe: a stage for the TAP tests, never installed.  It drives
 * the runtime down the paths no well-behaved stage takes (reading more
 * than its load, calling no terminal or two) and the terminals the stock
 * stages do not use (pause).  Its [stage-*] section says what it does:
 *   ACTION = headers | body | raw   read beyond its metadata load
 *            none | twice           call no terminal, or two
 *            pause                  pause for PAUSE_SECONDS (default 600)
 *            advance                advance (NEXT_STAGE)
 *            fan_out                keep recipient 1; 2..n to a sibling at
 *                                   FAN_STAGE; NEW_RCPT to a sibling paused
 *                                   for 60 s; then advance
 *            enqueue_new            inject a reply to the sender at
 *                                   ENQUEUE_STAGE, twice with one token;
 *                                   state.enqueued holds both ids; advance
 *            finish_with            finish, cloning a success DSN to the
 *                                   sender at CLONE_STAGE
 *            option_for             state.values: OPTION for each recipient
 *                                   (pepsi_option_for); advance
 * Every action but the misuses and finish_with merges {"probe": ACTION}
 * into the state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "runtime/stage.h"

static int
probe_fan_out(struct pepsi_ctx *ctx, json_t *merge)
{
	const int keep[] = {1};
	json_t	 *rest = json_array();
	json_t	 *groups;
	int		  rc;

	for (size_t i = 2; i <= pepsi_rcpt_count(ctx); i++)
		json_array_append_new(rest, json_integer((json_int_t) i));
	groups = json_pack("[{s:o, s:s?}, {s:[s?], s:s, s:f}]",
					   "rcpt_indices", rest, "stage", pepsi_option(ctx, "FAN_STAGE"),
					   "rcpt_to", pepsi_option(ctx, "NEW_RCPT"), "status", "retry",
					   "retry_seconds", 60.0);
	rc = pepsi_fan_out(ctx, keep, 1, groups);
	json_decref(groups);
	if (rc < 0)
		return -1;
	/* (after the fan-out, which refuses a stage that changed the row) */
	pepsi_merge_state(ctx, merge);
	return pepsi_advance(ctx);
}

static int
probe_enqueue_new(struct pepsi_ctx *ctx, json_t *merge)
{
	const char		 *sender = pepsi_mail_from(ctx);
	const char		 *stage = pepsi_option(ctx, "ENQUEUE_STAGE");
	static const char headers[] = "Subject: probe reply\r\n";
	static const char body[] = "An automatic reply.\r\n";
	char			  token[64];
	json_t			 *state = json_pack("{s:s}", "probe", "reply");
	long long		  first,
		second;

	snprintf(token, sizeof(token), "probe-reply-%lld", pepsi_id(ctx));
	first = pepsi_enqueue_new(ctx, stage, "", &sender, 1, headers, strlen(headers),
							  body, strlen(body), state, token);
	second = first < 0 ? -1
					   : pepsi_enqueue_new(ctx, stage, "", &sender, 1, headers, strlen(headers),
										   body, strlen(body), state, token);
	json_decref(state);
	if (first < 0 || second < 0)
		return -1;
	json_object_set_new(merge, "enqueued", json_pack("[I, I]", (json_int_t) first, (json_int_t) second));
	pepsi_merge_state(ctx, merge);
	return pepsi_advance(ctx);
}

static int
probe_finish_with(struct pepsi_ctx *ctx)
{
	char	token[64];
	json_t *clones;
	int		rc;

	snprintf(token, sizeof(token), "probe-dsn-%lld", pepsi_id(ctx));
	clones = json_pack("[{s:s, s:s?, s:s, s:[s], s:{s:{s:s}}}]",
					   "token", token, "stage", pepsi_option(ctx, "CLONE_STAGE"),
					   "mail_from", "", "rcpt_to", pepsi_mail_from(ctx),
					   "state", "bounce", "kind", "success");
	rc = pepsi_finish_with(ctx, clones);
	json_decref(clones);
	return rc;
}

static int
probe_option_for(struct pepsi_ctx *ctx, json_t *merge)
{
	const char *option = pepsi_option(ctx, "OPTION");
	json_t	   *values = json_array();

	for (size_t i = 0; i < pepsi_rcpt_count(ctx); i++)
	{
		const char *value = option ? pepsi_option_for(ctx, option, pepsi_rcpt(ctx, i)) : NULL;

		json_array_append_new(values, value ? json_string(value) : json_null());
	}
	json_object_set_new(merge, "values", values);
	pepsi_merge_state(ctx, merge);
	return pepsi_advance(ctx);
}

static int
probe_run(struct pepsi_ctx *ctx)
{
	const char *action = pepsi_option(ctx, "ACTION");
	const char *seconds = pepsi_option(ctx, "PAUSE_SECONDS");
	json_t	   *merge;
	int			rc;

	if (action == NULL)
		return pepsi_error(ctx, "[stage-%s] has no ACTION", pepsi_stage_name(ctx));
	if (strcmp(action, "headers") == 0)
		return pepsi_headers(ctx) ? pepsi_advance(ctx) : -1;
	if (strcmp(action, "body") == 0)
		return pepsi_body(ctx) ? pepsi_advance(ctx) : -1;
	if (strcmp(action, "raw") == 0)
	{
		struct buf raw = BUF_INIT;
		bool	   ok = pepsi_raw_message(ctx, &raw);

		buf_free(&raw);
		return ok ? pepsi_advance(ctx) : -1;
	}
	if (strcmp(action, "none") == 0)
		return 0;
	if (strcmp(action, "twice") == 0)
	{
		pepsi_advance(ctx);
		return pepsi_finish(ctx);
	}
	merge = json_pack("{s:s}", "probe", action);
	if (strcmp(action, "pause") == 0)
		rc = pepsi_pause(ctx, merge, seconds ? atof(seconds) : 600);
	else if (strcmp(action, "advance") == 0)
	{
		pepsi_merge_state(ctx, merge);
		rc = pepsi_advance(ctx);
	}
	else if (strcmp(action, "fan_out") == 0)
		rc = probe_fan_out(ctx, merge);
	else if (strcmp(action, "enqueue_new") == 0)
		rc = probe_enqueue_new(ctx, merge);
	else if (strcmp(action, "finish_with") == 0)
		rc = probe_finish_with(ctx);
	else if (strcmp(action, "option_for") == 0)
		rc = probe_option_for(ctx, merge);
	else
		rc = pepsi_error(ctx, "[stage-%s] ACTION %s is not known", pepsi_stage_name(ctx), action);
	json_decref(merge);
	return rc;
}

static const struct pepsi_stage probe_stage = {
	.program = "pepsi-test-probe",
	.load = PEPSI_LOAD_METADATA,
	.run = probe_run,
};

int
main(int argc, char **argv)
{
	return pepsi_worker_main(&probe_stage, argc, argv);
}
