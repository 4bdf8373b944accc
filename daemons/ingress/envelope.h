/*
 * envelope.h: what a finished SMTP transaction becomes in the queue: the
 * arguments of pepsi.workqueue_add.  The trace headers (Received,
 * Authentication-Results) are prepended, the message is split with
 * message_split, and state.origin / state.dsn are written (docs/architecture.md 2.4).
 * Pure like smtp.c, so the fuzz target runs it too.
 */
#ifndef PEPSI_INGRESS_ENVELOPE_H
#define PEPSI_INGRESS_ENVELOPE_H

#include <stdbool.h>
#include <time.h>

#include <jansson.h>

#include "base/buf.h"
#include "smtp.h"

/* What the host knows about the session that the protocol does not. */
struct envelope_origin
{
	const char	 *client_ip;
	const char	 *listener; /* the [listener-<name>] name */
	const char	 *hostname; /* "by" in Received */
	const char	 *authserv_id;
	const char	 *queue_id;		   /* "id" in Received, state.queue_id (common/message/queue_id.h) */
	bool		  trusted_network; /* the client is in TRUSTED_NETWORKS */
	unsigned	  max_hops;		   /* [ingress] MAX_HOPS: Received fields that mean a loop; 0: no limit */
	time_t		  now;
	const char	 *client_name; /* forward-confirmed (iprev) name, or NULL */
	const json_t *auth;		   /* state.auth, from which Authentication-Results is written */
	const json_t *iprev;	   /* state.origin.iprev, or NULL */
};

struct envelope
{
	char	  *mail_from;
	char	  *rcpt_array; /* a PostgreSQL text[] literal */
	struct buf headers;	   /* trace headers, then the message's */
	struct buf body;
	char	  *state; /* {"origin": ..., "dsn": ...} as JSON */
	char	  *client_ip;
	char	  *auth_account; /* NULL unless authenticated */
	char	  *log_detail;	 /* the mail log's "received" detail (JSON), or NULL: no mail log */
};

/* Build e from the transaction s; NULL, or the refusal to reply with. */
const char *envelope_build(const struct smtp_session *s, const struct envelope_origin *origin,
						   struct envelope *e);
void		envelope_free(struct envelope *e);

#endif
