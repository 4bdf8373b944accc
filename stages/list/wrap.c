/*
 * wrap.c: the DMARC wrap (pepsi-stage-list, docs/pepsi-stage-list.8.md),
 * the list option dmarc_mitigation "wrap": a post whose author's domain
 * publishes p=reject or quarantine goes out as a message from the list
 * (From: "Name via list" <list@>, Reply-To: the author) carrying the post
 * whole as its one message/rfc822 part, so the author's own DKIM
 * signature still verifies inside it while the list's signs the wrapper.
 * The wrapper keeps the post's To, Cc, Subject, Date and Message-ID.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "list.h"
#include "message/header.h"
#include "runtime/stage.h"

/* The fields of the post the wrapper repeats. */
static const char *const wrap_kept_fields[] = {"To", "Cc", "Subject", "Date", "Message-ID", "In-Reply-To",
											   "References", NULL};

void
list_wrap(struct pepsi_ctx *ctx, const char *list, const char *author, const char *display_name, const char *policy)
{
	const struct buf *headers = pepsi_headers(ctx);
	const struct buf *body = pepsi_body(ctx);
	char			 *from = header_get(headers->data, headers->len, "From");
	char			 *local;
	char			 *domain;
	char			  boundary[64];
	struct buf		  outer = BUF_INIT;
	struct buf		  inner = BUF_INIT;

	list_address_split(list, &local, &domain);
	snprintf(boundary, sizeof(boundary), "wrap-%lld-%s", pepsi_id(ctx), pepsi_queue_id(ctx));
	buf_printf(&outer, "From: \"%s via %s\" <%s>\r\n", display_name ? display_name : author, local, list);
	buf_printf(&outer, "Reply-To: %s\r\n", from ? from : author);
	for (size_t i = 0; wrap_kept_fields[i]; i++)
	{
		char *value = header_get(headers->data, headers->len, wrap_kept_fields[i]);

		if (value)
			buf_printf(&outer, "%s: %s\r\n", wrap_kept_fields[i], value + strspn(value, " \t"));
		free(value);
	}
	buf_printf(&outer, "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"%s\"\r\n", boundary);
	buf_printf(&inner, "The message from <%s> is attached: its domain's DMARC policy is %s.\r\n\r\n--%s\r\n"
					   "Content-Type: message/rfc822\r\nContent-Disposition: inline\r\n\r\n",
			   author, policy, boundary);
	buf_append(&inner, headers->data, headers->len);
	buf_append_str(&inner, "\r\n");
	buf_append(&inner, body->data, body->len);
	if (body->len == 0 || body->data[body->len - 1] != '\n')
		buf_append_str(&inner, "\r\n");
	buf_printf(&inner, "--%s--\r\n", boundary);
	pepsi_set_headers(ctx, outer.data, outer.len);
	pepsi_set_body(ctx, inner.data, inner.len);
	log_info("%s: row %lld: <%s>: the post from <%s> is wrapped in a message from the list (its domain's DMARC "
			 "policy is %s)",
			 pepsi_queue_id(ctx), pepsi_id(ctx), list, author, policy);
	free(from);
	free(local);
	free(domain);
	buf_free(&outer);
	buf_free(&inner);
}
