/*
 * pepsi-stage-check-whitelist: the confirm-to-send secretary
 * (docs/pepsi-stage-check-whitelist.8.md; spec 22.3).
 *
 * For a recipient whose WHITELIST is on (the owner's pepsi.settings, else
 * the section's option for the address), mail from a sender on the
 * owner's whitelist goes on to NEXT_STAGE; mail from anyone else is held
 * here, recorded against the one open challenge of that owner and sender
 * (pepsi.secretary_decide), and the sender gets that challenge once: an
 * RFC 3834 auto-reply from the null sender, injected at REPLY_STAGE,
 * carrying a single-use token (and CONFIRM_URL's link to pepsi-httpd's
 * page, when set).  A challenge goes only to a sender whose address is
 * proven (SPF pass for it, or a passing DKIM signature of its domain, as
 * ingress recorded in state.auth) and only for a message an auto-reply
 * may answer (common/message/autoreply.c: never the null sender, a list,
 * bulk or automatic mail); any other is held without one, so the
 * secretary is no backscatter source.  The sender's proven reply carrying
 * the token (in its Subject or text) releases what was held and
 * whitelists the sender; the reply itself is done with.  Released rows
 * come back here and pass.  Held mail nobody released expires after
 * HOLD_TIME (pepsi.secretary_expire).  A row with several recipients is
 * split so that each held row has one owner.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "config/settings.h"
#include "message/autoreply.h"
#include "message/header.h"
#include "message/origin.h"
#include "options.h"
#include "payment.h"
#include "runtime/stage.h"

int pepsi_stage_check_whitelist_main(int argc, char **argv);

/* A token as pepsi.secretary_decide makes it: 64 hexadecimal digits. */
#define SECRETARY_TOKEN_LEN 64

/* The most rows a worker takes at once: their recipients' settings read with one statement. */
#define CHECK_WHITELIST_BATCH_MAX 64

static bool
secretary_on(struct pepsi_ctx *ctx, json_t *settings, const char *address)
{
	const char *own = settings_owner_value(settings, "WHITELIST");
	bool		on;

	if (own != NULL)
	{
		if (option_parse_bool(own, &on))
			return on;
		log_warnx("%s: row %lld: <%s>: the setting WHITELIST = \"%s\" is not yes or no: ignored",
				  pepsi_queue_id(ctx), pepsi_id(ctx), address, own);
	}
	return config_bool_for(pepsi_config(ctx), pepsi_section(ctx), "WHITELIST", NULL, address);
}

/* Is domain d or a parent of it (DMARC's relaxed alignment)? */
static bool
secretary_aligned(const char *domain, const char *d)
{
	size_t len = strlen(domain);
	size_t dlen = strlen(d);

	if (dlen == 0 || dlen > len)
		return false;
	if (dlen == len)
		return strcasecmp(domain, d) == 0;
	return domain[len - dlen - 1] == '.' && strcasecmp(domain + len - dlen, d) == 0;
}

/*
 * How ingress proved the envelope sender's address (state.auth), or NULL:
 * SPF pass for that very address, or a passing DKIM signature of its
 * domain or a parent of it.
 */
static const char *
secretary_verified(struct pepsi_ctx *ctx, const char *sender)
{
	json_t	   *auth = json_object_get(pepsi_state(ctx), "auth");
	json_t	   *spf = json_object_get(auth, "spf");
	const char *at = strrchr(sender, '@');
	const char *result = json_string_value(json_object_get(spf, "result"));
	const char *mailfrom = json_string_value(json_object_get(spf, "smtp.mailfrom"));
	json_t	   *signature;
	size_t		i;

	if (at == NULL)
		return NULL;
	if (result && strcmp(result, "pass") == 0 && mailfrom && strcasecmp(mailfrom, sender) == 0)
		return "SPF pass";
	json_array_foreach (json_object_get(auth, "dkim"), i, signature)
	{
		const char *d = json_string_value(json_object_get(signature, "header.d"));

		result = json_string_value(json_object_get(signature, "result"));
		if (result && strcmp(result, "pass") == 0 && d && secretary_aligned(at + 1, d))
			return "aligned DKIM";
	}
	return NULL;
}

