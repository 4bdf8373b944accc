/*
 * pepsi-stage-auto-pay: pays, within their owner's limits, the payment
 * requests that come back for mail our users sent
 * (docs/pepsi-stage-auto-pay.8.md; spec 22.2, 22.5).
 *
 * Two things, on every row that passes:
 *
 *  - Mail one of our users sends (origin authenticated, trusted-network
 *    or local: never a stranger's, who could otherwise plant a Message-Id
 *    to be paid for) has its Message-Id recorded with its recipients'
 *    domains (pepsi.outbound_message, pruned by the schedule's
 *    outbound_message_prune).
 *
 *  - A payment request (a Payment-Request: field with the URI, as GNU
 *    Taler's taler://pay/..., and Payment-Amount: CURRENCY:VALUE; the
 *    secretary of another Pepsi sends them) to one of our users is paid
 *    only when it answers (In-Reply-To, References) a Message-Id that
 *    user sent to its From: domain (or a subdomain of it), which signed
 *    it (a passing DKIM signature of that domain or a parent, as ingress
 *    recorded in state.auth: a forged request pays nothing), and fits the
 *    owner's
 *    limits (AUTO_PAY_PER_MESSAGE, AUTO_PAY_PER_DAY, AUTO_PAY_PER_DOMAIN:
 *    pepsi.settings over the configuration; nothing is paid without the
 *    first two), which pepsi.auto_pay_reserve checks and records as a
 *    pending payment in one transaction.  The set-user-id root
 *    pepsi-helper-auto-pay then runs the user's wallet as the user (this
 *    program is set-group-id to the one group that may run it), killed
 *    after WALLET_TIME_LIMIT; its proof of payment goes back to the
 *    requester as an RFC 3834 reply (Payment-Proof: URI PROOF), injected
 *    at REPLY_STAGE.  Paid, refused or failed, the row in pepsi.payment
 *    and a log line say so, and the request itself goes on to NEXT_STAGE
 *    (the user's mailbox): a wallet that fails or hangs leaves it unpaid,
 *    never lost.  A stage crash between the wallet and the record leaves
 *    the payment pending, which counts against the limits and is never
 *    paid again.
 */
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
#include "process/helper_call.h"
#include "runtime/stage.h"

int pepsi_stage_auto_pay_main(int argc, char **argv);

#define AUTO_PAY_HELPER_NAME "pepsi-helper-auto-pay"
/* The helper answers one line. */
#define AUTO_PAY_MAX_ANSWER 4096
/* The most Message-Ids of In-Reply-To and References looked up. */
#define AUTO_PAY_MAX_IDS 20

/* Is the row our user's own mail (not a stranger's, not one Pepsi generated)? */
static bool
auto_pay_outbound(struct pepsi_ctx *ctx)
{
	const char *trust = origin_trust(pepsi_state(ctx));

	return trust
		   && (strcmp(trust, ORIGIN_TRUST_AUTHENTICATED) == 0 || strcmp(trust, ORIGIN_TRUST_TRUSTED_NETWORK) == 0
			   || strcmp(trust, ORIGIN_TRUST_LOCAL) == 0)
		   && pepsi_mail_from(ctx)[0] != '\0';
}

/* Append s (len bytes) to array, the inside of a text[] literal, quoted. */
static void
auto_pay_array_add(struct buf *array, const char *s, size_t len)
{
	buf_printf(array, "%s\"", array->len > 1 ? "," : "");
	for (size_t i = 0; i < len; i++)
	{
		if (s[i] == '"' || s[i] == '\\')
			buf_append_char(array, '\\');
		buf_append_char(array, s[i]);
	}
	buf_append_char(array, '"');
}

/* The Message-Ids (without <>) of the fields names, as a text[] literal; count in *n. */
static char *
auto_pay_ids(const struct buf *headers, const char *const *names, size_t nnames, size_t *n)
{
	struct buf array = BUF_INIT;

	*n = 0;
	buf_append_char(&array, '{');
	for (size_t f = 0; f < nnames; f++)
	{
		char	   *value = header_get(headers->data, headers->len, names[f]);
		const char *p = value;

		while (p && (p = strchr(p, '<')) != NULL && *n < AUTO_PAY_MAX_IDS)
		{
			const char *end = strchr(++p, '>');

			if (end == NULL)
				break;
			if (end > p)
			{
				auto_pay_array_add(&array, p, (size_t) (end - p));
				(*n)++;
			}
			p = end + 1;
		}
		free(value);
	}
	buf_append_char(&array, '}');
	return array.data;
}

