/*
 * milter_filter.h: a message shown to the milters of a MILTERS list, for
 * both of their users: pepsi-stage-milter (after the queue, a stored
 * row) and pepsi-ingress (before it, in the SMTP session).
 *
 *   milter_message.c  the message as the filters see and edit it: the
 *                     header list, the body, the envelope and each
 *                     recipient's fate
 *   milter_list.c     the MILTERS option: the filters in order, each with
 *                     the settings of its braces ({ address, command_timeout=10s })
 *   milter_filter.c   one filter shown one message: walked through the
 *                     protocol steps of milter_client.h (the connection,
 *                     the negotiation, the replies), the macros from
 *                     state.origin, the edits applied
 */
#ifndef PEPSI_MILTER_FILTER_H
#define PEPSI_MILTER_FILTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/buf.h"
#include "message/milter.h"
#include "message/milter_client.h"

struct milter_header
{
	char *name;
	char *value; /* as stored: after the colon, leading space and CRLF folds kept */
};

enum milter_rcpt_fate
{
	MILTER_RCPT_ACCEPTED = 0,
	MILTER_RCPT_REJECTED,  /* a 5xx at RCPT: bounced for this recipient */
	MILTER_RCPT_TEMPFAILED /* a 4xx at RCPT: retried later for this recipient */
};

struct milter_rcpt
{
	char				 *address;
	enum milter_rcpt_fate fate;
	char				 *reply;  /* the filter's reply when not accepted */
	char				 *filter; /* the filter that gave it */
};

struct milter_message
{
	struct milter_header *headers;
	size_t				  nheaders;
	bool				  headers_changed;
	struct buf			  body;
	bool				  body_changed;
	char				 *mail_from;
	bool				  mail_from_changed;
	struct milter_rcpt	 *rcpt; /* the row's recipients, in order */
	size_t				  nrcpt;
	char				**deleted; /* DELRCPT addresses, applied at commit */
	size_t				  ndeleted;
	char				**added; /* ADDRCPT addresses */
	size_t				  nadded;
	char				 *quarantine; /* the reason, once a filter asked */
};

/* Build from the row's parts (headers: CRLF lines, as stored). */
void milter_message_init(struct milter_message *m, const char *headers, size_t hlen,
						 const char *body, size_t blen, const char *mail_from,
						 const char *const *rcpt, size_t nrcpt);
void milter_message_free(struct milter_message *m);
/* The header block back, CRLF lines. */
void milter_message_headers(const struct milter_message *m, struct buf *out);
/* A header's value as a filter receives it: folds as LF, the leading space unless leadspc. */
char *milter_header_for_filter(const char *value, bool leadspc);
/*
 * The edits of one end-of-message reply.  value is as the filter sent it;
 * leadspc says the filter negotiated SMFIP_HDR_LEADSPC.  Body chunks
 * append to the new body (the first one of a reply starts it).
 */
void milter_message_add_header(struct milter_message *m, const char *name, const char *value,
							   bool leadspc);
void milter_message_insert_header(struct milter_message *m, uint32_t position, const char *name,
								  const char *value, bool leadspc);
void milter_message_change_header(struct milter_message *m, uint32_t occurrence,
								  const char *name, const char *value, bool leadspc);
void milter_message_body_chunk(struct milter_message *m, const char *data, size_t len,
							   bool first);
void milter_message_change_from(struct milter_message *m, const char *address);
void milter_message_add_rcpt(struct milter_message *m, const char *address);
void milter_message_delete_rcpt(struct milter_message *m, const char *address);
/* An address as the row stores it: the angle brackets a filter may send taken off. */
char *milter_bare_address(const char *address);

/* What the filter's macros are made of: from state.origin and the envelope. */
struct milter_macro_source
{
	const char *hostname; /* j: [pepsi] HOSTNAME */
	const char *queue_id; /* i: the row's id */
	json_t	   *origin;	  /* state.origin, or NULL (local submission) */
};

/* A filter of MILTERS and the settings its braces gave; -1: the stage's option decides. */
struct milter_entry
{
	char	 *address;
	long long connect_ms;
	long long command_ms;
	long long final_ms;
	int		  default_action; /* the index among DEFAULT_ACTION's choices */
};

/*
 * Parse a MILTERS value: addresses, or { address, name=value, ... } with
 * the settings connect_timeout, command_timeout, final_timeout (Postfix's
 * content_timeout) and default_action, checked as the stage options of
 * those names.  False with a sentence naming the problem in err.
 */
bool milters_parse(const char *value, struct milter_entry **out, size_t *count, char *err,
				   size_t errlen);
void milters_free(struct milter_entry *entries, size_t count);

/*
 * Show the message to the filter and apply its edits to m.  Returns the
 * verdict; reply holds the filter's reply text (for reject and tempfail)
 * or why it was unavailable (allocated, or NULL).  After any failure the
 * connection is closed, to be opened afresh for the next message.  The
 * filter's end-of-message edits are applied only once its final reply
 * lets the message go on; recipients it refused at RCPT stay refused.
 */
enum milter_verdict milter_filter_run(struct milter_client *c, struct milter_message *m,
									  const struct milter_macro_source *macros,
									  const struct milter_timeouts *timeouts, char **reply);

/*
 * One filter over one SMTP session (pepsi-ingress's before-queue
 * filtering): one connection, each step taken as the client gives its
 * command and its reply read before the client is answered, as Postfix's
 * smtpd_milters.  Each step returns MILTER_STEP_CONTINUE (go on),
 * MILTER_STEP_DONE with *verdict (accept: the filter is done with this
 * connection or transaction; reject or tempfail with the filter's *reply;
 * discard) or MILTER_STEP_ERROR (*reply says why).  A refusal at RCPT
 * refuses that recipient only.  A new MAIL ends the previous transaction
 * (SMFIC_ABORT when the filter did not see it to its end).  Freeing says
 * QUIT.  The macros' strings must live through the step.
 */
struct milter_filter_session;

struct milter_filter_session *milter_filter_session_new(const char					 *address,
														const struct milter_timeouts *timeouts,
														char *err, size_t errlen);
void						  milter_filter_session_free(struct milter_filter_session *fs);
/* Connect, negotiate, and CONNECT with client_ip of macros->origin. */
enum milter_step milter_filter_session_connect(struct milter_filter_session		*fs,
											   const struct milter_macro_source *macros,
											   enum milter_verdict *verdict, char **reply);
enum milter_step milter_filter_session_helo(struct milter_filter_session	 *fs,
											const struct milter_macro_source *macros, const char *helo,
											enum milter_verdict *verdict, char **reply);
enum milter_step milter_filter_session_mail(struct milter_filter_session	 *fs,
											const struct milter_macro_source *macros, const char *mail_from,
											const char *const *esmtp, size_t nesmtp,
											enum milter_verdict *verdict, char **reply);
enum milter_step milter_filter_session_rcpt(struct milter_filter_session	 *fs,
											const struct milter_macro_source *macros, const char *mail_from,
											const char *address, enum milter_verdict *verdict, char **reply);
/* DATA to end of message; the filter's edits applied to m when it lets the message go on. */
enum milter_step milter_filter_session_message(struct milter_filter_session		*fs,
											   const struct milter_macro_source *macros,
											   struct milter_message *m, enum milter_verdict *verdict,
											   char **reply);
/* False when a verdict left commands unanswered: the connection must be opened afresh. */
bool milter_filter_session_reusable(const struct milter_filter_session *fs);

#endif
