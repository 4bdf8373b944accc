/*
 * pepsi-stage-milter: content filtering through the filters postmasters
 * already run (rspamd, spamass-milter, clamav-milter, OpenDKIM, OpenDMARC),
 * spoken to in the Sendmail/Postfix milter protocol, version 6.
 *
 * Each message is shown to the filters of MILTERS in order, each filter
 * seeing it as the previous ones edited it.  The first filter to reject,
 * tempfail or discard decides; recipients a filter refused at RCPT are
 * split off (fan_out: a Retry group paused here for a 4xx, a bounce for a
 * 5xx); a quarantine holds the row (paused until released, as
 * pepsi.queue_hold leaves it) with the reason, for the operator.  Otherwise the edits are committed with the advance: the body
 * copy-on-write by the runtime, so sibling rows keep theirs.  The verdict
 * goes to state.milter and to the log.
 *
 * Options of its [stage-*] section (see pepsi-stage-milter(8)):
 *   MILTERS          inet:host:port, inet:[address]:port or unix:/path, in order;
 *                    { address, name=value, ... } gives one filter its own
 *                    timeouts or DEFAULT_ACTION (common/message/milter_list.c)
 *   CONNECT_TIMEOUT (30s), COMMAND_TIMEOUT (30s), FINAL_TIMEOUT (5m)
 *   DEFAULT_ACTION   tempfail (default) | accept: when a filter cannot be asked
 *   REJECT_ACTION    bounce (default) | discard: what a 5xx does
 *   RETRY_BASE (1m), RETRY_MAX (1h): the backoff of a tempfail
 *   BOUNCE_STAGE, NEXT_STAGE
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "milter_stage.h"
#include "runtime/stage.h"

int pepsi_stage_milter_main(int argc, char **argv);

enum milter_default_action
{
	DEFAULT_TEMPFAIL,
	DEFAULT_ACCEPT
};

enum milter_reject_action
{
	REJECT_BOUNCE,
	REJECT_DISCARD
};

/* The stage's options, read in one place. */
struct milter_options
{
	const char				  *milters;
	struct milter_timeouts	   timeouts;
	enum milter_default_action default_action;
	enum milter_reject_action  reject_action;
	long long				   retry_base_ms;
	long long				   retry_max_ms;
};

static bool
milter_read_options(const struct pepsi_config *cfg, const char *section, struct milter_options *o,
					char *err, size_t errlen)
{
	memset(o, 0, sizeof(*o));
	o->milters = config_get(cfg, section, "MILTERS");
	if (o->milters == NULL)
	{
		snprintf(err, errlen, "[%s] needs MILTERS (inet:host:port or unix:/path, in order)", section);
		return false;
	}
	o->timeouts.connect_ms = config_duration_ms(cfg, section, "CONNECT_TIMEOUT");
	o->timeouts.command_ms = config_duration_ms(cfg, section, "COMMAND_TIMEOUT");
	o->timeouts.final_ms = config_duration_ms(cfg, section, "FINAL_TIMEOUT");
	o->retry_base_ms = config_duration_ms(cfg, section, "RETRY_BASE");
	o->retry_max_ms = config_duration_ms(cfg, section, "RETRY_MAX");
	/* The enums' values are in the order of their choices in schema/options.def. */
	o->default_action = (enum milter_default_action) config_enum(cfg, section, "DEFAULT_ACTION");
	o->reject_action = (enum milter_reject_action) config_enum(cfg, section, "REJECT_ACTION");
	return true;
}

/*
 * The filters of this worker, kept open across messages, with the
 * settings of their braces, and the MILTERS they came from.
 */
static struct milter_client **milter_filters;
static struct milter_entry	 *milter_entries;
static size_t				  milter_nfilters;
static char					 *milter_filters_key;

static void
milter_close_filters(void)
{
	for (size_t i = 0; i < milter_nfilters; i++)
		milter_client_free(milter_filters[i]);
	free(milter_filters);
	milters_free(milter_entries, milter_nfilters);
	milter_filters = NULL;
	milter_entries = NULL;
	milter_nfilters = 0;
	free(milter_filters_key);
	milter_filters_key = NULL;
}

