/*
 * public_address.c: is an address one of the public internet's?
 * (public_address.h)
 */
#include "dns/public_address.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>

/* An IPv4 range: the address's first bits, and how many count. */
struct v4_range
{
	uint32_t	net;
	int			bits;
	const char *what;
};

/* RFC 6890's special-purpose registry, the ranges not globally reachable. */
static const struct v4_range v4_ranges[] = {
	{0x00000000, 8, "this network (0.0.0.0/8)"},
	{0x0a000000, 8, "private (10.0.0.0/8)"},
	{0x64400000, 10, "shared, carrier-grade NAT (100.64.0.0/10)"},
	{0x7f000000, 8, "loopback (127.0.0.0/8)"},
	{0xa9fe0000, 16, "link-local (169.254.0.0/16)"},
	{0xac100000, 12, "private (172.16.0.0/12)"},
	{0xc0000000, 24, "IETF protocol assignments (192.0.0.0/24)"},
	{0xc0000200, 24, "documentation (192.0.2.0/24)"},
	{0xc0586300, 24, "6to4 relay anycast (192.88.99.0/24)"},
	{0xc0a80000, 16, "private (192.168.0.0/16)"},
	{0xc6120000, 15, "benchmarking (198.18.0.0/15)"},
	{0xc6336400, 24, "documentation (198.51.100.0/24)"},
	{0xcb007100, 24, "documentation (203.0.113.0/24)"},
	{0xe0000000, 4, "multicast (224.0.0.0/4)"},
	{0xf0000000, 4, "reserved (240.0.0.0/4)"},
};

static const char *
v4_refusal(uint32_t a)
{
	for (size_t i = 0; i < sizeof(v4_ranges) / sizeof(v4_ranges[0]); i++)
		if ((a >> (32 - v4_ranges[i].bits)) == (v4_ranges[i].net >> (32 - v4_ranges[i].bits)))
			return v4_ranges[i].what;
	return NULL;
}

static uint32_t
v4_at(const unsigned char *p)
{
	return (uint32_t) p[0] << 24 | (uint32_t) p[1] << 16 | (uint32_t) p[2] << 8 | p[3];
}

static const char *
v6_refusal(const unsigned char *a)
{
	static const unsigned char zero[16];
	static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	static const unsigned char nat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};

	if (memcmp(a, zero, 15) == 0)
		return a[15] == 1 ? "loopback (::1)" : "unspecified (::)";
	/* The IPv4 address an IPv4-mapped or a NAT64 address reaches. */
	if (memcmp(a, mapped, 12) == 0 || memcmp(a, nat64, 12) == 0)
		return v4_refusal(v4_at(a + 12));
	if (memcmp(a, zero, 12) == 0)
		return "IPv4-compatible (::/96)";
	if ((a[0] & 0xfe) == 0xfc)
		return "unique local (fc00::/7)";
	if (a[0] == 0xfe && (a[1] & 0xc0) == 0x80)
		return "link-local (fe80::/10)";
	if (a[0] == 0xfe && (a[1] & 0xc0) == 0xc0)
		return "site-local (fec0::/10)";
	if (a[0] == 0xff)
		return "multicast (ff00::/8)";
	if (a[0] == 0x01 && a[1] == 0 && memcmp(a + 2, zero, 6) == 0)
		return "discard-only (100::/64)";
	if (a[0] == 0x20 && a[1] == 0x01 && a[2] == 0x0d && a[3] == 0xb8)
		return "documentation (2001:db8::/32)";
	if (a[0] == 0x20 && a[1] == 0x02)
		return v4_refusal(v4_at(a + 2)) ? "6to4 of a non-public IPv4 address (2002::/16)" : NULL;
	return NULL;
}

const char *
public_address_refusal(const struct sockaddr *sa, socklen_t len)
{
	if (sa == NULL)
		return "no address";
	if (sa->sa_family == AF_INET && len >= (socklen_t) sizeof(struct sockaddr_in))
		return v4_refusal(ntohl(((const struct sockaddr_in *) sa)->sin_addr.s_addr));
	if (sa->sa_family == AF_INET6 && len >= (socklen_t) sizeof(struct sockaddr_in6))
		return v6_refusal(((const struct sockaddr_in6 *) sa)->sin6_addr.s6_addr);
	return "not an internet address";
}

/* Open a connection's socket, unless its address is not a public one (and that is not allowed). */
static curl_socket_t
public_address_open_socket(void *arg, curlsocktype purpose, struct curl_sockaddr *address)
{
	struct public_address_guard *g = arg;
	const char					*what;

	if (!g->allow_private
		&& (what = public_address_refusal(&address->addr, (socklen_t) address->addrlen)) != NULL)
	{
		char text[INET6_ADDRSTRLEN] = "?";

		if (address->family == AF_INET)
			inet_ntop(AF_INET, &((const struct sockaddr_in *) (const void *) &address->addr)->sin_addr, text,
					  sizeof(text));
		else if (address->family == AF_INET6)
			inet_ntop(AF_INET6, &((const struct sockaddr_in6 *) (const void *) &address->addr)->sin6_addr, text,
					  sizeof(text));
		snprintf(g->refused, sizeof(g->refused), "not connecting to %s, %s, not a public address (%s)", text, what,
				 g->option);
		return CURL_SOCKET_BAD;
	}
	return socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
}

void
public_address_curl(void *curl, struct public_address_guard *g)
{
	g->refused[0] = '\0';
	curl_easy_setopt(curl, CURLOPT_OPENSOCKETFUNCTION, public_address_open_socket);
	curl_easy_setopt(curl, CURLOPT_OPENSOCKETDATA, g);
	curl_easy_setopt(curl, CURLOPT_PROXY, "");
}
