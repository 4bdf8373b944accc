/*
 * reject_log.h: the line Postfix's smtpd writes when it refuses a command
 * for policy (a recipient, a sender, a client), in the shape log tools
 * made for Postfix's logs read (pflogsumm's reject report keys on
 * "reject: <command> from <client>: <reply>"):
 *
 *   NOQUEUE: reject: RCPT from unknown[192.0.2.1]: 550 5.1.1 <bob@example.org>:
 *     Recipient address rejected: no such user here; from=<a@example.net>
 *     to=<bob@example.org> proto=ESMTP helo=<mail.example.net>
 *
 * (on one line), under the process's tag (smtpd for pepsi-ingress).
 */
#ifndef PEPSI_REJECT_LOG_H
#define PEPSI_REJECT_LOG_H

#include <stdbool.h>

struct reject_log
{
	const char *command;	 /* "RCPT", "MAIL", "DATA", "CONNECT" ... */
	const char *queue_id;	 /* NULL: the message has none yet (NOQUEUE) */
	const char *client_name; /* the client's verified name; NULL or "": unknown */
	const char *client_ip;
	const char *reply;	   /* the reply sent, without its CRLF */
	const char *mail_from; /* NULL: no MAIL yet; "": the null sender */
	const char *rcpt_to;   /* NULL: none */
	bool		esmtp;	   /* EHLO (proto=ESMTP) rather than HELO (SMTP) */
	const char *helo;	   /* NULL: no greeting yet */
	const char *action;	   /* NULL: "reject"; "milter-reject", "milter-discard" as Postfix writes a filter's */
};

void reject_log(const struct reject_log *r);

#endif
