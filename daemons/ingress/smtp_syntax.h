/*
 * smtp_syntax.h: validators and decoders for what an SMTP client sends.
 * Exposed for the state machine (smtp.c), the fuzz target and the unit
 * tests; none of them keeps state.
 */
#ifndef PEPSI_INGRESS_SMTP_SYNTAX_H
#define PEPSI_INGRESS_SMTP_SYNTAX_H

#include <stdbool.h>
#include <stddef.h>

/* Is s[0..len) well-formed UTF-8 (no overlong forms, surrogates or > U+10FFFF)? */
bool smtp_utf8_valid(const char *s, size_t len);
/* An RFC 5321 Mailbox (local@domain); utf8 allows RFC 6531 U-labels and local parts. */
bool smtp_mailbox_valid(const char *mailbox, bool utf8);
/* Base64 into out; returns the decoded length, or -1 if malformed or too long for out. */
long smtp_base64_decode(const char *in, size_t len, char *out, size_t outlen);
/* An atext octet of RFC 5322 (any octet above 127 with utf8). */
bool smtp_atext(unsigned char c, bool utf8);
/* A domain or an address literal, RFC 5321 4.1.2 (U-labels with SMTPUTF8). */
bool smtp_domain_valid(const char *d, size_t len, bool utf8);
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
