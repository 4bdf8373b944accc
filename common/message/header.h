/*
 * header.h: reading and editing an RFC 5322 header block (the headers
 * column, CRLF line ends, folded lines continuing with whitespace).
 */
#ifndef PEPSI_HEADER_H
#define PEPSI_HEADER_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"

/* The unfolded value of the first header named name (case-insensitive), or NULL (free it). */
char *header_get(const char *headers, size_t len, const char *name);
/* Append the unfolded values of every header named name, comma separated. */
void header_get_all(const char *headers, size_t len, const char *name, struct buf *out);
/* Copy headers to out without any header named name. */
void header_remove(const char *headers, size_t len, const char *name, struct buf *out);
/* How many fields named name the block has (Received, for a hop count). */
size_t header_count(const char *headers, size_t len, const char *name);
/*
 * Copy headers to out without the Authentication-Results fields whose
 * authserv-id is authserv_id (case-insensitive; RFC 8601 section 5: inside
 * our boundary only we may claim our name).  Returns how many were dropped.
 */
size_t header_remove_results_of(const char *headers, size_t len, const char *authserv_id,
								struct buf *out);
/*
 * The addresses of an address-list value (To, Cc, Bcc): angle-addr or
 * bare addr-spec, groups and comments skipped.  Appends each to *list.
 */
void header_addresses(const char *value, char ***list, size_t *count);
/*
 * The author of a message whose header block is headers: the one address
 * of its From: field, lowercased (malloc'd), or NULL when there is no
 * From:, it names none or several, or its address has no '@'.  Who may
 * change settings, post to a list or sign as an identity is decided on it.
 */
char *header_from_address(const char *headers, size_t len);

#endif
