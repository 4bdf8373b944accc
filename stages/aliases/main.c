/*
 * pepsi-stage-aliases: expand recipients through an aliases(5) file.
 *
 * Options of its [stage-*] section:
 *   ALIASES_FILE   the file (default /etc/aliases); re-read when it changes
 *   ALIAS_DOMAINS  the domains whose local parts are looked up (comma or
 *                  space separated; default [pepsi] HOSTNAME, or the system's name)
 * The recipients are rewritten with rewrite_recipients, and the parallel
 * per-recipient DSN parameters (state.dsn.rcpt) are rebuilt in lockstep:
 * every address an original recipient expands to carries that recipient's
 * NOTIFY and ORCPT (RFC 3461 section 6.2).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "local/aliases.h"
#include "runtime/stage.h"

int pepsi_stage_aliases_main(int argc, char **argv);

static struct alias_table *aliases_table;
static char				  *aliases_path;
static struct timespec	   aliases_mtime;

/* The table for path, re-read when the file changed. */
static struct alias_table *
aliases_current(const char *path, char *err, size_t errlen)
{
	struct stat st;

	if (stat(path, &st) != 0)
	{
		snprintf(err, errlen, "%s: cannot stat", path);
		return NULL;
	}
	if (aliases_table && strcmp(aliases_path, path) == 0
		&& st.st_mtim.tv_sec == aliases_mtime.tv_sec && st.st_mtim.tv_nsec == aliases_mtime.tv_nsec)
		return aliases_table;
	{
		struct alias_table *table = aliases_load(path, err, errlen);

		if (table == NULL)
			return NULL;
		aliases_free(aliases_table);
		free(aliases_path);
		aliases_table = table;
		aliases_path = xstrdup(path);
		aliases_mtime = st.st_mtim;
	}
	return aliases_table;
}

static const char *
aliases_file(const struct pepsi_ctx *ctx)
{
	return pepsi_option_text(ctx, "ALIASES_FILE");
}

static const char *
aliases_domains(const struct pepsi_ctx *ctx)
{
	const char *domains = pepsi_option(ctx, "ALIAS_DOMAINS");

	return domains ? domains : config_hostname(pepsi_config(ctx));
}

static int
aliases_run(struct pepsi_ctx *ctx)
{
	char				err[1024];
	struct alias_table *table = aliases_current(aliases_file(ctx), err, sizeof(err));
	json_t			   *state = pepsi_state(ctx);
	json_t			   *dsn_rcpt = json_object_get(json_object_get(state, "dsn"), "rcpt");
	bool				lockstep = json_is_array(dsn_rcpt) && json_array_size(dsn_rcpt) == pepsi_rcpt_count(ctx);
	char			  **expanded = NULL;
	size_t				count = 0;
	json_t			   *new_dsn_rcpt = json_array();
	bool				changed = false;
	int					rc;

	if (table == NULL)
	{
		json_decref(new_dsn_rcpt);
		return pepsi_error(ctx, "%s", err);
	}
	for (size_t i = 0; i < pepsi_rcpt_count(ctx); i++)
	{
		size_t before = count;

		if (!aliases_expand(table, pepsi_rcpt(ctx, i), aliases_domains(ctx), &expanded, &count,
							err, sizeof(err)))
		{
			json_t *merge = json_pack("{s:s}", "last_error", err);

			for (size_t k = 0; k < count; k++)
				free(expanded[k]);
			free(expanded);
			json_decref(new_dsn_rcpt);
			rc = pepsi_fail(ctx, merge);
			json_decref(merge);
			return rc;
		}
		if (count - before != 1 || strcmp(expanded[before], pepsi_rcpt(ctx, i)) != 0)
			changed = true;
		for (size_t k = before; k < count; k++)
			json_array_append(new_dsn_rcpt, lockstep ? json_array_get(dsn_rcpt, i) : json_null());
	}
	if (!changed)
		rc = pepsi_advance(ctx);
	else
	{
		json_t *new_state = json_deep_copy(state);

		if (lockstep)
			json_object_set(json_object_get(new_state, "dsn"), "rcpt", new_dsn_rcpt);
		rc = pepsi_rewrite_recipients(ctx, (const char *const *) expanded, count, new_state);
		json_decref(new_state);
	}
	for (size_t k = 0; k < count; k++)
		free(expanded[k]);
	free(expanded);
	json_decref(new_dsn_rcpt);
	return rc;
}

static bool
aliases_check_config(const struct pepsi_config *cfg, const char *section, char *err, size_t errlen)
{
	struct alias_table *table = aliases_load(config_text(cfg, section, "ALIASES_FILE"), err, errlen);

	if (table == NULL)
		return false;
	aliases_free(table);
	return true;
}

const struct pepsi_stage pepsi_stage_aliases_stage = {
	.program = "pepsi-stage-aliases",
	.load = PEPSI_LOAD_METADATA,
	.run = aliases_run,
	.check_config = aliases_check_config,
};

int
pepsi_stage_aliases_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_aliases_stage, argc, argv);
}
