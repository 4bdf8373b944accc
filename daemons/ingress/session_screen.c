/*
 * session_screen.c: the connection-level checks of a session (screen.h):
 * its DNSBL lookups started when it connects, the banner held back for
 * PREGREET_WAIT to catch a client that talks first, and the verdict
 * applied at RCPT on listeners of MODE smtp.  A trusted client is not
 * screened; one that authenticated is not refused (policy.screen).
 */
#include <stdio.h>

#include "base/log.h"
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
		case SCREEN_PASS:
		case SCREEN_ALLOWED:
			break;
	}
	return SMTP_SCREEN_PASS;
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
	screen_wait(s->screen, session_screened, s);
}