/* Parse a MILTERS value into filters (or just check it, when filters is NULL). */
static bool
milter_parse_list(const char *milters, struct milter_client ***filters, struct milter_entry **entries,
				  size_t *count, char *err, size_t errlen)
{
	struct milter_entry *parsed;
	size_t				 n;

	if (!milters_parse(milters, &parsed, &n, err, errlen))
		return false;
	for (size_t i = 0; i < n; i++)
	{
		struct milter_client *f = milter_client_new(parsed[i].address, err, errlen);

		if (f == NULL)
		{
			for (size_t k = 0; filters && k < i; k++)
				milter_client_free((*filters)[k]);
			if (filters)
			{
				free(*filters);
				*filters = NULL;
			}
			milters_free(parsed, n);
			return false;
		}
		if (filters == NULL)
		{
			milter_client_free(f);
			continue;
		}
		*filters = xrealloc(*filters, (i + 1) * sizeof(**filters));
		(*filters)[i] = f;
	}
	if (entries)
		*entries = parsed;
	else
		milters_free(parsed, n);
	*count = n;
	return true;
}

static bool
milter_check_config(const struct pepsi_config *cfg, const char *section, char *err, size_t errlen)
{
	struct milter_options o;
	size_t				  count;

	if (!milter_read_options(cfg, section, &o, err, errlen))
		return false;
	if (!milter_parse_list(o.milters, NULL, NULL, &count, err, errlen))
	{
		/* the section, as the configuration loader names the others */
		char detail[512];

		snprintf(detail, sizeof(detail), "[%s] %s", section, err);
		snprintf(err, errlen, "%s", detail);
		return false;
	}
	return true;
}

/* Filter i's timeouts: its braces' settings, else the stage's. */
static struct milter_timeouts
milter_timeouts_of(const struct milter_options *o, size_t i)
{
	const struct milter_entry *e = &milter_entries[i];
	struct milter_timeouts	   t = o->timeouts;

	if (e->connect_ms >= 0)
		t.connect_ms = e->connect_ms;
	if (e->command_ms >= 0)
		t.command_ms = e->command_ms;
	if (e->final_ms >= 0)
		t.final_ms = e->final_ms;
	return t;
}

static enum milter_default_action
milter_default_action_of(const struct milter_options *o, size_t i)
{
	return milter_entries[i].default_action >= 0
			   ? (enum milter_default_action) milter_entries[i].default_action
			   : o->default_action;
}

/* Seconds until a tempfailed message is tried again: RETRY_BASE doubling to RETRY_MAX. */
static double
milter_backoff(const struct milter_options *o, long attempts)
{
	double seconds = o->retry_base_ms / 1000.0 * pow(2, attempts > 1 ? (double) (attempts - 1) : 0);

	return fmin(seconds, o->retry_max_ms / 1000.0);
}

/* What the filters said, for state.milter and the log. */
struct milter_outcome
{
	enum milter_verdict verdict;
	char			   *reply;	 /* the deciding reply, or why a filter could not be asked */
	const char		   *filter;	 /* the deciding filter */
	json_t			   *filters; /* [{"milter", "verdict", "reply"}] */
};

/* Show m to the filters in order; stop at the first that decides. */
static void
milter_run_filters(const struct milter_options *o, struct milter_message *m,
				   const struct milter_macro_source *source, struct milter_outcome *out)
{
	out->verdict = MILTER_VERDICT_ACCEPT;
	out->filters = json_array();
	for (size_t i = 0; i < milter_nfilters; i++)
	{
		char					  *reply = NULL;
		struct milter_timeouts	   timeouts = milter_timeouts_of(o, i);
		enum milter_default_action default_action = milter_default_action_of(o, i);
		enum milter_verdict		   v = milter_filter_run(milter_filters[i], m, source, &timeouts, &reply);
		const char				  *name = milter_client_name(milter_filters[i]);

		json_array_append_new(out->filters, json_pack("{s:s,s:s,s:s?}", "milter", name,
													  "verdict", milter_verdict_name(v), "reply", reply));
		if (v == MILTER_VERDICT_UNAVAILABLE)
		{
			log_warnx("row %s: milter %s unavailable (DEFAULT_ACTION %s): %s", source->queue_id, name,
					  default_action == DEFAULT_ACCEPT ? "accept" : "tempfail", reply);
			if (default_action == DEFAULT_ACCEPT)
			{
				free(reply);
				continue;
			}
		}
		if (v != MILTER_VERDICT_ACCEPT)
		{
			out->verdict = v;
			out->reply = reply;
			out->filter = name;
			return;
		}
		free(reply);
	}
}

