/*
 * fuzz_smtp.c: libFuzzer target for the SMTP command parser, the DATA and
 * BDAT state machines and the envelope built from what they accept
 * (daemons/ingress/smtp.c, envelope.c), with relay control and recipient
 * validation (relay_control.c, common/local/local.c) answering RCPT when the
 * settings ask for them, and AUTH answered through the failed-AUTH
 * throttle (auth_throttle.c).  "make fuzz" runs it.
 *
 * Input: one byte of settings, then what a client sends.  The bytes are
 * fed in pieces of varying size, as reads from a socket would be, and the
 * host's part is played as session.c plays it: unused input is kept and
 * offered again, input after STARTTLS is dropped, every event answered.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "auth_throttle.h"
#include "config/config.h"
#include "envelope.h"
#include "local/local.h"
#include "relay_control.h"
#include "smtp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Settings byte: which listener, and how the host answers. */
#define FUZZ_STARTTLS 0x01
#define FUZZ_AUTH 0x02
#define FUZZ_AUTH_REQUIRED 0x04
#define FUZZ_DATABASE_DOWN 0x08
#define FUZZ_SMALL_LIMITS 0x10
#define FUZZ_RELAY_CONTROL 0x20
#define FUZZ_TRUSTED_CLIENT 0x40

/* The recipient checks of pepsi-ingress, over a fixed set of local mailboxes. */
static struct relay_request fuzz_relay = {.local_domains = "example.org, mx.test"};

static enum smtp_rcpt_verdict
fuzz_rcpt_check(const struct smtp_session *s, const char *address)
{
	struct relay_request   request = fuzz_relay;
	enum smtp_rcpt_verdict verdict;

	request.trusted_client = *(const uint8_t *) s->host & FUZZ_TRUSTED_CLIENT;
	request.authenticated = s->auth_account != NULL;
	verdict = relay_control_rcpt(&request, address);
	/* The invariant: nothing outside the local domains without trust or AUTH. */
	if (verdict == SMTP_RCPT_ACCEPT && !request.trusted_client && !request.authenticated
		&& !local_address_is_local(request.local_domains, address))
		abort();
	return verdict;
}

static void
fuzz_relay_init(void)
{
	static const char *const mailboxes[] = {"alice@example.org", "bob@mx.test"};
	char					 err[256];
	struct pepsi_config		*cfg;

	if (fuzz_relay.resolver)
		return;
	cfg = config_parse_string("[pepsi]\nLOCAL_RECIPIENTS = virtual\n", "fuzz.conf", err, sizeof(err));
	if (cfg == NULL || (fuzz_relay.resolver = local_resolver_new(cfg, err, sizeof(err))) == NULL)
		abort();
	local_resolver_set_virtual_list(fuzz_relay.resolver, mailboxes, 2);
	config_free(cfg);
}

/*
 * AUTH as session.c answers it, with the failed-AUTH throttle of
 * auth_throttle.c keyed by one client and a clock that ticks per attempt
 * (the window outlasts a run, so the counts only grow).
 */
#define FUZZ_AUTH_LIMIT 3

static struct auth_throttle *fuzz_throttle;
static double				 fuzz_clock;

static void
fuzz_auth(struct smtp_session *s)
{
	bool   close = false;
	double delay;

	fuzz_clock += 1.0;
	if (auth_throttle_blocked(fuzz_throttle, "192.0.2.1", fuzz_clock))
	{
		smtp_auth_refused(s, "454 4.7.0 Too many failed authentications from your address");
		return;
	}
	if (strcmp(s->auth_user, "alice") == 0 && strcmp(s->auth_password, "secret") == 0)
	{
		smtp_auth_done(s, true);
		return;
	}
	/* Each failure waits longer, within DELAY..32 DELAY. */
	delay = auth_throttle_failed(fuzz_throttle, "192.0.2.1", fuzz_clock, &close);
	if (delay < 0.5 || delay > 0.5 * 32)
		abort();
	/* The invariant: the limit-th failure closes, and blocks from then on. */
	if (close != (auth_throttle_failures(fuzz_throttle, "192.0.2.1", fuzz_clock) >= FUZZ_AUTH_LIMIT)
		|| close != auth_throttle_blocked(fuzz_throttle, "192.0.2.1", fuzz_clock))
		abort();
	if (close)
	{
		smtp_auth_refused(s, NULL);
		smtp_close(s, "421 4.7.0 Too many failed authentications, closing connection");
	}
	else
		smtp_auth_done(s, false);
}

