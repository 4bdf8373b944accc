/*
 * ingress.h: what the parts of pepsi-ingress share: the listeners (from
 * [listener-<name>] sections only, never from the database) and the
 * process-wide settings.  main.c sets up, session.c serves connections,
 * admit.c stores messages.
 */
#ifndef PEPSI_INGRESS_H
#define PEPSI_INGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include <ev.h>
#include <openssl/ssl.h>

#include "auth.h"
#include "config.h"
#include "smtp.h"

enum listener_mode
{
	LISTENER_SMTP,				/* 25: relay in, STARTTLS offered */
	LISTENER_SUBMISSION,		/* 587: AUTH required, only after STARTTLS */
	LISTENER_SMTPS				/* 465: submission over implicit TLS */
};

struct listener
{
	char	   *name;			/* "smtp" for [listener-smtp] */
	enum listener_mode mode;
	int			fd;
	ev_io		io;
	SSL_CTX    *tls;			/* NULL without CERTIFICATE */
	struct smtp_policy policy;
	double		idle_timeout;	/* seconds */
	size_t		max_sessions;
	size_t		max_sessions_per_client;
	size_t		sessions;
	struct listener *next;
};

struct ingress
{
	struct ev_loop *loop;
	struct pepsi_config *cfg;
	const char *hostname;
	const char *authserv_id;
	struct credentials *credentials;
	struct listener *listeners;
	size_t		sessions;
	bool		stopping;
};

extern struct ingress ingress;

/* session.c */
void		session_accept(struct listener *l, int fd, const struct sockaddr *addr);
/* Stop: 421 to every session not waiting for the database. */
void		session_shutdown_all(void);

#endif
