/*
 * client_key.h: the key a client's failures are counted under (failed
 * logins, failed AUTH): its IPv4 address, or its IPv6 /64, which one
 * host or customer commonly holds whole, so that stepping through its
 * addresses gains nothing.  An IPv4-mapped IPv6 address (a dual-stack
 * socket's IPv4 client) is its IPv4 address.
 */
#ifndef PEPSI_CLIENT_KEY_H
#define PEPSI_CLIENT_KEY_H

#include <netinet/in.h>
#include <stddef.h>
#include <sys/socket.h>

/* Room for the longest key: an IPv6 prefix and "/64". */
#define CLIENT_KEY_SIZE (INET6_ADDRSTRLEN + 4)

/* The key of addr (AF_INET or AF_INET6) in key; "" for another family. */
void client_key(const struct sockaddr *addr, char *key, size_t keylen);

#endif
