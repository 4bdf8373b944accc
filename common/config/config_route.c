/*
 * config_route.c: config_route_refusal (config.h), whether an override of
 * a STAGE option would route mail around a stage an override may never
 * skip (options.def UNSKIPPABLE: the milters, the DKIM signer).
 *
 * The routes are the file's alone: every [stage-*] section's STAGE options
 * as pepsi.conf gives them (the database's overrides are what is checked,
 * never what it is checked against).  What the file's value leads to, on
 * any path, is what the override's value must lead through on every path:
 * a message never misses a filter or a signature it could have had.
 * Programs stand for each other: another signing stage will do.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "config/config.h"
#include "options.h"

/* The [stage-*] sections the routes are drawn from: more is not a mail graph. */
#define ROUTE_STAGES_MAX 256
#define ROUTE_EDGES_MAX 1024

struct route_graph
{
	const char *sections[ROUTE_STAGES_MAX]; /* "stage-init" */
	uint32_t	self[ROUTE_STAGES_MAX];		/* the unskippable program it runs, as a bit */
	uint32_t	reach[ROUTE_STAGES_MAX];	/* such programs on some path from it */
	uint32_t	must[ROUTE_STAGES_MAX];		/* such programs on every path from it */
	uint32_t	onward[ROUTE_STAGES_MAX];	/* such programs on some path from its successors */
	size_t		count;
};

/* Is e a line of the file that names a stage a message goes on to? */
static bool
route_is_edge(const struct pepsi_config *cfg, const struct config_entry *e)
{
	const struct option_def *def;
	size_t					 len = strlen(e->option);

	if (e->scope != NULL || strncmp(e->section, "stage-", 6) != 0)
		return false;
	def = config_option_def(cfg, e->section, e->option);
	return def ? def->type == OPTION_STAGE : len > 6 && strcmp(e->option + len - 6, "_STAGE") == 0;
}

/* The index of [stage-name], or -1 when the file has none. */
static int
route_find(const struct route_graph *g, const char *name)
{
	for (size_t i = 0; i < g->count; i++)
		if (strcmp(g->sections[i] + 6, name) == 0)
			return (int) i;
	return -1;
}

/* The file's value of section's option: its line, else the schema's default. */
static const char *
route_file_value(const struct pepsi_config *cfg, const char *section, const char *option)
{
	const struct option_def *def = config_option_def(cfg, section, option);
	const char				*value = NULL;

	for (size_t k = 0; k < cfg->count; k++)
		if (cfg->entries[k].scope == NULL && strcmp(cfg->entries[k].section, section) == 0
			&& strcmp(cfg->entries[k].option, option) == 0)
			value = cfg->entries[k].value;
	return value ? value : def ? def->default_value
							   : NULL;
}

