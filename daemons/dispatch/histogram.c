/*
 * histogram.c: the dispatcher's histograms of stage run time (the worker
 * time each message took) and delivery delay (from receipt to a sent
 * delivery, as the worker's status line reports it), kept per pool
 * between statistics flushes and added to pepsi.stage_histogram, which
 * /metrics exposes as Prometheus histograms.
 */
#include <stdio.h>

#include "dispatch.h"

/* Upper bounds in seconds; a last bucket holds what is above them all. */
static const double histogram_bounds[HISTOGRAMS][HISTOGRAM_BOUNDS] = {
	[HISTOGRAM_RUN] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	[HISTOGRAM_DELIVERY_DELAY] = {0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600, 7200, 21600, 86400,
								  432000},
};
static const char *const histogram_metric[HISTOGRAMS] = {
	[HISTOGRAM_RUN] = "run_seconds",
	[HISTOGRAM_DELIVERY_DELAY] = "delivery_delay_seconds",
};

void
histogram_observe(struct pool_stats *stats, enum histogram_kind kind, double seconds)
{
	struct histogram *h = &stats->histograms[kind];
	int				  i = 0;

	if (seconds < 0)
		seconds = 0;
	while (i < HISTOGRAM_BOUNDS && seconds > histogram_bounds[kind][i])
		i++;
	h->buckets[i]++;
	h->sum += seconds;
	h->count++;
}

/* The pool's histograms with observations, as rows for pepsi.stage_histogram_add. */
void
histogram_rows(json_t *rows, const char *stage, const struct pool_stats *stats)
{
	for (int kind = 0; kind < HISTOGRAMS; kind++)
	{
		const struct histogram *h = &stats->histograms[kind];
		json_t				   *le, *buckets;

		if (h->count == 0)
			continue;
		le = json_array();
		buckets = json_array();
		for (int i = 0; i < HISTOGRAM_BOUNDS; i++)
			json_array_append_new(le, json_real(histogram_bounds[kind][i]));
		for (int i = 0; i <= HISTOGRAM_BOUNDS; i++)
			json_array_append_new(buckets, json_integer((json_int_t) h->buckets[i]));
		json_array_append_new(rows, json_pack("{s:s, s:s, s:o, s:o, s:f, s:I}", "stage", stage, "metric",
											  histogram_metric[kind], "le", le, "buckets", buckets, "sum",
											  h->sum, "count", (json_int_t) h->count));
	}
}