/* The first run of exactly 64 hexadecimal digits in the Subject (a reply keeps the challenge's), or NULL. */
static char *
secretary_subject_token(const struct buf *headers)
{
	char *subject = header_get(headers->data, headers->len, "Subject");
	char *token = NULL;

	for (const char *p = subject; p && *p && token == NULL; p++)
	{
		size_t n = strspn(p, "0123456789abcdef");

		if (n == SECRETARY_TOKEN_LEN && (p == subject || !isalnum((unsigned char) p[-1])))
			token = xstrndup(p, n);
		p += n ? n - 1 : 0;
	}
	free(subject);
	return token;
}

/*
 * Does the message answer a challenge (In-Reply-To or References names
 * one's Message-ID, "<autoreply.ROW.secretary.TIME@host>")?  Only then is
 * its text searched for the token, server-side: the stage loads no body.
 */
static bool
secretary_refers_to_challenge(const struct buf *headers)
{
	static const char *const fields[] = {"In-Reply-To", "References"};
	bool					 refers = false;

	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]) && !refers; i++)
	{
		char *value = header_get(headers->data, headers->len, fields[i]);

		refers = value != NULL && strstr(value, ".secretary.") != NULL;
		free(value);
	}
	return refers;
}

/*
 * Inject the challenge with token to the sender (reference: its order
 * reference, which a payment request names); false (and the message
 * fails) on an error.
 */
static bool
secretary_challenge(struct pepsi_ctx *ctx, const struct buf *headers, const char *owner, const char *token,
					long long challenge, const char *reference)
{
	const char		*sender = pepsi_mail_from(ctx);
	const char		*reply_stage = pepsi_option_text(ctx, "REPLY_STAGE");
	const char		*url = pepsi_option_text(ctx, "CONFIRM_URL");
	struct buf		 reply_headers = BUF_INIT;
	struct buf		 reply_body = BUF_INIT;
	struct buf		 text = BUF_INIT;
	struct buf		 payment = BUF_INIT;
	char			 unique[64];
	char			*subject = xasprintf("Please confirm your message to %s (%s)", owner, token);
	char			*enqueue_token = xasprintf("secretary-challenge-%lld-%s", challenge, token);
	json_t			*state;
	long long		 id;
	struct autoreply reply = {
		.responder = owner,
		.recipient = sender,
		.subject = subject,
		.hostname = config_hostname(pepsi_config(ctx)),
		.unique = unique,
	};

	buf_printf(&text,
			   "This is an automatic message.  %s takes mail only from senders it knows,\n"
			   "and your message waits until you confirm that you sent it.\n\n"
			   "To confirm, reply to this message (keep the subject as it is).\n",
			   owner);
	if (url != NULL)
		buf_printf(&text, "Or open this page and press its button:\n\n  %s%stoken=%s\n", url,
				   strchr(url, '?') ? "&" : "?", token);
	buf_printf(&text,
			   "\nYour message, and any later ones from you, are then delivered.  Unconfirmed,\n"
			   "it is deleted after %.0f days.  If you did not write to %s, ignore this.\n",
			   pepsi_option_seconds(ctx, "HOLD_TIME") / 86400.0, owner);
	secretary_payment_offer(ctx, owner, challenge, reference, &payment, &text);
	reply.text = text.data;
	snprintf(unique, sizeof(unique), "%lld.secretary", pepsi_id(ctx));
	autoreply_build(&reply, headers->data, headers->len, &reply_headers, &reply_body);
	buf_append(&reply_headers, payment.data, payment.len);
	state = json_pack("{s:o}", "origin", origin_generated("pepsi-stage-check-whitelist"));
	id = pepsi_enqueue_new(ctx, reply_stage ? reply_stage : "init", "", &sender, 1, reply_headers.data,
						   reply_headers.len, reply_body.data, reply_body.len, state, enqueue_token);
	json_decref(state);
	if (id >= 0)
		log_info("%s: row %lld: <%s>: challenge to <%s> (row %lld)", pepsi_queue_id(ctx), pepsi_id(ctx), owner,
				 sender, id);
	free(subject);
	free(enqueue_token);
	buf_free(&text);
	buf_free(&payment);
	buf_free(&reply_headers);
	buf_free(&reply_body);
	return id >= 0;
}

