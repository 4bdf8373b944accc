/*
 * payment.c: see payment.h.
 *
 * The order a challenge's payment request names is "pepsi-ID-REFERENCE"
 * (ORDER in what follows): ID the challenge's, REFERENCE its order
 * reference, 32 lower-case hexadecimal digits (128 bits the database drew
 * from its strong random source when it opened the challenge), at the
 * payment service PAYMENT_MERCHANT (a GNU Taler merchant backend:
 * taler://pay/MERCHANT/ORDER/; another scheme's
 * SCHEME://MERCHANT/ORDER?amount=PRICE).  The payer's reply carries the
 * service's proof of payment back, which is checked one of two ways.
 * Why a reference and not the id alone: ids are sequential, so anyone
 * could name an open challenge's order and have its proof judged (the
 * verifier run, see below); a reference is learnt only from the payment
 * request, which goes to the challenged sender.  The id stays in the order
 * so that a log line, and the service's records, say which challenge.
 * A challenge opened before 0.13 has no reference: its order was
 * "pepsi-ID", still accepted for it, and for no other challenge
 * (pepsi--0.12--0.13.sql says why).
 *
 * A shared secret (PAYMENT_SECRET): the proof is the service's
 * HMAC-SHA256 of the order under the secret the service and this stage
 * share, in lower-case hexadecimal, which the service hands to the
 * payer's wallet once the order is paid in full (its fulfillment step).
 * Why a shared secret where the service can be taught one: the stage
 * checks the proof by itself, in microseconds and in constant time, with
 * no process to run, no network call from a stage, and nothing to wait
 * for when the service is down.
 *
 * A verifier (PAYMENT_VERIFY_COMMAND), for a service that issues proofs
 * of its own and cannot be taught the HMAC (a Taler merchant backend is
 * asked whether the order is paid; a processor signs receipts): the
 * operator's program asks the service, or checks its signature, and its
 * exit status is the verdict.  The price of asking is a process per proof
 * and a worker waiting on it, so it runs bounded: as the stage's own user
 * (no privilege to give), without a shell, in a clean environment, with
 * ORDER SCHEME PRICE MERCHANT as its arguments (and PEPSI_PAYMENT_* in
 * its environment) and the proof on its standard input, never on its
 * command line, which other users see; killed with what it started at
 * PAYMENT_VERIFY_TIME_LIMIT, its output read up to a cap
 * (common/process/child_run.c).  Exit 0 is paid and 1 not paid; anything
 * else (another status, a signal, the time limit, a status lost) is "it
 * could not say": the proof counts for nothing, a log line names why, the
 * held mail stays held and its challenge open, so a later proof still
 * counts, and nothing is sent that says paid or not paid.  When the
 * command is set it judges alone and PAYMENT_SECRET is not consulted:
 * with two judges either of which releases, a secret the service no
 * longer stands behind (leaked, or kept after the move to the service's
 * own proofs) would go on releasing mail the service says is unpaid.
 *
 * Either way only the service can make a proof, and a proof names its one
 * challenge, so it cannot be replayed for another, and a second use finds
 * the challenge released (pepsi.secretary_paid): a proof is good once.
 * And either way a proof is judged only when its order names an open
 * challenge of this recipient (sent, not released, in time) and that
 * challenge's reference (pepsi.secretary_challenge_open, asked first,
 * which compares the references as hashes: its time says nothing of the
 * reference); any other is not paid, logged as such, and the verifier is
 * not run: anyone can send a well-formed proof naming any order, and a
 * process a message (perhaps a call to the payment service) is not theirs
 * to cost.  The reply's sender
 * is not compared with the challenge's: a wallet may answer from an
 * address of its own (pepsi-stage-auto-pay(8) does).
 */
#include "payment.h"

#include <ctype.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "config/settings.h"
#include "message/header.h"
#include "process/child_run.h"
#include "process/privilege.h"

/* An order reference: 32 lower-case hexadecimal digits (pepsi.secretary_challenge.order_ref). */
#define PAYMENT_REFERENCE_LEN 32
/* The longest proof a reply may carry (as long as pepsi-helper-auto-pay's wallet may print). */
#define PAYMENT_PROOF_MAX 512
/* The most of a verifier's output read (the rest is dropped); what a log line quotes of it. */
#define PAYMENT_VERIFY_MAX_OUTPUT 4096
#define PAYMENT_VERIFY_QUOTED 200

/* What a proof is found to be. */
enum payment_verdict
{
	PAYMENT_PAID,
	PAYMENT_NOT_PAID,
	PAYMENT_UNVERIFIED, /* the verifier could not say: counts for nothing, the challenge stays open */
};

