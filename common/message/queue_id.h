/*
 * queue_id.h: the queue id, one name for a message from the moment it is
 * received, made before its row exists and carried by every row split or
 * fanned out from it (in state.queue_id, copied by the extension's
 * splits): the 250 reply, the Received header, every log line, the mail
 * log, pepsi-queue and pepsi-httpd show it (docs/architecture.md 2.5).
 *
 * Shaped as Postfix's long queue ids, in their alphabet (digits and
 * consonants: no word can form) so that tools made for Postfix's logs
 * accept it: the time in seconds (6 characters), this host ([pepsi]
 * HOST_ID, 2), the process (4) and a count within the second (3).  Unique
 * across hosts and processes without asking the database.
 */
#ifndef PEPSI_QUEUE_ID_H
#define PEPSI_QUEUE_ID_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "config/config.h"

/* Characters of a queue id, without its NUL. */
#define QUEUE_ID_LEN 15
/* Host ids are 0 .. QUEUE_ID_HOSTS - 1 (two characters). */
#define QUEUE_ID_HOSTS 2704

/* [pepsi] HOST_ID, else a hash of HOSTNAME (set HOST_ID where hosts share a database). */
unsigned queue_id_host(const struct pepsi_config *cfg);
/* A new queue id into out (at least QUEUE_ID_LEN + 1 bytes). */
void queue_id_make(unsigned host, char *out);
/* Is s shaped as queue_id_make makes them? */
bool queue_id_valid(const char *s);
/*
 * The queue id of a row: its state's queue_id, or, for a row made
 * without one (admitted with plain SQL, or before Pepsi 0.4), its row id
 * in decimal, written into buf.
 */
const char *queue_id_of(json_t *state, long long row_id, char *buf, size_t buflen);

#endif