/* Record the Message-Id of our user's mail, and its recipients; false (and the message fails) on an error. */
static bool
auto_pay_record(struct pepsi_ctx *ctx, const struct buf *headers)
{
	static const char *const names[] = {"Message-ID"};
	size_t					 n;
	char					*ids = auto_pay_ids(headers, names, 1, &n);
	bool					 ok = true;

	if (n == 1)
	{
		struct buf	rcpts = BUF_INIT;
		const char *values[3] = {ids, pepsi_mail_from(ctx), NULL};
		json_t	   *answer;

		buf_append_char(&rcpts, '{');
		for (size_t i = 0; i < pepsi_rcpt_count(ctx); i++)
			auto_pay_array_add(&rcpts, pepsi_rcpt(ctx, i), strlen(pepsi_rcpt(ctx, i)));
		buf_append_char(&rcpts, '}');
		values[2] = rcpts.data;
		answer = pepsi_call_json(ctx,
								 "SELECT to_jsonb(pepsi.outbound_message_record(($1::text[])[1], $2, $3::text[]))"
								 " FROM (SELECT set_config('synchronous_commit', 'off', true)) AS unflushed",
								 3, values);
		ok = answer != NULL;
		json_decref(answer);
		buf_free(&rcpts);
	}
	free(ids);
	return ok;
}

/* Did a DKIM signature of domain (or a parent of it, not a top-level one) pass, as ingress found? */
static bool
auto_pay_dkim_aligned(struct pepsi_ctx *ctx, const char *domain)
{
	json_t *signature;
	size_t	i;
	size_t	len = strlen(domain);

	json_array_foreach (json_object_get(json_object_get(pepsi_state(ctx), "auth"), "dkim"), i, signature)
	{
		const char *d = json_string_value(json_object_get(signature, "header.d"));
		const char *result = json_string_value(json_object_get(signature, "result"));
		size_t		dlen = d ? strlen(d) : 0;

		if (result == NULL || strcmp(result, "pass") != 0 || dlen == 0 || dlen > len || strchr(d, '.') == NULL)
			continue;
		if (dlen == len ? strcasecmp(domain, d) == 0
						: domain[len - dlen - 1] == '.' && strcasecmp(domain + len - dlen, d) == 0)
			return true;
	}
	return false;
}

/* Send the proof back to peer, in reply to the request; false (and the message fails) on an error. */
static bool
auto_pay_reply(struct pepsi_ctx *ctx, const struct buf *headers, const char *payer, const char *peer,
			   const char *uri, const char *amount, const char *proof, long long payment)
{
	const char		*reply_stage = pepsi_option_text(ctx, "REPLY_STAGE");
	struct buf		 reply_headers = BUF_INIT;
	struct buf		 reply_body = BUF_INIT;
	struct buf		 text = BUF_INIT;
	char			 unique[64];
	char			*token = xasprintf("auto-pay-%lld", payment);
	json_t			*state;
	long long		 id;
	struct autoreply reply = {
		.responder = payer,
		.recipient = peer,
		.subject = "Payment sent",
		.hostname = config_hostname(pepsi_config(ctx)),
		.unique = unique,
	};

	buf_printf(&text,
			   "This is an automatic message.  %s paid %s for the payment request\n"
			   "%s\nIts proof of payment is in this message's Payment-Proof field.\n",
			   payer, amount, uri);
	reply.text = text.data;
	snprintf(unique, sizeof(unique), "%lld.auto-pay", pepsi_id(ctx));
	autoreply_build(&reply, headers->data, headers->len, &reply_headers, &reply_body);
	buf_printf(&reply_headers, "Payment-Proof: %s %s\r\n", uri, proof);
	state = json_pack("{s:o}", "origin", origin_generated("pepsi-stage-auto-pay"));
	id = pepsi_enqueue_new(ctx, reply_stage ? reply_stage : "init", "", &peer, 1, reply_headers.data,
						   reply_headers.len, reply_body.data, reply_body.len, state, token);
	json_decref(state);
	free(token);
	buf_free(&text);
	buf_free(&reply_headers);
	buf_free(&reply_body);
	return id >= 0;
}

