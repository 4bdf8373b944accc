/*
 * milter_gate.c: see milter_gate.h.  The steps each filter is walked
 * through (what a verdict at CONNECT, HELO, MAIL, RCPT or the message
 * means for the session and the transaction), run on the threads of
 * milter_gate_pool.c.
 *
 * Each filter of a conversation is in one of three states for the rest
 * of the session, as Postfix's milter8 keeps them: asked; done with (it
 * accepted the connection, or it failed with default_action accept); or
 * refusing (it refused at CONNECT or HELO, or failed with
 * default_action tempfail), when its reply answers every MAIL after.  A
 * filter that accepts at MAIL or RCPT is done with the transaction only.
 */
#include "milter_gate_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "options.h"

bool
milter_gate_list_load(const char *value, struct milter_gate_list *list, char *err, size_t errlen)
{
	*list = (struct milter_gate_list){0};
	if (value == NULL)
		return true;
	return milters_parse(value, &list->entries, &list->count, err, errlen);
}

void
milter_gate_list_free(struct milter_gate_list *list)
{
	milters_free(list->entries, list->count);
	*list = (struct milter_gate_list){0};
}

void
milter_gate_result_free(struct milter_gate_result *r)
{
	free(r->reply);
	free(r->filter);
	free(r->quarantine);
	buf_free(&r->content);
	free(r->mail_from);
	for (size_t i = 0; i < r->nrcpt; i++)
		free(r->rcpt[i]);
	free(r->rcpt);
	free(r->log);
	*r = (struct milter_gate_result){0};
}

/* A stage option's default from the schema, the value a filter's braces did not override. */
static long long
gate_default_ms(const char *option)
{
	const struct option_def *def = option_find("stage-milter", "pepsi-stage-milter", option);
	long long				 ms = 30000;

	if (def && def->default_value)
		option_parse_duration_ms(def->default_value, &ms);
	return ms;
}

/* Is the filter's default_action (or the stage's DEFAULT_ACTION default) accept? */
static bool
gate_fail_open(const struct milter_entry *e)
{
	const struct option_def *def = option_find("stage-milter", "pepsi-stage-milter", "DEFAULT_ACTION");
	int						 accept = def ? option_enum_index(def, "accept") : 1;
	int						 action = e->default_action;

	if (action < 0)
		action = def && def->default_value ? option_enum_index(def, def->default_value) : 0;
	return action == accept;
}

/* A reply a filter gave, or the one Postfix's smtpd gives for its verdict. */
static char *
gate_reply(char *reply, enum milter_verdict verdict)
{
	if (reply && (reply[0] == '4' || reply[0] == '5'))
		return reply;
	free(reply);
	return xstrdup(verdict == MILTER_VERDICT_REJECT ? "550 5.7.1 Command rejected"
													: "451 4.7.1 Service unavailable - try again later");
}

void
gate_filters_new(struct milter_gate *g, const struct milter_gate_list *list)
{
	g->filters = xcalloc(list->count ? list->count : 1, sizeof(*g->filters));
	g->count = list->count;
	for (size_t i = 0; i < list->count; i++)
	{
		const struct milter_entry *e = &list->entries[i];
		struct gate_filter		  *f = &g->filters[i];

		f->entry = *e;
		f->entry.address = xstrdup(e->address);
		f->timeouts = (struct milter_timeouts){
			.connect_ms = e->connect_ms >= 0 ? e->connect_ms : gate_default_ms("CONNECT_TIMEOUT"),
			.command_ms = e->command_ms >= 0 ? e->command_ms : gate_default_ms("COMMAND_TIMEOUT"),
			.final_ms = e->final_ms >= 0 ? e->final_ms : gate_default_ms("FINAL_TIMEOUT"),
		};
	}
}

