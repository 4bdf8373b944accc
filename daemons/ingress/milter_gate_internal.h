/*
 * milter_gate_internal.h: a session's conversation with its filters, as
 * milter_gate.c (the steps and what their verdicts mean) and
 * milter_gate_pool.c (the threads that take them, the queue, the answers
 * back to the loop) share it.  Not for the rest of ingress.
 */
#ifndef PEPSI_INGRESS_MILTER_GATE_INTERNAL_H
#define PEPSI_INGRESS_MILTER_GATE_INTERNAL_H

#include <stdbool.h>

#include <jansson.h>

#include "milter_gate.h"

enum gate_filter_state
{
	GATE_FILTER_ASKED,	 /* the filter hears the session's steps */
	GATE_FILTER_DONE,	 /* accepted the connection, or failed open: not asked again */
	GATE_FILTER_REFUSING /* refused the client, or failed closed: refusal answers every MAIL */
};

struct gate_filter
{
	struct milter_entry			  entry; /* a copy: a reload changes nothing here */
	struct milter_timeouts		  timeouts;
	struct milter_filter_session *session; /* NULL: not connected (yet, or any more) */
	enum gate_filter_state		  state;
	char						 *refusal;
	bool						  transaction_done; /* accepted this transaction at MAIL or RCPT */
	bool						  heard_mail;		/* this transaction's MAIL went to it */
};

enum gate_step_kind
{
	GATE_STEP_CONNECT,
	GATE_STEP_HELO,
	GATE_STEP_MAIL,
	GATE_STEP_RCPT,
	GATE_STEP_MESSAGE,
	GATE_STEP_QUIT /* the session is gone: the filters hear QUIT, then the conversation is freed */
};

/* One step, made on the loop, taken on a thread, answered (or dropped) on the loop. */
struct gate_step
{
	enum gate_step_kind		  kind;
	bool					  answered; /* the session waits for result */
	json_t					 *origin;	/* the macros' values, as at the step */
	char					 *text;		/* HELO's name, MAIL's sender, RCPT's recipient */
	char					 *queue_id; /* the message's, from the end of DATA */
	bool					  has_message;
	struct milter_message	  m;
	struct milter_gate_result result;
	struct milter_gate		 *gate;
	struct gate_step		 *next;
};

struct milter_gate
{
	/* Fixed at open */
	char			  *ip;
	char			  *listener;
	char			  *hostname;
	milter_gate_answer answer;
	void			  *arg;
	/* The thread taking a step owns these (one step of a conversation at a time) */
	struct gate_filter *filters;
	size_t				count;
	char			   *helo;
	char			   *mail_from;
	bool				discard; /* a filter discarded the transaction at MAIL or RCPT */
	char			   *discard_filter;
	char				name[64]; /* for the log: the client's address, then the message's queue id */
	/* Under the pool's lock */
	struct gate_step   *steps; /* waiting, oldest first */
	struct gate_step   *steps_tail;
	bool				scheduled; /* on the ready list, or a thread takes its step */
	bool				closed;	   /* the session is gone */
	struct milter_gate *next_ready;
};

/* milter_gate.c */
void	gate_filters_new(struct milter_gate *g, const struct milter_gate_list *list);
void	gate_filters_free(struct milter_gate *g);
void	gate_step_run(struct milter_gate *g, struct gate_step *step);
void	gate_message_copy(struct gate_step *step, const struct smtp_session *smtp);
json_t *gate_origin(const struct milter_gate *g, const struct smtp_session *smtp);

#endif
