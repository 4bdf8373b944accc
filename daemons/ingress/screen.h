/*
 * screen.h: connection-level checks of pepsi-ingress, postscreen's useful
 * half: DNSBL and DNSWL lookups of the client's address (DNSBL_SITES in
 * postscreen_dnsbl_sites syntax, weighted, DNSBL_THRESHOLD), started when
 * the client connects, on the event loop through common/dns/dns.h, and
 * the pre-greeting test (a client that talks before the banner,
 * PREGREET_WAIT per listener, in session.c) and postscreen's after-220
 * tests (commands pipelined where PIPELINING was not offered, a bare LF
 * ending a command).  A verdict is kept per client
 * address for DNSBL_TTL, in the process and in pepsi.screen_verdict (so
 * that every ingress host sharing the database knows it), so the client's
 * next sessions ask nothing, and logged once.  A listener of MODE smtp applies it at RCPT (550 5.7.1
 * naming the list), so a client that authenticated first, or a trusted
 * one, never meets it.
 *
 * A list's error replies (127.255.255.x) and a list that does not answer
 * count as not listed: a broken list must not refuse mail.
 */
#ifndef PEPSI_INGRESS_SCREEN_H
#define PEPSI_INGRESS_SCREEN_H

#include <stdbool.h>
#include <stddef.h>

#include <ev.h>

#include "config/config.h"
#include "dns/dns.h"

enum screen_verdict
{
	SCREEN_PENDING,		/* lookups still out */
	SCREEN_PASS,		/* below the threshold */
	SCREEN_ALLOWED,		/* at or below DNSBL_ALLOWLIST_THRESHOLD: a DNSWL-listed client */
	SCREEN_LISTED,		/* at or above DNSBL_THRESHOLD */
	SCREEN_PREGREET,	/* talked before the greeting */
	SCREEN_PIPELINING,	/* sent commands without waiting, PIPELINING not offered */
	SCREEN_BARE_NEWLINE /* ended a command with a bare LF */
};

/*
 * [ingress] DNSBL_*, at start and on reload (the verdicts kept in this
 * process are forgotten); false with err naming the option for a bad value
 * (nothing changed then).  screen_check: would it be accepted?
 */
bool screen_configure(const struct pepsi_config *cfg, struct dns_resolver *resolver, char *err,
					  size_t errlen);
bool screen_check(const struct pepsi_config *cfg, char *err, size_t errlen);
/* Are any lists configured? */
bool screen_enabled(void);
void screen_shutdown(void);

struct screen;
typedef void (*screen_done_fn)(void *arg);

/* The client's lookups start (or its cached verdict is found). */
struct screen *screen_start(const char *client_ip);
/* The verdict so far; *list names the heaviest list that listed the client. */
enum screen_verdict screen_verdict(const struct screen *sc, const char **list);
/* Was the verdict kept from an earlier session (so the client need not be tested again)? */
bool screen_from_cache(const struct screen *sc);
/* done(arg) once the verdict is in, from the loop (never from here). */
void screen_wait(struct screen *sc, screen_done_fn done, void *arg);
void screen_free(struct screen *sc);
/* The client talked before the greeting: remembered as its verdict. */
void screen_pregreet(const char *client_ip);
/* A protocol violation (SCREEN_PIPELINING, SCREEN_BARE_NEWLINE): the session's verdict and the client's. */
void screen_violation(struct screen *sc, enum screen_verdict verdict);

/* Parse DNSBL_SITES (exposed for the unit test); false with err. */
struct screen_site;
bool screen_sites_parse(const char *text, struct screen_site **sites, size_t *count, char *err,
						size_t errlen);
/* Does the A record reply (network order octets) match site i's filter?  Its weight in *weight. */
bool screen_site_matches(const struct screen_site *sites, size_t i, const unsigned char reply[4],
						 int *weight);
void screen_sites_free(struct screen_site *sites, size_t count);

#endif