/* For each stage, the unskippable programs on some path and on every path (fixed points). */
static void
route_graph_build(const struct pepsi_config *cfg, struct route_graph *g)
{
	int	   from[ROUTE_EDGES_MAX];
	int	   to[ROUTE_EDGES_MAX];
	size_t edges = 0;
	bool   changed = true;

	g->count = config_sections(cfg, "stage-", g->sections, ROUTE_STAGES_MAX);
	for (size_t i = 0; i < g->count; i++)
	{
		const char *program = route_file_value(cfg, g->sections[i], "PROGRAM");
		int			bit = program ? option_unskippable_index(program, NULL) : -1;

		g->self[i] = bit >= 0 ? (uint32_t) 1 << bit : 0;
		g->reach[i] = g->must[i] = g->self[i];
	}
	/* The file's routes, once: from a stage to another (-1: one the file has not, anywhere). */
	for (size_t k = 0; k < cfg->count && edges < ROUTE_EDGES_MAX; k++)
		if (route_is_edge(cfg, &cfg->entries[k])
			&& (from[edges] = route_find(g, cfg->entries[k].section + 6)) >= 0)
			to[edges++] = route_find(g, cfg->entries[k].value);
	/* Some path: what any successor reaches. */
	for (size_t pass = 0; changed && pass <= g->count; pass++)
	{
		changed = false;
		for (size_t e = 0; e < edges; e++)
			if (to[e] >= 0 && (g->reach[from[e]] | g->reach[to[e]]) != g->reach[from[e]])
			{
				g->reach[from[e]] |= g->reach[to[e]];
				changed = true;
			}
	}
	for (size_t i = 0; i < g->count; i++)
		g->onward[i] = 0;
	for (size_t e = 0; e < edges; e++)
		g->onward[from[e]] |= to[e] >= 0 ? g->reach[to[e]] : 0;
	/* Every path: what all successors pass, from "all it reaches" down. */
	for (size_t i = 0; i < g->count; i++)
		g->must[i] = g->reach[i];
	changed = true;
	for (size_t pass = 0; changed && pass <= g->count; pass++)
	{
		changed = false;
		for (size_t i = 0; i < g->count; i++)
		{
			uint32_t all = UINT32_MAX;
			bool	 any = false;
			uint32_t must;

			for (size_t e = 0; e < edges; e++)
				if (from[e] == (int) i)
				{
					all &= to[e] >= 0 ? g->must[to[e]] : 0;
					any = true;
				}
			must = g->self[i] | (any ? all : 0);
			if (must != g->must[i])
			{
				g->must[i] = must;
				changed = true;
			}
		}
	}
}

const char *
config_route_refusal(const struct pepsi_config *cfg, const char *section, const char *option,
					 const char *value, char *why, size_t whylen)
{
	struct route_graph		 g;
	const char				*file_value;
	const char				*program;
	const char				*reason = NULL;
	const struct option_def *def;
	uint32_t				 needed;
	uint32_t				 passed;
	int						 from;
	int						 to;

	if (strcmp(option, "PROGRAM") == 0 && strncmp(section, "stage-", 6) == 0)
	{
		/* The stage itself must stay what it is. */
		program = route_file_value(cfg, section, "PROGRAM");
		if (program && option_unskippable_index(program, &reason) >= 0
			&& strcmp(option_program_name(program), option_program_name(value)) != 0)
		{
			snprintf(why, whylen, "[%s] runs %s in the file, which an override never replaces (%s)",
					 section, option_program_name(program), reason);
			return why;
		}
		return NULL;
	}
	def = config_option_def(cfg, section, option);
	if (def ? def->type != OPTION_STAGE
			: !(strlen(option) > 6 && strcmp(option + strlen(option) - 6, "_STAGE") == 0))
		return NULL;
	file_value = route_file_value(cfg, section, option);
	if (file_value && strcmp(file_value, value) == 0)
		return NULL;
	route_graph_build(cfg, &g);
	to = route_find(&g, value);
	if (file_value)
	{
		from = route_find(&g, file_value);
		needed = from >= 0 ? g.reach[from] : 0;
	}
	else
	{
		/* Unset in the file (REMOTE_STAGE is NEXT_STAGE...): whatever the stage leads to. */
		from = strncmp(section, "stage-", 6) == 0 ? route_find(&g, section + 6) : -1;
		needed = from >= 0 ? g.onward[from] : 0;
		file_value = "(unset)";
	}
	passed = to >= 0 ? g.must[to] : 0;
	if ((needed & ~passed) == 0)
		return NULL;
	/* Name the first stage the file's route passes that the override's may miss. */
	for (size_t i = 0; i < g.count; i++)
		if (g.self[i] & needed & ~passed)
		{
			program = route_file_value(cfg, g.sections[i], "PROGRAM");
			option_unskippable_index(program, &reason);
			snprintf(why, whylen,
					 "mail to stage %s could skip [%s] (%s), which the file's %s = %s leads to: "
					 "an override never routes mail around it (%s)",
					 value, g.sections[i], option_program_name(program), option, file_value, reason);
			return why;
		}
	snprintf(why, whylen, "mail to stage %s could skip a stage the file's %s = %s leads through", value,
			 option, file_value);
	return why;
}
