/*
 * milter_client.h: the MTA's side of a conversation with one milter, as
 * Postfix's milter8 client holds it: a connection kept across messages,
 * negotiated once, the protocol steps of an SMTP transaction (CONNECT,
 * HELO, MAIL, RCPT, DATA, the headers, the body, end of message), the
 * replies read and checked against the step they answer, and the
 * end-of-message edits kept until the final reply says they stand.
 *
 * It knows no queue row and no SMTP session: the caller gives the values
 * of the macros and hears of recipients refused at RCPT through
 * struct milter_session_calls, and applies the edits itself.  The packets
 * are common/message/milter.c's.  pepsi-stage-milter walks a queued
 * message through it; a caller in the SMTP session can take the steps as
 * its client sends them.
 */
#ifndef PEPSI_MILTER_CLIENT_H
#define PEPSI_MILTER_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/buf.h"
#include "message/milter.h"

enum milter_verdict
{
	MILTER_VERDICT_ACCEPT = 0, /* accept or continue: the message goes on */
	MILTER_VERDICT_REJECT,
	MILTER_VERDICT_TEMPFAIL,
	MILTER_VERDICT_DISCARD,
	MILTER_VERDICT_UNAVAILABLE /* the filter could not be asked: the caller's default decides */
};

const char *milter_verdict_name(enum milter_verdict verdict);

struct milter_timeouts
{
	long connect_ms;
	long command_ms;
	long final_ms; /* end of message: the filter scans the content */
};

/* What a step came to. */
enum milter_step
{
	MILTER_STEP_CONTINUE, /* go on to the next step */
	MILTER_STEP_SKIP,	  /* a body chunk only: no more body chunks */
	MILTER_STEP_DONE,	  /* the verdict is known: stop talking about this message */
	MILTER_STEP_ERROR	  /* unavailable: the session's err says why */
};

/* One filter: its address and its connection, kept across messages. */
struct milter_client;

/* A filter at address (common/message/milter.h's forms); connected on first use. */
struct milter_client *milter_client_new(const char *address_text, char *err, size_t errlen);
/* Says QUIT to an open connection (never waited on) and frees c. */
void		milter_client_free(struct milter_client *c);
const char *milter_client_name(const struct milter_client *c);
/* The protocol flags the filter negotiated (MILTER_PROTO_*): HDR_LEADSPC says how header values go. */
uint32_t milter_client_protocol(const struct milter_client *c);

/* What the conversation needs from its caller. */
struct milter_session_calls
{
	/*
	 * The value of a macro (its name without braces) for this message,
	 * or NULL when it has none; rcpt is the recipient at RCPT, else NULL.
	 * A value made up may be written into scratch.
	 */
	const char *(*macro_value)(void *arg, const char *name, const char *rcpt, char *scratch,
							   size_t len);
	/* The filter refused recipient number rcpt at RCPT (reject or tempfail); reply is given over. */
	void (*rcpt_refused)(void *arg, size_t rcpt, enum milter_verdict verdict, char *reply);
	void *arg;
};

/* A step whose reply is still to be read: what it was, for the checks and the messages. */
struct milter_pending_step
{
	const char *step;
	bool		body;
	ssize_t		rcpt; /* the recipient's number for RCPT, else -1 */
};

/* One conversation about one message.  Its fields are the client's: read err, reply and replies. */
struct milter_session
{
	struct milter_client			  *client;
	const struct milter_timeouts	  *timeouts;
	const struct milter_session_calls *calls;
	struct buf						   out;
	char							   err[512];
	/* the end-of-message edits, kept until the final reply says they stand */
	struct buf edits;
	size_t	   nedits;
	char	  *reply;		/* reject/tempfail text */
	size_t	   replies;		/* read so far */
	bool	   completed;	/* through end of message: the connection can take another */
	bool	   same_client; /* CONNECT and HELO were for this client already */
	/* the steps written and not yet answered, oldest first */
	struct milter_pending_step *pending;
	size_t						npending;
	size_t						pending_cap;
};

void milter_session_init(struct milter_session *s, struct milter_client *c,
						 const struct milter_timeouts *timeouts, const struct milter_session_calls *calls);
void milter_session_free(struct milter_session *s);

/*
 * Start a message: connect and negotiate when the connection is closed;
 * on a kept one, the next transaction of the same client (client_key
 * says who it is: what CONNECT and HELO would tell) or QUIT_NC before
 * another client's.  MILTER_STEP_CONTINUE or MILTER_STEP_ERROR.
 */
