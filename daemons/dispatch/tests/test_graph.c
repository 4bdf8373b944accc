/*
 * test_graph.c: the dispatcher's stage-graph checks (graph.c) against the
 * graphs in data/graphs.txt, one per line: what is accepted, and which
 * cycles with no way out and unknown stages are refused, and with what.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/data_cases.h"

#include "base/buf.h"
#include "dispatch.h"

/* graph.c reads and sets the dispatcher's options; main.c is not linked. */
struct dispatcher dispatcher;

/* "a NEXT_STAGE=b; b" as pepsi.conf: one [stage-*] section per stage. */
static void
graph_config(const char *graph, struct buf *conf)
{
	char *copy = strdup(graph);
	char *save_stage = NULL;

	for (char *stage = strtok_r(copy, ";", &save_stage); stage;
		 stage = strtok_r(NULL, ";", &save_stage))
	{
		char *save_word = NULL;
		char *name = strtok_r(stage, " ", &save_word);

		buf_printf(conf, "[stage-%s]\nPROGRAM = pepsi-test-probe\n", name);
		for (char *edge = strtok_r(NULL, " ", &save_word); edge; edge = strtok_r(NULL, " ", &save_word))
		{
			char *eq = strchr(edge, '=');

			if (eq == NULL)
				fail_msg("edge \"%s\" is not OPTION=stage", edge);
			*eq = '\0';
			buf_printf(conf, "%s = %s\n", edge, eq + 1);
		}
	}
	free(copy);
}

static void
test_graph(void **state)
{
	const struct data_case *c = *state;
	const char			   *expect = data_case_field(c, 0);
	struct buf				conf = BUF_INIT;
	struct pepsi_config	   *cfg;
	struct stage_spec	   *specs = NULL;
	size_t					count = 0;
	char					err[1024] = "";
	bool					ok;

	graph_config(data_case_field(c, 1), &conf);
	cfg = config_parse_string(conf.data, "pepsi.conf", err, sizeof(err));
	if (cfg == NULL)
		fail_msg("%s: the configuration is refused: %s", c->name, err);
	ok = graph_load(cfg, &specs, &count, err, sizeof(err));
	if (ok)
		graph_free(specs, count);
	config_free(cfg);
	buf_free(&conf);
	if (strcmp(expect, "ok") == 0)
	{
		if (!ok)
			fail_msg("%s: refused: %s", c->name, err);
	}
	else if (ok)
		fail_msg("%s: accepted, should be refused (\"%s\")", c->name, expect);
	else if (strstr(err, expect) == NULL)
		fail_msg("%s: refusal \"%s\" does not say \"%s\"", c->name, err, expect);
}

int
main(void)
{
	size_t			  count;
	struct data_case *cases = data_cases_load(__FILE__, "graphs.txt", &count);

	return data_cases_run("graphs.txt", cases, count, test_graph);
}
