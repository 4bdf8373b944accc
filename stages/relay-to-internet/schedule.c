/*
 * schedule.c: when a relay-to-internet worker may deliver to a
 * destination.  The slot of the destination (its concurrency, rate limit
 * and backoff, destination.h) is taken before connecting and kept with
 * the session after a delivery, so that the next message to the same
 * domain carries on under it; and the domains this process saw to be
 * slow are remembered, so that their rows are not fused into route's pass.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "internet.h"
#include "tls_policy_seam.h"

/* ---------------------------------------------------------------------------
 * Destinations this process saw to be slow: not fused (see the top)
 * ------------------------------------------------------------------------- */

#define INTERNET_SLOW_DOMAINS 16
#define INTERNET_SLOW_MEMO_SECONDS 60.0

static struct
{
	char  *domain; /* in A-labels */
	double seen_at;
} internet_slow[INTERNET_SLOW_DOMAINS];

/* A delivery to domain took seconds: remember it if that is slow (the oldest entry goes). */
void
internet_slow_note(struct pepsi_ctx *ctx, const char *domain, double seconds)
{
	double slow = pepsi_option_seconds(ctx, "DESTINATION_SLOW");
	size_t at = 0;

	if (slow <= 0 || seconds < slow)
		return;
	for (size_t i = 0; i < INTERNET_SLOW_DOMAINS; i++)
	{
		if (internet_slow[i].domain && strcasecmp(internet_slow[i].domain, domain) == 0)
		{
			at = i;
			break;
		}
		if (internet_slow[i].seen_at < internet_slow[at].seen_at)
			at = i;
	}
	if (internet_slow[at].domain == NULL || strcasecmp(internet_slow[at].domain, domain) != 0)
	{
		free(internet_slow[at].domain);
		internet_slow[at].domain = xstrdup(domain);
	}
	internet_slow[at].seen_at = destination_now();
}

bool
internet_slow_recently(const char *domain)
{
	double now = destination_now();

	for (size_t i = 0; i < INTERNET_SLOW_DOMAINS; i++)
		if (internet_slow[i].domain && now - internet_slow[i].seen_at < INTERNET_SLOW_MEMO_SECONDS
			&& strcasecmp(internet_slow[i].domain, domain) == 0)
			return true;
	return false;
}

/*
 * A run of deliveries to one destination (a batch's rows to one domain)
 * asks destination_begin once: while the slot of the last delivery there
 * is kept, and the destination needs no asking per message (no rate
 * limit, not a slow one capped to a share of the workers, not contended),
 * up to INTERNET_TURN_MESSAGES more go under that slot within
 * INTERNET_TURN_SECONDS of the begin.  Anything else (another domain in
 * between, a failure, the worker idle) ends the run: the next asks.
 */
#define INTERNET_TURN_MESSAGES 7
#define INTERNET_TURN_SECONDS 1.0

static struct
{
	char  *domain; /* NULL: no run */
	int	   left;
	double until;
} internet_turn;

static void
internet_turn_set(const char *domain, const struct destination_start *start)
{
	free(internet_turn.domain);
	internet_turn.domain = NULL;
	if (start == NULL || start->slot < 0 || start->per_message || start->contended)
		return;
	internet_turn.domain = xstrdup(domain);
	internet_turn.left = INTERNET_TURN_MESSAGES;
	internet_turn.until = destination_now() + INTERNET_TURN_SECONDS;
}

/* Does this delivery to domain go on under the kept slot?  Then start says so. */
static bool
internet_turn_carry_on(const char *domain, struct destination_start *start)
{
	int slot;

	if (internet_turn.domain == NULL || strcasecmp(internet_turn.domain, domain) != 0
		|| internet_turn.left <= 0 || destination_now() >= internet_turn.until
		|| (slot = destination_carry_on(domain)) < 0)
		return false;
	internet_turn.left--;
	memset(start, 0, sizeof(*start));
	start->slot = slot;
	internet_session_keep(NULL);
	return true;
}

/*
 * destination_begin for domain, whose MX hosts are route's.  A session
 * kept with the slot of a contended destination is closed when the slot
 * goes (the destination counts an idle connection as a busy one); to the
 * same domain, slot and session carry on.
 */
bool
internet_destination_begin(struct pepsi_ctx *ctx, const char *domain, const struct mx_route *route,
						   struct destination_start *start, char *err, size_t errlen)
{
	const char			   **hosts;
	bool					 kept_contended;
	const char				*kept = destination_kept_domain(&kept_contended);
	bool					 same = kept && strcasecmp(kept, domain) == 0;
	struct smtp_client		*kept_client = internet_session_kept();
	bool					 ok;
	struct destination_share share;