/*
 * Run the wallet through the helper for payment id: "paid PROOF" or
 * "failed REASON" in *answer.  The helper is told the payment's id only:
 * it claims the payment from the database itself (pepsi.auto_pay_claim)
 * and pays the address and amount recorded there, once.
 */
static void
auto_pay_wallet(struct pepsi_ctx *ctx, long long payment, struct buf *answer)
{
	char	   *helper = helper_call_path(pepsi_option_text(ctx, "HELPER"), AUTO_PAY_HELPER_NAME);
	const char *config = pepsi_option_text(ctx, "HELPER_CONFIG");
	char		id[32];
	char		seconds[32];
	char		err[512];
	const char *argv[] = {AUTO_PAY_HELPER_NAME, "-c", config ? config : pepsi_config(ctx)->path,
						  "-s", pepsi_section(ctx),
						  "pay", id,
						  seconds, NULL};

	snprintf(id, sizeof(id), "%lld", payment);
	snprintf(seconds, sizeof(seconds), "%.0f", pepsi_option_seconds(ctx, "WALLET_TIME_LIMIT"));
	if (!helper_call(helper, argv, NULL, AUTO_PAY_MAX_ANSWER, answer, err, sizeof(err)))
	{
		buf_reset(answer);
		buf_printf(answer, "failed %s", err);
	}
	else if (strncmp(answer->data, "paid ", 5) != 0 && strncmp(answer->data, "failed ", 7) != 0)
	{
		buf_reset(answer);
		buf_printf(answer, "failed %s answered nothing it may", helper);
	}
	answer->len = strcspn(answer->data, "\n");
	answer->data[answer->len] = '\0';
	free(helper);
}

/* Tell the database what the wallet did with payment id; false (and the message fails) on an error. */
static bool
auto_pay_finish(struct pepsi_ctx *ctx, long long payment, const char *outcome, const char *reason)
{
	char		id[32];
	const char *values[3] = {id, outcome, reason};
	json_t	   *answer;

	snprintf(id, sizeof(id), "%lld", payment);
	answer = pepsi_call_json(ctx, "SELECT to_jsonb(pepsi.auto_pay_finish($1::bigint, $2, $3))", 3, values);
	json_decref(answer);
	return answer != NULL;
}

/*
 * The request (uri) to the row's one recipient, our user: checked,
 * reserved against the limits, paid through the helper, answered.  The
 * request goes on to NEXT_STAGE whatever became of it.
 */
