/*
 * milter_filter.c: one filter shown one message (pepsi-stage-milter's queued one, pepsi-ingress's in the session):
 * the row's envelope, header list and body walked through the protocol
 * steps of common/message/milter_client.c, the macros made of the row's
 * state.origin (what ingress recorded of its SMTP session), recipients
 * refused at RCPT marked on the message, and the filter's end-of-message
 * edits applied to it once its final reply lets the message go on.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "message/milter_filter.h"

/* One message shown to one filter. */
struct filter_walk
{
	struct milter_message			 *m;
	const struct milter_macro_source *source;
	const char						 *filter;	 /* its name, for the recipients it refuses */
	const char						 *mail_from; /* the {mail_addr} macro */
};

/* A string of state.origin, or NULL. */
static const char *
origin_string(const struct milter_macro_source *source, const char *key)
{
	return source->origin ? json_string_value(json_object_get(source->origin, key)) : NULL;
}

static const char *
origin_tls_string(const struct milter_macro_source *source, const char *key, char *scratch, size_t len)
{
	json_t *tls = source->origin ? json_object_get(source->origin, "tls") : NULL;
	json_t *value = json_is_object(tls) ? json_object_get(tls, key) : NULL;

	if (json_is_integer(value))
	{
		snprintf(scratch, len, "%lld", (long long) json_integer_value(value));
		return scratch;
	}
	return json_string_value(value);
}

/* A macro's value, or NULL when this message has none. */
static const char *
filter_macro_value(void *arg, const char *name, const char *rcpt, char *scratch, size_t len)
{
	const struct filter_walk		 *w = arg;
	const struct milter_macro_source *src = w->source;
	const char						 *ip = origin_string(src, "client_ip");

	if (strcmp(name, "j") == 0)
		return src->hostname;
	if (strcmp(name, "i") == 0)
		return src->queue_id;
	if (strcmp(name, "v") == 0)
		return "Pepsi";
	if (strcmp(name, "daemon_name") == 0)
		return origin_string(src, "listener");
	if (strcmp(name, "client_addr") == 0)
		return ip;
	if (strcmp(name, "client_name") == 0)
		return ip ? "unknown" : NULL;
	if (strcmp(name, "_") == 0)
	{
		if (ip == NULL)
			return NULL;
		snprintf(scratch, len, "unknown [%s]", ip);
		return scratch;
	}
	if (strcmp(name, "auth_authen") == 0)
		return origin_string(src, "auth");
	if (strcmp(name, "auth_type") == 0)
		return origin_string(src, "auth") ? "PLAIN" : NULL;
	if (strcmp(name, "tls_version") == 0)
		return origin_tls_string(src, "version", scratch, len);
	if (strcmp(name, "cipher") == 0)
		return origin_tls_string(src, "cipher", scratch, len);
	if (strcmp(name, "cipher_bits") == 0)
		return origin_tls_string(src, "bits", scratch, len);
	if (strcmp(name, "mail_addr") == 0)
		return w->mail_from;
	if (strcmp(name, "rcpt_addr") == 0)
		return rcpt;
	return NULL;
}

/* A refusal at RCPT refuses that recipient only: a 5xx bounces it, a 4xx retries it later. */
static void
filter_rcpt_refused(void *arg, size_t index, enum milter_verdict verdict, char *reply)
{
	const struct filter_walk *w = arg;
	struct milter_rcpt		 *rcpt = &w->m->rcpt[index];

	rcpt->fate = verdict == MILTER_VERDICT_REJECT ? MILTER_RCPT_REJECTED : MILTER_RCPT_TEMPFAILED;
	rcpt->reply = reply;
	rcpt->filter = xstrdup(w->filter);
}

static size_t
filter_accepted_rcpts(const struct milter_message *m)
{
	size_t accepted = 0;

	for (size_t i = 0; i < m->nrcpt; i++)
		accepted += m->rcpt[i].fate == MILTER_RCPT_ACCEPTED;
	return accepted;
}