/* What secretary_decide is asked about a row: its proof, and the token a reply may carry. */
struct secretary_args
{
	const char *proof; /* how the sender is proven (NULL: not, or a message no auto-reply may answer) */
	char		why[256];
	char	   *token; /* a token in the Subject, or NULL */
	bool		look_in_text;
};

static bool
secretary_args(struct pepsi_ctx *ctx, struct secretary_args *a)
{
	const struct buf *headers = pepsi_headers(ctx);
	const char		 *owner = pepsi_rcpt(ctx, 0);
	const char		 *sender = pepsi_mail_from(ctx);

	memset(a, 0, sizeof(*a));
	if (headers == NULL)
		return false;
	/* Proven, and a message an auto-reply may answer: a challenge may go, and a reply may release. */
	a->proof = secretary_verified(ctx, sender);
	if (a->proof == NULL)
		snprintf(a->why, sizeof(a->why), "the sender's address is not proven (no SPF pass, no aligned DKIM)");
	else if (autoreply_refused(headers->data, headers->len, sender, owner, a->why, sizeof(a->why)))
		a->proof = NULL;
	else
		a->token = secretary_subject_token(headers);
	a->look_in_text = a->proof && a->token == NULL && secretary_refers_to_challenge(headers);
	return true;
}

/*
 * The decisions prepare made for the batch's rows with one call
 * (pepsi.secretary_decide_many), which run takes instead of a call per
 * row: each row's answer, taken once.
 */
static struct secretary_decided
{
	struct pepsi_ctx *ctx;
	long long		  id;
	json_t			 *answer;
} * secretary_batch;
static size_t secretary_batch_len;

static void
secretary_batch_free(void)
{
	for (size_t i = 0; i < secretary_batch_len; i++)
		json_decref(secretary_batch[i].answer);
	free(secretary_batch);
	secretary_batch = NULL;
	secretary_batch_len = 0;
}

/* The answer prepare had for this row (a new reference), or NULL. */
static json_t *
secretary_batch_take(struct pepsi_ctx *ctx)
{
	for (size_t i = 0; i < secretary_batch_len; i++)
		if (secretary_batch[i].ctx == ctx && secretary_batch[i].id == pepsi_id(ctx)
			&& secretary_batch[i].answer != NULL)
		{
			json_t *answer = secretary_batch[i].answer;

			secretary_batch[i].answer = NULL; /* this pass's: not again for a later hop of the row */
			return answer;
		}
	return NULL;
}

/* The row's one decision call, when prepare had none for it. */
static json_t *
secretary_decide_one(struct pepsi_ctx *ctx, const struct secretary_args *a)
{
	char		id[32];
	char		ttl[48];
	char		max[32];
	const char *values[8] = {pepsi_rcpt(ctx, 0), pepsi_mail_from(ctx), id, a->proof ? "true" : "false", a->token,
							 a->look_in_text ? "true" : "false", ttl, max};

	snprintf(id, sizeof(id), "%lld", pepsi_id(ctx));
	snprintf(ttl, sizeof(ttl), "%.0f seconds", pepsi_option_seconds(ctx, "HOLD_TIME"));
	snprintf(max, sizeof(max), "%lld", pepsi_option_int(ctx, "MAX_CHALLENGES_PER_HOUR"));
	/*
	 * Its own transaction, committed without waiting for the WAL flush
	 * (synchronous_commit off for it alone): what it records only matters
	 * once the row's own commit says held, released or passed, and that
	 * commit (or the challenge's workqueue_inject) waits for the flush,
	 * which covers this earlier commit too.  A crash in between leaves the
	 * row running, decided again on its retry.
	 */
	return pepsi_call_json(ctx,
						   "SELECT pepsi.secretary_decide($1, $2, $3::bigint, $4::boolean, $5, $6::boolean,"
						   " $7::interval, $8::integer)"
						   " FROM (SELECT set_config('synchronous_commit', 'off', true)) AS unflushed",
						   8, values);
}

