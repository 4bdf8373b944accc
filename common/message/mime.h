/*
 * mime.h: reading MIME entities (RFC 2045, 2046): where an entity's
 * header block ends, its media type and parameters, the delimiters of a
 * multipart body, and the decoded text of a message.
 *
 * mime_downgrade.c walks entities with these to re-encode them for a
 * next hop; mime_text reads a message's text for a stage that looks at
 * what it says (pepsi-stage-detect-language).
 */
#ifndef PEPSI_MIME_H
#define PEPSI_MIME_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"

/* Hostile input nests multiparts without end; real mail stays far below. */
#define MIME_MAX_DEPTH 32

/* Where the header block of an entity ends (after the last header's line end) and its body begins. */
void mime_entity_split(const char *s, size_t len, size_t *headers_len, size_t *body_start);
/* The media type of a Content-Type value, lower case ("text/plain" when absent). */
void mime_media_type(const char *content_type, char *out, size_t outlen);
/* The parameter name of a Content-Type value (quoted or not), or NULL (free it). */
char *mime_parameter(const char *content_type, const char *name);
/* The boundary parameter (RFC 2046 5.1.1: 1 to 70 characters), or NULL (free it). */
char *mime_boundary(const char *content_type);
/* The next delimiter line of d (dlen, "--" and the boundary) at or after from; len when there is none. */
size_t mime_next_delimiter(const char *s, size_t len, size_t from, const char *d, size_t dlen, bool *closing);
/* Just past the line end of the line at from (len on the last line). */
size_t mime_line_end(const char *s, size_t len, size_t from);

/* The decoders of Content-Transfer-Encoding (RFC 2045 6.7 and 6.8), lenient as readers must be. */
void mime_decode_quoted_printable(const char *in, size_t len, struct buf *out);
void mime_decode_base64(const char *in, size_t len, struct buf *out);
/*
 * Append in, text in charset (NULL: us-ascii, which 8-bit octets show is
 * not quite true, so those are then read as UTF-8 or Latin-1), as UTF-8 to
 * out.  False (out untouched) for a charset iconv does not know.
 */
bool mime_text_to_utf8(const char *in, size_t len, const char *charset, struct buf *out);

/*
 * The text of the message raw (headers, empty line, body) as UTF-8,
 * appended to out: every text/plain part that is no attachment, decoded
 * (transfer encoding, then charset), parts apart by an empty line; when
 * there is none, the text/html parts with their markup left out.  At most
 * max bytes are appended (0: no limit).  Returns how many parts were read.
 */
size_t mime_text(const char *raw, size_t len, size_t max, struct buf *out);

#endif