/* The enhanced status code of a reply ("550 5.7.1 text" -> "5.7.1"), or a default. */
static char *
milter_enhanced_status(const char *reply, bool permanent)
{
	const char *p = reply && strlen(reply) > 4 ? reply + 4 : "";
	size_t		len = strspn(p, "0123456789.");

	if (len >= 5 && p[0] == (permanent ? '5' : '4') && p[1] == '.')
		return xstrndup(p, len);
	return xstrdup(permanent ? "5.7.1" : "4.7.1");
}

/* state.bounce for a filter's 5xx, for one recipient or (NULL) the message. */
static json_t *
milter_bounce_json(const char *reply, const char *filter, const char *recipient)
{
	char   *status = milter_enhanced_status(reply, true);
	char   *diagnostic = xasprintf("smtp; %s", reply);
	json_t *bounce = json_pack("{s:s,s:s,s:s,s:i,s:s,s:s,s:s,s:s?}", "kind", "permanent",
							   "status", status, "diagnostic", diagnostic,
							   "smtp_code", atoi(reply), "reply_text", reply,
							   "phase", "content filter", "remote_mta", filter,
							   "failed_recipient", recipient);

	free(status);
	free(diagnostic);
	return bounce;
}

/* state.milter: the verdict, the deciding reply, each filter's answer, the attempts. */
static json_t *
milter_state(const struct milter_outcome *out, const char *verdict, long attempts)
{
	json_t *milter = json_pack("{s:s,s:O}", "verdict", verdict, "filters", out->filters);

	if (out->reply)
		json_object_set_new(milter, "reply", json_string(out->reply));
	if (attempts)
		json_object_set_new(milter, "attempts", json_integer(attempts));
	return json_pack("{s:o}", "milter", milter);
}

static long
milter_previous_attempts(struct pepsi_ctx *ctx)
{
	json_t *milter = json_object_get(pepsi_state(ctx), "milter");

	return (long) json_integer_value(json_object_get(milter, "attempts"));
}

static int
milter_rejected(struct pepsi_ctx *ctx, const struct milter_options *o, struct milter_outcome *out)
{
	const char *bounce_stage = pepsi_option(ctx, "BOUNCE_STAGE");
	json_t	   *merge = milter_state(out, "reject", 0);
	int			rc;

	if (o->reject_action == REJECT_DISCARD || bounce_stage == NULL || pepsi_mail_from(ctx)[0] == '\0')
	{
		log_info("%s: row %lld: milter verdict reject by %s, dropped%s: %s", pepsi_queue_id(ctx), pepsi_id(ctx), out->filter,
				 o->reject_action == REJECT_DISCARD ? " (REJECT_ACTION discard)"
				 : pepsi_mail_from(ctx)[0] == '\0'	? " (null sender)"
													: " (no BOUNCE_STAGE)",
				 out->reply);
		json_decref(merge);
		return pepsi_finish(ctx);
	}
	log_info("%s: row %lld: milter verdict reject by %s, bounced: %s", pepsi_queue_id(ctx), pepsi_id(ctx), out->filter, out->reply);
	json_object_set_new(merge, "bounce", milter_bounce_json(out->reply, out->filter, NULL));
	rc = pepsi_reroute(ctx, bounce_stage, merge);
	json_decref(merge);
	return rc;
}

static int
milter_tempfailed(struct pepsi_ctx *ctx, const struct milter_options *o, struct milter_outcome *out,
				  const char *verdict)
{
	long	attempts = milter_previous_attempts(ctx) + 1;
	double	seconds = milter_backoff(o, attempts);
	json_t *merge = milter_state(out, verdict, attempts);
	int		rc;

	log_info("%s: row %lld: milter verdict %s by %s (attempt %ld, again in %.0fs): %s", pepsi_queue_id(ctx), pepsi_id(ctx),
			 verdict, out->filter, attempts, seconds, out->reply);
	rc = pepsi_pause(ctx, merge, seconds);
	json_decref(merge);
	return rc;
}

/*
 * Recipients the filters refused at RCPT leave the row first: a 4xx
 * recipient as a Retry group paused at this stage (filtered again when
 * it comes back), a 5xx recipient as a bounce (or failed, when there is
 * no one to tell).  When no recipient was accepted the row itself keeps
 * the tempfailed ones (the caller pauses it).  Returns -1 on error.
 */
