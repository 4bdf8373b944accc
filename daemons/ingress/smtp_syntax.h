/*
 * smtp_syntax.h: validators and decoders for what an SMTP client sends.
 * Exposed for the state machine (smtp.c), the fuzz target and the unit
 * tests; none of them keeps state.
 */
#ifndef PEPSI_INGRESS_SMTP_SYNTAX_H
#define PEPSI_INGRESS_SMTP_SYNTAX_H

#include <stdbool.h>
#include <stddef.h>

#include "smtp/smtp_address.h" /* the mailbox syntax, shared with pepsi-sendmail */

/* RFC 3461 xtext, decoded in place; false if malformed or a control character. */
bool smtp_xtext_decode(char *s, bool utf8);
/*
 * "<path>" at *p: the mailbox without brackets and source route into out.
 * Returns false on a syntax error.  *p is left after the '>'.
 */
bool smtp_parse_path(char **p, char *out, size_t outlen);
/* The next "KEY[=VALUE]" of a parameter list, split in place; NULL at the end. */
char *smtp_next_param(char **p, char **value);

#endif
