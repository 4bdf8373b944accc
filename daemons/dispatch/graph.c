/*
 * graph.c: the stage graph as the configuration describes it.
 *
 * Every [stage-*] section needs a PROGRAM and sane pool sizes, every
 * option naming a stage (NEXT_STAGE, BOUNCE_STAGE and any other option
 * ending in _STAGE, including the INIT_STAGE where ingress and sendmail
 * admit mail) must name a section that exists, and no set of stages may
 * form a cycle with no way out: a message entering it could never leave.
 * The dispatcher refuses to start on any of these.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "dispatch.h"
#include "runtime/db.h"

#define GRAPH_MAX_STAGES 256

static int
graph_index(struct stage_spec *specs, size_t count, const char *name)
{
	for (size_t i = 0; i < count; i++)
		if (strcmp(specs[i].name, name) == 0)
			return (int) i;
	return -1;
}

/* Tarjan's strongly connected components, to find cycles with no exit. */
struct graph_scc
{
	bool (*edges)[GRAPH_MAX_STAGES];
	size_t count;
	int	   index[GRAPH_MAX_STAGES];
	int	   low[GRAPH_MAX_STAGES];
	int	   component[GRAPH_MAX_STAGES];
	bool   on_stack[GRAPH_MAX_STAGES];
	int	   stack[GRAPH_MAX_STAGES];
	int	   depth;
	int	   next_index;
	int	   components;
};

static void
graph_strongconnect(struct graph_scc *g, int v)
{
	g->index[v] = g->low[v] = g->next_index++;
	g->stack[g->depth++] = v;
	g->on_stack[v] = true;
	for (size_t w = 0; w < g->count; w++)
	{
		if (!g->edges[v][w])
			continue;
		if (g->index[w] < 0)
		{
			graph_strongconnect(g, (int) w);
			if (g->low[w] < g->low[v])
				g->low[v] = g->low[w];
		}
		else if (g->on_stack[w] && g->index[w] < g->low[v])
			g->low[v] = g->index[w];
	}
	if (g->low[v] == g->index[v])
	{
		int w;

		do
		{
			w = g->stack[--g->depth];
			g->on_stack[w] = false;
			g->component[w] = g->components;
		} while (w != v);
		g->components++;
	}
}

static bool
graph_check_cycles(struct stage_spec *specs, size_t count, bool (*edges)[GRAPH_MAX_STAGES],
				   const bool *finishes, const char *path, char *err, size_t errlen)
{
	struct graph_scc g = {.edges = edges, .count = count};

	for (size_t i = 0; i < count; i++)
		g.index[i] = -1;
	for (size_t i = 0; i < count; i++)
		if (g.index[i] < 0)
			graph_strongconnect(&g, (int) i);
	for (int c = 0; c < g.components; c++)
	{
		size_t	   members = 0;
		bool	   cyclic = false;
		bool	   exit = false;
		struct buf names = BUF_INIT;

		for (size_t v = 0; v < count; v++)
		{
			if (g.component[v] != c)
				continue;
			members++;
			buf_printf(&names, "%s%s", names.len ? " -> " : "", specs[v].name);
			if (finishes[v])
				exit = true;
			for (size_t w = 0; w < count; w++)
				if (edges[v][w])
				{
					if (g.component[w] == c)
						cyclic = true;
					else
						exit = true;
				}
		}
		if (cyclic && !exit && members == 1)
		{
			snprintf(err, errlen, "%s: stage %s names only itself as the next stage: a message "
								  "that enters it can never leave",
					 path, names.data);
			buf_free(&names);
			return false;
		}
		if (cyclic && !exit)
		{
			snprintf(err, errlen, "%s: stages %s form a cycle with no exit: a message that "
								  "enters it can never leave",
					 path, names.data);
			buf_free(&names);
			return false;
		}
		buf_free(&names);
	}
	return true;
}

