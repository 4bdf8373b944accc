/*
 * test_depth.c: a stage's pipeline depth (depth.c) against
 * data/pipeline_depth.txt: batches with a fixed cost and a cost per row
 * are fed back in a closed loop, and the depth must settle where the
 * marginal cost of a row puts it, never collapsing to its floor because
 * the fixed cost is large.
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

#include "dispatch.h"

/* Uniform in [-1, 1], the same sequence every run. */
static double
jitter_unit(uint64_t *seed)
{
	*seed = *seed * 6364136223846793005ULL + 1442695040888963407ULL;
	return (double) (*seed >> 11) / (double) (1ULL << 53) * 2 - 1;
}

static void
test_settles(void **state)
{
	const struct data_case *c = *state;
	long					queue_limit = strtol(data_case_field(c, 0), NULL, 10);
	const char			   *batch = data_case_field(c, 1);
	double					fixed_ms = strtod(data_case_field(c, 2), NULL);
	double					row_ms = strtod(data_case_field(c, 3), NULL);
	double					jitter_ms = strtod(data_case_field(c, 4), NULL);
	double					low = strtod(data_case_field(c, 5), NULL);
	double					high = strtod(data_case_field(c, 6), NULL);
	struct pool_depth		depth;
	uint64_t				seed = 42;
	double					sum = 0;

	depth_init(&depth);
	for (int i = 1; i <= 300; i++)
	{
		int	   limit = depth_limit(&depth, queue_limit);
		int	   rows = strcmp(batch, "full") == 0 ? limit : atoi(batch);
		double ms = fixed_ms + row_ms * rows + jitter_ms * jitter_unit(&seed);

		if (i > 200)
			sum += limit;
		depth_record_batch(&depth, rows, (ms > 0 ? ms : 0) * 1000);
	}
	if (sum / 100 < low || sum / 100 > high)
		fail_msg("%s: mean depth %.1f, want %.0f to %.0f (sized by %.1f us a row)", c->name,
				 sum / 100, low, high, depth.row_us);
}

int
main(void)
{
	size_t			  count;
	struct data_case *cases = data_cases_load(__FILE__, "pipeline_depth.txt", &count);

	return data_cases_run("pipeline_depth.txt", cases, count, test_settles);
}