/* What owner charges, and in which scheme, or false when owner offers no payment. */
static bool
payment_terms(struct pepsi_ctx *ctx, const char *owner, char **scheme, char **price)
{
	json_t	   *settings = pepsi_address_settings(ctx, owner);
	const char *s;
	const char *p;

	*scheme = *price = NULL;
	if (settings == NULL)
		return false;
	s = settings_text_for(pepsi_config(ctx), pepsi_section(ctx), settings, "SECRETARY_PAYMENT", owner);
	p = settings_text_for(pepsi_config(ctx), pepsi_section(ctx), settings, "SECRETARY_PRICE", owner);
	if (s && strcmp(s, "off") != 0)
	{
		if (p == NULL || pepsi_option_text(ctx, "PAYMENT_MERCHANT") == NULL
			|| (pepsi_option_text(ctx, "PAYMENT_SECRET") == NULL
				&& pepsi_option_text(ctx, "PAYMENT_VERIFY_COMMAND") == NULL))
			log_warnx("%s: row %lld: <%s>: SECRETARY_PAYMENT = %s, but %s is not set: no payment offered",
					  pepsi_queue_id(ctx), pepsi_id(ctx), owner, s,
					  p == NULL											   ? "SECRETARY_PRICE"
					  : pepsi_option_text(ctx, "PAYMENT_MERCHANT") == NULL ? "PAYMENT_MERCHANT"
																		   : "PAYMENT_SECRET (secrets.d) or PAYMENT_VERIFY_COMMAND");
		else
		{
			*scheme = xstrdup(s);
			*price = xstrdup(p);
		}
	}
	json_decref(settings);
	return *scheme != NULL;
}

/* Is s an order reference: exactly 32 lower-case hexadecimal digits? */
static bool
payment_reference_ok(const char *s)
{
	size_t n = 0;

	for (; s[n] && n <= PAYMENT_REFERENCE_LEN; n++)
		if (!isdigit((unsigned char) s[n]) && (s[n] < 'a' || s[n] > 'f'))
			return false;
	return n == PAYMENT_REFERENCE_LEN;
}

/* The order of challenge: "pepsi-ID-REFERENCE", or "pepsi-ID" for one opened before 0.13 (reference NULL). */
static void
payment_order_name(long long challenge, const char *reference, char *order, size_t len)
{
	if (reference != NULL)
		snprintf(order, len, "pepsi-%lld-%s", challenge, reference);
	else
		snprintf(order, len, "pepsi-%lld", challenge);
}

void
secretary_payment_offer(struct pepsi_ctx *ctx, const char *owner, long long challenge, const char *reference,
						struct buf *fields, struct buf *text)
{
	const char *merchant = pepsi_option_text(ctx, "PAYMENT_MERCHANT");
	char	   *scheme;
	char	   *price;
	char	   *uri;
	char		order[64];

	if (!payment_terms(ctx, owner, &scheme, &price))
		return;
	if (reference == NULL || !payment_reference_ok(reference))
	{
		/* pepsi.secretary_decide gives every challenge it sends one; an order without it is not made. */
		log_warnx("%s: row %lld: <%s>: challenge %lld has no order reference: no payment offered", pepsi_queue_id(ctx),
				  pepsi_id(ctx), owner, challenge);
		free(scheme);
		free(price);
		return;
	}
	payment_order_name(challenge, reference, order, sizeof(order));
	if (strcmp(scheme, "taler") == 0)
		uri = xasprintf("taler://pay/%s/%s/", merchant, order);
	else
		uri = xasprintf("%s://%s/%s?amount=%s", scheme, merchant, order, price);
	buf_printf(fields, "Payment-Request: %s\r\nPayment-Amount: %s\r\n", uri, price);
	buf_printf(text, "\nOr pay %s instead of confirming (your wallet may do it for you):\n\n  %s\n", price, uri);
	free(uri);
	free(scheme);
	free(price);
}