bool
graph_load(struct pepsi_config *cfg, struct stage_spec **out, size_t *out_count,
		   char *err, size_t errlen)
{
	const char		  *sections[GRAPH_MAX_STAGES];
	size_t			   count = config_sections(cfg, "stage-", sections, GRAPH_MAX_STAGES);
	struct stage_spec *specs = xcalloc(count + 1, sizeof(*specs));
	bool(*edges)[GRAPH_MAX_STAGES] = xcalloc(GRAPH_MAX_STAGES, sizeof(*edges));
	bool ok = true;

	for (size_t i = 0; i < count && ok; i++)
	{
		const char *section = sections[i];
		const char *program = config_get(cfg, section, "PROGRAM");

		specs[i].name = xstrdup(section + strlen("stage-"));
		if (program == NULL)
		{
			snprintf(err, errlen, "%s: [%s] has no PROGRAM", cfg->path, section);
			ok = false;
			break;
		}
		specs[i].program = xstrdup(program);
		specs[i].parallelism = config_int(cfg, section, "PARALLELISM");
		specs[i].max_messages = config_int(cfg, section, "MAX_MESSAGES");
		specs[i].queue_limit = config_int(cfg, section, "QUEUE_LIMIT");
		specs[i].light_lane = config_bool(cfg, section, "LIGHT_LANE");
		specs[i].bulk_nice = (int) config_int(cfg, section, "BULK_NICE");
		specs[i].max_runtime_ms = config_duration_ms(cfg, section, "MAX_RUNTIME");
	}
	/*
	 * Edges: every option ending in _STAGE names a stage that must exist;
	 * outside the [stage-*] sections (INIT_STAGE) it is an entry, not an
	 * edge.
	 */
	for (size_t e = 0; e < cfg->count && ok; e++)
	{
		const struct config_entry *entry = &cfg->entries[e];
		size_t					   len = strlen(entry->option);
		int						   from = -1;
		int						   to;

		if (len < 6 || strcmp(entry->option + len - 6, "_STAGE") != 0)
			continue;
		if (strncmp(entry->section, "stage-", 6) == 0)
			from = graph_index(specs, count, entry->section + 6);
		to = graph_index(specs, count, entry->value);
		if (to < 0)
		{
			if (entry->scope)
				snprintf(err, errlen, "override %s: [%s] %s names stage \"%s\", which has no "
									  "[stage-%s] section",
						 entry->scope, entry->section, entry->option,
						 entry->value, entry->value);
			else
				snprintf(err, errlen, "%s:%d: [%s] %s names stage \"%s\", which has no "
									  "[stage-%s] section",
						 cfg->path, entry->line, entry->section,
						 entry->option, entry->value, entry->value);
			ok = false;
			break;
		}
		if (from >= 0)
			edges[from][to] = true;
	}
	if (ok)
	{
		/*
		 * A stage with no NEXT_STAGE and no edge but its BOUNCE_STAGE is a
		 * delivery stage: it finishes messages, so it is a way out of any
		 * cycle it is on (delivery -> bounce -> delivery of the DSN).
		 */
		bool *finishes = xcalloc(count + 1, sizeof(bool));

		for (size_t i = 0; i < count; i++)
		{
			char *section = xasprintf("stage-%s", specs[i].name);

			finishes[i] = config_get(cfg, section, "NEXT_STAGE") == NULL;
			for (size_t e = 0; e < cfg->count && finishes[i]; e++)
			{
				const struct config_entry *entry = &cfg->entries[e];
				size_t					   len = strlen(entry->option);

				if (strcmp(entry->section, section) == 0 && len >= 6
					&& strcmp(entry->option + len - 6, "_STAGE") == 0
					&& strcmp(entry->option, "BOUNCE_STAGE") != 0)
					finishes[i] = false;
			}
			free(section);
		}
		ok = graph_check_cycles(specs, count, edges, finishes, cfg->path, err, errlen);
		free(finishes);
	}
	free(edges);
	if (!ok)
	{
		graph_free(specs, count);
		return false;
	}
	*out = specs;
	*out_count = count;
	return true;
}

void
graph_free(struct stage_spec *specs, size_t count)
{
	for (size_t i = 0; i < count; i++)
	{
		free(specs[i].name);
		free(specs[i].program);
	}
	free(specs);
}

