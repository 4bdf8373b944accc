/*
 * fuzz_milter.c: libFuzzer target for what a milter filter sends back: the
 * packet framing and reply parser (common/message/milter.c) and the edits
 * pepsi-stage-milter applies to a message from the replies that pass
 * (common/message/milter_message.c).  "make fuzz" runs it.
 *
 * Input: what a filter writes on its socket, cut into packets as the stage
 * cuts it; each reply that parses is applied as an end-of-message edit to
 * a small message, which is then written back out as the row would be.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "message/milter.h"
#include "milter_stage.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
fuzz_apply(struct milter_message *m, const struct milter_reply *r, bool *first_chunk)
{
	bool leadspc = (r->index & 1) != 0; /* both spellings of the value */

	switch (r->command)
	{
		case MILTER_REPLY_ADDHEADER:
			milter_message_add_header(m, r->name, r->value, leadspc);
			break;
		case MILTER_REPLY_INSHEADER:
			milter_message_insert_header(m, r->index, r->name, r->value, leadspc);
			break;
		case MILTER_REPLY_CHGHEADER:
			milter_message_change_header(m, r->index, r->name, r->value, leadspc);
			break;
		case MILTER_REPLY_REPLBODY:
			milter_message_body_chunk(m, r->data, r->data_len, *first_chunk);
			*first_chunk = false;
			break;
		case MILTER_REPLY_ADDRCPT:
		case MILTER_REPLY_ADDRCPT_PAR:
			milter_message_add_rcpt(m, r->text);
			break;
		case MILTER_REPLY_DELRCPT:
			milter_message_delete_rcpt(m, r->text);
			break;
		case MILTER_REPLY_CHGFROM:
			milter_message_change_from(m, r->text);
			break;
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char	  headers[] = "From: <a@example.org>\r\nSubject: one\r\n two\r\nno colon line\r\n"
									  "Subject: again\r\n";
	const char			 *rcpt[] = {"a@example.org", "b@example.org"};
	struct milter_message m;
	const char			 *p = (const char *) data;
	size_t				  left = size;
	bool				  first_chunk = true;
	struct buf			  out = BUF_INIT;

	milter_message_init(&m, headers, sizeof(headers) - 1, "body\r\n", 6, "s@example.net", rcpt, 2);
	for (;;)
	{
		char				command;
		const char		   *payload;
		size_t				payload_len;
		size_t				consumed;
		char				err[256];
		struct milter_reply r;

		/* small packets only: a fuzz input is small, and the limit is checked too */
		if (milter_frame(p, left, 4096, &command, &payload, &payload_len, &consumed, err,
						 sizeof(err))
			!= MILTER_FRAME_OK)
			break;
		if (milter_parse_reply(command, payload, payload_len, &r, err, sizeof(err)))
			fuzz_apply(&m, &r, &first_chunk);
		p += consumed;
		left -= consumed;
	}
	milter_message_headers(&m, &out);
	/* An edit can never start a header or end the block: every line is a field or a fold. */
	for (size_t i = 0; i + 1 < out.len; i++)
		if (out.data[i] == '\n' && out.data[i + 1] == '\r')
			abort();
	buf_free(&out);
	milter_message_free(&m);
	return 0;
}
