/*
 * smtp_internal.h: what the protocol machine's two files share: smtp.c
 * (the commands and the host's answers) and smtp_content.c (the content
 * of DATA and BDAT, and the input loop).  Not for the rest of ingress,
 * which sees smtp.h only.
 */
#ifndef PEPSI_INGRESS_SMTP_INTERNAL_H
#define PEPSI_INGRESS_SMTP_INTERNAL_H

#include <stddef.h>

#include "smtp.h"

/* The reply when the messages in flight hold MAX_MESSAGE_MEMORY already. */
#define SMTP_MEMORY_REPLY "451 4.3.1 Insufficient system storage, try again later"

/* A reply line, queued on the session's output. */
void smtp_reply(struct smtp_session *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An error reply the client caused: counted, and too many end the session. */
void smtp_error(struct smtp_session *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void smtp_message_release(struct smtp_session *s);
void smtp_reset_transaction(struct smtp_session *s);
/* A line of an AUTH exchange (smtp.c), read by the input loop. */
void smtp_auth_response(struct smtp_session *s, const char *line);
/* A command line, read by the input loop. */
void smtp_dispatch_command(struct smtp_session *s, char *line, size_t len);
/* BDAT content octets (smtp_content.c); returns how many were used. */
size_t smtp_input_bdat(struct smtp_session *s, const char *data, size_t len);

#endif
