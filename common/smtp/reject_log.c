/* reject_log.c: see reject_log.h. */
#include "smtp/reject_log.h"

#include <stddef.h>

#include "base/buf.h"
#include "base/log.h"

void
reject_log(const struct reject_log *r)
{
	struct buf line = BUF_INIT;

	buf_printf(&line, "%s: %s: %s from %s[%s]: %s;", r->queue_id ? r->queue_id : "NOQUEUE",
			   r->action ? r->action : "reject", r->command,
			   r->client_name && r->client_name[0] ? r->client_name : "unknown", r->client_ip, r->reply);
	if (r->mail_from)
		buf_printf(&line, " from=<%s>", r->mail_from);
	if (r->rcpt_to)
		buf_printf(&line, " to=<%s>", r->rcpt_to);
	buf_printf(&line, " proto=%s", r->esmtp ? "ESMTP" : "SMTP");
	if (r->helo)
		buf_printf(&line, " helo=<%s>", r->helo);
	log_info("%s", line.data);
	buf_free(&line);
}