/* Apply the kept edits, in the order the filter sent them. */
static void
filter_apply_edits(struct milter_session *s, struct milter_message *m)
{
	bool				leadspc = (milter_client_protocol(s->client) & MILTER_PROTO_HDR_LEADSPC) != 0;
	bool				first_chunk = true;
	size_t				at = 0;
	struct milter_reply r;

	while (milter_session_next_edit(s, &at, &r))
		switch (r.command)
		{
			case MILTER_REPLY_ADDHEADER:
				milter_message_add_header(m, r.name, r.value, leadspc);
				break;
			case MILTER_REPLY_INSHEADER:
				milter_message_insert_header(m, r.index, r.name, r.value, leadspc);
				break;
			case MILTER_REPLY_CHGHEADER:
				milter_message_change_header(m, r.index, r.name, r.value, leadspc);
				break;
			case MILTER_REPLY_REPLBODY:
				milter_message_body_chunk(m, r.data, r.data_len, first_chunk);
				first_chunk = false;
				break;
			case MILTER_REPLY_ADDRCPT:
			case MILTER_REPLY_ADDRCPT_PAR:
				milter_message_add_rcpt(m, r.text);
				break;
			case MILTER_REPLY_DELRCPT:
				milter_message_delete_rcpt(m, r.text);
				break;
			case MILTER_REPLY_CHGFROM:
				milter_message_change_from(m, r.text);
				break;
			case MILTER_REPLY_QUARANTINE:
				free(m->quarantine);
				m->quarantine = xstrdup(r.text);
				break;
		}
}

/*
 * The content: DATA, the headers, the body, end of message and its edits.
 * *ended: the filter gave its final reply (the transaction is over for it).
 */
static enum milter_step
filter_content(struct milter_session *s, struct milter_message *m, enum milter_verdict *verdict, bool *ended)
{
	bool			 leadspc = (milter_client_protocol(s->client) & MILTER_PROTO_HDR_LEADSPC) != 0;
	enum milter_step o;

	if ((o = milter_session_data(s)) != MILTER_STEP_CONTINUE)
		return o;
	for (size_t i = 0; i < m->nheaders; i++)
	{
		const struct milter_header *h = &m->headers[i];
		char					   *value;

		if (h->name == NULL)
			continue;
		value = milter_header_for_filter(h->value, leadspc);
		o = milter_session_header(s, h->name, value);
		free(value);
		if (o != MILTER_STEP_CONTINUE)
			return o;
	}
	if ((o = milter_session_end_of_headers(s)) != MILTER_STEP_CONTINUE)
		return o;
	if ((o = milter_session_body(s, m->body.data, m->body.len, verdict)) != MILTER_STEP_CONTINUE)
		return o;
	o = milter_session_end_of_message(s, verdict);
	if (o == MILTER_STEP_ERROR || o == MILTER_STEP_DONE)
		return o;
	if (filter_accepted_rcpts(m) == 0)
	{
		/*
		 * The filter refused every recipient: the message goes on as far
		 * as it is concerned, its end-of-message replies unread (the
		 * connection is closed, as after any verdict but continue).
		 */
		*verdict = MILTER_VERDICT_ACCEPT;
		return MILTER_STEP_DONE;
	}
	o = milter_session_final_reply(s, verdict);
	*ended = o == MILTER_STEP_DONE;
	if (o == MILTER_STEP_DONE && *verdict == MILTER_VERDICT_ACCEPT)
		filter_apply_edits(s, m);
	return o;
}

/* The SMTP-level steps, then the content.  MILTER_STEP_DONE with *verdict set, or MILTER_STEP_ERROR. */
static enum milter_step
filter_walk(struct milter_session *s, void *arg, enum milter_verdict *verdict)
{
	struct filter_walk *w = arg;
	const char		   *ip = origin_string(w->source, "client_ip");
	const char		   *helo = origin_string(w->source, "helo");
	const char		   *body = origin_string(w->source, "body");
	const char		   *esmtp[1] = {"BODY=8BITMIME"};
	enum milter_step	o;
	char			   *hostname = ip ? xasprintf("[%s]", ip) : xstrdup("localhost");
	size_t				accepted = 0;

	o = milter_session_connect(s, hostname, ip, 0);
	free(hostname);
	if (o != MILTER_STEP_CONTINUE)
		return o;
	if ((o = milter_session_helo(s, helo ? helo : w->source->hostname)) != MILTER_STEP_CONTINUE)
		return o;
	o = milter_session_mail(s, w->m->mail_from, esmtp, body && strcasecmp(body, "8BITMIME") == 0 ? 1 : 0);
	if (o != MILTER_STEP_CONTINUE)
		return o;
	for (size_t i = 0; i < w->m->nrcpt; i++)
	{
		if (w->m->rcpt[i].fate != MILTER_RCPT_ACCEPTED)
			continue; /* an earlier filter refused it */
		accepted++;
		if ((o = milter_session_rcpt(s, w->m->rcpt[i].address, i)) != MILTER_STEP_CONTINUE)
			return o;
	}
	if (accepted == 0)
	{
		/* Nothing left to show it: the message goes on as far as this filter is concerned. */
		*verdict = MILTER_VERDICT_ACCEPT;
		return MILTER_STEP_DONE;
	}
	return filter_content(s, w->m, verdict, &(bool){false});
}

