/*
 * client_key.c: see client_key.h.
 */
#include "smtp/client_key.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

void
client_key(const struct sockaddr *addr, char *key, size_t keylen)
{
	char text[INET6_ADDRSTRLEN] = "";

	if (addr->sa_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *) addr)->sin_addr, text, sizeof(text));
	else if (addr->sa_family == AF_INET6)
	{
		struct in6_addr prefix = ((const struct sockaddr_in6 *) addr)->sin6_addr;

		if (IN6_IS_ADDR_V4MAPPED(&prefix))
			inet_ntop(AF_INET, &prefix.s6_addr[12], text, sizeof(text));
		else
		{
			memset(prefix.s6_addr + 8, 0, 8);
			inet_ntop(AF_INET6, &prefix, text, sizeof(text));
			snprintf(key, keylen, "%s/64", text);
			return;
		}
	}
	snprintf(key, keylen, "%s", text);
}
