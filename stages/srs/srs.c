/*
 * pepsi-stage-srs: the Sender Rewriting Scheme for forwarded mail.  A
 * message whose envelope sender is in a domain that is not ours is sent on
 * from an address of the [srs] DOMAIN (common/message/srs.h), so that SPF at the
 * next hop judges us, not the original sender's domain, and a bounce comes
 * back to us: pepsi-ingress reverses the address at RCPT and relays the
 * bounce to the original sender.
 *
 * Options of its [stage-*] section:
 *   NEXT_STAGE      where the message goes (typically DKIM signing)
 *   LOCAL_DOMAINS   senders in these domains are ours and keep their
 *                   address (default: [pepsi] LOCAL_DOMAINS)
 * The null sender, a sender without a domain and one already in the SRS
 * domain are left as they are.  The original sender is kept in state.srs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "base/log.h"
#include "message/srs.h"
#include "runtime/stage.h"

int pepsi_stage_srs_main(int argc, char **argv);

static struct srs				  srs_engine;
static const struct pepsi_config *srs_engine_config;

static const char *
srs_local_domains(struct pepsi_ctx *ctx)
{
	const char *domains = pepsi_option_text(ctx, "LOCAL_DOMAINS");

	return domains ? domains : config_text(pepsi_config(ctx), "pepsi", "LOCAL_DOMAINS");
}

static int
srs_run(struct pepsi_ctx *ctx)
{
	const char *sender = pepsi_mail_from(ctx);
	const char *at = sender ? strrchr(sender, '@') : NULL;
	char		err[512];
	char	   *rewritten;
	json_t	   *merge;

	if (srs_engine_config != pepsi_config(ctx))
	{
		srs_free(&srs_engine);
		srs_engine_config = NULL;
		if (!srs_from_config(pepsi_config(ctx), &srs_engine, err, sizeof(err)))
			return pepsi_error(ctx, "%s", err);
		srs_engine_config = pepsi_config(ctx);
	}
	if (at == NULL || config_list_contains(srs_local_domains(ctx), at + 1))
		return pepsi_advance(ctx);
	rewritten = srs_forward(&srs_engine, sender, time(NULL));
	if (rewritten == NULL)
		return pepsi_advance(ctx);
	merge = json_pack("{s:{s:s}}", "srs", "original_sender", sender);
	pepsi_merge_state(ctx, merge);
	json_decref(merge);
	pepsi_set_mail_from(ctx, rewritten);
	free(rewritten);
	return pepsi_advance(ctx);
}

static bool
srs_check_config(const struct pepsi_config *cfg, const char *section, char *err, size_t errlen)
{
	struct srs engine;

	if (!srs_from_config(cfg, &engine, err, errlen))
		return false;
	if (engine.domain == NULL)
	{
		snprintf(err, errlen, "%s: [%s] runs pepsi-stage-srs, which needs an [srs] section "
							  "(DOMAIN and SECRET_FILE)",
				 cfg->path, section);
		return false;
	}
	srs_free(&engine);
	return true;
}

const struct pepsi_stage pepsi_stage_srs_stage = {
	.program = "pepsi-stage-srs",
	.load = PEPSI_LOAD_METADATA,
	.run = srs_run,
	.check_config = srs_check_config,
};

int
pepsi_stage_srs_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_srs_stage, argc, argv);
}
