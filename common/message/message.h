/*
 * message.h: the header/body split of a raw message.
 *
 * The queue stores a message as headers and body with the invariant
 * raw = headers || CRLF || body: headers run up to and including the line
 * end of the last header line, body is everything after the empty line.
 * A message with no empty line is all headers (the last line given a line
 * end if it had none) and an empty body.
 * Input with bare LF line ends (a local sendmail) is normalised to CRLF.
 */
#ifndef PEPSI_MESSAGE_H
#define PEPSI_MESSAGE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"

/* Split raw into headers and body (appended to them). */
void message_split(const char *raw, size_t len, struct buf *headers, struct buf *body);
/* raw = headers || CRLF || body. */
void message_join(const char *headers, size_t hlen, const char *body, size_t blen,
				  struct buf *raw);

/* Does s hold an octet above 127 (8BITMIME, SMTPUTF8)? */
bool message_has_8bit(const char *s, size_t len);

#endif