/* What CONNECT and HELO said about the client: its address, name, listener, account, TLS. */
static char *
filter_client_key(const struct milter_macro_source *source)
{
	json_t *key;
	char   *text;

	if (source->origin == NULL)
		return xstrdup("local");
	key = json_pack("[s?,s?,s?,s?,O?]", origin_string(source, "client_ip"),
					origin_string(source, "helo"), origin_string(source, "listener"),
					origin_string(source, "auth"), json_object_get(source->origin, "tls"));
	text = key ? json_dumps(key, JSON_COMPACT) : NULL;
	json_decref(key);
	return text ? text : xstrdup("?");
}

enum milter_verdict
milter_filter_run(struct milter_client *c, struct milter_message *m,
				  const struct milter_macro_source *macros, const struct milter_timeouts *timeouts,
				  char **reply)
{
	struct filter_walk			w = {.m = m, .source = macros, .filter = milter_client_name(c), .mail_from = m->mail_from};
	struct milter_session_calls calls = {
		.macro_value = filter_macro_value, .rcpt_refused = filter_rcpt_refused, .arg = &w};
	struct milter_session s;
	char				 *key = filter_client_key(macros);
	enum milter_verdict	  verdict;

	milter_session_init(&s, c, timeouts, &calls);
	verdict = milter_session_run(&s, key, filter_walk, &w, reply);
	milter_session_free(&s);
	free(key);
	return verdict;
}

/*
 * One filter over one SMTP session: the walk's macros and its recipient
 * refusals come from the step being taken, not from a stored row.
 */
struct milter_filter_session
{
	struct milter_client	   *client;
	struct milter_timeouts		timeouts;
	struct milter_session		s;
	struct milter_session_calls calls;
	struct filter_walk			w;
	bool						opened;
	bool						in_transaction; /* MAIL sent, no final reply yet */
	bool						unfinished;		/* a verdict within the content left commands unanswered */
	bool						rcpt_refused;	/* the RCPT step's refusal, from the walk's callback */
	enum milter_verdict			rcpt_verdict;
	char					   *rcpt_reply;
};

static void
session_rcpt_refused(void *arg, size_t index, enum milter_verdict verdict, char *reply)
{
	struct milter_filter_session *fs = arg;

	(void) index;
	free(fs->rcpt_reply);
	fs->rcpt_refused = true;
	fs->rcpt_verdict = verdict;
	fs->rcpt_reply = reply;
}

static const char *
session_macro_value(void *arg, const char *name, const char *rcpt, char *scratch, size_t len)
{
	struct milter_filter_session *fs = arg;

	return filter_macro_value(&fs->w, name, rcpt, scratch, len);
}

struct milter_filter_session *
milter_filter_session_new(const char *address, const struct milter_timeouts *timeouts, char *err, size_t errlen)
{
	struct milter_client		 *c = milter_client_new(address, err, errlen);
	struct milter_filter_session *fs;

	if (c == NULL)
		return NULL;
	fs = xcalloc(1, sizeof(*fs));
	fs->client = c;
	fs->timeouts = *timeouts;
	fs->calls = (struct milter_session_calls){
		.macro_value = session_macro_value, .rcpt_refused = session_rcpt_refused, .arg = fs};
	fs->w.filter = milter_client_name(c);
	milter_session_init(&fs->s, c, &fs->timeouts, &fs->calls);
	return fs;
}