/* The secretary's decision for the row's one recipient, whose WHITELIST is on. */
static int
secretary_decide(struct pepsi_ctx *ctx)
{
	const struct buf	 *headers = pepsi_headers(ctx);
	const char			 *owner = pepsi_rcpt(ctx, 0);
	const char			 *sender = pepsi_mail_from(ctx);
	struct secretary_args a;
	const char			 *action;
	json_t				 *answer;
	int					  rc;

	/*
	 * A proof of payment (SECRETARY_PAYMENT) releases as a confirmation
	 * does.  Such a row is never in prepare's batch call
	 * (secretary_question), so no decision was recorded for it.
	 */
	if (headers != NULL && (rc = secretary_payment_proof(ctx, headers, owner)) != 0)
		return rc < 0 ? -1 : pepsi_finish(ctx);
	if (!secretary_args(ctx, &a))
		return -1;
	if ((answer = secretary_batch_take(ctx)) == NULL)
		answer = secretary_decide_one(ctx, &a);
	free(a.token);
	if (answer == NULL)
		return -1;
	action = json_string_value(json_object_get(answer, "action"));
	if (action && strcmp(action, "pass") == 0)
		rc = pepsi_advance(ctx);
	else if (action && strcmp(action, "released") == 0)
	{
		log_info("%s: row %lld: <%s>: <%s> confirmed (%s): held mail released, sender whitelisted",
				 pepsi_queue_id(ctx), pepsi_id(ctx), owner, sender, a.proof);
		rc = pepsi_finish(ctx);
	}
	else if (action && strcmp(action, "hold") == 0)
	{
		const char *challenge_token = json_string_value(json_object_get(answer, "token"));
		json_t	   *challenge = json_object_get(answer, "challenge");
		bool		held = json_is_true(json_object_get(answer, "held"));
		json_t	   *merge;

		/* Held by prepare's call, its challenge injected in that transaction (secretary_prepare). */
		if (challenge_token != NULL && !held
			&& !secretary_challenge(ctx, headers, owner, challenge_token, json_integer_value(challenge),
									json_string_value(json_object_get(answer, "reference"))))
		{
			json_decref(answer);
			return -1;
		}
		log_info("%s: row %lld: <%s>: held, from <%s>, not on the whitelist: %s%s%s", pepsi_queue_id(ctx),
				 pepsi_id(ctx), owner, sender, json_string_value(json_object_get(answer, "why")),
				 a.why[0] && challenge_token == NULL ? ": " : "", challenge_token == NULL ? a.why : "");
		if (held)
			rc = pepsi_held_by_call(ctx);
		else
		{
			merge = json_pack("{s:{s:s,s:O}}", "secretary", "owner", owner, "challenge", challenge);
			rc = pepsi_hold(ctx, merge);
			json_decref(merge);
		}
	}
	else
		rc = pepsi_error(ctx, "pepsi.secretary_decide answered no action");
	json_decref(answer);
	return rc;
}

/* Is the secretary on for the row's first recipient (false, and the row fails, if its settings cannot be read)? */
static bool
secretary_on_first(struct pepsi_ctx *ctx, bool *on)
{
	json_t *settings = pepsi_address_settings(ctx, pepsi_rcpt(ctx, 0));

	if (settings == NULL)
		return false;
	*on = secretary_on(ctx, settings, pepsi_rcpt(ctx, 0));
	json_decref(settings);
	return true;
}

/* Whether the row carries a Payment-Proof: header (secretary_payment_proof reads it). */
static bool
secretary_has_payment_proof(struct pepsi_ctx *ctx)
{
	const struct buf *headers = pepsi_headers(ctx);
	char			 *value = headers ? header_get(headers->data, headers->len, "Payment-Proof") : NULL;

	free(value);
	return value != NULL;
}

