/*
 * srs_rcpt.c: the reverse path of the Sender Rewriting Scheme at RCPT.
 * A bounce (MAIL FROM:<>) to an address of the [srs] DOMAIN, of mail that
 * pepsi-stage-srs rewrote, is taken when the address's hash and age
 * verify, and its recipient becomes the original sender, to whom it is
 * relayed.  So that an SRS address cannot be guessed into a relay, one
 * that does not verify is refused (550 5.1.1), mail other than a bounce
 * is refused before anything is checked, and a client's invalid SRS
 * addresses are counted like its failed AUTH (auth_throttle.h, a second
 * table): the SRS_FAILURE_LIMIT-th closes its session, and until
 * SRS_FAILURE_WINDOW passes its SRS addresses get 450 unchecked.
 */
#include <string.h>
#include <time.h>

#include "auth_throttle.h"
#include "base/log.h"
#include "ingress.h"
#include "message/srs.h"

static struct srs			 srs_rcpt_engine;
static struct auth_throttle *srs_rcpt_failures;
static unsigned				 srs_rcpt_limit;

bool
srs_rcpt_init(const struct pepsi_config *cfg, char *err, size_t errlen)
{
	if (!srs_from_config(cfg, &srs_rcpt_engine, err, errlen))
		return false;
	srs_rcpt_failures = auth_throttle_new(0, 0, 0);
	srs_rcpt_configure(cfg);
	return true;
}

void
srs_rcpt_configure(const struct pepsi_config *cfg)
{
	srs_rcpt_limit = (unsigned) config_int(cfg, "ingress", "SRS_FAILURE_LIMIT");
	auth_throttle_configure(srs_rcpt_failures, srs_rcpt_limit,
							config_duration_ms(cfg, "ingress", "SRS_FAILURE_WINDOW") / 1000.0, 0);
}

bool
srs_rcpt_enabled(void)
{
	return srs_rcpt_engine.domain != NULL;
}

enum smtp_srs_verdict
srs_rcpt_reverse(const struct smtp_session *s, char *address, size_t size)
{
	const char	   *client = session_client_of(s);
	double			now = ev_now(ingress.loop);
	char			original[SMTP_PATH_MAX + 1];
	enum srs_result r = srs_reverse(&srs_rcpt_engine, address, time(NULL), original, sizeof(original));
	bool			close = false;

	if (r == SRS_NOT_SRS)
		return SMTP_SRS_NONE;
	if (auth_throttle_blocked(srs_rcpt_failures, client, now))
	{
		log_info("%s: refused RCPT <%s> unchecked: %u invalid SRS addresses from %s "
				 "(SRS_FAILURE_LIMIT %u within SRS_FAILURE_WINDOW)",
				 client, address, auth_throttle_failures(srs_rcpt_failures, client, now), client,
				 srs_rcpt_limit);
		return SMTP_SRS_THROTTLED;
	}
	if (s->mail_from == NULL || s->mail_from[0] != '\0')
	{
		log_info("%s: refused RCPT <%s>: an SRS address takes only bounces, and MAIL FROM is <%s>",
				 client, address, s->mail_from ? s->mail_from : "");
		return SMTP_SRS_NOT_BOUNCE;
	}
	if (r != SRS_REVERSED || strlen(original) >= size)
	{
		auth_throttle_failed(srs_rcpt_failures, client, now, &close);
		log_info("%s: refused RCPT <%s>: %s (%u invalid SRS addresses from %s, SRS_FAILURE_LIMIT %u%s)",
				 client, address, srs_result_text(r), auth_throttle_failures(srs_rcpt_failures, client, now),
				 client, srs_rcpt_limit, close ? ": closing, and refusing its SRS addresses for a while" : "");
		return close ? SMTP_SRS_TOO_MANY : SMTP_SRS_INVALID;
	}
	log_info("SRS recipient <%s> reversed to <%s>", address, original);
	memcpy(address, original, strlen(original) + 1);
	return SMTP_SRS_REVERSED;
}
