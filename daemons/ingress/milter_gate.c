/*
 * milter_gate.c: see milter_gate.h.
 *
 * Why a thread per transaction, and not the filter's socket on the event
 * loop: the conversation is common/message/milter_client.c's, the very
 * code pepsi-stage-milter runs after the queue, and it waits on its
 * socket with poll() under its own deadlines (CONNECT_TIMEOUT,
 * COMMAND_TIMEOUT, FINAL_TIMEOUT of the stage, or a filter's braces).
 * Run on a thread of its own, that wait can stall nothing but the one
 * transaction that asked: the loop keeps serving every other session, and
 * a shared pool could not promise that (one hung filter would hold a
 * worker every other session then queues behind).  The thread owns
 * copies of everything it reads (the content, the envelope, the filter
 * list and the macros), so a session that closes meanwhile or a reload
 * that replaces the listener's MILTERS changes nothing it uses; its
 * result comes back through an ev_async, and a cancelled job's result is
 * dropped there.  The threads are as many as the transactions being
 * filtered, bounded by MAX_SESSIONS, each for at most its timeouts.
 */
#include "milter_gate.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "options.h"

/* The thread reads a message and a few replies: a small stack is plenty. */
#define MILTER_GATE_STACK (512 * 1024)

struct milter_gate_job
{
	/* Owned by the thread until it is done */
	struct milter_entry		 *entries;
	size_t					  count;
	struct milter_message	  m;
	json_t					 *origin;
	char					 *hostname;
	char					 *queue_id;
	struct milter_gate_result result;
	/* On the loop only */
	milter_gate_done		done;
	void				   *arg;
	bool					cancelled;
	struct milter_gate_job *next;
};

static pthread_mutex_t		   gate_lock = PTHREAD_MUTEX_INITIALIZER;
static struct milter_gate_job *gate_done_list;
static struct ev_loop		  *gate_loop;
static ev_async				   gate_async;

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