/* A row's question for pepsi.secretary_decide_many, or NULL when run is to ask alone. */
static json_t *
secretary_question(struct pepsi_ctx *ctx, struct pepsi_ctx *first)
{
	struct secretary_args a;
	json_t				 *q;
	json_t				 *hold;
	bool				  on = false;

	if (pepsi_rcpt_count(ctx) == 0 || !secretary_on_first(ctx, &on) || !on)
		return NULL;
	/* A proof of payment is run's alone (secretary_decide): nothing is decided for it here. */
	if (secretary_has_payment_proof(ctx) || !secretary_args(ctx, &a))
		return NULL;
	/* One hold time and rate for the call: the first row's section's. */
	if (pepsi_option_seconds(ctx, "HOLD_TIME") != pepsi_option_seconds(first, "HOLD_TIME")
		|| pepsi_option_int(ctx, "MAX_CHALLENGES_PER_HOUR") != pepsi_option_int(first, "MAX_CHALLENGES_PER_HOUR"))
	{
		free(a.token);
		return NULL;
	}
	/* may_defer: a row whose pair another batch is deciding is left to run (a null answer), not waited for. */
	q = json_pack("{s:s,s:s,s:I,s:b,s:s?,s:b,s:b}", "owner", pepsi_rcpt(ctx, 0), "sender", pepsi_mail_from(ctx),
				  "row_id", (json_int_t) pepsi_id(ctx), "verified", a.proof != NULL, "token", a.token,
				  "look_in_text", a.look_in_text, "may_defer", 1);
	/*
	 * A row of one recipient (run splits no other off it) is held by the
	 * call itself, in the decision's transaction, when that is the answer.
	 */
	if (pepsi_rcpt_count(ctx) == 1 && (hold = pepsi_hold_args(ctx)) != NULL)
		json_object_set_new(q, "hold", hold);
	free(a.token);
	return q;
}

/*
 * The challenges of the rows the batch call held (each answer that says
 * held, with a token), injected in its transaction; false, with why in
 * err and the failing row's error set, if one could not be.
 */
static bool
secretary_batch_challenges(char *err, size_t errlen)
{
	for (size_t i = 0; i < secretary_batch_len; i++)
	{
		struct pepsi_ctx *ctx = secretary_batch[i].ctx;
		json_t			 *answer = secretary_batch[i].answer;
		const char		 *token = json_string_value(json_object_get(answer, "token"));

		if (token == NULL || !json_is_true(json_object_get(answer, "held")))
			continue;
		if (!secretary_challenge(ctx, pepsi_headers(ctx), pepsi_rcpt(ctx, 0), token,
								 json_integer_value(json_object_get(answer, "challenge")),
								 json_string_value(json_object_get(answer, "reference"))))
		{
			snprintf(err, errlen, "row %lld: its challenge could not be queued", pepsi_id(ctx));
			return false;
		}
	}
	return true;
}

/*
 * The batch's decisions with one call and one transaction: the settings
 * of every recipient read with one statement, then
 * pepsi.secretary_decide_many for the rows whose first recipient has the
 * secretary on, which also holds the rows it decides to hold (each
 * one-recipient row's claim passed with it, pepsi_hold_args), and the
 * challenges of those rows injected, all committed together without
 * waiting for the flush (as secretary_decide_one's; a crash that loses
 * the commit loses the decisions, holds and challenges together, and the
 * rows, still running, are decided again).  So a batch is one commit, and
 * no row is recorded as held, or challenged, without being so.  If
 * anything fails, nothing of it stays and each row asks alone in run.
 */