static int
milter_split_refused(struct pepsi_ctx *ctx, const struct milter_options *o, struct milter_message *m,
					 bool keep_tempfailed)
{
	const char *bounce_stage = pepsi_option(ctx, "BOUNCE_STAGE");
	json_t	   *groups = json_array();
	int		   *keep = xcalloc(m->nrcpt + 1, sizeof(int));
	size_t		nkeep = 0;
	long		attempts = milter_previous_attempts(ctx) + 1;
	int			rc = 0;

	for (size_t i = 0; i < m->nrcpt; i++)
	{
		struct milter_rcpt *r = &m->rcpt[i];
		json_t			   *group;

		if (r->fate == MILTER_RCPT_ACCEPTED
			|| (keep_tempfailed && r->fate == MILTER_RCPT_TEMPFAILED))
		{
			keep[nkeep++] = (int) i + 1;
			continue;
		}
		if (r->fate == MILTER_RCPT_TEMPFAILED)
		{
			group = json_pack("{s:[i],s:s,s:f,s:{s:{s:s,s:s,s:s,s:i}}}", "rcpt_indices", (int) i + 1,
							  "status", "retry", "retry_seconds", milter_backoff(o, attempts),
							  "state", "milter", "verdict", "tempfail", "reply", r->reply,
							  "milter", r->filter, "attempts", (int) attempts);
			log_info("%s: row %lld: milter tempfail for <%s> by %s: %s", pepsi_queue_id(ctx), pepsi_id(ctx), r->address,
					 r->filter, r->reply);
		}
		else if (bounce_stage && pepsi_mail_from(ctx)[0] != '\0' && o->reject_action == REJECT_BOUNCE)
		{
			group = json_pack("{s:[i],s:s,s:{s:o,s:{s:s,s:s,s:s}}}", "rcpt_indices", (int) i + 1,
							  "stage", bounce_stage, "state",
							  "bounce", milter_bounce_json(r->reply, r->filter, r->address),
							  "milter", "verdict", "reject", "reply", r->reply, "milter", r->filter);
			log_info("%s: row %lld: milter reject for <%s> by %s, bounced: %s", pepsi_queue_id(ctx), pepsi_id(ctx), r->address,
					 r->filter, r->reply);
		}
		else
		{
			/* Nobody to tell: the recipient is dropped, as its 5xx says. */
			log_info("%s: row %lld: milter reject for <%s> by %s, dropped: %s", pepsi_queue_id(ctx), pepsi_id(ctx),
					 r->address, r->filter, r->reply);
			continue;
		}
		json_array_append_new(groups, group);
	}
	if (nkeep < m->nrcpt)
	{
		if (json_array_size(groups) > 0)
			rc = pepsi_fan_out(ctx, keep, nkeep, groups) < 0 ? -1 : 0;
		else
		{
			/* only drops: the row keeps the rest */
			const char **list = xcalloc(nkeep + 1, sizeof(char *));

			for (size_t k = 0; k < nkeep; k++)
				list[k] = m->rcpt[keep[k] - 1].address;
			pepsi_set_rcpt_to(ctx, list, nkeep);
			free(list);
		}
	}
	json_decref(groups);
	free(keep);
	return rc;
}

/* The recipients after the filters' ADDRCPT and DELRCPT, with state.dsn.rcpt in lockstep. */
static void
milter_commit_recipients(struct pepsi_ctx *ctx, struct milter_message *m, json_t *merge)
{
	json_t *dsn = json_object_get(pepsi_state(ctx), "dsn");
	json_t *dsn_rcpt = json_object_get(dsn, "rcpt");
	bool	lockstep = json_is_array(dsn_rcpt) && json_array_size(dsn_rcpt) == pepsi_rcpt_count(ctx);
	/* copies: pepsi_set_rcpt_to frees the row's strings before it takes these */
	char  **list = xcalloc(pepsi_rcpt_count(ctx) + m->nadded + 1, sizeof(char *));
	json_t *new_dsn_rcpt = json_array();
	size_t	n = 0;

	if (m->ndeleted == 0 && m->nadded == 0)
	{
		free(list);
		json_decref(new_dsn_rcpt);
		return;
	}
	for (size_t i = 0; i < pepsi_rcpt_count(ctx); i++)
	{
		bool deleted = false;

		for (size_t d = 0; d < m->ndeleted; d++)
			deleted |= strcasecmp(pepsi_rcpt(ctx, i), m->deleted[d]) == 0;
		if (deleted)
			continue;
		list[n++] = xstrdup(pepsi_rcpt(ctx, i));
		json_array_append(new_dsn_rcpt, lockstep ? json_array_get(dsn_rcpt, i) : json_object());
	}
	for (size_t a = 0; a < m->nadded; a++)
	{
		bool dup = false;

		for (size_t i = 0; i < n; i++)
			dup |= strcasecmp(list[i], m->added[a]) == 0;
		if (dup)
			continue;
		list[n++] = xstrdup(m->added[a]);
		json_array_append_new(new_dsn_rcpt, json_pack("{s:n,s:n}", "notify", "orcpt"));
	}
	pepsi_set_rcpt_to(ctx, (const char *const *) list, n);
	for (size_t i = 0; i < n; i++)
		free(list[i]);
	if (lockstep)
	{
		json_t *new_dsn = json_deep_copy(dsn);

		json_object_set(new_dsn, "rcpt", new_dsn_rcpt);
		json_object_set_new(merge, "dsn", new_dsn);
	}
	json_decref(new_dsn_rcpt);
	free(list);
}

