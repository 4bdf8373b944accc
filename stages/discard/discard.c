/*
 * pepsi-stage-discard: drop the message.
 *
 * With BOUNCE = yes in its section the sender is told: the row is rerouted
 * to BOUNCE_STAGE with state.bounce (kind permanent, the DIAGNOSTIC text);
 * otherwise it is finished silently.  A message from the null sender is
 * never bounced.
 */
#include <string.h>
#include <strings.h>

#include "runtime/stage.h"

int pepsi_stage_discard_main(int argc, char **argv);

static int
discard_run(struct pepsi_ctx *ctx)
{
	const char *bounce_stage = pepsi_option(ctx, "BOUNCE_STAGE");
	const char *diagnostic = pepsi_option_text(ctx, "DIAGNOSTIC");
	bool		bounce = pepsi_option_bool(ctx, "BOUNCE");
	json_t	   *merge;
	int			rc;

	if (!bounce || bounce_stage == NULL || pepsi_mail_from(ctx)[0] == '\0')
		return pepsi_finish(ctx);
	merge = json_pack("{s:{s:s,s:s}}", "bounce", "kind", "permanent", "diagnostic", diagnostic);
	rc = pepsi_reroute(ctx, bounce_stage, merge);
	json_decref(merge);
	return rc;
}

static bool
discard_check_config(const struct pepsi_config *cfg, const char *section, char *err, size_t errlen)
{
	if (config_bool(cfg, section, "BOUNCE") && config_get(cfg, section, "BOUNCE_STAGE") == NULL)
	{
		char origin[512];

		snprintf(err, errlen, "%s: [%s] has BOUNCE = yes but no BOUNCE_STAGE",
				 config_origin(cfg, section, "BOUNCE", origin, sizeof(origin)), section);
		return false;
	}
	return true;
}

const struct pepsi_stage pepsi_stage_discard_stage = {
	.program = "pepsi-stage-discard",
	.load = PEPSI_LOAD_METADATA,
	.run = discard_run,
	.check_config = discard_check_config,
};

int
pepsi_stage_discard_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_discard_stage, argc, argv);
}
