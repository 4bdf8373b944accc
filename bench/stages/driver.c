/*
 * driver.c: the stand-in dispatcher of bench/stages.  It starts the
 * workers of every stage, then loops: one pepsi.workqueue_claim_tokens for every stage (as
 * the dispatcher claims on each wake), the claimed ids and their tokens written to their
 * stage's workers, their status lines read back, until a claim finds
 * nothing.
 *
 *   driver run  CONNINFO CONFIG PROGRAM QUEUE_LIMIT WORKERS STAGE...
 *       WORKERS workers per stage, all working at once as the
 *       dispatcher's pools do, each fed half its QUEUE_LIMIT per claim,
 *       the next claim running while they work on them (so at most
 *       QUEUE_LIMIT ids in flight, as the dispatcher keeps); "serial" for
 *       one per stage, one working at a time and no claim meanwhile
 *       (what a stage hop costs, whatever the number of cores); prints "seconds
 *       messages hops fused_hops claims client_cpu_seconds" on stdout (the
 *       CPU time of the driver and its workers together); a non-zero
 *       status line is fatal
 *   driver rss  CONFIG PROGRAM ID
 *       starts PROGRAM worker, has it do row ID, prints its VmRSS and
 *       RssFile (kB) while it idles
 *
 * PROGRAM is run as "PROGRAM worker -c CONFIG"; with the multi-call binary
 * it is a symlink named for the stage program.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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
	char	  (*tokens)[37];	/* their claim tokens, written after the ids */
	int			nids;
	int			unanswered;		/* ids of the previous round not answered yet */
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

/* Send the worker its ids: it starts on them while the others get theirs. */
static void
worker_send(struct worker *w)
{
	/* A bare id for a row set running by hand (rss: no claim, so no token). */
	for (int i = 0; i < w->nids; i++)
		if (w->tokens)
			fprintf(w->in, "%lld %s\n", w->ids[i], w->tokens[i]);
		else
			fprintf(w->in, "%lld\n", w->ids[i]);
	fflush(w->in);
}

/* Read one status line for each of the n ids sent first; returns the fused hops they report. */
static long
worker_collect(struct worker *w, int n)
{
	char		line[4096];
	long		fused = 0;

	for (int i = 0; i < n; i++)
	{
		if (fgets(line, sizeof(line), w->out) == NULL)
			die("worker of stage %s ended early", w->stage);
		if (line[0] != '0' || (line[1] != '\n' && line[1] != ' '))
			die("status line: %s", line);
		fused += fused_hops(line);
	}
	return fused;
}

/* Send the worker its ids and read one status line per id. */
static long
worker_round(struct worker *w)
{
	int			n = w->nids;

	worker_send(w);
	w->nids = 0;
	return worker_collect(w, n);
}

static double
now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double
rusage_seconds(const struct rusage *ru)
{
	return ru->ru_utime.tv_sec + ru->ru_utime.tv_usec / 1e6 + ru->ru_stime.tv_sec + ru->ru_stime.tv_usec / 1e6;
}

