/*
 * mime_downgrade.h: making a message fit a next hop that cannot take its
 * content as it is (RFC 6152 section 3: a client "MUST NOT" send 8-bit
 * data to a server without 8BITMIME, and converts it instead; RFC 3030: a
 * binary body goes only with BDAT to a server with BINARYMIME).
 *
 * The relay stages' SMTP client (common/smtp/smtp_client.c) calls it once it
 * knows what the next hop said in EHLO.  Every leaf part whose content the
 * hop cannot take is re-encoded, text parts as quoted-printable and anything
 * else as base64, and its Content-Transfer-Encoding says so; multipart and
 * message/rfc822 entities are walked, never encoded themselves (RFC 2045
 * section 6.4).  Header fields are never rewritten: raw 8-bit header
 * fields belong to SMTPUTF8, and such a message cannot be downgraded.
 *
 * A DKIM signature made over the 8-bit form does not survive this: the
 * dkim-sign stage converts first (its DOWNGRADE_8BIT option, RFC 6376
 * section 5.3), so that what it signs is what any hop receives.
 */
#ifndef PEPSI_MIME_DOWNGRADE_H
#define PEPSI_MIME_DOWNGRADE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"

enum mime_downgrade_target
{
	MIME_TO_7BIT, /* the hop has no 8BITMIME: only 7-bit lines */
	MIME_TO_8BIT  /* the hop has 8BITMIME but no BINARYMIME: no NUL, no bare CR */
};

enum mime_downgrade_result
{
	MIME_DOWNGRADE_UNCHANGED, /* the message fits already; out is untouched */
	MIME_DOWNGRADE_DONE,	  /* out holds the converted message */
	MIME_DOWNGRADE_IMPOSSIBLE /* why says what cannot be converted */
};

/* A NUL or a CR not followed by LF: what only BDAT with BINARYMIME carries. */
bool mime_has_binary(const char *s, size_t len);
/* Does the message hold content the target cannot carry? */
bool mime_needs_downgrade(const char *raw, size_t len, enum mime_downgrade_target target);

/*
 * Convert raw (headers, empty line, body) for target into out (appended).
 * The result is a well-formed MIME message; the original is left alone.
 */
enum mime_downgrade_result mime_downgrade(const char *raw, size_t len,
										  enum mime_downgrade_target target, struct buf *out,
										  char *why, size_t whylen);

/* The encoders, for their tests: RFC 2045 6.7 (CRLF or LF line ends kept as CRLF) and 6.8. */
void mime_encode_quoted_printable(const char *in, size_t len, struct buf *out);
void mime_encode_base64(const char *in, size_t len, struct buf *out);

#endif