static void
secretary_prepare(struct pepsi_ctx *const *ctxs, size_t count)
{
	json_t *questions = json_array();
	json_t *answers = NULL;
	char   *dump;
	char	ttl[48];
	char	max[32];
	char	err[512] = "";
	bool	ok;

	secretary_batch_free();
	pepsi_prefetch_address_settings(ctxs, count);
	secretary_batch = xcalloc(count ? count : 1, sizeof(*secretary_batch));
	for (size_t i = 0; i < count; i++)
	{
		json_t *q = secretary_question(ctxs[i], ctxs[0]);

		if (q == NULL)
			continue;
		json_array_append_new(questions, q);
		secretary_batch[secretary_batch_len].ctx = ctxs[i];
		secretary_batch[secretary_batch_len++].id = pepsi_id(ctxs[i]);
	}
	if (secretary_batch_len == 0)
	{
		json_decref(questions);
		return;
	}
	dump = json_dumps(questions, JSON_COMPACT);
	json_decref(questions);
	snprintf(ttl, sizeof(ttl), "%.0f seconds", pepsi_option_seconds(ctxs[0], "HOLD_TIME"));
	snprintf(max, sizeof(max), "%lld", pepsi_option_int(ctxs[0], "MAX_CHALLENGES_PER_HOUR"));
	ok = pepsi_batch_begin(ctxs[0], err, sizeof(err));
	if (ok)
	{
		const char *values[3] = {dump, ttl, max};

		answers = pepsi_read_json(ctxs[0],
								  "SELECT pepsi.secretary_decide_many($1::jsonb, $2::interval, $3::integer)"
								  " FROM (SELECT set_config('synchronous_commit', 'off', true)) AS unflushed",
								  3, values, err, sizeof(err));
		if (answers != NULL && json_array_size(answers) != secretary_batch_len)
			snprintf(err, sizeof(err), "not an answer a row");
		ok = answers != NULL && json_array_size(answers) == secretary_batch_len;
	}
	free(dump);
	/* A null answer: the call left the row undecided (its pair was another batch's); run decides it alone. */
	for (size_t i = 0; ok && i < secretary_batch_len; i++)
		if (!json_is_null(json_array_get(answers, i)))
			secretary_batch[i].answer = json_incref(json_array_get(answers, i));
	json_decref(answers);
	ok = ok && secretary_batch_challenges(err, sizeof(err));
	if (ok)
		ok = pepsi_batch_end(ctxs[0], true, err, sizeof(err));
	else
	{
		char ignored[256];

		pepsi_batch_end(ctxs[0], false, ignored, sizeof(ignored));
	}
	if (!ok)
	{
		log_warnx("pepsi.secretary_decide_many: %s (each row is decided alone)", err);
		for (size_t i = 0; i < secretary_batch_len; i++)
			json_decref(secretary_batch[i].answer);
		secretary_batch_len = 0;
	}
}

static int
check_whitelist_run(struct pepsi_ctx *ctx)
{
	size_t count = pepsi_rcpt_count(ctx);
	bool  *on;
	int	  *others;
	size_t nothers = 0;
	int	   rc;

	if (count == 0)
		return pepsi_advance(ctx);
	on = xcalloc(count, sizeof(bool));
	for (size_t i = 0; i < count; i++)
	{
		json_t *settings = pepsi_address_settings(ctx, pepsi_rcpt(ctx, i));

		if (settings == NULL)
		{
			free(on);
			return -1;
		}
		on[i] = secretary_on(ctx, settings, pepsi_rcpt(ctx, i));
		json_decref(settings);
	}
	/*
	 * Mail the secretary does not screen goes on as one row; each
	 * screened recipient gets a row of its own (a sibling at this stage),
	 * so that a held row waits for one owner's sender only.
	 */
	others = xcalloc(count, sizeof(int));
	for (size_t i = 1; i < count; i++)
		if (on[0] || on[i])
			others[nothers++] = (int) i + 1;
	if (nothers > 0 && pepsi_split_off_recipients(ctx, others, nothers, pepsi_stage_name(ctx)) < 0)
		rc = -1;
	else if (!on[0])
		rc = pepsi_advance(ctx);
	else
		rc = secretary_decide(ctx);
	free(others);
	free(on);
	return rc;
}

const struct pepsi_stage pepsi_stage_check_whitelist_stage = {
	.program = "pepsi-stage-check-whitelist",
	.load = PEPSI_LOAD_HEADERS,
	.run = check_whitelist_run,
	.batch_max = CHECK_WHITELIST_BATCH_MAX,
	.prepare = secretary_prepare,
	/* After route, which loads less, the headers are loaded in the same pass: one claim and commit. */
	.late_load = true,
};

int
pepsi_stage_check_whitelist_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_check_whitelist_stage, argc, argv);
}
