/*
 * smtp_address.h: the syntax of an RFC 5321 mailbox (4.1.2), with RFC
 * 6531 UTF-8 where allowed.  Pure functions: pepsi-ingress checks MAIL
 * and RCPT with them (smtp_syntax.h), pepsi-sendmail its -f sender.
 */
#ifndef PEPSI_SMTP_ADDRESS_H
#define PEPSI_SMTP_ADDRESS_H

#include <stdbool.h>
#include <stddef.h>

/* The longest mailbox taken (RFC 5321 4.5.3.1.3 says 256 octets of path). */
#define SMTP_PATH_MAX 256

/* Is s[0..len) well-formed UTF-8 (no overlong forms, surrogates or > U+10FFFF)? */
bool smtp_utf8_valid(const char *s, size_t len);
/* An RFC 5321 Mailbox (local@domain); utf8 allows RFC 6531 U-labels and local parts. */
bool smtp_mailbox_valid(const char *mailbox, bool utf8);
/* An atext octet of RFC 5322 (any octet above 127 with utf8). */
bool smtp_atext(unsigned char c, bool utf8);
/* A domain or an address literal, RFC 5321 4.1.2 (U-labels with SMTPUTF8). */
bool smtp_domain_valid(const char *d, size_t len, bool utf8);

#endif
