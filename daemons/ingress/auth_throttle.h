/*
 * auth_throttle.h: failed AUTH counted per client (an IPv4 address, or an
 * IPv6 /64: session.c's client key), so that guessing passwords gets
 * slower with each failure and then stops.  Each failure's 535 waits
 * longer (DELAY, doubled per earlier failure, at most 32 times DELAY);
 * the LIMIT-th failure closes the session with 421, and until WINDOW has
 * passed since the last failure AUTH from that client gets 454 without a
 * password being checked.  Pure bookkeeping: the caller passes the clock.
 */
#ifndef PEPSI_INGRESS_AUTH_THROTTLE_H
#define PEPSI_INGRESS_AUTH_THROTTLE_H

#include <stdbool.h>
#include <stddef.h>

struct auth_throttle;

/* limit 0: no limit (failures are still delayed); window and delay in seconds. */
struct auth_throttle *auth_throttle_new(unsigned limit, double window, double delay);
void				  auth_throttle_free(struct auth_throttle *t);
void				  auth_throttle_configure(struct auth_throttle *t, unsigned limit, double window,
											  double delay);

/* Is AUTH from this client refused (454) without checking? */
bool auth_throttle_blocked(struct auth_throttle *t, const char *client, double now);
/*
 * Count a failure; returns how long to wait before answering, and sets
 * *close when this failure reaches the limit (answer 421 and close).
 */
double auth_throttle_failed(struct auth_throttle *t, const char *client, double now, bool *close);
/* Failures this client has to its name now (for logs and tests). */
unsigned auth_throttle_failures(struct auth_throttle *t, const char *client, double now);
/* Forget clients whose last failure is older than the window; returns how many remain. */
size_t auth_throttle_expire(struct auth_throttle *t, double now);

#endif
