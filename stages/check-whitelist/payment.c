/*
 * payment.c: see payment.h.
 *
 * The order a challenge's payment request names is "pepsi-ID" (ID the
 * challenge's), at the payment service PAYMENT_MERCHANT (a GNU Taler
 * merchant backend: taler://pay/MERCHANT/pepsi-ID/).  A proof of payment
 * is the service's HMAC-SHA256 of the order under PAYMENT_SECRET, which
 * the service and this stage share, in lower-case hexadecimal: the
 * service hands it to the payer's wallet once the order is paid in full
 * (its fulfillment step), and the payer's reply carries it back.  Why a
 * shared secret rather than asking the service (a verifier command):
 * the stage checks a proof by itself, in microseconds, with no process
 * to run, no network call from a stage, and nothing to wait for when the
 * service is down; only the service can make a proof, and a proof names
 * its one challenge, so it cannot be replayed for another (and a second
 * use finds the challenge released).  Compared in constant time.
 */
#include "payment.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "config/settings.h"
#include "message/header.h"

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
			|| pepsi_option_text(ctx, "PAYMENT_SECRET") == NULL)
			log_warnx("%s: row %lld: <%s>: SECRETARY_PAYMENT = %s, but %s is not set: no payment offered",
					  pepsi_queue_id(ctx), pepsi_id(ctx), owner, s,
					  p == NULL											   ? "SECRETARY_PRICE"
					  : pepsi_option_text(ctx, "PAYMENT_MERCHANT") == NULL ? "PAYMENT_MERCHANT"
																		   : "PAYMENT_SECRET (secrets.d)");
		else
		{
			*scheme = xstrdup(s);
			*price = xstrdup(p);
		}
	}
	json_decref(settings);
	return *scheme != NULL;
}

void
secretary_payment_offer(struct pepsi_ctx *ctx, const char *owner, long long challenge, struct buf *fields,
						struct buf *text)
{
	const char *merchant = pepsi_option_text(ctx, "PAYMENT_MERCHANT");
	char	   *scheme;
	char	   *price;
	char	   *uri;

	if (!payment_terms(ctx, owner, &scheme, &price))
		return;
	if (strcmp(scheme, "taler") == 0)
		uri = xasprintf("taler://pay/%s/pepsi-%lld/", merchant, challenge);
	else
		uri = xasprintf("%s://%s/pepsi-%lld?amount=%s", scheme, merchant, challenge, price);
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

int
secretary_payment_proof(struct pepsi_ctx *ctx, const struct buf *headers, const char *owner)
{
	char	   *value = header_get(headers->data, headers->len, "Payment-Proof");
	char	   *scheme = NULL;
	char	   *price = NULL;
	char		order[48];
	char		want[65] = "";
	char		uri[1024];
	char		proof[129];
	const char *at;
	long long	challenge;
	int			rc = 0;

	if (value == NULL)
		return 0;
	if (!payment_terms(ctx, owner, &scheme, &price))
		log_info("%s: row %lld: <%s>: a proof of payment, but no payment is offered: ignored", pepsi_queue_id(ctx),
				 pepsi_id(ctx), owner);
	else if (sscanf(value, " %1023s %128s", uri, proof) != 2 || (at = strstr(uri, "/pepsi-")) == NULL
			 || sscanf(at, "/pepsi-%lld", &challenge) != 1 || challenge <= 0)
		log_info("%s: row %lld: <%s>: Payment-Proof is not \"URI PROOF\" naming an order of ours: ignored",
				 pepsi_queue_id(ctx), pepsi_id(ctx), owner);
	else
	{
		snprintf(order, sizeof(order), "pepsi-%lld", challenge);
		payment_proof_of(pepsi_option_text(ctx, "PAYMENT_SECRET"), order, want);
		if (strlen(proof) != 64 || CRYPTO_memcmp(want, proof, 64) != 0)
			log_warnx("%s: row %lld: <%s>: a proof of payment for %s from <%s> that is not the payment service's: ignored",
					  pepsi_queue_id(ctx), pepsi_id(ctx), owner, order, pepsi_mail_from(ctx));
		else
		{
			char		id[32];
			const char *from = pepsi_mail_from(ctx);
			const char *values[5] = {owner, from[0] ? from : owner, id, uri, price};
			json_t	   *released;

			snprintf(id, sizeof(id), "%lld", challenge);
			released = pepsi_call_json(ctx, "SELECT to_jsonb(pepsi.secretary_paid($1, $2, $3::bigint, $4, $5))", 5,
									   values);
			if (released == NULL)
				rc = -1;
			else
			{
				if (json_is_integer(released))
					log_info("%s: row %lld: <%s>: paid %s (%s): held mail released (%lld), sender whitelisted",
							 pepsi_queue_id(ctx), pepsi_id(ctx), owner, price, order,
							 json_integer_value(released));
				else
					log_info("%s: row %lld: <%s>: a proof of payment for %s, which is no open challenge: done with",
							 pepsi_queue_id(ctx), pepsi_id(ctx), owner, order);
				rc = 1;
			}
			json_decref(released);
		}
	}
	free(value);
	free(scheme);
	free(price);
	return rc;
}