/* The conversations' end (on a thread): QUIT to each filter still open. */
void
gate_filters_free(struct milter_gate *g)
{
	for (size_t i = 0; i < g->count; i++)
	{
		milter_filter_session_free(g->filters[i].session);
		free(g->filters[i].entry.address);
		free(g->filters[i].refusal);
	}
	free(g->filters);
	g->filters = NULL;
	g->count = 0;
	free(g->helo);
	g->helo = NULL;
}

/* The filter could not be asked: done with for the session (accept), or refusing (tempfail). */
static void
gate_unavailable(struct milter_gate *g, struct gate_filter *f, const char *why)
{
	bool open = gate_fail_open(&f->entry);

	log_warnx("%s: milter %s unavailable (%s): default_action %s", g->name, f->entry.address,
			  why ? why : "?", open ? "accept, the session goes on without it" : "tempfail");
	milter_filter_session_free(f->session);
	f->session = NULL;
	if (open)
		f->state = GATE_FILTER_DONE;
	else
	{
		f->state = GATE_FILTER_REFUSING;
		free(f->refusal);
		f->refusal = xstrdup("451 4.7.1 Service unavailable - try again later");
	}
}

/*
 * A verdict at CONNECT or HELO: an accept is for the whole session, a
 * refusal answers every MAIL after it (Postfix answers HELO with 250
 * whatever the filters say, but for 421).  True when the filter refused.
 */
static bool
gate_session_verdict(struct milter_gate *g, struct gate_filter *f, enum milter_step o,
					 enum milter_verdict v, char *reply)
{
	if (o == MILTER_STEP_ERROR)
		gate_unavailable(g, f, reply);
	else if (o == MILTER_STEP_DONE && (v == MILTER_VERDICT_REJECT || v == MILTER_VERDICT_TEMPFAIL))
	{
		f->state = GATE_FILTER_REFUSING;
		free(f->refusal);
		f->refusal = gate_reply(reply, v);
		log_info("%s: milter %s refuses the client: %s", g->name, f->entry.address, f->refusal);
		return true;
	}
	else if (o == MILTER_STEP_DONE)
		f->state = GATE_FILTER_DONE; /* accepted (or discarded) the connection: not asked again */
	free(reply);
	return f->state == GATE_FILTER_REFUSING;
}

/* Connect, CONNECT, and HELO when the client gave one: false when the filter is not to be asked. */
static bool
gate_filter_open(struct milter_gate *g, struct gate_filter *f, const struct milter_macro_source *macros)
{
	char				err[256];
	char			   *reply = NULL;
	enum milter_verdict v = MILTER_VERDICT_ACCEPT;
	enum milter_step	o;

	f->session = milter_filter_session_new(f->entry.address, &f->timeouts, err, sizeof(err));
	if (f->session == NULL)
	{
		/* checked when MILTERS was read: cannot happen */
		gate_unavailable(g, f, err);
		return false;
	}
	o = milter_filter_session_connect(f->session, macros, &v, &reply);
	if (gate_session_verdict(g, f, o, v, reply) || f->state != GATE_FILTER_ASKED)
		return false;
	if (g->helo)
	{
		o = milter_filter_session_helo(f->session, macros, g->helo, &v, &reply);
		if (gate_session_verdict(g, f, o, v, reply) || f->state != GATE_FILTER_ASKED)
			return false;
	}
	return true;
}

/* CONNECT: each filter in order, up to the first that refuses the client. */
static void
gate_step_connect(struct milter_gate *g, const struct milter_macro_source *macros)
{
	for (size_t i = 0; i < g->count; i++)
		if (!gate_filter_open(g, &g->filters[i], macros) && g->filters[i].state == GATE_FILTER_REFUSING)
			return;
}

