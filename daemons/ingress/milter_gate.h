/*
 * milter_gate.h: before-queue filtering, a listener's MILTERS (Postfix's
 * smtpd_milters).  Each SMTP session holds one conversation with each of
 * its filters (common/message/milter_filter.h, the client
 * pepsi-stage-milter uses after the queue): CONNECT when the client
 * connects, HELO at its EHLO, MAIL and RCPT answered at their step (a
 * refused sender at MAIL, one refused recipient at its RCPT), the
 * message at the end of DATA, SMFIC_ABORT between transactions and QUIT
 * when the session ends.  The verdicts are answered in the session:
 * reject and tempfail with the filter's reply, discard as a 250 that
 * stores nothing, and the edits (headers, body, recipients, sender,
 * quarantine) applied before the row is stored.
 */
#ifndef PEPSI_INGRESS_MILTER_GATE_H
#define PEPSI_INGRESS_MILTER_GATE_H

#include <stdbool.h>
#include <stddef.h>

#include <ev.h>

#include "message/milter_filter.h"
#include "smtp.h"

/* A listener's MILTERS, parsed: NULL entries when it has none. */
struct milter_gate_list
{
	struct milter_entry *entries;
	size_t				 count;
};

/* [section] MILTERS into list (emptied first); false with err naming the problem. */
bool milter_gate_list_load(const char *value, struct milter_gate_list *list, char *err, size_t errlen);
void milter_gate_list_free(struct milter_gate_list *list);

enum milter_gate_outcome
{
	MILTER_GATE_STORE,	/* MAIL, RCPT: take it; the message: store it (edited) */
	MILTER_GATE_REFUSE, /* answer reply (4xx or 5xx); the message: store nothing */
	MILTER_GATE_DISCARD /* the message: answer 250, store nothing */
};

/* What the filters decided, for the session to apply. */
struct milter_gate_result
{
	enum milter_gate_outcome outcome;
	char					*reply;		 /* MILTER_GATE_REFUSE: the SMTP reply */
	char					*filter;	 /* the filter that decided (refuse, discard, quarantine) */
	char					*quarantine; /* MILTER_GATE_STORE: held, for this reason; or NULL */
	/* MILTER_GATE_STORE, when changed: the new content (headers CRLF body), sender, recipients */
	bool	   content_changed;
	struct buf content;
	char	  *mail_from;
	char	 **rcpt; /* NULL: unchanged */
	size_t	   nrcpt;
	char	  *log; /* what was done, for the log line (allocated) */
};

void milter_gate_result_free(struct milter_gate_result *r);

/* Who the filters are told of: the session's CONNECT and the macros. */
struct milter_gate_client
{
	const char *ip;
	const char *listener;
	const char *hostname; /* ours: the j macro */
};

/* The threads that hold the conversations: at most threads, started as they are needed. */
void milter_gate_init(struct ev_loop *loop, size_t threads);

/* One session's conversation with its filters. */
struct milter_gate;
typedef void (*milter_gate_answer)(void *arg, struct milter_gate_result *result);

/*
 * A conversation with the filters of list (copied: a reload changes
 * nothing here), CONNECT sent at once; answer(arg, result) runs on the
 * loop for each step that asks for an answer, one at a time.
 */
struct milter_gate *milter_gate_open(const struct milter_gate_list *list, const struct milter_gate_client *client,
									 milter_gate_answer answer, void *arg);
/* HELO or EHLO: told, not waited for (a filter's refusal answers the next MAIL, as Postfix's). */
void milter_gate_helo(struct milter_gate *g, const struct smtp_session *smtp);
/* MAIL (rcpt NULL) or RCPT: answered with MILTER_GATE_STORE or MILTER_GATE_REFUSE. */
void milter_gate_envelope(struct milter_gate *g, const struct smtp_session *smtp, const char *address, bool mail);
/* The transaction of smtp at the end of its DATA, named queue_id: answered with any outcome. */
void milter_gate_message(struct milter_gate *g, const struct smtp_session *smtp, const char *queue_id);
/* The session is gone: no answer comes any more, what waited is dropped, the filters hear QUIT. */
void milter_gate_close(struct milter_gate *g);

#endif
