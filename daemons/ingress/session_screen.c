/*
 * session_screen.c: the connection-level checks of a session (screen.h):
 * its DNSBL lookups started when it connects, the banner held back for
 * PREGREET_WAIT to catch a client that talks first, and the verdict
 * applied at RCPT on listeners of MODE smtp, and greylisting (GREYLIST)
 * at RCPT.  A trusted client is not screened; one that authenticated is
 * not refused (policy.screen).
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "db_query.h"
#include "session_internal.h"

static void
session_on_pregreet_wait(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct session *s = w->data;

	s->greet_pending = false;
	smtp_greet(&s->smtp);
	if (session_flush(s))
		session_update(s);
}

void
session_screen_start(struct session *s, const struct sockaddr *addr)
{
	struct listener *l = s->listener;

	ev_timer_init(&s->pregreet, session_on_pregreet_wait, l->pregreet_wait, 0);
	s->pregreet.data = s;
	if (s->trusted || l->mode != LISTENER_SMTP || (!screen_enabled() && l->pregreet_wait <= 0))
		return;
	s->screen = screen_start(s->ip);
	/* A client whose verdict is kept was tested already. */
	if (l->pregreet_wait > 0 && !screen_from_cache(s->screen))
	{
		s->greet_pending = true;
		ev_timer_start(ingress.loop, &s->pregreet);
	}
}

bool
session_screen_early_talk(struct session *s)
{
	if (!s->greet_pending)
		return false;
	s->greet_pending = false;
	ev_timer_stop(ingress.loop, &s->pregreet);
	screen_pregreet(s->ip);
	smtp_close(&s->smtp, "554 5.5.1 Protocol error: talking before the greeting");
	s->closing = true;
	return true;
}

void
session_screen_stop(struct session *s)
{
	ev_timer_stop(ingress.loop, &s->pregreet);
	screen_free(s->screen);
	s->screen = NULL;
	db_query_cancel(s->greylist_query);
	s->greylist_query = NULL;
	free(s->greylist_address);
	s->greylist_address = NULL;
}

enum smtp_screen_verdict
session_screen_verdict(const struct smtp_session *smtp, char *reply, size_t size)
{
	struct session *s = smtp->host;
	const char	   *list;

	/* Authenticated first: the account answers for its mail. */
	if (s->screen == NULL || smtp->auth_account)
		return SMTP_SCREEN_PASS;
	switch (screen_verdict(s->screen, &list))
	{
		case SCREEN_PENDING:
			return SMTP_SCREEN_WAIT;
		case SCREEN_LISTED:
			snprintf(reply, size, "550 5.7.1 Service unavailable; client [%s] blocked using %s",
					 s->ip, list);
			return SMTP_SCREEN_REFUSE;
		case SCREEN_PREGREET:
			snprintf(reply, size, "550 5.5.1 Protocol error: client [%s] talked before the greeting",
					 s->ip);
			return SMTP_SCREEN_REFUSE;
		case SCREEN_PIPELINING:
		case SCREEN_BARE_NEWLINE:
			snprintf(reply, size, "550 5.5.1 Protocol error: client [%s] %s", s->ip,
					 screen_verdict(s->screen, &list) == SCREEN_PIPELINING
						 ? "sent commands without waiting (PIPELINING was not offered)"
						 : "ended a command with a bare LF");
			return SMTP_SCREEN_REFUSE;
		case SCREEN_PASS:
		case SCREEN_ALLOWED:
			break;
	}
	return SMTP_SCREEN_PASS;
}

void
session_screen_violation(const struct smtp_session *smtp, enum smtp_violation v)
{
	struct session *s = smtp->host;

	if (s->screen && smtp->auth_account == NULL)
		screen_violation(s->screen, v == SMTP_VIOLATION_PIPELINING ? SCREEN_PIPELINING
																   : SCREEN_BARE_NEWLINE);
}

