/*
 * auth_worker.h: AUTH passwords checked off the event loop.  Hashing a
 * password (SHA-crypt, thousands of rounds) takes milliseconds of CPU;
 * done on the loop it would stall every other session, and a client that
 * sends AUTH in a loop could stall them all.  A small pool of threads
 * hashes; the loop hears of each result through an ev_async and calls the
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

#endif
