/*
 * dsn.c: see dsn.h.  The layout follows RFC 3464 section 2 and what the
 * widely deployed MTAs send: a human-readable text/plain part, the
 * message/delivery-status part (one per-message block, then a block per
 * recipient), and the returned message (message/rfc822) or its headers
 * (text/rfc822-headers).  Lines end CRLF, like every stored message.
 */
#include "message/dsn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/log.h"
#include "smtp/smtp_client.h"

static bool
dsn_has_8bit(const char *s, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if ((unsigned char) s[i] >= 0x80)
			return true;
	return false;
}

void
dsn_format_date(time_t t, char *out, size_t outlen)
{
	static const char *const days[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
	static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug",
										 "Sep", "Oct", "Nov", "Dec"};
	struct tm				 tm;

	/* Written out by hand so the locale cannot change the names. */
	gmtime_r(&t, &tm);
	snprintf(out, outlen, "%s, %d %s %d %02d:%02d:%02d +0000", days[tm.tm_wday], tm.tm_mday,
			 months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

/* A header value must not carry a line end of its own. */
static void
dsn_append_value(struct buf *b, const char *value)
{
	for (const char *p = value ? value : ""; *p; p++)
		buf_append_char(b, *p == '\r' || *p == '\n' ? ' ' : *p);
}

static const char *
dsn_subject(enum dsn_kind kind)
{
	switch (kind)
	{
		case DSN_DELAY:
			return "Delayed Mail (still being retried)";
		case DSN_SUCCESS:
			return "Successful Mail Delivery Report";
		case DSN_FAILURE:
			break;
	}
	return "Undelivered Mail Returned to Sender";
}

static void
dsn_human_part(const struct dsn_report *r, struct buf *b)
{
	buf_printf(b, "This is the mail system at host %s.\r\n\r\n", r->reporting_mta);
	switch (r->kind)
	{
		case DSN_FAILURE:
			buf_append_str(b, "I'm sorry to have to inform you that your message could not\r\n"
							  "be delivered to one or more recipients. It's attached below.\r\n");
			break;
		case DSN_DELAY:
			buf_append_str(b, "Your message could not be delivered yet to one or more\r\n"
							  "recipients. It will be retried; you need not send it again.\r\n");
			break;
		case DSN_SUCCESS:
			buf_append_str(b, "Your message was successfully delivered to the destination(s)\r\n"
							  "listed below.\r\n");
			break;
	}
	buf_append_str(b, "\r\n");
	for (size_t i = 0; i < r->nrecipients; i++)
	{
		const struct dsn_recipient *rc = &r->recipients[i];

		buf_printf(b, "<%s>: ", rc->final_recipient);
		if (rc->remote_mta)
			buf_printf(b, "host %s said: ", rc->remote_mta);
		dsn_append_value(b, rc->diagnostic_code ? rc->diagnostic_code : rc->status);
		buf_append_str(b, "\r\n");
		if (rc->will_retry_until)
		{
			char date[64];

			dsn_format_date(rc->will_retry_until, date, sizeof(date));
			buf_printf(b, "    (retried until %s)\r\n", date);
		}
	}
}

static void
dsn_status_part(const struct dsn_report *r, struct buf *b)
{
	char date[64];

	buf_printf(b, "Reporting-MTA: dns; %s\r\n", r->reporting_mta);
	if (r->envid && *r->envid)
	{
		buf_append_str(b, "Original-Envelope-Id: ");
		smtp_xtext_encode(r->envid, b);
		buf_append_str(b, "\r\n");
	}
	if (r->arrival_date)
	{
		dsn_format_date(r->arrival_date, date, sizeof(date));
		buf_printf(b, "Arrival-Date: %s\r\n", date);
	}
	for (size_t i = 0; i < r->nrecipients; i++)
	{
		const struct dsn_recipient *rc = &r->recipients[i];

		buf_append_str(b, "\r\n");
		if (rc->original_recipient && strchr(rc->original_recipient, ';'))
		{
			const char *semi = strchr(rc->original_recipient, ';');

			buf_printf(b, "Original-Recipient: %.*s; ", (int) (semi - rc->original_recipient),
					   rc->original_recipient);
			dsn_append_value(b, semi + 1 + strspn(semi + 1, " "));
			buf_append_str(b, "\r\n");
		}
		buf_append_str(b, "Final-Recipient: rfc822; ");
		dsn_append_value(b, rc->final_recipient);
		buf_printf(b, "\r\nAction: %s\r\nStatus: %s\r\n", rc->action, rc->status);
		if (rc->remote_mta)
		{
			buf_append_str(b, "Remote-MTA: dns; ");
			dsn_append_value(b, rc->remote_mta);
			buf_append_str(b, "\r\n");
		}
		if (rc->diagnostic_code)
		{
			buf_append_str(b, "Diagnostic-Code: ");
			dsn_append_value(b, rc->diagnostic_code);
			buf_append_str(b, "\r\n");
		}
		if (rc->last_attempt)
		{
			dsn_format_date(rc->last_attempt, date, sizeof(date));
			buf_printf(b, "Last-Attempt-Date: %s\r\n", date);
		}
		if (rc->will_retry_until)
		{
			dsn_format_date(rc->will_retry_until, date, sizeof(date));
			buf_printf(b, "Will-Retry-Until: %s\r\n", date);
		}
	}
}

/*
 * The returned header block, cut at the last whole field within
 * DSN_RETURNED_HEADERS_MAX: a message with megabytes of headers must not
 * make every bounce of it as large (amplification).
 */
static size_t
dsn_returned_headers_len(const struct dsn_report *r)
{
	size_t len = r->headers_len;

	if (len <= DSN_RETURNED_HEADERS_MAX)
		return len;
	for (len = DSN_RETURNED_HEADERS_MAX; len >= 2; len--)
		if (r->headers[len - 1] == '\n' && r->headers[len] != ' ' && r->headers[len] != '\t')
			return len;
	return 0;
}

/* Does the returned content hold text that a boundary line would be made of? */
static bool
dsn_content_has(const struct dsn_report *r, size_t headers_len, const char *boundary)
{
	size_t n = strlen(boundary);

	return memmem(r->headers, headers_len, boundary, n) != NULL
		   || (r->return_full && r->body && memmem(r->body, r->body_len, boundary, n) != NULL);
}

/*
 * A boundary no one can predict (RFC 2046 5.1.1: it must not occur in the
 * content): 128 random bits, drawn again in the unlikely case that the
 * returned content holds them.  A predictable one let the sender of the
 * bounced message forge MIME parts of the report.
 */
static void
dsn_boundary(const struct dsn_report *r, size_t headers_len, char *out, size_t outlen)
{
	do
	{
		unsigned char random_bytes[16];
		size_t		  n;

		if (getrandom(random_bytes, sizeof(random_bytes), 0) != (ssize_t) sizeof(random_bytes))
			fatal("getrandom");
		n = (size_t) snprintf(out, outlen, "=_pepsi_dsn_");
		for (size_t i = 0; i < sizeof(random_bytes) && n + 3 <= outlen; i++)
			n += (size_t) snprintf(out + n, outlen - n, "%02x", random_bytes[i]);
	} while (dsn_content_has(r, headers_len, out));
}

void
dsn_build(const struct dsn_report *r, struct buf *headers, struct buf *body)
{
	size_t returned_headers_len = dsn_returned_headers_len(r);
	/* Headers cut short cannot head a whole message/rfc822: the headers alone, then. */
	bool return_full = r->return_full && returned_headers_len == r->headers_len;
	char date[64];
	char boundary[128];
	bool eight_bit = dsn_has_8bit(r->headers, returned_headers_len)
					 || (return_full && dsn_has_8bit(r->body, r->body_len));
	struct buf human = BUF_INIT;
	bool	   human_8bit;

	dsn_format_date(r->now, date, sizeof(date));
	dsn_boundary(r, returned_headers_len, boundary, sizeof(boundary));
	dsn_human_part(r, &human);
	human_8bit = dsn_has_8bit(human.data, human.len);

	buf_printf(headers, "Date: %s\r\n", date);
	buf_printf(headers, "From: Mail Delivery System <MAILER-DAEMON@%s>\r\n", r->reporting_mta);
	buf_append_str(headers, "To: <");
	dsn_append_value(headers, r->original_sender);
	buf_append_str(headers, ">\r\n");
	buf_printf(headers, "Subject: %s\r\n", dsn_subject(r->kind));
	buf_printf(headers, "Message-ID: <dsn.%s.%lld@%s>\r\n", r->unique, (long long) r->now,
			   r->reporting_mta);
	buf_append_str(headers, "Auto-Submitted: auto-replied\r\n");
	buf_append_str(headers, "MIME-Version: 1.0\r\n");
	buf_printf(headers, "Content-Type: multipart/report; report-type=delivery-status;\r\n"
						"\tboundary=\"%s\"\r\n",
			   boundary);
	if (eight_bit || human_8bit)
		buf_append_str(headers, "Content-Transfer-Encoding: 8bit\r\n");

	buf_append_str(body, "This is a MIME-encapsulated message.\r\n\r\n");
	buf_printf(body, "--%s\r\n", boundary);
	buf_printf(body, "Content-Description: Notification\r\n"
					 "Content-Type: text/plain; charset=%s\r\n",
			   human_8bit ? "utf-8" : "us-ascii");
	if (human_8bit)
		buf_append_str(body, "Content-Transfer-Encoding: 8bit\r\n");
	buf_append_str(body, "\r\n");
	buf_append(body, human.data, human.len);
	buf_append_str(body, "\r\n");

	buf_printf(body, "--%s\r\n", boundary);
	buf_append_str(body, "Content-Description: Delivery report\r\n"
						 "Content-Type: message/delivery-status\r\n\r\n");
	dsn_status_part(r, body);
	buf_append_str(body, "\r\n");

	buf_printf(body, "--%s\r\n", boundary);
	if (return_full)
		buf_printf(body, "Content-Description: %s\r\nContent-Type: message/rfc822\r\n",
				   r->kind == DSN_FAILURE ? "Undelivered Message" : "Message");
	else
		buf_printf(body, "Content-Description: %s\r\nContent-Type: text/rfc822-headers\r\n",
				   r->kind == DSN_FAILURE ? "Undelivered Message Headers" : "Message Headers");
	if (eight_bit)
		buf_append_str(body, "Content-Transfer-Encoding: 8bit\r\n");
	buf_append_str(body, "\r\n");
	buf_append(body, r->headers, returned_headers_len);
	if (return_full)
	{
		buf_append_str(body, "\r\n");
		buf_append(body, r->body, r->body_len);
		if (r->body_len > 0 && r->body[r->body_len - 1] != '\n')
			buf_append_str(body, "\r\n");
	}
	buf_printf(body, "\r\n--%s--\r\n", boundary);
	buf_free(&human);
}