static void
gate_job_free(struct milter_gate_job *job)
{
	milters_free(job->entries, job->count);
	milter_message_free(&job->m);
	json_decref(job->origin);
	free(job->hostname);
	free(job->queue_id);
	milter_gate_result_free(&job->result);
	free(job);
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

/* The message the filters let through: what changed goes back to the session. */
static void
gate_collect(struct milter_gate_job *job, struct buf *log)
{
	struct milter_message	  *m = &job->m;
	struct milter_gate_result *r = &job->result;
	size_t					   refused = 0;

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
	for (size_t i = 0; i < m->nrcpt; i++)
		refused += m->rcpt[i].fate != MILTER_RCPT_ACCEPTED;
	if (refused)
	{
		/*
		 * A filter refused a recipient at its RCPT.  The client heard 250
		 * for it long ago; the filters are asked at the end of DATA, so the
		 * refusal is the message's: the first refused recipient's reply, a
		 * 5xx when any was rejected.  Nothing is stored that a recipient's
		 * filter refused, and the sender is told, which a quiet drop would
		 * not do.
		 */
		bool rejected = false;

		for (size_t i = 0; i < m->nrcpt; i++)
			rejected |= m->rcpt[i].fate == MILTER_RCPT_REJECTED;
		for (size_t i = 0; i < m->nrcpt; i++)
			if (m->rcpt[i].fate == (rejected ? MILTER_RCPT_REJECTED : MILTER_RCPT_TEMPFAILED))
			{
				r->outcome = MILTER_GATE_REFUSE;
				r->reply = gate_reply(m->rcpt[i].reply ? xstrdup(m->rcpt[i].reply) : NULL,
									  rejected ? MILTER_VERDICT_REJECT : MILTER_VERDICT_TEMPFAIL);
				r->filter = xstrdup(m->rcpt[i].filter ? m->rcpt[i].filter : "?");
				buf_printf(log, "%srecipient <%s> refused", log->len ? ", " : "", m->rcpt[i].address);
				break;
			}
		return;
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

/* The filters in order, each seeing the message as the ones before it left it. */
static void
gate_run(struct milter_gate_job *job)
{
	struct milter_macro_source source = {.hostname = job->hostname, .queue_id = job->queue_id, .origin = job->origin};
	struct buf				   log = BUF_INIT;

	for (size_t i = 0; i < job->count; i++)
	{
		const struct milter_entry *e = &job->entries[i];
		struct milter_timeouts	   t = {
				.connect_ms = e->connect_ms >= 0 ? e->connect_ms : gate_default_ms("CONNECT_TIMEOUT"),
				.command_ms = e->command_ms >= 0 ? e->command_ms : gate_default_ms("COMMAND_TIMEOUT"),
				.final_ms = e->final_ms >= 0 ? e->final_ms : gate_default_ms("FINAL_TIMEOUT"),
		};
		char				  err[256];
		struct milter_client *c = milter_client_new(e->address, err, sizeof(err));
		char				 *reply = NULL;
		enum milter_verdict	  v;

		if (c == NULL)
		{
			/* checked when MILTERS was read: cannot happen */
			v = MILTER_VERDICT_UNAVAILABLE;
			reply = xstrdup(err);
		}
		else
		{
			v = milter_filter_run(c, &job->m, &source, &t, &reply);
			milter_client_free(c);
		}
		if (v == MILTER_VERDICT_UNAVAILABLE)
		{
			bool open = gate_fail_open(e);

			log_warnx("%s: milter %s unavailable (%s): default_action %s", job->queue_id, e->address,
					  reply ? reply : "?", open ? "accept, the message goes on" : "tempfail");
			free(reply);
			if (open)
				continue;
			v = MILTER_VERDICT_TEMPFAIL;
			reply = NULL;
		}
		if (v == MILTER_VERDICT_ACCEPT)
		{
			free(reply);
			continue;
		}
		job->result.filter = xstrdup(e->address);
		if (v == MILTER_VERDICT_DISCARD)
		{
			free(reply);
			job->result.outcome = MILTER_GATE_DISCARD;
		}
		else
		{
			job->result.outcome = MILTER_GATE_REFUSE;
			job->result.reply = gate_reply(reply, v);
		}
		buf_free(&log);
		return;
	}
	gate_collect(job, &log);
	if (job->result.outcome == MILTER_GATE_STORE && job->result.quarantine && job->result.filter == NULL)
		job->result.filter = xstrdup("milter");
	if (log.len)
		job->result.log = xstrdup(log.data);
	buf_free(&log);
}

/* The job's result is in: the loop takes it (gate_on_done). */
static void
gate_finish(struct milter_gate_job *job)
{
	pthread_mutex_lock(&gate_lock);
	job->next = gate_done_list;
	gate_done_list = job;
	pthread_mutex_unlock(&gate_lock);
	ev_async_send(gate_loop, &gate_async);
}

static void *
gate_thread(void *arg)
{
	struct milter_gate_job *job = arg;

	gate_run(job);
	gate_finish(job);
	return NULL;
}

static void
gate_on_done(struct ev_loop *loop, ev_async *w, int revents)
{
	struct milter_gate_job *list;

	pthread_mutex_lock(&gate_lock);
	list = gate_done_list;
	gate_done_list = NULL;
	pthread_mutex_unlock(&gate_lock);
	while (list)
	{
		struct milter_gate_job *job = list;

		list = job->next;
		if (!job->cancelled)
			job->done(job->arg, &job->result);
		gate_job_free(job);
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

/* What CONNECT, HELO and the macros say, as the stage reads them from state.origin. */
static json_t *
gate_origin(const struct smtp_session *smtp, const struct milter_gate_client *client)
{
	json_t *o = json_object();

	json_object_set_new(o, "client_ip", json_string(client->ip));
	json_object_set_new(o, "listener", json_string(client->listener));
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

struct milter_gate_job *
milter_gate_start(struct ev_loop *loop, const struct milter_gate_list *list, const struct smtp_session *smtp,
				  const struct milter_gate_client *client, milter_gate_done done, void *arg)
{
	struct milter_gate_job *job = xcalloc(1, sizeof(*job));
	const char			  **rcpt = xcalloc(smtp->nrcpt + 1, sizeof(*rcpt));
	const char			   *body;
	size_t					hlen, blen;
	pthread_attr_t			attr;
	pthread_t				thread;
	int						rc;

	if (gate_loop == NULL)
	{
		gate_loop = loop;
		ev_async_init(&gate_async, gate_on_done);
		ev_async_start(loop, &gate_async);
		/* Not a reason to keep the loop running by itself. */
		ev_unref(loop);
	}
	job->entries = xcalloc(list->count, sizeof(*job->entries));
	for (size_t i = 0; i < list->count; i++)
	{
		job->entries[i] = list->entries[i];
		job->entries[i].address = xstrdup(list->entries[i].address);
	}
	job->count = list->count;
	for (size_t i = 0; i < smtp->nrcpt; i++)
		rcpt[i] = smtp->rcpt[i].address;
	gate_split(&smtp->message, &hlen, &body, &blen);
	milter_message_init(&job->m, smtp->message.data ? smtp->message.data : "", hlen, body, blen,
						smtp->mail_from ? smtp->mail_from : "", rcpt, smtp->nrcpt);
	free(rcpt);
	job->origin = gate_origin(smtp, client);
	job->hostname = xstrdup(client->hostname);
	job->queue_id = xstrdup(client->queue_id);
	job->done = done;
	job->arg = arg;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, MILTER_GATE_STACK);
	rc = pthread_create(&thread, &attr, gate_thread, job);
	pthread_attr_destroy(&attr);
	if (rc != 0)
	{
		/* No thread, no filter: what it would have decided unavailable (451). */
		log_warnx("%s: milters not asked: no thread (%s)", client->queue_id, strerror(rc));
		job->result.outcome = MILTER_GATE_REFUSE;
		job->result.reply = xstrdup("451 4.3.0 Filters temporarily unavailable, try again later");
		job->result.filter = xstrdup("-");
		gate_finish(job);
	}
	return job;
}

void
milter_gate_cancel(struct milter_gate_job *job)
{
	if (job)
		job->cancelled = true;
}