static int
milter_accepted(struct pepsi_ctx *ctx, const struct milter_options *o, struct milter_message *m,
				struct milter_outcome *out)
{
	size_t	accepted = 0;
	size_t	tempfailed = 0;
	json_t *merge;
	int		rc;

	for (size_t i = 0; i < m->nrcpt; i++)
	{
		accepted += m->rcpt[i].fate == MILTER_RCPT_ACCEPTED;
		tempfailed += m->rcpt[i].fate == MILTER_RCPT_TEMPFAILED;
	}
	if (accepted == 0 && tempfailed == 0)
	{
		/* every recipient refused for good: the message is rejected */
		out->reply = xstrdup(m->rcpt[0].reply ? m->rcpt[0].reply : "550 5.7.1 Command rejected");
		out->filter = m->rcpt[0].filter ? m->rcpt[0].filter : "?";
		return milter_rejected(ctx, o, out);
	}
	if (milter_split_refused(ctx, o, m, accepted == 0) < 0)
		return -1;
	if (accepted == 0)
	{
		for (size_t i = 0; i < m->nrcpt && out->reply == NULL; i++)
			if (m->rcpt[i].fate == MILTER_RCPT_TEMPFAILED)
			{
				out->reply = xstrdup(m->rcpt[i].reply);
				out->filter = m->rcpt[i].filter;
			}
		return milter_tempfailed(ctx, o, out, "tempfail");
	}
	merge = milter_state(out, m->quarantine ? "quarantine" : "accept", 0);
	if (m->headers_changed)
	{
		struct buf headers = BUF_INIT;

		milter_message_headers(m, &headers);
		pepsi_set_headers(ctx, headers.data ? headers.data : "", headers.len);
		buf_free(&headers);
	}
	if (m->body_changed)
		pepsi_set_body(ctx, m->body.data ? m->body.data : "", m->body.len);
	if (m->mail_from_changed)
		pepsi_set_mail_from(ctx, m->mail_from);
	milter_commit_recipients(ctx, m, merge);
	if (pepsi_rcpt_count(ctx) == 0)
	{
		json_decref(merge);
		log_info("%s: row %lld: milter: the filters deleted every recipient", pepsi_queue_id(ctx), pepsi_id(ctx));
		return pepsi_finish(ctx);
	}
	if (m->quarantine)
	{
		/* Postfix's hold queue: kept with the filters' edits until the operator releases it. */
		json_object_set_new(json_object_get(merge, "milter"), "quarantine", json_string(m->quarantine));
		log_info("%s: row %lld: milter verdict quarantine (held for the operator): %s", pepsi_queue_id(ctx), pepsi_id(ctx),
				 m->quarantine);
		rc = pepsi_hold(ctx, merge);
		json_decref(merge);
		return rc;
	}
	pepsi_merge_state(ctx, merge);
	json_decref(merge);
	log_info("%s: row %lld: milter verdict accept%s%s%s%s", pepsi_queue_id(ctx), pepsi_id(ctx),
			 m->headers_changed ? " (headers edited)" : "", m->body_changed ? " (body replaced)" : "",
			 m->mail_from_changed ? " (sender changed)" : "",
			 m->nadded || m->ndeleted ? " (recipients changed)" : "");
	return pepsi_advance(ctx);
}

/* The verdict as a pepsi.mail_log event ([pepsi] MAIL_LOG), committed with the outcome. */
static void
milter_mail_log(struct pepsi_ctx *ctx, const struct milter_outcome *out, const char *verdict)
{
	json_t *detail = json_pack("{s:s, s:s?, s:O}", "verdict", verdict, "reply", out->reply,
							   "filters", out->filters);

	pepsi_mail_log(ctx, "milter", detail);
	json_decref(detail);
}

