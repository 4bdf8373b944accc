/*
 * sender_login.h: which addresses an authenticated account may use, in
 * MAIL FROM and From: (Postfix's smtpd_sender_login_maps with
 * reject_sender_login_mismatch), and how much it may send: [ingress]
 * SENDER_LOGIN_MAPS lists the sources, "file:/path" (lines "address
 * account[,account...]", an address "@domain" for all of a domain) and
 * "sql" (pepsi.sender_login, asked once per session through
 * pepsi.sender_login_addresses); SEND_LIMIT_MESSAGES and
 * SEND_LIMIT_RECIPIENTS per account and hour, counted in the database
 * (pepsi.send_count_take) so that every ingress host shares them.
 */
#ifndef PEPSI_INGRESS_SENDER_LOGIN_H
#define PEPSI_INGRESS_SENDER_LOGIN_H

#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"

/* At start: load and install; false with err naming the option or the file's line. */
bool sender_login_configure(const struct pepsi_config *cfg, char *err, size_t errlen);
/*
 * On reload, in two steps so that a refused reload changes nothing: load
 * reads the settings without using them (NULL with err when refused);
 * install puts a loaded list in force (and frees the old); discard frees
 * one that is not to be installed.
 */
struct sender_logins;
struct sender_logins *sender_login_load(const struct pepsi_config *cfg, char *err, size_t errlen);
void				  sender_login_install(struct sender_logins *next);
void				  sender_login_discard(struct sender_logins *next);
void				  sender_login_shutdown(void);
/* Is any source configured (the addresses are checked)? */
bool sender_login_enabled(void);
/* Is the "sql" source among them? */
bool sender_login_uses_sql(void);
/* [ingress] SEND_LIMIT_MESSAGES, SEND_LIMIT_RECIPIENTS (0: none). */
long sender_login_limit_messages(void);
long sender_login_limit_recipients(void);
/*
 * May account use address?  The file's entries, then sql (the account's
 * addresses from the database, count of them; NULL without the sql source).
 */
bool sender_login_allows(const char *account, const char *address, char *const *sql,
						 size_t count);

#endif