static void
gate_step_helo(struct milter_gate *g, struct gate_step *step, const struct milter_macro_source *macros)
{
	free(g->helo);
	g->helo = xstrdup(step->text);
	for (size_t i = 0; i < g->count; i++)
	{
		struct gate_filter *f = &g->filters[i];
		char			   *reply = NULL;
		enum milter_verdict v = MILTER_VERDICT_ACCEPT;
		enum milter_step	o;

		if (f->state == GATE_FILTER_REFUSING)
			return;
		if (f->state != GATE_FILTER_ASKED || f->session == NULL)
			continue;
		o = milter_filter_session_helo(f->session, macros, g->helo, &v, &reply);
		if (gate_session_verdict(g, f, o, v, reply))
			return;
	}
}

/* The step's refusal, by filter f: the client hears reply. */
static void
gate_refuse(struct gate_step *step, const struct gate_filter *f, char *reply, enum milter_verdict v)
{
	step->result.outcome = MILTER_GATE_REFUSE;
	step->result.reply = gate_reply(reply, v);
	step->result.filter = xstrdup(f->entry.address);
}

/* The ESMTP parameters of MAIL the filter hears: BODY= as given. */
static size_t
gate_mail_esmtp(const struct gate_step *step, const char **esmtp)
{
	json_t *body = json_object_get(step->origin, "body");

	if (json_is_string(body))
	{
		esmtp[0] = "BODY=8BITMIME";
		return 1;
	}
	return 0;
}

/*
 * MAIL or RCPT: each filter still asked, in order, up to the first that
 * refuses; a new MAIL starts a transaction (the filters that did not see
 * the last one to its end hear SMFIC_ABORT first).
 */
static void
gate_step_envelope(struct milter_gate *g, struct gate_step *step, const struct milter_macro_source *macros)
{
	bool mail = step->kind == GATE_STEP_MAIL;

	if (mail)
	{
		free(g->mail_from);
		g->mail_from = xstrdup(step->text);
		g->discard = false;
		for (size_t i = 0; i < g->count; i++)
			g->filters[i].transaction_done = g->filters[i].heard_mail = false;
	}
	step->result.outcome = MILTER_GATE_STORE;
	if (g->discard)
		return; /* the message will be discarded: nothing more to ask */
	for (size_t i = 0; i < g->count; i++)
	{
		struct gate_filter *f = &g->filters[i];
		char			   *reply = NULL;
		const char		   *esmtp[1];
		enum milter_verdict v = MILTER_VERDICT_ACCEPT;
		enum milter_step	o;

		if (f->state == GATE_FILTER_REFUSING)
		{
			gate_refuse(step, f, xstrdup(f->refusal), MILTER_VERDICT_TEMPFAIL);
			return;
		}
		if (f->state != GATE_FILTER_ASKED || f->transaction_done)
			continue;
		/* after a verdict that left commands unanswered the filter was closed: opened afresh */
		if (f->session == NULL && !gate_filter_open(g, f, macros))
		{
			if (f->state == GATE_FILTER_REFUSING)
				gate_refuse(step, f, xstrdup(f->refusal), MILTER_VERDICT_TEMPFAIL);
			if (f->state == GATE_FILTER_REFUSING)
				return;
			continue;
		}
		if (mail)
			o = milter_filter_session_mail(f->session, macros, g->mail_from, esmtp,
										   gate_mail_esmtp(step, esmtp), &v, &reply);
		else
			o = milter_filter_session_rcpt(f->session, macros, g->mail_from, step->text, &v, &reply);
		if (o == MILTER_STEP_ERROR)
		{
			gate_unavailable(g, f, reply);
			free(reply);
			if (f->state == GATE_FILTER_REFUSING)
			{
				gate_refuse(step, f, xstrdup(f->refusal), MILTER_VERDICT_TEMPFAIL);
				return;
			}
			continue;
		}
		f->heard_mail |= mail;
		if (o == MILTER_STEP_CONTINUE)
		{
			free(reply);
			continue;
		}
		switch (v)
		{
			case MILTER_VERDICT_ACCEPT:
				f->transaction_done = true; /* accepts the message: not asked about it again */
				free(reply);
				break;
			case MILTER_VERDICT_DISCARD:
				/* Sendmail: the whole message, stored nowhere, the client told 250 */
				g->discard = true;
				free(g->discard_filter);
				g->discard_filter = xstrdup(f->entry.address);
				free(reply);
				return;
			default:
				gate_refuse(step, f, reply, v);
				return;
		}
	}
}