/* Open the filters of MILTERS, or keep those already open when it has not changed. */
static bool
milter_ensure_filters(const struct milter_options *o, char *err, size_t errlen)
{
	if (milter_filters_key && strcmp(milter_filters_key, o->milters) == 0)
		return true;
	milter_close_filters();
	if (!milter_parse_list(o->milters, &milter_filters, &milter_entries, &milter_nfilters, err, errlen))
	{
		milter_close_filters();
		return false;
	}
	milter_filters_key = xstrdup(o->milters);
	return true;
}

static int
milter_run(struct pepsi_ctx *ctx)
{
	struct milter_options	   o;
	struct milter_message	   m;
	struct milter_outcome	   out = {0};
	struct milter_macro_source source;
	char					   err[512];
	char					   queue_id[32];
	char					  *section = xasprintf("stage-%s", pepsi_stage_name(ctx));
	json_t					  *previous = json_object_get(pepsi_state(ctx), "milter");
	const struct buf		  *headers;
	const struct buf		  *body;
	int						   rc;

	if (!milter_read_options(pepsi_config(ctx), section, &o, err, sizeof(err))
		|| !milter_ensure_filters(&o, err, sizeof(err)))
	{
		free(section);
		return pepsi_error(ctx, "%s", err);
	}
	free(section);
	/* A quarantined row the operator released goes on without being filtered again. */
	if (json_is_string(json_object_get(previous, "quarantine")))
	{
		log_info("%s: row %lld: released from quarantine; not filtered again", pepsi_queue_id(ctx), pepsi_id(ctx));
		return pepsi_advance(ctx);
	}
	headers = pepsi_headers(ctx);
	body = pepsi_body(ctx);
	if (headers == NULL || body == NULL)
		return -1;
	{
		const char **rcpt = xcalloc(pepsi_rcpt_count(ctx) + 1, sizeof(char *));

		for (size_t i = 0; i < pepsi_rcpt_count(ctx); i++)
			rcpt[i] = pepsi_rcpt(ctx, i);
		milter_message_init(&m, headers->data ? headers->data : "", headers->len,
							body->data ? body->data : "", body->len, pepsi_mail_from(ctx), rcpt,
							pepsi_rcpt_count(ctx));
		free(rcpt);
	}
	snprintf(queue_id, sizeof(queue_id), "%lld", pepsi_id(ctx));
	source.hostname = config_hostname(pepsi_config(ctx));
	source.queue_id = queue_id;
	source.origin = json_object_get(pepsi_state(ctx), "origin");
	if (!json_is_object(source.origin))
		source.origin = NULL;

	milter_run_filters(&o, &m, &source, &out);
	milter_mail_log(ctx, &out, out.verdict == MILTER_VERDICT_ACCEPT && m.quarantine ? "quarantine" : milter_verdict_name(out.verdict));
	switch (out.verdict)
	{
		case MILTER_VERDICT_DISCARD:
			{
				json_t *merge = milter_state(&out, "discard", 0);

				log_info("%s: row %lld: milter verdict discard by %s", pepsi_queue_id(ctx), pepsi_id(ctx), out.filter);
				json_decref(merge);
				rc = pepsi_finish(ctx);
			}
			break;
		case MILTER_VERDICT_REJECT:
			rc = milter_rejected(ctx, &o, &out);
			break;
		case MILTER_VERDICT_TEMPFAIL:
			rc = milter_tempfailed(ctx, &o, &out, "tempfail");
			break;
		case MILTER_VERDICT_UNAVAILABLE:
			rc = milter_tempfailed(ctx, &o, &out, "unavailable");
			break;
		default:
			rc = milter_accepted(ctx, &o, &m, &out);
	}
	milter_message_free(&m);
	free(out.reply);
	json_decref(out.filters);
	return rc;
}

/*
 * Fused into another stage's pass, a stage may not split its row; a
 * filter may refuse some recipients of a row that has several, which
 * splits it.  A row with one recipient never splits here.
 */
static bool
milter_can_fuse(struct pepsi_ctx *ctx)
{
	return pepsi_rcpt_count(ctx) <= 1;
}

const struct pepsi_stage pepsi_stage_milter_stage = {
	.program = "pepsi-stage-milter",
	.load = PEPSI_LOAD_FULL,
	.run = milter_run,
	.can_fuse = milter_can_fuse,
	.check_config = milter_check_config,
};

int
pepsi_stage_milter_main(int argc, char **argv)
{
	int rc = pepsi_worker_main(&pepsi_stage_milter_stage, argc, argv);

	milter_close_filters();
	return rc;
}
