/*
 * admit_clients.h: which clients are new to the admission pool's wakes.
 *
 * A client (its account, else its address) is new when it was admitted
 * neither in the current interval nor in the one before.  admit.c wakes
 * the dispatcher at once for a new client's commit and puts its messages
 * in the express lane, while a client that keeps sending shares the
 * interval's one wake (admit.c, "The dispatcher is woken at most once per
 * DISPATCH_WAKE_INTERVAL").  The intervals are the caller's
 * wake_interval; times are ev_now()'s, passed in, so the tables are plain
 * data (and the rules can be read without the event loop).
 */
#ifndef PEPSI_INGRESS_ADMIT_CLIENTS_H
#define PEPSI_INGRESS_ADMIT_CLIENTS_H

#include <stdbool.h>
#include <stddef.h>

/* Clients kept an interval; past that, none is new until the next. */
#define ADMIT_CLIENTS_KEPT 16
/* A client's name is compared on its first ADMIT_CLIENT_NAME_MAX - 1 bytes. */
#define ADMIT_CLIENT_NAME_MAX 64

struct admit_clients
{
	/* The clients admitted in the interval that began at since ([0]) and in the one before it ([1]). */
	char   names[2][ADMIT_CLIENTS_KEPT][ADMIT_CLIENT_NAME_MAX];
	size_t count[2];
	double since;
};

/* Whether client is new at now, recording nothing (a submitted message's lane). */
bool admit_clients_is_new(const struct admit_clients *t, const char *client, double now, double interval);
/* client's batch committed at now: record it in the interval, and say whether it was new. */
bool admit_clients_record(struct admit_clients *t, const char *client, double now, double interval);

#endif
