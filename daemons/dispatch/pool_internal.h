/*
 * pool_internal.h: what the worker pools' two files share (not for the
 * rest of pepsi-dispatch, which sees dispatch.h): pool.c sizes the pools,
 * spawns workers and hands them ids; worker.c reads their answers and
 * ends them.
 */
#ifndef PEPSI_DISPATCH_POOL_INTERNAL_H
#define PEPSI_DISPATCH_POOL_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>

#include "dispatch.h"

/*
 * How many of its ids a worker that takes one id per pass holds in its
 * stdin: the one it works on and two more, so it never waits for us to
 * write the next.  The rest of its pipeline stays in its ring here,
 * claimed (so no claim round trip stands between two rows) but still in
 * an order we choose: a row of a sender that has used less worker time
 * than the senders of the rows not yet written goes ahead of them (CFS
 * within the pipeline).  A light sender's row claimed a moment after a
 * burst's then waits for about HAND_AHEAD rows, not a pipeline of them.
 * A batching worker is written all of its ids: it takes what is waiting
 * as one batch.  A program the stage registry does not know is taken to
 * batch once it answers HAND_AHEAD ids at once.
 */
#define HAND_AHEAD 3

/* pool.c */
void pool_note_queued(struct pool *pool, json_t *report);
void worker_hand(struct pool_worker *w);
void worker_lower_priority(pid_t pid, int bulk_nice);
bool worker_is_bulk(const struct pool *pool, bool light_lane);

/* worker.c */
void worker_transition(struct pool_worker *w, enum worker_state to);
void worker_on_readable(struct ev_loop *loop, ev_io *watcher, int revents);
void worker_on_exit(struct ev_loop *loop, ev_child *watcher, int revents);
void worker_close(struct pool_worker *w);

#endif
