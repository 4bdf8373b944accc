/*
 * milter_gate.h: before-queue filtering, a listener's MILTERS (Postfix's
 * smtpd_milters).  At the end of DATA the transaction is shown to the
 * filters in order (common/message/milter_filter.h, the conversation
 * pepsi-stage-milter has with them after the queue) and their verdict is
 * answered in the session: reject and tempfail with the filter's reply,
 * discard as a 250 that stores nothing, and the edits (headers, body,
 * recipients, sender, quarantine) applied before the row is stored.
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
	MILTER_GATE_STORE,	/* store the (edited) transaction */
	MILTER_GATE_REFUSE, /* answer reply (4xx or 5xx), store nothing */
	MILTER_GATE_DISCARD /* answer 250, store nothing */
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

/* Who the filters are told of: the session's CONNECT, HELO and macros. */
struct milter_gate_client
{
	const char *ip;
	const char *listener;
	const char *hostname; /* ours: the j macro */
	const char *queue_id; /* the i macro */
};

struct milter_gate_job;
typedef void (*milter_gate_done)(void *arg, struct milter_gate_result *result);

/*
 * Show the transaction of smtp to the filters of list, off the event
 * loop; done(arg, result) runs on loop once they decided.  Everything the
 * filters need is copied first: the session may go on being read, or go.
 */
struct milter_gate_job *milter_gate_start(struct ev_loop *loop, const struct milter_gate_list *list,
										  const struct smtp_session		  *smtp,
										  const struct milter_gate_client *client,
										  milter_gate_done done, void *arg);
/* The session is gone: done is never called, the result is dropped.  NULL is fine. */
void milter_gate_cancel(struct milter_gate_job *job);

#endif
