/*
 * depth.c: how many ids a stage worker's pipeline may hold.
 *
 * A row claimed a moment after a burst filled the pipelines waits behind
 * the burst's rows, so a pipeline holds about PIPELINE_AHEAD_US of work,
 * and never fewer than PIPELINE_MIN ids (the one being worked on, the
 * next, and one to cover the claim that refills it).  What "work" costs
 * is measured from the batches the workers answer (pool.c): a batch of n
 * rows costs a fixed C (its load, its commit, the fsync) plus v per row,
 * and only v grows with the depth.  Sizing by the mean cost per row,
 * (C + v n) / n, instead, shrinks the depth once C is large (a loaded
 * disk), which makes the batches smaller and each row dearer still: the
 * pipeline collapses to its floor and stays there.  So v is fitted by
 * least squares over the last DEPTH_WINDOW batches, within its sane
 * bounds (0, and the mean cost, which assumes C = 0).  Until there are
 * DEPTH_FIT_MIN batches, and while the batches of the window are too
 * alike in size to tell C from v, the mean cost sizes the pipeline; but
 * then nothing says the depth is too deep, so once the window is that
 * long it may reach twice the batches seen: the next batches differ in
 * size and the fit has its answer.  A stage that runs one row
 * at a time answers batches of one, and keeps the mean cost's depth.
 */
#include <math.h>

#include "dispatch.h"

#define PIPELINE_AHEAD_US 20000.0
#define PIPELINE_MIN 3
/* Batches needed before a fit is believed: two points and some noise. */
#define DEPTH_FIT_MIN 4
/* The depth never planned beyond this, whatever QUEUE_LIMIT says. */
#define DEPTH_MAX 100000

/* The depth of a pool that has answered nothing yet: a guess of 1 ms a row. */
void
depth_init(struct pool_depth *depth)
{
	*depth = (struct pool_depth){.depth = (int) (PIPELINE_AHEAD_US / 1000.0)};
}

static int
depth_for_cost(double row_us)
{
	double rows = row_us > 0 ? ceil(PIPELINE_AHEAD_US / row_us) : DEPTH_MAX;

	return rows < DEPTH_MAX ? (int) rows : DEPTH_MAX;
}

/* A worker answered a batch of rows ids together, us after it started on them. */
void
depth_record_batch(struct pool_depth *depth, int rows, double us)
{
	double mean_rows = 0, mean_us = 0, sxx = 0, sxy = 0;
	double spread;
	double row_us;
	int	   explore = 0;
	int	   wanted;

	if (rows <= 0 || !(us >= 0))
		return;
	depth->rows[depth->next] = rows;
	depth->us[depth->next] = us;
	depth->next = (depth->next + 1) % DEPTH_WINDOW;
	if (depth->count < DEPTH_WINDOW)
		depth->count++;

	for (int i = 0; i < depth->count; i++)
	{
		mean_rows += depth->rows[i];
		mean_us += depth->us[i];
	}
	mean_rows /= depth->count;
	mean_us /= depth->count;
	for (int i = 0; i < depth->count; i++)
	{
		sxx += (depth->rows[i] - mean_rows) * (depth->rows[i] - mean_rows);
		sxy += (depth->rows[i] - mean_rows) * (depth->us[i] - mean_us);
	}

	/*
	 * The mean cost bounds v from above (C >= 0).  A fit needs sizes that
	 * spread by a row and by an eighth of their mean, or the timing noise
	 * of a loaded machine is all it measures.
	 */
	row_us = mean_us / mean_rows;
	spread = mean_rows / 8 > 1 ? mean_rows / 8 : 1;
	if (depth->count >= DEPTH_FIT_MIN && sxx / depth->count >= spread * spread)
	{
		double slope = sxy / sxx;

		if (slope < row_us)
			row_us = slope > 0 ? slope : 0;
	}
	else if (depth->count >= DEPTH_FIT_MIN)
		explore = (int) ceil(2 * mean_rows);
	wanted = depth_for_cost(row_us);
	if (wanted < explore)
		wanted = explore;
	depth->depth = wanted > PIPELINE_MIN ? wanted : PIPELINE_MIN;
	depth->row_us = row_us;
}

/* The depth for a worker whose queue holds at most queue_limit ids. */
int
depth_limit(const struct pool_depth *depth, long queue_limit)
{
	return depth->depth < queue_limit ? depth->depth : (int) queue_limit;
}