/* The content split where the header section ends: the filters take them apart. */
static void
gate_split(const struct buf *message, size_t *hlen, const char **body, size_t *blen)
{
	const char *data = message->data ? message->data : "";
	const char *end = NULL;

	if (message->len >= 2 && data[0] == '\r' && data[1] == '\n')
	{
		*hlen = 0;
		*body = data + 2;
		*blen = message->len - 2;
		return;
	}
	end = memmem(data, message->len, "\r\n\r\n", 4);
	if (end == NULL)
	{
		*hlen = message->len;
		*body = data + message->len;
		*blen = 0;
		return;
	}
	*hlen = (size_t) (end - data) + 2;
	*body = end + 4;
	*blen = message->len - (size_t) (end - data) - 4;
}

void
gate_message_copy(struct gate_step *step, const struct smtp_session *smtp)
{
	const char **rcpt = xcalloc(smtp->nrcpt + 1, sizeof(*rcpt));
	const char	*body;
	size_t		 hlen, blen;

	for (size_t i = 0; i < smtp->nrcpt; i++)
		rcpt[i] = smtp->rcpt[i].address;
	gate_split(&smtp->message, &hlen, &body, &blen);
	milter_message_init(&step->m, smtp->message.data ? smtp->message.data : "", hlen, body, blen,
						smtp->mail_from ? smtp->mail_from : "", rcpt, smtp->nrcpt);
	step->has_message = true;
	free(rcpt);
}

/* The message the filters let through: what changed goes back to the session. */
static void
gate_collect(struct gate_step *step, struct buf *log)
{
	struct milter_message	  *m = &step->m;
	struct milter_gate_result *r = &step->result;

	r->outcome = MILTER_GATE_STORE;
	if (m->headers_changed || m->body_changed)
	{
		r->content_changed = true;
		milter_message_headers(m, &r->content);
		buf_append(&r->content, "\r\n", 2);
		buf_append(&r->content, m->body.data, m->body.len);
		buf_printf(log, "%s%s", log->len ? ", " : "", m->body_changed ? "headers and body changed" : "headers changed");
	}
	if (m->mail_from_changed)
	{
		r->mail_from = xstrdup(m->mail_from);
		buf_printf(log, "%ssender <%s>", log->len ? ", " : "", m->mail_from);
	}
	if (m->nadded || m->ndeleted)
	{
		/* The recipients the row will have: the deleted ones out, the added ones after. */
		r->rcpt = xcalloc(m->nrcpt + m->nadded + 1, sizeof(*r->rcpt));
		for (size_t i = 0; i < m->nrcpt; i++)
		{
			bool deleted = false;

			for (size_t d = 0; d < m->ndeleted; d++)
				deleted |= strcasecmp(m->deleted[d], m->rcpt[i].address) == 0;
			if (!deleted)
				r->rcpt[r->nrcpt++] = xstrdup(m->rcpt[i].address);
		}
		for (size_t a = 0; a < m->nadded; a++)
			r->rcpt[r->nrcpt++] = xstrdup(m->added[a]);
		buf_printf(log, "%s%zu recipient(s) added, %zu deleted", log->len ? ", " : "", m->nadded,
				   m->ndeleted);
	}
	if (m->quarantine)
	{
		r->quarantine = xstrdup(m->quarantine);
		buf_printf(log, "%squarantined: %s", log->len ? ", " : "", m->quarantine);
	}
}

