/*
 * driver.c: the stand-in dispatcher of bench/stages.  It starts one worker
 * per stage, then loops: one pepsi.workqueue_claim for every stage (as
 * the dispatcher claims on each wake), the claimed ids written to their
 * stage's worker, its status lines read back, until a claim finds nothing.
 * One worker works at a time, so the figures compare what a stage hop
 * costs, not how many cores the machine has.
 *
 *   driver run  CONNINFO CONFIG PROGRAM QUEUE_LIMIT STAGE...
 *       prints "seconds messages hops fused_hops claims" on stdout; a
 *       non-zero status line is fatal
 *   driver rss  CONFIG PROGRAM ID
 *       starts PROGRAM worker, has it do row ID, prints its VmRSS and
 *       RssFile (kB) while it idles
 *
 * PROGRAM is run as "PROGRAM worker -c CONFIG"; with the multi-call binary
 * it is a symlink named for the stage program.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

struct worker
{
	const char *stage;
	pid_t		pid;
	FILE	   *in;				/* its stdin */
	FILE	   *out;			/* its stdout */
	long long  *ids;			/* claimed for it this round */
	int			nids;
};

static void
die(const char *fmt, const char *arg)
{
	fprintf(stderr, "driver: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n");
	exit(1);
}

static void
worker_start(struct worker *w, const char *program, const char *config)
{
	int			to_child[2];
	int			from_child[2];

	/* Close-on-exec: a worker must not hold another's stdin open past its end. */
	if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0)
		die("pipe: %s", strerror(errno));
	w->pid = fork();
	if (w->pid < 0)
		die("fork: %s", strerror(errno));
	if (w->pid == 0)
	{
		dup2(to_child[0], 0);
		dup2(from_child[1], 1);
		close(to_child[0]);
		close(to_child[1]);
		close(from_child[0]);
		close(from_child[1]);
		execl(program, program, "worker", "-c", config, (char *) NULL);
		fprintf(stderr, "driver: cannot run %s: %s\n", program, strerror(errno));
		_exit(127);
	}
	close(to_child[0]);
	close(from_child[1]);
	w->in = fdopen(to_child[1], "w");
	w->out = fdopen(from_child[0], "r");
}

static void
worker_stop(struct worker *w)
{
	int			status;

	fclose(w->in);
	fclose(w->out);
	waitpid(w->pid, &status, 0);
}

/* Count the fused hops a status line reports ("0 {"fused":[{...},{...}]}"). */
static long
fused_hops(const char *line)
{
	long		hops = 0;

	for (const char *p = line; (p = strstr(p, "\"stage\"")) != NULL; p++)
		hops++;
	return hops;
}

/* Send the worker its ids and read one status line per id. */
static long
worker_round(struct worker *w)
{
	char		line[4096];
	long		fused = 0;

	for (int i = 0; i < w->nids; i++)
		fprintf(w->in, "%lld\n", w->ids[i]);
	fflush(w->in);
	for (int i = 0; i < w->nids; i++)
	{
		if (fgets(line, sizeof(line), w->out) == NULL)
			die("worker of stage %s ended early", w->stage);
		if (line[0] != '0' || (line[1] != '\n' && line[1] != ' '))
			die("status line: %s", line);
		fused += fused_hops(line);
	}
	w->nids = 0;
	return fused;
}

static double
now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int
run(int argc, char **argv)
{
	const char *conninfo = argv[2];
	const char *config = argv[3];
	const char *program = argv[4];
	int			limit = atoi(argv[5]);
	int			nstages = argc - 6;
	struct worker *workers = calloc((size_t) nstages, sizeof(struct worker));
	char		stages[1024] = "{";
	char		capacities[1024] = "{";
	const char *values[2] = {stages, capacities};
	PGconn	   *conn = PQconnectdb(conninfo);
	long		messages = 0;
	long		hops = 0;
	long		fused = 0;
	long		claims = 0;
	double		started;

	if (PQstatus(conn) != CONNECTION_OK)
		die("%s", PQerrorMessage(conn));
	if (limit < 1 || nstages < 1)
		die("%s", "usage: driver run CONNINFO CONFIG PROGRAM QUEUE_LIMIT STAGE...");
	for (int s = 0; s < nstages; s++)
	{
		workers[s].stage = argv[6 + s];
		workers[s].ids = calloc((size_t) limit, sizeof(long long));
		worker_start(&workers[s], program, config);
		snprintf(stages + strlen(stages), sizeof(stages) - strlen(stages), "%s\"%s\"",
				 s ? "," : "", argv[6 + s]);
		snprintf(capacities + strlen(capacities), sizeof(capacities) - strlen(capacities),
				 "%s%d", s ? "," : "", limit);
	}
	strcat(stages, "}");
	strcat(capacities, "}");
	if (PQresultStatus(PQprepare(conn, "claim",
								 "SELECT id, stage FROM pepsi.workqueue_claim($1::text[], $2::int[])",
								 2, NULL)) != PGRES_COMMAND_OK)
		die("%s", PQerrorMessage(conn));

	started = now_seconds();
	for (;;)
	{
		PGresult   *res = PQexecPrepared(conn, "claim", 2, values, NULL, NULL, 0);
		int			rows;

		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			die("claim: %s", PQerrorMessage(conn));
		claims++;
		rows = PQntuples(res);
		if (rows == 0)
		{
			PQclear(res);
			break;
		}
		for (int r = 0; r < rows; r++)
		{
			const char *stage = PQgetvalue(res, r, 1);

			for (int s = 0; s < nstages; s++)
				if (strcmp(workers[s].stage, stage) == 0)
				{
					workers[s].ids[workers[s].nids++] = atoll(PQgetvalue(res, r, 0));
					if (s == 0)
						messages++;
				}
		}
		PQclear(res);
		/* Each stage's worker in turn, in chain order. */
		for (int s = 0; s < nstages; s++)
		{
			hops += workers[s].nids;
			fused += worker_round(&workers[s]);
		}
	}
	printf("%.3f %ld %ld %ld %ld\n", now_seconds() - started, messages, hops + fused, fused, claims);
	fflush(stdout);
	for (int s = 0; s < nstages; s++)
		worker_stop(&workers[s]);
	PQfinish(conn);
	return 0;
}

/* The resident set of a worker that has done one row and waits for the next. */
static int
rss(int argc, char **argv)
{
	struct worker w = {.stage = "rss"};
	long long	id = atoll(argv[4]);
	char		path[64];
	char		line[256];
	FILE	   *status;

	w.ids = &id;
	w.nids = 1;
	worker_start(&w, argv[3], argv[2]);
	worker_round(&w);
	snprintf(path, sizeof(path), "/proc/%d/status", (int) w.pid);
	if ((status = fopen(path, "r")) == NULL)
		die("%s: cannot open", path);
	while (fgets(line, sizeof(line), status))
		if (strncmp(line, "VmRSS:", 6) == 0 || strncmp(line, "RssFile:", 8) == 0
			|| strncmp(line, "RssAnon:", 8) == 0)
			fputs(line, stdout);
	fclose(status);
	worker_stop(&w);
	return 0;
}

int
main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	if (argc >= 7 && strcmp(argv[1], "run") == 0)
		return run(argc, argv);
	if (argc == 5 && strcmp(argv[1], "rss") == 0)
		return rss(argc, argv);
	fprintf(stderr, "usage: driver run CONNINFO CONFIG PROGRAM QUEUE_LIMIT STAGE...\n"
			"       driver rss CONFIG PROGRAM ID\n");
	return 64;
}