/* The proof of order under secret: HMAC-SHA256, lower-case hexadecimal, into hex (65 bytes). */
static void
payment_proof_of(const char *secret, const char *order, char *hex)
{
	unsigned char mac[EVP_MAX_MD_SIZE];
	unsigned int  maclen = 0;

	HMAC(EVP_sha256(), secret, (int) strlen(secret), (const unsigned char *) order, strlen(order), mac, &maclen);
	for (unsigned int i = 0; i < maclen && i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", mac[i]);
}

/* Is proof PAYMENT_SECRET's HMAC of order? */
static enum payment_verdict
payment_verdict_of_secret(struct pepsi_ctx *ctx, const char *order, const char *proof)
{
	char want[65] = "";

	payment_proof_of(pepsi_option_text(ctx, "PAYMENT_SECRET"), order, want);
	return strlen(proof) == 64 && CRYPTO_memcmp(want, proof, 64) == 0 ? PAYMENT_PAID : PAYMENT_NOT_PAID;
}

/* Is s printable ASCII without a space (what a proof or one of the verifier's arguments may be)? */
static bool
payment_printable(const char *s)
{
	for (; *s; s++)
		if ((unsigned char) *s <= 0x20 || (unsigned char) *s >= 0x7f)
			return false;
	return true;
}

/* May s be one of the verifier's arguments: printable, and not empty or an option ("-...")? */
static bool
payment_argument_ok(const char *s)
{
	return s[0] != '\0' && s[0] != '-' && payment_printable(s);
}

/* What the verifier's child runs: the command itself, no shell, nothing of the worker's but the pipes. */
struct payment_verifier
{
	const char *command;
	const char *order;
	const char *scheme;
	const char *price;
	const char *merchant;
	char	  **env;
};

static void
payment_verifier_exec(void *arg)
{
	const struct payment_verifier *v = arg;
	sigset_t					   none;

	/* The worker ignores SIGPIPE; the verifier starts with every signal's default and none blocked. */
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	signal(SIGPIPE, SIG_DFL);
	if (chdir("/") != 0)
		_exit(126);
	/* Its standard input, output and error are child_run's pipes; the database session is not its. */
	close_range(3, ~0U, 0);
	execle(v->command, v->command, v->order, v->scheme, v->price, v->merchant, (char *) NULL, v->env);
	_exit(127);
}

/* The verifier's output as a log line may quote it: its first line, printable, trimmed, short. */
static void
payment_verifier_said(const char *output, char *said, size_t len)
{
	size_t kept = 0;

	for (const char *p = output; *p && *p != '\n' && kept + 1 < len && kept < PAYMENT_VERIFY_QUOTED; p++)
		said[kept++] = (unsigned char) *p < 0x20 || *p == 0x7f ? ' ' : *p;
	while (kept > 0 && said[kept - 1] == ' ')
		kept--;
	said[kept] = '\0';
}

/* What the verifier's run says: its exit status, or why it could not say (in why; what it said when it did). */
static enum payment_verdict
payment_verdict_of_run(const struct child_result *r, const char *command, double limit, char *why, size_t whylen)
{
	char said[PAYMENT_VERIFY_QUOTED + 1];

	payment_verifier_said(r->output, said, sizeof(said));
	if (r->end == CHILD_EXITED && (r->code == 0 || r->code == 1))
	{
		snprintf(why, whylen, "%s", said);
		return r->code == 0 ? PAYMENT_PAID : PAYMENT_NOT_PAID;
	}
	if (r->end == CHILD_TIMED_OUT)
		snprintf(why, whylen, "%s ran longer than PAYMENT_VERIFY_TIME_LIMIT (%gs) and was killed", command, limit);
	else if (r->end == CHILD_SIGNALED)
		snprintf(why, whylen, "%s was killed by signal %d", command, r->code);
	else if (r->end == CHILD_LOST)
		snprintf(why, whylen, "%s ended, but its exit status was lost", command);
	else
		snprintf(why, whylen, "%s exited with status %d%s (0: paid, 1: not paid, anything else: it could not say)%s%s",
				 command, r->code, r->code == 127 ? ", as when it cannot be executed" : "", said[0] ? ": " : "",
				 said);
	return PAYMENT_UNVERIFIED;
}

/*
 * PAYMENT_VERIFY_COMMAND's verdict on proof for order (the owner's scheme
 * and price, our merchant); why it could not say, or what it said, in why.
 */
static enum payment_verdict
payment_verdict_of_command(struct pepsi_ctx *ctx, const char *order, const char *scheme, const char *price,
						   const char *proof, char *why, size_t whylen)
{
	const char			   *command = pepsi_option_text(ctx, "PAYMENT_VERIFY_COMMAND");
	const char			   *merchant = pepsi_option_text(ctx, "PAYMENT_MERCHANT");
	double					limit = pepsi_option_seconds(ctx, "PAYMENT_VERIFY_TIME_LIMIT");
	const char *const		pairs[] = {"PATH", "/usr/bin:/bin", "PEPSI_PAYMENT_ORDER", order, "PEPSI_PAYMENT_SCHEME", scheme,
									   "PEPSI_PAYMENT_PRICE", price, "PEPSI_PAYMENT_MERCHANT", merchant, NULL};
	struct payment_verifier v = {command, order, scheme, price, merchant, NULL};
	char				   *input = xasprintf("%s\n", proof);
	struct child_spec		spec = {payment_verifier_exec, &v, (long long) (limit * 1000), PAYMENT_VERIFY_MAX_OUTPUT, input,
									strlen(input)};
	struct child_result		r;
	enum payment_verdict	verdict = PAYMENT_UNVERIFIED;
	char					err[256];

	why[0] = '\0';
	if (!payment_argument_ok(scheme) || !payment_argument_ok(price) || !payment_argument_ok(merchant))
		snprintf(why, whylen, "the scheme, the price or PAYMENT_MERCHANT is empty, starts with '-', or has a space"
							  " or a control character: the verifier was not run");
	else
	{
		v.env = privilege_clean_env(pairs);
		if (!child_run(&spec, &r, err, sizeof(err)))
			snprintf(why, whylen, "%s could not be started: %s", command, err);
		else
		{
			verdict = payment_verdict_of_run(&r, command, limit, why, whylen);
			child_result_free(&r);
		}
		privilege_env_free(v.env);
	}
	explicit_bzero(input, strlen(input));
	free(input);
	return verdict;
}

/* Record the payment of challenge and release what it holds: 1, or -1 on an error (the message fails). */
static int
payment_release(struct pepsi_ctx *ctx, const char *owner, long long challenge, const char *order, const char *uri,
				const char *price)
{
	char		id[32];
	const char *from = pepsi_mail_from(ctx);
	const char *values[5] = {owner, from[0] ? from : owner, id, uri, price};
	json_t	   *released;

	snprintf(id, sizeof(id), "%lld", challenge);
	released = pepsi_call_json(ctx, "SELECT to_jsonb(pepsi.secretary_paid($1, $2, $3::bigint, $4, $5))", 5, values);
	if (released == NULL)
		return -1;
	if (json_is_integer(released))
		log_info("%s: row %lld: <%s>: paid %s (%s): held mail released (%lld), sender whitelisted", pepsi_queue_id(ctx),
				 pepsi_id(ctx), owner, price, order, json_integer_value(released));
	else
		log_info("%s: row %lld: <%s>: a proof of payment for %s, which is no open challenge: done with",
				 pepsi_queue_id(ctx), pepsi_id(ctx), owner, order);
	json_decref(released);
	return 1;
}

/*
 * Is challenge, named with reference (NULL: none, an order of before
 * 0.13), an open challenge of owner's (sent, not released, in time) and
 * reference its order reference (pepsi.secretary_challenge_open)?  1 yes,
 * 0 no, -1 on an error (the message fails).  Asked before a proof is
 * judged: anyone may send a well-formed proof naming any order, and
 * PAYMENT_VERIFY_COMMAND is a process (perhaps a call to the payment
 * service) that only a proof that could release something may cost.
 */
static int
payment_challenge_open(struct pepsi_ctx *ctx, const char *owner, long long challenge, const char *reference)
{
	char		id[32];
	const char *values[3] = {owner, id, reference};
	char		err[256] = "";
	json_t	   *open;
	int			rc;

	snprintf(id, sizeof(id), "%lld", challenge);
	open = pepsi_read_json(ctx, "SELECT to_jsonb(pepsi.secretary_challenge_open($1, $2::bigint, $3))", 3, values, err,
						   sizeof(err));
	if (open == NULL)
		return pepsi_error(ctx, "pepsi.secretary_challenge_open: %s", err);
	rc = json_is_true(open) ? 1 : 0;
	json_decref(open);
	return rc;
}

/*
 * The value of Payment-Proof: as "URI PROOF", the challenge the URI's
 * order names and its reference (into reference, 33 bytes; "" when the
 * order is "pepsi-ID", of before 0.13): false when it is not that (the
 * order not "/pepsi-ID-REFERENCE" or "/pepsi-ID" up to a '/', '?', '#' or
 * the URI's end, or PROOF longer than a proof may be, or not printable).
 */
static bool
payment_proof_parse(const char *value, char *uri, char *proof, long long *challenge, char *reference)
{
	const char *at;
	char	   *digits_end;
	size_t		n;
	int			end = 0;

	/* PROOF ends where the value does (a longer one is not cut to fit). */
	if (sscanf(value, " %1023s %512s%n", uri, proof, &end) != 2
		|| (value[end] != '\0' && !isspace((unsigned char) value[end])))
		return false;
	if ((at = strstr(uri, "/pepsi-")) == NULL || !isdigit((unsigned char) at[7]))
		return false;
	*challenge = strtoll(at + 7, &digits_end, 10);
	if (*challenge <= 0 || *challenge == LLONG_MAX)
		return false;
	reference[0] = '\0';
	if (*digits_end == '-')
	{
		n = strcspn(digits_end + 1, "/?#");
		if (n != PAYMENT_REFERENCE_LEN)
			return false;
		memcpy(reference, digits_end + 1, n);
		reference[n] = '\0';
		if (!payment_reference_ok(reference))
			return false;
		digits_end += 1 + n;
	}
	if (*digits_end != '\0' && strchr("/?#", *digits_end) == NULL)
		return false;
	return payment_printable(proof);
}

/*
 * Judge proof for order, of owner's open challenge (named with its
 * reference): by PAYMENT_VERIFY_COMMAND when set, else by PAYMENT_SECRET;
 * paid releases it.  What secretary_payment_proof returns.
 */
static int
payment_judge(struct pepsi_ctx *ctx, const char *owner, long long challenge, const char *order, const char *uri,
			  const char *scheme, const char *price, const char *proof)
{
	static bool			 warned_both;
	bool				 by_command = pepsi_option_text(ctx, "PAYMENT_VERIFY_COMMAND") != NULL;
	char				 why[1024] = "";
	enum payment_verdict verdict;

	if (by_command && pepsi_option_text(ctx, "PAYMENT_SECRET") != NULL && !warned_both)
	{
		log_warnx("PAYMENT_VERIFY_COMMAND and PAYMENT_SECRET are both set: the command judges proofs of payment,"
				  " the secret is not used");
		warned_both = true;
	}
	verdict = by_command ? payment_verdict_of_command(ctx, order, scheme, price, proof, why, sizeof(why))
						 : payment_verdict_of_secret(ctx, order, proof);
	if (verdict == PAYMENT_PAID)
		return payment_release(ctx, owner, challenge, order, uri, price);
	if (verdict == PAYMENT_NOT_PAID)
		log_warnx("%s: row %lld: <%s>: a proof of payment for %s from <%s> that %s: ignored%s%s%s", pepsi_queue_id(ctx),
				  pepsi_id(ctx), owner, order, pepsi_mail_from(ctx),
				  by_command ? "PAYMENT_VERIFY_COMMAND says is not paid" : "is not the payment service's",
				  why[0] ? " (" : "", why, why[0] ? ")" : "");
	else
		log_warnx("%s: row %lld: <%s>: a proof of payment for %s from <%s> could not be verified: %s;"
				  " it counts for nothing, the held mail stays held and its challenge open",
				  pepsi_queue_id(ctx), pepsi_id(ctx), owner, order, pepsi_mail_from(ctx), why);
	return 0;
}

int
secretary_payment_proof(struct pepsi_ctx *ctx, const struct buf *headers, const char *owner)
{
	char	 *value = header_get(headers->data, headers->len, "Payment-Proof");
	char	 *scheme = NULL;
	char	 *price = NULL;
	char	  order[64];
	char	  reference[PAYMENT_REFERENCE_LEN + 1];
	char	  uri[1024];
	char	  proof[PAYMENT_PROOF_MAX + 1];
	long long challenge;
	int		  rc = 0;

	if (value == NULL)
		return 0;
	if (!payment_terms(ctx, owner, &scheme, &price))
		log_info("%s: row %lld: <%s>: a proof of payment, but no payment is offered: ignored", pepsi_queue_id(ctx),
				 pepsi_id(ctx), owner);
	else if (!payment_proof_parse(value, uri, proof, &challenge, reference))
		log_info("%s: row %lld: <%s>: Payment-Proof is not \"URI PROOF\" naming an order of ours: ignored",
				 pepsi_queue_id(ctx), pepsi_id(ctx), owner);
	else
	{
		const char *named = reference[0] ? reference : NULL;

		payment_order_name(challenge, named, order, sizeof(order));
		if ((rc = payment_challenge_open(ctx, owner, challenge, named)) == 0)
			log_warnx("%s: row %lld: <%s>: a proof of payment for %s from <%s>, which is no open challenge of"
					  " this recipient (none such, released, expired, never sent, or not its order reference):"
					  " not paid, %s",
					  pepsi_queue_id(ctx), pepsi_id(ctx), owner, order, pepsi_mail_from(ctx),
					  pepsi_option_text(ctx, "PAYMENT_VERIFY_COMMAND") != NULL ? "PAYMENT_VERIFY_COMMAND not run"
																			   : "not checked");
		else if (rc > 0)
			rc = payment_judge(ctx, owner, challenge, order, uri, scheme, price, proof);
	}
	free(value);
	free(scheme);
	free(price);
	return rc;
}
