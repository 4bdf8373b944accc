/*
 * srs_rcpt.c: the reverse path of the Sender Rewriting Scheme at RCPT.
 * Mail to an address of the [srs] DOMAIN (a bounce of mail that
 * pepsi-stage-srs rewrote) is taken when its hash and age verify, and its
 * recipient becomes the original sender, to whom it is relayed; an SRS
 * address that does not verify is refused (550 5.1.1), so a forged one
 * cannot make us an open relay.
 */
#include <string.h>
#include <time.h>

#include "ingress.h"
#include "log.h"
#include "srs.h"

static struct srs srs_rcpt_engine;

bool
srs_rcpt_init(const struct pepsi_config *cfg, char *err, size_t errlen)
{
	return srs_from_config(cfg, &srs_rcpt_engine, err, errlen);
}

bool
srs_rcpt_enabled(void)
{
	return srs_rcpt_engine.domain != NULL;
}

int
srs_rcpt_reverse(const struct smtp_session *s, char *address, size_t size)
{
	char			original[SMTP_PATH_MAX + 1];
	enum srs_result r = srs_reverse(&srs_rcpt_engine, address, time(NULL), original, sizeof(original));

	if (r == SRS_NOT_SRS)
		return 0;
	if (r != SRS_REVERSED || strlen(original) >= size)
	{
		log_info("refused RCPT <%s>: %s", address, srs_result_text(r));
		return -1;
	}
	log_info("SRS recipient <%s> reversed to <%s>", address, original);
	memcpy(address, original, strlen(original) + 1);
	return 1;
}