static void
session_screened(void *arg)
{
	struct session *s = arg;

	smtp_screen_done(&s->smtp);
	if (s->smtp.event == SMTP_EVENT_CLOSE)
		s->closing = true;
	/* Pipelined commands waited behind the reply: go on with them. */
	if (session_flush(s) && session_read(s))
		session_update(s);
}

void
session_screen_wait(struct session *s)
{
	/* A database answer (greylisting, the account's addresses or limits) resumes the session itself. */
	if (s->screen && !s->greylist_query && !s->login_query && !s->quota_query)
		screen_wait(s->screen, session_screened, s);
}

/*
 * Greylisting (GREYLIST): the triplet of the client's network, the sender
 * and the recipient, asked of pepsi.greylist_check; the RCPT waits for the
 * answer and is given again once it is in.  Trusted, authenticated and
 * allow-listed (DNSWL) clients are not greylisted; with the database down
 * the recipient is let through (our trouble is not the sender's).
 */

/* The client's network: an IPv4 /24, an IPv6 /64. */
static void
session_greylist_network(const char *ip, char *out, size_t outlen)
{
	unsigned char a[16];

	if (inet_pton(AF_INET, ip, a) == 1)
		snprintf(out, outlen, "%u.%u.%u.0/24", a[0], a[1], a[2]);
	else if (inet_pton(AF_INET6, ip, a) == 1)
	{
		char text[INET6_ADDRSTRLEN];

		memset(a + 8, 0, 8);
		inet_ntop(AF_INET6, a, text, sizeof(text));
		snprintf(out, outlen, "%s/64", text);
	}
	else
		snprintf(out, outlen, "%s", ip);
}

static void
session_greylist_answered(void *arg, const PGresult *res)
{
	struct session *s = arg;

	s->greylist_query = NULL;
	s->greylist_answered = true;
	s->greylist_pass = res == NULL || PQntuples(res) != 1 || strcmp(PQgetvalue(res, 0, 0), "f") != 0;
	if (res == NULL)
		log_warnx("%s: greylisting: the database did not answer: <%s> let through", s->ip,
				  s->greylist_address);
	session_screened(s);
}

enum smtp_screen_verdict
session_greylist(const struct smtp_session *smtp, const char *address, char *reply, size_t size)
{
	struct session		  *s = smtp->host;
	const struct listener *l = s->listener;
	const char			  *list;
	char				   network[INET6_ADDRSTRLEN + 8];
	char				   delay[32],
		expire[32],
		auto_whitelist[32];
	const char *values[6];

	if (s->trusted || smtp->auth_account
		|| (s->screen && screen_verdict(s->screen, &list) == SCREEN_ALLOWED))
		return SMTP_SCREEN_PASS;
	if (s->greylist_answered && s->greylist_address && strcmp(s->greylist_address, address) == 0)
	{
		s->greylist_answered = false;
		if (s->greylist_pass)
			return SMTP_SCREEN_PASS;
		log_info("%s: greylisted: from=<%s> to=<%s>", s->ip, smtp->mail_from, address);
		snprintf(reply, size, "451 4.7.1 <%.256s>: Recipient address rejected: Greylisted, try again later",
				 address);
		return SMTP_SCREEN_REFUSE;
	}
	session_greylist_network(s->ip, network, sizeof(network));
	snprintf(delay, sizeof(delay), "%.3f seconds", l->greylist_delay);
	snprintf(expire, sizeof(expire), "%.3f seconds", l->greylist_expire);
	snprintf(auto_whitelist, sizeof(auto_whitelist), "%.3f seconds", l->greylist_auto_whitelist);
	values[0] = network;
	values[1] = smtp->mail_from;
	values[2] = address;
	values[3] = delay;
	values[4] = expire;
	values[5] = auto_whitelist;
	free(s->greylist_address);
	s->greylist_address = xstrdup(address);
	s->greylist_answered = false;
	s->greylist_query = db_query_send("SELECT pepsi.greylist_check($1, $2, $3, $4::interval, "
									  "$5::interval, $6::interval)",
									  6, values, session_greylist_answered, s);
	return SMTP_SCREEN_WAIT;
}
