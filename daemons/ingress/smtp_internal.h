/*
 * smtp_internal.h: what the protocol machine's files share: smtp.c (the
 * session, its replies, the command dispatch and the host's answers),
 * smtp_envelope_cmds.c and smtp_session_cmds.c (the verbs' handlers) and
 * smtp_content.c (the content of DATA and BDAT, and the input loop).  Not
 * for the rest of ingress, which sees smtp.h only.
 */
#ifndef PEPSI_INGRESS_SMTP_INTERNAL_H
#define PEPSI_INGRESS_SMTP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "smtp.h"

/* The reply when the messages in flight hold MAX_MESSAGE_MEMORY already. */
#define SMTP_MEMORY_REPLY "451 4.3.1 Insufficient system storage, try again later"

/* A reply line, queued on the session's output. */
void smtp_reply(struct smtp_session *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An error reply the client caused: counted, and too many end the session. */
void smtp_error(struct smtp_session *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void smtp_message_release(struct smtp_session *s);
/* Is the memory for messages in flight used up? */
bool smtp_memory_exhausted(const struct smtp_session *s);
/* Wipe a secret (a password, a user name) and free it. */
void smtp_wipe(char **secret);
void smtp_reset_transaction(struct smtp_session *s);
/* A line of an AUTH exchange (smtp_session_cmds.c), read by the input loop. */
void smtp_auth_response(struct smtp_session *s, const char *line);
/* A command line, read by the input loop. */
void smtp_dispatch_command(struct smtp_session *s, char *line, size_t len);
/* The verbs' handlers (smtp_envelope_cmds.c, smtp_session_cmds.c); arg is
 * what follows the verb. */
void smtp_cmd_helo_plain(struct smtp_session *s, char *arg);
void smtp_cmd_ehlo(struct smtp_session *s, char *arg);
void smtp_cmd_mail(struct smtp_session *s, char *arg);
void smtp_cmd_rcpt(struct smtp_session *s, char *arg);
void smtp_cmd_data(struct smtp_session *s, char *arg);
void smtp_cmd_bdat(struct smtp_session *s, char *arg);
void smtp_cmd_rset(struct smtp_session *s, char *arg);
void smtp_cmd_starttls(struct smtp_session *s, char *arg);
void smtp_cmd_auth(struct smtp_session *s, char *arg);
void smtp_cmd_noop(struct smtp_session *s, char *arg);
void smtp_cmd_vrfy(struct smtp_session *s, char *arg);
void smtp_cmd_help(struct smtp_session *s, char *arg);
void smtp_cmd_quit(struct smtp_session *s, char *arg);
/* BDAT content octets (smtp_content.c); returns how many were used. */
size_t smtp_input_bdat(struct smtp_session *s, const char *data, size_t len);

#endif