static int
auto_pay_request(struct pepsi_ctx *ctx, const struct buf *headers, const char *uri)
{
	static const char *const   fields[] = {"In-Reply-To", "References"};
	const char				  *payer = pepsi_rcpt(ctx, 0);
	const struct pepsi_config *cfg = pepsi_config(ctx);
	char					  *peer = header_from_address(headers->data, headers->len);
	char					  *amount = header_get(headers->data, headers->len, "Payment-Amount");
	const char				  *at = peer ? strrchr(peer, '@') : NULL;
	size_t					   nids;
	char					  *ids = auto_pay_ids(headers, fields, 2, &nids);
	json_t					  *settings = pepsi_address_settings(ctx, payer);
	json_t					  *answer = NULL;
	struct buf				   paid = BUF_INIT;
	int						   rc = -1;

	if (settings == NULL)
		goto done;
	if (at == NULL || amount == NULL || nids == 0)
	{
		log_info("%s: row %lld: <%s>: a payment request without %s: not paid", pepsi_queue_id(ctx), pepsi_id(ctx),
				 payer, at == NULL ? "a From: address" : amount == NULL ? "Payment-Amount"
																		: "In-Reply-To");
		rc = pepsi_advance(ctx);
		goto done;
	}
	{
		const char *values[9] = {
			payer,
			peer,
			ids,
			uri,
			amount,
			settings_text_for(cfg, pepsi_section(ctx), settings, "AUTO_PAY_PER_MESSAGE", payer),
			settings_text_for(cfg, pepsi_section(ctx), settings, "AUTO_PAY_PER_DAY", payer),
			settings_text_for(cfg, pepsi_section(ctx), settings, "AUTO_PAY_PER_DOMAIN", payer),
			auto_pay_dkim_aligned(ctx, at + 1) ? NULL : "no passing DKIM signature of the requester's domain",
		};

		answer = pepsi_call_json(ctx,
								 "SELECT pepsi.auto_pay_reserve($1, $2, $3::text[], $4, $5, $6, $7, $8, $9)", 9,
								 values);
	}
	if (answer == NULL)
		goto done;
	if (!json_is_true(json_object_get(answer, "pay")))
	{
		log_info("%s: row %lld: <%s>: payment request from <%s> for %s not paid: %s", pepsi_queue_id(ctx),
				 pepsi_id(ctx), payer, peer, amount, json_string_value(json_object_get(answer, "why")));
		rc = pepsi_advance(ctx);
		goto done;
	}
	auto_pay_wallet(ctx, json_integer_value(json_object_get(answer, "id")), &paid);
	if (strncmp(paid.data, "paid ", 5) == 0)
	{
		long long payment = json_integer_value(json_object_get(answer, "id"));

		if (!auto_pay_finish(ctx, payment, "paid", NULL)
			|| !auto_pay_reply(ctx, headers, payer, peer, uri, amount, paid.data + 5, payment))
			goto done;
		log_info("%s: row %lld: <%s>: paid %s to <%s> for %s (payment %lld); proof sent", pepsi_queue_id(ctx),
				 pepsi_id(ctx), payer, amount, peer, uri, payment);
	}
	else
	{
		if (!auto_pay_finish(ctx, json_integer_value(json_object_get(answer, "id")), "failed", paid.data + 7))
			goto done;
		log_warnx("%s: row %lld: <%s>: payment request from <%s> for %s not paid: the wallet: %s",
				  pepsi_queue_id(ctx), pepsi_id(ctx), payer, peer, amount, paid.data + 7);
	}
	rc = pepsi_advance(ctx);
done:
	json_decref(answer);
	json_decref(settings);
	buf_free(&paid);
	free(ids);
	free(peer);
	free(amount);
	return rc;
}

static int
auto_pay_run(struct pepsi_ctx *ctx)
{
	const struct buf *headers = pepsi_headers(ctx);
	char			 *uri;
	int				  rc;

	if (headers == NULL)
		return -1;
	uri = header_get(headers->data, headers->len, "Payment-Request");
	if (uri == NULL)
	{
		if (auto_pay_outbound(ctx) && !auto_pay_record(ctx, headers))
			return -1;
		return pepsi_advance(ctx);
	}
	/* A request is paid for one of our users at a time. */
	if (pepsi_rcpt_count(ctx) > 1 && pepsi_split_to_one_per_row(ctx) < 0)
		rc = -1;
	else if (pepsi_rcpt_count(ctx) == 0)
		rc = pepsi_advance(ctx);
	else
		rc = auto_pay_request(ctx, headers, uri);
	free(uri);
	return rc;
}

/*
 * Never fused into another stage's worker: a payment request needs the
 * program's set-group-id bit (the helper's group), which only its own
 * workers have, and what is not one needs its headers read anyway.
 */
static bool
auto_pay_can_fuse(struct pepsi_ctx *ctx)
{
	return false;
}

static bool
auto_pay_check_config(const struct pepsi_config *cfg, const char *section, char *err, size_t errlen)
{
	if (config_get(cfg, section, "NEXT_STAGE") == NULL)
	{
		snprintf(err, errlen, "%s: [%s] needs NEXT_STAGE (where mail goes on, paid or not)", cfg->path, section);
		return false;
	}
	return true;
}

const struct pepsi_stage pepsi_stage_auto_pay_stage = {
	.program = "pepsi-stage-auto-pay",
	.load = PEPSI_LOAD_HEADERS,
	.run = auto_pay_run,
	.can_fuse = auto_pay_can_fuse,
	.check_config = auto_pay_check_config,
};

int
pepsi_stage_auto_pay_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_auto_pay_stage, argc, argv);
}
