/*
 * pepsi-test-probe: a stage for the TAP tests, never installed.  It drives
 * the runtime down the paths no well-behaved stage takes (reading more
 * than its load, calling no terminal or two) and the terminals the stock
 * stages do not use (pause).  Its [stage-*] section says what it does:
 *   ACTION = headers | body | raw   read beyond its metadata load
 *            none | twice           call no terminal, or two
 *            pause                  pause for PAUSE_SECONDS (default 600)
 *            advance                advance (NEXT_STAGE)
 * Every action but the misuses merges {"probe": ACTION} into the state.
 */
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "stage.h"

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
		struct buf	raw = BUF_INIT;
		bool		ok = pepsi_raw_message(ctx, &raw);

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