static int
run(int argc, char **argv)
{
	const char *conninfo = argv[2];
	const char *config = argv[3];
	const char *program = argv[4];
	int			limit = atoi(argv[5]);
	bool		serial = strcmp(argv[6], "serial") == 0;
	int			per_stage = serial ? 1 : atoi(argv[6]);
	int			nstages = argc - 7;
	/* Ids per worker per claim: two claims' worth are in flight at once. */
	int			share = serial ? limit : (limit + 1) / 2;
	int			nworkers = nstages * per_stage;
	struct worker *workers = calloc((size_t) (nworkers > 0 ? nworkers : 1), sizeof(struct worker));
	char		stages[1024] = "{";
	char		capacities[1024] = "{";
	const char *values[2] = {stages, capacities};
	PGconn	   *conn = PQconnectdb(conninfo);
	long		messages = 0;
	long		hops = 0;
	long		fused = 0;
	long		claims = 0;
	double		started;
	double		seconds;
	struct rusage self;
	struct rusage children;

	if (PQstatus(conn) != CONNECTION_OK)
		die("%s", PQerrorMessage(conn));
	if (limit < 1 || per_stage < 1 || nstages < 1)
		die("%s", "usage: driver run CONNINFO CONFIG PROGRAM QUEUE_LIMIT WORKERS STAGE...");
	/* Worker s * per_stage + k is the k-th worker of stage s. */
	for (int w = 0; w < nworkers; w++)
	{
		workers[w].stage = argv[7 + w / per_stage];
		workers[w].ids = calloc((size_t) limit, sizeof(long long));
		workers[w].tokens = calloc((size_t) limit, sizeof(*workers[w].tokens));
		worker_start(&workers[w], program, config);
	}
	for (int s = 0; s < nstages; s++)
	{
		snprintf(stages + strlen(stages), sizeof(stages) - strlen(stages), "%s\"%s\"",
				 s ? "," : "", argv[7 + s]);
		snprintf(capacities + strlen(capacities), sizeof(capacities) - strlen(capacities),
				 "%s%d", s ? "," : "", share * per_stage);
	}
	strcat(stages, "}");
	strcat(capacities, "}");
	if (PQresultStatus(PQprepare(conn, "claim",
								 "SELECT id, stage, claim_token"
								 " FROM pepsi.workqueue_claim_tokens($1::text[], $2::int[])",
								 2, NULL)) != PGRES_COMMAND_OK)
		die("%s", PQerrorMessage(conn));

	started = now_seconds();
	for (;;)
	{
		PGresult   *res = PQexecPrepared(conn, "claim", 2, values, NULL, NULL, 0);
		int			rows;
		bool		waiting = false;

		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			die("claim: %s", PQerrorMessage(conn));
		claims++;
		rows = PQntuples(res);
		for (int w = 0; w < nworkers; w++)
			waiting |= workers[w].unanswered > 0;
		if (rows == 0 && !waiting)
		{
			PQclear(res);
			break;
		}
		/* Each stage's rows filled onto its workers in turn, a share each. */
		for (int r = 0; r < rows; r++)
		{
			const char *stage = PQgetvalue(res, r, 1);

			for (int s = 0; s < nstages; s++)
				if (strcmp(argv[7 + s], stage) == 0)
				{
					struct worker *w = &workers[s * per_stage];

					while (w->nids == share)
						w++;
					snprintf(w->tokens[w->nids], sizeof(w->tokens[w->nids]), "%s", PQgetvalue(res, r, 2));
					w->ids[w->nids++] = atoll(PQgetvalue(res, r, 0));
					if (s == 0)
						messages++;
				}
		}
		PQclear(res);
		/*
		 * Every worker gets its ids before any answer is read, so they work
		 * at once; then the answers to the previous round are read, while
		 * the workers go on with this one, and the next claim runs while
		 * they do, as the dispatcher claims while its pools work.  With
		 * WORKERS "serial", one worker at a time and no claim meanwhile.
		 */
		for (int w = 0; w < nworkers; w++)
		{
			int			sent = workers[w].nids;

			hops += sent;
			if (serial)
			{
				fused += worker_round(&workers[w]);
				continue;
			}
			worker_send(&workers[w]);
			workers[w].nids = 0;
			fused += worker_collect(&workers[w], workers[w].unanswered);
			workers[w].unanswered = sent;
		}
	}
	seconds = now_seconds() - started;
	for (int w = 0; w < nworkers; w++)
		worker_stop(&workers[w]);
	/* The clients' CPU: this driver and its workers, now that they are reaped. */
	getrusage(RUSAGE_SELF, &self);
	getrusage(RUSAGE_CHILDREN, &children);
	printf("%.3f %ld %ld %ld %ld %.3f\n", seconds, messages, hops + fused, fused, claims,
		   rusage_seconds(&self) + rusage_seconds(&children));
	fflush(stdout);
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
	if (argc >= 8 && strcmp(argv[1], "run") == 0)
		return run(argc, argv);
	if (argc == 5 && strcmp(argv[1], "rss") == 0)
		return rss(argc, argv);
	fprintf(stderr, "usage: driver run CONNINFO CONFIG PROGRAM QUEUE_LIMIT WORKERS STAGE...\n"
			"       driver rss CONFIG PROGRAM ID\n");
	return 64;
}
