/*
 * auth_worker.h: authentication work done off the event loop.  Hashing a
 * password (SHA-crypt, thousands of rounds) takes milliseconds of CPU, and
 * so can checking a message's DKIM and ARC signatures (a header section at
 * the limits, every signature hashing its fields, RSA for each); done on
 * the loop, it would stall every other session, and a client that sends
 * such work in a loop could stall them all.  A small pool of threads does
 * it; the loop hears of each result through an ev_async and calls the
 * job's callback there.
 */
#ifndef PEPSI_INGRESS_AUTH_WORKER_H
#define PEPSI_INGRESS_AUTH_WORKER_H

#include <stdbool.h>

#include <ev.h>

#include "auth.h"

struct auth_job;

typedef void (*auth_job_done)(void *arg, bool ok);

/*
 * Check user's password against c, on a worker thread; done(arg, ok) runs
 * on loop later (never from within this call).  The user's hash and the
 * password are copied: c may be replaced (a reload) meanwhile.
 */
struct auth_job *auth_worker_submit(struct ev_loop *loop, const struct credentials *c,
									const char *user, const char *password, auth_job_done done,
									void *arg);
/* The session went away: its result is dropped, done is never called. */
void auth_worker_cancel(struct auth_job *job);

/*
 * Two lanes: light work (passwords, ordinary messages) on two threads,
 * heavy work (a message of SMTP_HEAVY_MESSAGE octets or more) on a third,
 * at a lower priority.  A client sending the biggest messages the limits
 * allow, in a loop, then keeps one thread busy, not all of them, and the
 * other sessions' messages never wait behind its own.
 */
enum auth_lane
{
	AUTH_LANE_LIGHT,
	AUTH_LANE_HEAVY
};

/*
 * Any other work: work(arg) runs on a worker thread of lane, then done(arg)
 * on loop (never from within this call).  What work reads and writes must
 * be left alone by the loop until done.
 */
typedef void (*auth_work_fn)(void *arg);
struct auth_job *auth_worker_run(struct ev_loop *loop, enum auth_lane lane, auth_work_fn work,
								 auth_work_fn done, void *arg);
/*
 * The owner of such a job went away while work may still be running:
 * done is never called; release(arg) is, on the loop, once work is over,
 * to free what it used.
 */
void auth_worker_abandon(struct auth_job *job, auth_work_fn release);

#endif