/* The message: each filter still asked, in order, each seeing it as the ones before it left it. */
static void
gate_step_message(struct milter_gate *g, struct gate_step *step, const struct milter_macro_source *macros)
{
	struct buf log = BUF_INIT;

	if (g->discard)
	{
		step->result.outcome = MILTER_GATE_DISCARD;
		step->result.filter = xstrdup(g->discard_filter ? g->discard_filter : "milter");
		return;
	}
	for (size_t i = 0; i < g->count; i++)
	{
		struct gate_filter *f = &g->filters[i];
		char			   *reply = NULL;
		enum milter_verdict v = MILTER_VERDICT_ACCEPT;
		enum milter_step	o;

		if (f->state == GATE_FILTER_REFUSING)
		{
			gate_refuse(step, f, xstrdup(f->refusal), MILTER_VERDICT_TEMPFAIL);
			buf_free(&log);
			return;
		}
		/* a filter that did not hear this MAIL (its listener gained MILTERS since) hears no DATA */
		if (f->state != GATE_FILTER_ASKED || f->transaction_done || f->session == NULL || !f->heard_mail)
			continue;
		o = milter_filter_session_message(f->session, macros, &step->m, &v, &reply);
		if (o == MILTER_STEP_ERROR)
		{
			gate_unavailable(g, f, reply);
			free(reply);
			if (f->state != GATE_FILTER_REFUSING)
				continue;
			gate_refuse(step, f, xstrdup(f->refusal), MILTER_VERDICT_TEMPFAIL);
			buf_free(&log);
			return;
		}
		if (!milter_filter_session_reusable(f->session))
		{
			/* commands of this message left unanswered: the next transaction opens it afresh */
			milter_filter_session_free(f->session);
			f->session = NULL;
		}
		if (v == MILTER_VERDICT_ACCEPT)
		{
			free(reply);
			continue;
		}
		if (v == MILTER_VERDICT_DISCARD)
		{
			free(reply);
			step->result.outcome = MILTER_GATE_DISCARD;
			step->result.filter = xstrdup(f->entry.address);
		}
		else
			gate_refuse(step, f, reply, v);
		buf_free(&log);
		return;
	}
	gate_collect(step, &log);
	if (step->result.quarantine && step->result.filter == NULL)
		step->result.filter = xstrdup("milter");
	if (log.len)
		step->result.log = xstrdup(log.data);
	buf_free(&log);
}

void
gate_step_run(struct milter_gate *g, struct gate_step *step)
{
	struct milter_macro_source macros = {.hostname = g->hostname, .queue_id = step->queue_id, .origin = step->origin};

	if (step->queue_id)
		snprintf(g->name, sizeof(g->name), "%s", step->queue_id);
	switch (step->kind)
	{
		case GATE_STEP_CONNECT:
			gate_step_connect(g, &macros);
			break;
		case GATE_STEP_HELO:
			gate_step_helo(g, step, &macros);
			break;
		case GATE_STEP_MAIL:
		case GATE_STEP_RCPT:
			gate_step_envelope(g, step, &macros);
			break;
		case GATE_STEP_MESSAGE:
			gate_step_message(g, step, &macros);
			break;
		case GATE_STEP_QUIT:
			gate_filters_free(g);
			break;
	}
}

/* What CONNECT, HELO and the macros say, as the stage reads them from state.origin. */
json_t *
gate_origin(const struct milter_gate *g, const struct smtp_session *smtp)
{
	json_t *o = json_object();

	json_object_set_new(o, "client_ip", json_string(g->ip));
	json_object_set_new(o, "listener", json_string(g->listener));
	if (smtp == NULL)
		return o;
	if (smtp->helo)
		json_object_set_new(o, "helo", json_string(smtp->helo));
	if (smtp->auth_account)
		json_object_set_new(o, "auth", json_string(smtp->auth_account));
	if (smtp->body == SMTP_BODY_8BITMIME)
		json_object_set_new(o, "body", json_string("8BITMIME"));
	if (smtp->tls)
		json_object_set_new(o, "tls", json_pack("{s:s, s:s, s:i}", "version", smtp->tls_info.version, "cipher", smtp->tls_info.cipher, "bits", smtp->tls_info.bits));
	return o;
}