bool
dispatch_options_load(const struct pepsi_config *cfg, char *err, size_t errlen)
{
	/* Checked against schema/options.def when the configuration was loaded. */
	dispatcher.poll_interval = config_duration_ms(cfg, "dispatch", "POLL_INTERVAL") / 1000.0;
	dispatcher.fair_half_life = config_duration_ms(cfg, "dispatch", "FAIR_HALF_LIFE") / 1000.0;
	dispatcher.fair_fifo_percent = (int) config_int(cfg, "dispatch", "FAIR_FIFO_PERCENT");
	dispatcher.idle_timeout = config_duration_ms(cfg, "dispatch", "WORKER_IDLE_TIMEOUT") / 1000.0;
	dispatcher.spawn_cooldown = config_duration_ms(cfg, "dispatch", "SPAWN_COOLDOWN") / 1000.0;
	dispatcher.stats_interval = config_duration_ms(cfg, "dispatch", "STATS_INTERVAL") / 1000.0;
	dispatcher.crash_limit = (int) config_int(cfg, "dispatch", "CRASH_LIMIT");
	dispatcher.crash_retry_delay = config_duration_ms(cfg, "dispatch", "CRASH_RETRY_DELAY") / 1000.0;
	dispatcher.standby = config_bool(cfg, "dispatch", "STANDBY");
	return true;
}

static int
graph_name_compare(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

/*
 * [dispatch] STAGES: keep only the listed stages' specs (the graph was
 * checked whole), refusing a name that is not a stage.  The first call
 * records the set (dispatcher.stage_set, for the locks and the orphan
 * reset); a later one (a reload) refuses a different set, since the locks
 * taken at start name it.
 */
bool
graph_select_stages(const struct pepsi_config *cfg, struct stage_spec *specs, size_t *count,
					char *err, size_t errlen)
{
	const char *list = config_text(cfg, "dispatch", "STAGES");
	char	   *copy;
	char	   *save = NULL;
	char	  **names;
	size_t		nnames = 0;
	size_t		kept = 0;
	struct buf	set = BUF_INIT;
	struct buf	readable = BUF_INIT;
	bool		ok = true;

	if (list == NULL)
	{
		if (dispatcher.stage_set_names && dispatcher.stage_set)
		{
			snprintf(err, errlen, "[dispatch] STAGES was removed; the stage set (%s) changes only at a restart",
					 dispatcher.stage_set_names);
			return false;
		}
		if (dispatcher.stage_set_names == NULL)
			dispatcher.stage_set_names = xstrdup("every stage");
		return true;
	}
	copy = xstrdup(list);
	names = xcalloc(strlen(list) / 2 + 2, sizeof(*names));
	for (char *name = strtok_r(copy, ", \t", &save); name; name = strtok_r(NULL, ", \t", &save))
	{
		bool known = false;

		if (strncmp(name, "stage-", 6) == 0)
			name += 6;
		for (size_t i = 0; i < *count && !known; i++)
			known = strcmp(specs[i].name, name) == 0;
		if (!known)
		{
			snprintf(err, errlen, "%s: [dispatch] STAGES names \"%s\", which has no [stage-%s] section",
					 cfg->path, name, name);
			ok = false;
			break;
		}
		names[nnames++] = name;
	}
	if (ok && nnames == 0)
	{
		snprintf(err, errlen, "%s: [dispatch] STAGES is empty: list the stages this dispatcher serves, or remove it",
				 cfg->path);
		ok = false;
	}
	if (ok)
	{
		qsort(names, nnames, sizeof(*names), graph_name_compare);
		buf_append_char(&set, '{');
		for (size_t i = 0; i < nnames; i++)
		{
			if (i > 0 && strcmp(names[i], names[i - 1]) == 0)
				continue;
			db_array_append(&set, names[i]);
			buf_printf(&readable, "%s%s", readable.len ? ", " : "", names[i]);
		}
		buf_append_char(&set, '}');
		if (dispatcher.stage_set_names && (dispatcher.stage_set == NULL || strcmp(dispatcher.stage_set, set.data) != 0))
		{
			snprintf(err, errlen, "[dispatch] STAGES changed from %s to %s; the stage set changes only at a restart",
					 dispatcher.stage_set_names, readable.data);
			ok = false;
		}
	}
	if (ok)
	{
		for (size_t i = 0; i < *count; i++)
		{
			if (!config_list_contains(list, specs[i].name))
			{
				char *prefixed = xasprintf("stage-%s", specs[i].name);
				bool  listed = config_list_contains(list, prefixed);

				free(prefixed);
				if (!listed)
				{
					free(specs[i].name);
					free(specs[i].program);
					continue;
				}
			}
			specs[kept++] = specs[i];
		}
		*count = kept;
		if (dispatcher.stage_set == NULL)
		{
			dispatcher.stage_set = xstrdup(set.data);
			dispatcher.stage_set_names = xstrdup(readable.data);
		}
	}
	buf_free(&set);
	buf_free(&readable);
	free(names);
	free(copy);
	return ok;
}
