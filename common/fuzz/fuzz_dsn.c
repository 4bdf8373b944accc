/*
 * fuzz_dsn.c: libFuzzer target for the delivery status notifications
 * (common/message/dsn.c).  Pepsi parses no DSN it receives (a bounce arriving is
 * mail like any other); what dsn.c reads is the original message it
 * returns (headers cut at a whole field past DSN_RETURNED_HEADERS_MAX, a
 * boundary that must not occur in it) and the per-recipient values that
 * came from the network: the ENVID and ORCPT a client gave, the next hop's
 * name and its reply text.  "make fuzz" runs it.
 *
 * Input: one byte of flags (bits 0-1: the kind; bit 2: RET=FULL; bits
 * 3-7: the original header block repeated that many times more, to pass
 * the 64 KiB cut), then NUL-separated fields: the original sender, ENVID,
 * final recipient, ORCPT, remote MTA, diagnostic code, the original header
 * block, its body.  The ORCPT's address type is made an atom first, as
 * ingress checks it (daemons/ingress/smtp.c), and the final recipient and
 * the remote MTA lose their line ends, as an envelope address and a host
 * name have none.  The report's header block
 * and its message/delivery-status part must be lines of fields ending in
 * CRLF: a line end coming through from a value is a bug, and abort()
 * makes libFuzzer keep the input.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/xalloc.h"
#include "message/dsn.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_FIELDS 8

/* Lines "Name: value" (or continuations, or empty where allowed), each ending CRLF. */
static void
fuzz_check_fields(const char *s, size_t len, bool empty_lines)
{
	size_t at = 0;

	while (at < len)
	{
		const char *nl = memchr(s + at, '\n', len - at);
		size_t		end = nl ? (size_t) (nl - s) : len;

		if (nl == NULL || end == at || s[end - 1] != '\r')
			abort();
		if (memchr(s + at, '\r', end - 1 - at) != NULL)
			abort();
		if (end - 1 == at)
		{
			if (!empty_lines)
				abort();
		}
		else if (s[at] != ' ' && s[at] != '\t' && memchr(s + at, ':', end - 1 - at) == NULL)
			abort();
		at = end + 1;
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char			*field[FUZZ_FIELDS] = {NULL};
	size_t				 flen[FUZZ_FIELDS] = {0};
	char				*copy;
	struct buf			 original = BUF_INIT;
	struct buf			 headers = BUF_INIT;
	struct buf			 body = BUF_INIT;
	struct dsn_recipient rcpt[2];
	struct dsn_report	 r;
	size_t				 at = 0;
	int					 n = 0;

	if (size < 1)
		return 0;
	copy = xmalloc(size);
	memcpy(copy, data + 1, size - 1);
	copy[size - 1] = '\0';
	while (n < FUZZ_FIELDS && at <= size - 1)
	{
		size_t l = strnlen(copy + at, size - 1 - at);

		field[n] = copy + at;
		flen[n++] = l;
		at += l + 1;
	}
	for (int i = 0; i < FUZZ_FIELDS; i++)
		if (field[i] == NULL)
		{
			field[i] = "";
			flen[i] = 0;
		}
	/* an envelope address and a host name hold no line end (ingress, DNS) */
	for (int f = 2; f <= 4; f += 2)
		for (char *p = (char *) field[f]; *p; p++)
			if (*p == '\r' || *p == '\n')
				*p = 'x';
	/* the ORCPT's address type, as ingress lets it through: an atom */
	if (strchr(field[3], ';'))
		for (char *p = (char *) field[3]; *p != ';'; p++)
			if (!isalnum((unsigned char) *p) && *p != '-')
				*p = 'x';
	for (int i = 0; i <= data[0] >> 3; i++)
		buf_append(&original, field[6], flen[6]);
	memset(rcpt, 0, sizeof(rcpt));
	rcpt[0] = (struct dsn_recipient){
		.final_recipient = field[2][0] ? field[2] : "bob@example.net",
		.original_recipient = field[3][0] ? field[3] : NULL,
		.action = "failed",
		.status = "5.1.1",
		.remote_mta = field[4][0] ? field[4] : NULL,
		.diagnostic_code = field[5][0] ? field[5] : NULL,
		.last_attempt = 1796536800,
		.will_retry_until = (data[0] & 3) == DSN_DELAY ? 1796968800 : 0,
	};
	rcpt[1] = (struct dsn_recipient){
		.final_recipient = "carol@example.net",
		.action = "delivered",
		.status = "2.0.0",
	};
	r = (struct dsn_report){
		.kind = (enum dsn_kind)((data[0] & 3) % 3),
		.reporting_mta = "mx.example.org",
		.original_sender = field[0],
		.envid = field[1][0] ? field[1] : NULL,
		.arrival_date = 1796536000,
		.now = 1796536860,
		.unique = "42",
		.return_full = data[0] & 4,
		.headers = original.data ? original.data : "",
		.headers_len = original.len,
		.body = field[7],
		.body_len = flen[7],
		.recipients = rcpt,
		.nrecipients = 2,
	};
	dsn_build(&r, &headers, &body);
	fuzz_check_fields(headers.data, headers.len, false);
	{
		static const char start[] = "Content-Type: message/delivery-status\r\n\r\n";
		const char		 *part = memmem(body.data, body.len, start, sizeof(start) - 1);
		const char		 *end;

		if (part == NULL)
			abort();
		part += sizeof(start) - 1;
		end = memmem(part, body.len - (size_t) (part - body.data), "\r\n--=_pepsi_dsn_", 16);
		if (end == NULL)
			abort();
		fuzz_check_fields(part, (size_t) (end - part) + 2, true);
	}
	buf_free(&headers);
	buf_free(&body);
	buf_free(&original);
	free(copy);
	return 0;
}
