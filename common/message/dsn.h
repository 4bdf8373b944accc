/*
 * dsn.h: delivery status notifications, RFC 3464 (multipart/report with a
 * message/delivery-status part), as the bounce stage sends them: failed,
 * delayed and successful deliveries, with the original message or only its
 * headers returned as RFC 3461's RET asks.
 *
 * Pure: it builds the header block and the body of the new message and
 * touches neither the queue nor the clock (the caller passes "now").
 */
#ifndef PEPSI_DSN_H
#define PEPSI_DSN_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "base/buf.h"

enum dsn_kind
{
	DSN_FAILURE, /* Action: failed */
	DSN_DELAY,	 /* Action: delayed */
	DSN_SUCCESS	 /* Action: delivered or relayed */
};

struct dsn_recipient
{
	const char *final_recipient;	/* the address the attempt was for */
	const char *original_recipient; /* ORCPT, "rfc822;addr", or NULL */
	const char *action;				/* "failed", "delayed", "delivered", "relayed" */
	const char *status;				/* "5.1.1" */
	const char *remote_mta;			/* NULL for local delivery */
	const char *diagnostic_code;	/* "smtp; 550 5.1.1 ..." or NULL */
	time_t		last_attempt;		/* 0: not given */
	time_t		will_retry_until;	/* 0: not given (delay DSNs) */
};

/* The most of the original header block a report returns (whole fields). */
#define DSN_RETURNED_HEADERS_MAX (64 * 1024)

struct dsn_report
{
	enum dsn_kind				kind;
	const char				   *reporting_mta;	 /* our host name */
	const char				   *original_sender; /* the To: of the DSN */
	const char				   *envid;			 /* ENVID, decoded, or NULL */
	time_t						arrival_date;	 /* 0: not given */
	time_t						now;
	const char				   *unique;		 /* makes Message-ID and the boundary unique: the row id */
	bool						return_full; /* the whole message (else its headers only) */
	const char				   *headers;	 /* the original message */
	size_t						headers_len;
	const char				   *body;
	size_t						body_len;
	const struct dsn_recipient *recipients;
	size_t						nrecipients;
};

/* Append the DSN's header block (ending CRLF) and body to headers and body. */
void dsn_build(const struct dsn_report *report, struct buf *headers, struct buf *body);

/* RFC 5322 date-time, e.g. "Mon, 30 Nov 2026 09:41:00 +0000". */
void dsn_format_date(time_t t, char *out, size_t outlen);

#endif
