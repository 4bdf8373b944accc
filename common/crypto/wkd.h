/*
 * wkd.h: the Web Key Directory's names (draft-koch-openpgp-webkey-service):
 * shared by pepsi-keys (publishing) and pepsi-keydisc (looking up).
 */
#ifndef PEPSI_WKD_H
#define PEPSI_WKD_H

#include <stddef.h>

/* The WKD hash of a local part (lower-cased here): z-base-32 of its SHA-1, 32 characters and a NUL into out. */
void wkd_hash(const char *local, size_t len, char *out);

#endif