static void
fuzz_answer(struct smtp_session *s, uint8_t settings)
{
	struct envelope		   e;
	struct envelope_origin origin = {
		.client_ip = "192.0.2.1",
		.listener = "fuzz",
		.hostname = "mx.test",
		.authserv_id = "auth.test",
		.queue_id = "4Yj3Rb0Wg1p9000",
		.max_hops = 5,
		.trusted_network = false,
	};
	struct smtp_tls_info tls = {"TLSv1.3", "TLS_AES_256_GCM_SHA384", 256};
	const char			*refusal;

	switch (s->event)
	{
		case SMTP_EVENT_STARTTLS:
			smtp_tls_started(s, &tls);
			break;
		case SMTP_EVENT_AUTH:
			fuzz_auth(s);
			break;
		case SMTP_EVENT_SCREEN:
			smtp_screen_done(s);
			break;
		case SMTP_EVENT_MESSAGE:
			if ((refusal = envelope_build(s, &origin, &e)) != NULL)
			{
				smtp_admit_refused(s, refusal);
				break;
			}
			/* The invariant the queue relies on: nothing of the message is lost. */
			if (s->body != SMTP_BODY_BINARYMIME && e.body.len > s->message.len)
				abort();
			envelope_free(&e);
			smtp_admit_done(s, !(settings & FUZZ_DATABASE_DOWN), "4Yj3Rb0Wg1p9000");
			break;
		default:
			break;
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct smtp_policy policy = {
		.hostname = "mx.test",
		.max_size = 1 << 20,
		.max_recipients = 100,
		.max_line_length = 998,
		.max_header_fields = 1000,
		.max_header_size = 1 << 16,
		.max_errors = 1000,
		.command_rate = 0,
	};
	struct smtp_session s;
	struct buf			pending = BUF_INIT;
	uint8_t				settings;
	uint32_t			rng;
	size_t				pos = 1;

	if (size < 1)
		return 0;
	settings = data[0];
	/* Each input is a new client: the throttle starts empty. */
	auth_throttle_free(fuzz_throttle);
	fuzz_throttle = auth_throttle_new(FUZZ_AUTH_LIMIT, 1e9, 0.5);
	fuzz_clock = 0;
	policy.starttls = settings & FUZZ_STARTTLS;
	policy.auth = settings & FUZZ_AUTH;
	policy.auth_required = settings & FUZZ_AUTH_REQUIRED;
	if (settings & FUZZ_RELAY_CONTROL)
	{
		fuzz_relay_init();
		policy.rcpt_check = fuzz_rcpt_check;
	}
	if (settings & FUZZ_SMALL_LIMITS)
	{
		policy.max_size = 300;
		policy.max_recipients = 2;
		policy.max_line_length = 40;
		policy.max_header_fields = 4;
		policy.max_header_size = 120;
		policy.max_errors = 20;
	}
	rng = settings * 2654435761u + (uint32_t) size;
	smtp_init(&s, &policy);
	s.host = &settings;
	smtp_greet(&s);
	while (pos < size && s.state != SMTP_STATE_CLOSED)
	{
		size_t chunk;
		size_t used;

		rng = rng * 1103515245u + 12345u;
		chunk = 1 + (rng >> 16) % 97;
		if (chunk > size - pos)
			chunk = size - pos;
		buf_append(&pending, data + pos, chunk);
		pos += chunk;
		for (;;)
		{
			used = smtp_input(&s, pending.data, pending.len);
			if (s.event == SMTP_EVENT_STARTTLS)
				used = pending.len; /* RFC 3207: dropped */
			buf_consume(&pending, used);
			if (s.event == SMTP_EVENT_NONE || s.event == SMTP_EVENT_CLOSE)
				break;
			fuzz_answer(&s, settings);
		}
		buf_reset(&s.out); /* "written" */
	}
	buf_free(&pending);
	smtp_free(&s);
	return 0;
}