	if (kept_client && !kept_contended && same && internet_turn_carry_on(domain, start))
		return true;
	share = (struct destination_share){
		.default_concurrency = pepsi_option_int(ctx, "DESTINATION_CONCURRENCY"),
		.slow_seconds = pepsi_option_seconds(ctx, "DESTINATION_SLOW"),
		/* (rounded up: a slow destination keeps a slot of a small stage) */
		.slow_limit = (pepsi_option_int(ctx, "PARALLELISM") * pepsi_option_int(ctx, "DESTINATION_SLOW_SHARE") + 99)
					  / 100,
		.handoff_seconds = pepsi_option_seconds(ctx, "DESTINATION_HANDOFF"),
		.stage = pepsi_stage_name(ctx),
	};

	/*
	 * To another domain, the session goes before the slot: a waiter given
	 * the slot at once must not find the destination's connections full.
	 */
	if (kept_client && kept_contended && !same)
	{
		internet_session_close(kept_client);
		kept_client = NULL;
	}
	hosts = xcalloc(route->nhosts + 1, sizeof(char *));
	for (size_t i = 0; i < route->nhosts; i++)
		hosts[i] = route->hosts[i].name;
	ok = destination_begin(pepsi_db(ctx), domain, &share, hosts, route->nhosts, start, err, errlen);
	free(hosts);
	internet_session_keep(NULL);
	if (kept_client && kept_contended && !(ok && same && start->slot >= 0))
		internet_session_close(kept_client);
	internet_turn_set(domain, ok ? start : NULL);
	if (ok)
	{
		internet_tls_policy_sts_cached(domain, start->sts_policy_id, start->sts_policy);
		/* Recorded by whichever worker: the same result need not be written again. */
		if (start->tls_policy)
			internet_tls_note(domain, start->tls_policy, start->tls_outcome);
	}
	return ok;
}

/* The worker has no row to work on: after a short grace, the kept slot goes. */
#define INTERNET_KEEP_GRACE_MS 200

int
internet_idle(PGconn *conn, double idle_seconds)
{
	bool		contended;
	const char *kept = destination_kept_domain(&contended);
	char		err[512];

	if (kept == NULL)
		return -1;
	if (idle_seconds * 1000 < INTERNET_KEEP_GRACE_MS)
		return INTERNET_KEEP_GRACE_MS - (int) (idle_seconds * 1000);
	/* (The session first, as internet_destination_begin does.) */
	if (contended && internet_session_kept())
		internet_session_close(internet_session_kept());
	internet_session_keep(NULL);
	if (!destination_release(conn, err, sizeof(err)))
		log_warnx("%s", err);
	return -1;
}

/* ---------------------------------------------------------------------------
 * The TLS results recorded in pepsi.destination, as this worker last
 * wrote or read them (destination_begin answers them; the oldest goes)
 * ------------------------------------------------------------------------- */

#define INTERNET_TLS_MEMO 32

static struct
{
	char *domain;
	char *policy;
	char *outcome;
} internet_tls_memo[INTERNET_TLS_MEMO];
static size_t internet_tls_next;

static bool
internet_same(const char *a, const char *b)
{
	return a == NULL ? b == NULL : b != NULL && strcmp(a, b) == 0;
}

bool
internet_tls_recorded(const char *domain, const char *policy, const char *outcome)
{
	if (policy == NULL)
		return true;
	for (size_t i = 0; i < INTERNET_TLS_MEMO; i++)
		if (internet_tls_memo[i].domain && strcasecmp(internet_tls_memo[i].domain, domain) == 0)
			return internet_same(internet_tls_memo[i].policy, policy)
				   && internet_same(internet_tls_memo[i].outcome, outcome);
	return false;
}

void
internet_tls_note(const char *domain, const char *policy, const char *outcome)
{
	size_t at = internet_tls_next;

	if (policy == NULL)
		return;
	for (size_t i = 0; i < INTERNET_TLS_MEMO; i++)
		if (internet_tls_memo[i].domain && strcasecmp(internet_tls_memo[i].domain, domain) == 0)
			at = i;
	if (at == internet_tls_next)
		internet_tls_next = (internet_tls_next + 1) % INTERNET_TLS_MEMO;
	free(internet_tls_memo[at].domain);
	free(internet_tls_memo[at].policy);
	free(internet_tls_memo[at].outcome);
	internet_tls_memo[at].domain = xstrdup(domain);
	internet_tls_memo[at].policy = xstrdup(policy);
	internet_tls_memo[at].outcome = outcome ? xstrdup(outcome) : NULL;
}
