/*
 * public_address.h: is an address one of the public internet's?
 *
 * A program that connects where a name in the DNS (or a remote server)
 * points it, on behalf of mail from anyone, must not be sent by a hostile
 * answer to the machine itself or its private network (loopback,
 * RFC 1918 and unique local, link-local, carrier-grade NAT, documentation,
 * benchmarking, multicast, reserved; IPv4-mapped and NAT64 addresses are
 * judged by the IPv4 address they carry).  pepsi-keydisc checks the
 * address it actually connects to with this, so a check made on an
 * earlier answer cannot be got around by a second one (DNS rebinding).
 */
#ifndef PEPSI_PUBLIC_ADDRESS_H
#define PEPSI_PUBLIC_ADDRESS_H

#include <stdbool.h>
#include <stddef.h>

#include <sys/socket.h>

/*
 * NULL when sa (of len bytes) is a public unicast address; otherwise
 * what it is ("loopback", "private", "link-local"...), static.
 */
const char *public_address_refusal(const struct sockaddr *sa, socklen_t len);

#endif
