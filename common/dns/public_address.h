/*
 * public_address.h: is an address one of the public internet's?
 *
 * A program that connects where a name in the DNS (or a remote server)
 * points it, on behalf of mail from anyone, must not be sent by a hostile
 * answer to the machine itself or its private network (loopback,
 * RFC 1918 and unique local, link-local, carrier-grade NAT, documentation,
 * benchmarking, multicast, reserved; IPv4-mapped and NAT64 addresses are
 * judged by the IPv4 address they carry).  pepsi-keydisc and the MTA-STS
 * policy fetch check the address they actually connect to with this
 * (public_address_curl), so a check made on an earlier answer cannot be
 * got around by a second one (DNS rebinding).
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

/*
 * A libcurl transfer's guard: public_address_curl(curl, &g) makes the
 * transfer check the address of every socket it opens
 * (CURLOPT_OPENSOCKETFUNCTION) and refuse one that is not public unless
 * allow_private, and use no proxy (not even the environment's: the address
 * checked must be the server's).  After the transfer, refused holds why a
 * connection was refused ("not connecting to 127.0.0.1, loopback
 * (127.0.0.0/8), not a public address (OPTION)"), or is empty.  g must
 * live as long as the transfer.
 */
struct public_address_guard
{
	bool		allow_private;
	const char *option; /* the option that allows them, named in the refusal */
	char		refused[200];
};
void public_address_curl(void *curl, struct public_address_guard *g);

#endif
