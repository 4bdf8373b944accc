/*
 * admit.h: admission into the queue with group commit.
 *
 * A small pool of libpq connections in non-blocking pipeline mode, driven
 * by the event loop, and one more for new clients' admissions (admit.c).  Messages that arrive while every connection is busy
 * wait, and the next connection to come free takes all of them (up to
 * BATCH_SIZE) as one pipeline: one pepsi.workqueue_add per message and a
 * single Sync, which is one implicit transaction, one commit and one WAL
 * flush for the lot.  The known clients' messages go into an open
 * pipeline instead, sent as they come, whose Sync goes out while the
 * commit before it is flushing, once the sessions that commit's
 * predecessor answered are back (admit.c).  A message's
 * callback runs only after its commit returned.  The dispatcher is woken by a coalescing timer after commits,
 * in a transaction of its own (docs/architecture.md 2.1: no NOTIFY in
 * the admission).
 */
#ifndef PEPSI_INGRESS_ADMIT_H
#define PEPSI_INGRESS_ADMIT_H

#include <stdbool.h>
#include <stddef.h>

#include <ev.h>

#include "config/config.h"
#include "envelope.h"

struct admit_options
{
	int			connections;   /* [ingress] DATABASE_CONNECTIONS */
	int			batch_size;	   /* [ingress] BATCH_SIZE */
	const char *stage;		   /* [ingress] INIT_STAGE */
	double		wake_interval; /* [ingress] DISPATCH_WAKE_INTERVAL, seconds */
	int			bulk_nice;	   /* [ingress] BULK_NICE: the known clients' sessions' nice value */
	/* pepsi_config_changed arrived (coalesced; called from the loop). */
	void (*config_changed)(void);
};

/* The counters admit_report sends to pepsi.ingress_stats. */
struct admit_report
{
	const char		  *instance; /* host:pid */
	unsigned long long sessions;
	unsigned long long sessions_total;
	unsigned long long messages;
	const char		  *refusals; /* smtp_refusals_json() */
};

/* ok: committed, with its row id; otherwise the message was not stored. */
typedef void (*admit_done_fn)(void *arg, bool ok, long long id);

struct admission;

void admit_init(struct ev_loop *loop, const struct pepsi_config *cfg,
				const struct admit_options *options);
/* Is any connection up (or coming up)?  If not, reply 451 at once. */
bool admit_available(void);
/* Queue e (taken over) for storing; done(arg, ...) is called later, never from here. */
struct admission *admit_submit(struct envelope *e, admit_done_fn done, void *arg);
/* The session went away: the admission completes without telling anyone. */
void admit_detach(struct admission *a);
/*
 * The session arg went away (or submitted its next message): the open
 * batch no longer awaits it (admit_gather).
 */
void admit_forget(void *arg);
/*
 * Send r to pepsi.ingress_report on the next idle connection (a report
 * still waiting is replaced); admit_shutdown removes the instance's row.
 */
void admit_report(const struct admit_report *r);
/* Admissions queued or in flight (shutdown waits for them). */
size_t admit_pending(void);
void   admit_shutdown(void);

#endif