enum milter_step milter_session_begin(struct milter_session *s, const char *client_key);

/*
 * The steps, in the order of an SMTP transaction.  Each is skipped when
 * the filter negotiated so (CONNECT and HELO also on the same client's
 * next transaction), sent with the macros the filter asked for (or
 * Postfix's), and its reply awaited after the replies before it: they are
 * read at the latest by milter_session_end_of_message, in order, and the
 * first that is not "continue" decides (MILTER_STEP_DONE, *verdict).
 * A reply refusing a recipient at RCPT refuses that one only.
 */
enum milter_step milter_session_connect(struct milter_session *s, const char *hostname,
										const char *ip, unsigned port);
enum milter_step milter_session_helo(struct milter_session *s, const char *helo);
/* The sender without angle brackets, and the MAIL command's ESMTP parameters. */
enum milter_step milter_session_mail(struct milter_session *s, const char *mail_from,
									 const char *const *esmtp, size_t nesmtp);
/* A recipient without angle brackets, number rcpt for milter_session_calls.rcpt_refused. */
enum milter_step milter_session_rcpt(struct milter_session *s, const char *address, size_t rcpt);
enum milter_step milter_session_data(struct milter_session *s);
/* A header's value as the filter takes it (see milter_client_protocol's HDR_LEADSPC). */
enum milter_step milter_session_header(struct milter_session *s, const char *name, const char *value);
enum milter_step milter_session_end_of_headers(struct milter_session *s);
/* The whole body, in chunks; a filter that may SKIP is asked chunk by chunk. */
enum milter_step milter_session_body(struct milter_session *s, const char *body, size_t len,
									 enum milter_verdict *verdict);
/*
 * Write the steps so far and read their replies, in order: what a caller
 * in the SMTP session does after each command, to answer its client
 * before the next.  MILTER_STEP_CONTINUE, MILTER_STEP_SKIP (a body
 * chunk's), MILTER_STEP_DONE (*verdict) or MILTER_STEP_ERROR.
 */
enum milter_step milter_session_replies(struct milter_session *s, enum milter_verdict *verdict);
/* End of message written, and the replies of every step before it read. */
enum milter_step milter_session_end_of_message(struct milter_session *s, enum milter_verdict *verdict);
/*
 * The end-of-message replies: the edits (each checked against the
 * actions the filter negotiated, kept) up to the final reply.
 * MILTER_STEP_DONE with *verdict, or MILTER_STEP_ERROR.  With
 * MILTER_VERDICT_ACCEPT the kept edits stand: milter_session_next_edit.
 */
enum milter_step milter_session_final_reply(struct milter_session *s, enum milter_verdict *verdict);
/* The kept edits in the order the filter sent them; *at starts at 0. */
bool milter_session_next_edit(const struct milter_session *s, size_t *at, struct milter_reply *edit);

/*
 * The transaction is over, for a caller holding one conversation per SMTP
 * session: what it kept of it (the reply, the edits) is dropped, and
 * SMFIC_ABORT goes out with the next step when tell_filter (the filter is
 * inside a transaction it did not see to its end of message).
 */
void milter_session_next_transaction(struct milter_session *s, bool tell_filter);

/*
 * After the steps: a conversation that ended with a verdict before the
 * filter let the message through to its end is closed politely (the
 * connection is opened again for the next message); only a filter that
 * continued at end of message keeps its connection (libmilter goes to
 * QUIT_NC from there only).  A failure leaves it to the caller.
 */
void milter_session_end(struct milter_session *s, enum milter_step outcome);

/*
 * The steps of one message, taken by milter_session_run after
 * milter_session_begin: MILTER_STEP_DONE with *verdict, or MILTER_STEP_ERROR.
 */
typedef enum milter_step (*milter_session_walk)(struct milter_session *s, void *arg,
												enum milter_verdict *verdict);

/*
 * One message from begin to end, once more afresh when a kept connection
 * proves closed before any reply.  The verdict; *reply is the filter's
 * reply text (for reject and tempfail) or why it was unavailable
 * (allocated, or NULL).  After any failure the connection is closed.
 */
enum milter_verdict milter_session_run(struct milter_session *s, const char *client_key,
									   milter_session_walk walk, void *arg, char **reply);

#endif
