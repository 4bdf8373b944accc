/*
 * pepsi-stage-route: local domains to one stage, everything else to another.
 *
 * Options of its [stage-*] section:
 *   LOCAL_DOMAINS  the domains delivered here (comma or space separated;
 *                  default [pepsi] LOCAL_DOMAINS, the list ingress's relay
 *                  control uses, so the two agree unless told otherwise)
 *   LOCAL_STAGE    where their recipients go
 *   REMOTE_STAGE   where other recipients go (default: NEXT_STAGE)
 * A row with both kinds is split: the remote recipients move to a sibling
 * at REMOTE_STAGE, the row keeps the local ones and goes to LOCAL_STAGE.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "local/local.h"
#include "runtime/stage.h"

#define ROUTE_MAX_DOMAINS 256

int pepsi_stage_route_main(int argc, char **argv);

/* The local domains of this stage's section (local.c's fallbacks included). */
static const char *
route_domains(struct pepsi_ctx *ctx)
{
	const char *domains = pepsi_option(ctx, "LOCAL_DOMAINS");

	return domains ? domains : local_domains(pepsi_config(ctx), NULL);
}

static const char *
route_remote_stage(struct pepsi_ctx *ctx)
{
	const char *remote = pepsi_option(ctx, "REMOTE_STAGE");

	return remote ? remote : pepsi_option(ctx, "NEXT_STAGE");
}

static size_t
route_count_local(struct pepsi_ctx *ctx)
{
	const char *domains = route_domains(ctx);
	size_t		local = 0;

	for (size_t i = 0; i < pepsi_rcpt_count(ctx); i++)
		if (local_address_is_local(domains, pepsi_rcpt(ctx, i)))
			local++;
	return local;
}

static int
route_run(struct pepsi_ctx *ctx)
{
	const char *domains = route_domains(ctx);
	size_t		count = pepsi_rcpt_count(ctx);
	size_t		local = route_count_local(ctx);
	int		   *remote;
	size_t		nremote = 0;
	int			rc;

	if (local == count)
		return pepsi_advance_to(ctx, pepsi_option(ctx, "LOCAL_STAGE"));
	if (local == 0)
		return pepsi_advance_to(ctx, route_remote_stage(ctx));

	remote = xcalloc(count, sizeof(int));
	for (size_t i = 0; i < count; i++)
		if (!local_address_is_local(domains, pepsi_rcpt(ctx, i)))
			remote[nremote++] = (int) i + 1;
	rc = pepsi_split_off_recipients(ctx, remote, nremote, route_remote_stage(ctx));
	free(remote);
	if (rc < 0)
		return -1;
	return pepsi_advance_to(ctx, pepsi_option(ctx, "LOCAL_STAGE"));
}

/* A mixed row must be split, which a fused pass cannot do. */
static bool
route_can_fuse(struct pepsi_ctx *ctx)
{
	size_t local = route_count_local(ctx);

	return local == 0 || local == pepsi_rcpt_count(ctx);
}

static bool
route_check_config(const struct pepsi_config *cfg, const char *section, char *err, size_t errlen)
{
	if (config_get(cfg, section, "LOCAL_STAGE") == NULL)
	{
		snprintf(err, errlen, "%s: [%s] needs LOCAL_STAGE (where local recipients go)",
				 cfg->path, section);
		return false;
	}
	if (config_get(cfg, section, "REMOTE_STAGE") == NULL && config_get(cfg, section, "NEXT_STAGE") == NULL)
	{
		snprintf(err, errlen, "%s: [%s] needs REMOTE_STAGE or NEXT_STAGE (where other recipients go)",
				 cfg->path, section);
		return false;
	}
	return true;
}

const struct pepsi_stage pepsi_stage_route_stage = {
	.program = "pepsi-stage-route",
	.load = PEPSI_LOAD_METADATA,
	.run = route_run,
	.can_fuse = route_can_fuse,
	.check_config = route_check_config,
};

int
pepsi_stage_route_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_route_stage, argc, argv);
}