void
milter_filter_session_free(struct milter_filter_session *fs)
{
	if (fs == NULL)
		return;
	milter_session_free(&fs->s);
	milter_client_free(fs->client);
	free(fs->rcpt_reply);
	free(fs);
}

/* The step written: its reply read, and what it says. */
static enum milter_step
session_answer(struct milter_filter_session *fs, enum milter_step o, enum milter_verdict *verdict, char **reply)
{
	*reply = NULL;
	if (o == MILTER_STEP_CONTINUE)
		o = milter_session_replies(&fs->s, verdict);
	if (o == MILTER_STEP_CONTINUE && fs->rcpt_refused)
	{
		o = MILTER_STEP_DONE;
		*verdict = fs->rcpt_verdict;
		*reply = fs->rcpt_reply;
		fs->rcpt_reply = NULL;
	}
	fs->rcpt_refused = false;
	if (o == MILTER_STEP_DONE && *reply == NULL && fs->s.reply)
	{
		*reply = fs->s.reply;
		fs->s.reply = NULL;
	}
	if (o == MILTER_STEP_ERROR)
		*reply = xstrdup(fs->s.err[0] ? fs->s.err : "the filter failed");
	return o;
}

enum milter_step
milter_filter_session_connect(struct milter_filter_session *fs, const struct milter_macro_source *macros,
							  enum milter_verdict *verdict, char **reply)
{
	const char		*ip = origin_string(macros, "client_ip");
	char			*hostname = ip ? xasprintf("[%s]", ip) : xstrdup("localhost");
	enum milter_step o;

	fs->w.source = macros;
	/* a fresh connection: CONNECT and HELO are this session's */
	o = milter_session_begin(&fs->s, "session");
	fs->opened = o == MILTER_STEP_CONTINUE;
	if (o == MILTER_STEP_CONTINUE)
		o = milter_session_connect(&fs->s, hostname, ip, 0);
	free(hostname);
	return session_answer(fs, o, verdict, reply);
}

enum milter_step
milter_filter_session_helo(struct milter_filter_session *fs, const struct milter_macro_source *macros,
						   const char *helo, enum milter_verdict *verdict, char **reply)
{
	fs->w.source = macros;
	return session_answer(fs, milter_session_helo(&fs->s, helo), verdict, reply);
}

enum milter_step
milter_filter_session_mail(struct milter_filter_session *fs, const struct milter_macro_source *macros,
						   const char *mail_from, const char *const *esmtp, size_t nesmtp,
						   enum milter_verdict *verdict, char **reply)
{
	enum milter_step o;

	milter_session_next_transaction(&fs->s, fs->in_transaction);
	fs->in_transaction = true;
	fs->w.source = macros;
	fs->w.mail_from = mail_from;
	o = session_answer(fs, milter_session_mail(&fs->s, mail_from, esmtp, nesmtp), verdict, reply);
	fs->w.mail_from = NULL;
	return o;
}

enum milter_step
milter_filter_session_rcpt(struct milter_filter_session *fs, const struct milter_macro_source *macros,
						   const char *mail_from, const char *address, enum milter_verdict *verdict,
						   char **reply)
{
	enum milter_step o;

	fs->w.source = macros;
	fs->w.mail_from = mail_from;
	o = session_answer(fs, milter_session_rcpt(&fs->s, address, 0), verdict, reply);
	fs->w.mail_from = NULL;
	return o;
}

enum milter_step
milter_filter_session_message(struct milter_filter_session *fs, const struct milter_macro_source *macros,
							  struct milter_message *m, enum milter_verdict *verdict, char **reply)
{
	bool			 ended = false;
	enum milter_step o;

	fs->w.source = macros;
	fs->w.m = m;
	fs->w.mail_from = m->mail_from;
	o = filter_content(&fs->s, m, verdict, &ended);
	fs->w.m = NULL;
	fs->w.mail_from = NULL;
	if (ended)
		fs->in_transaction = false;
	fs->unfinished = !ended;
	return session_answer(fs, o, verdict, reply);
}

bool
milter_filter_session_reusable(const struct milter_filter_session *fs)
{
	/* a verdict before end of message leaves commands unanswered: the filter is asked afresh */
	return !fs->unfinished;
}
