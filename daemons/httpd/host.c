/*
 * host.c: the names pepsi-httpd answers to.  A page on another site can
 * point its own name at this server's address (DNS rebinding) and then
 * talk to it as its own origin, the browser's same-origin rule and the
 * CSRF checks none the wiser; but its requests carry the attacker's name
 * in Host.  So a request is served only when Host names this server: one
 * of [httpd] SERVER_NAMES (default: [pepsi] HOSTNAME and localhost), or
 * the address the connection came in on (a literal address is not a name
 * anyone can rebind).  A request without Host is HTTP/1.0 (libmicrohttpd
 * refuses an HTTP/1.1 one), which no browser sends, and is served.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <string.h>
#include <strings.h>

#include "httpd.h"

/* Is text the address the connection came in on? */
static bool
host_is_local_address(const struct request *req, const char *text)
{
	const struct sockaddr_in  *in4 = (const struct sockaddr_in *) &req->local;
	const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *) &req->local;
	unsigned char			   address[16];

	if (inet_pton(AF_INET, text, address) == 1)
	{
		if (req->local.ss_family == AF_INET)
			return memcmp(address, &in4->sin_addr, 4) == 0;
		return req->local.ss_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)
			   && memcmp(address, &in6->sin6_addr.s6_addr[12], 4) == 0;
	}
	if (inet_pton(AF_INET6, text, address) == 1)
		return req->local.ss_family == AF_INET6 && memcmp(address, &in6->sin6_addr, 16) == 0;
	return false;
}

/*
 * The name of "name[:port]", "[v6]:port" or "[v6]" in name, without a
 * final dot; false when the header is none of these.
 */
static bool
host_name(const char *host, char *name, size_t namelen)
{
	const char *start = host, *end;
	size_t		len;

	if (*host == '[')
	{
		start = host + 1;
		if ((end = strchr(start, ']')) == NULL || (end[1] != '\0' && end[1] != ':'))
			return false;
	}
	else if ((end = strchr(host, ':')) == NULL)
		end = host + strlen(host);
	else if (strchr(end + 1, ':') != NULL)
		return false; /* an IPv6 address without its brackets */
	len = (size_t) (end - start);
	if (len > 0 && start[len - 1] == '.')
		len--;
	if (len == 0 || len >= namelen)
		return false;
	memcpy(name, start, len);
	name[len] = '\0';
	return true;
}

bool
httpd_host_allowed(const struct request *req, char *shown, size_t shownlen)
{
	const char *host = MHD_lookup_connection_value(req->connection, MHD_HEADER_KIND,
												   MHD_HTTP_HEADER_HOST);
	char		name[256];
	size_t		i;

	if (host == NULL)
		return true;
	/* For the error: printable ASCII only, so that the JSON reply can carry it. */
	for (i = 0; host[i] && i + 1 < shownlen && i < 100; i++)
		shown[i] = isprint((unsigned char) host[i]) ? host[i] : '?';
	shown[i] = '\0';
	if (!host_name(host, name, sizeof(name)))
		return false;
	if (host_is_local_address(req, name))
		return true;
	if (httpd.server_names)
		return config_list_contains(httpd.server_names, name);
	return strcasecmp(name, "localhost") == 0 || strcasecmp(name, config_hostname(httpd.cfg)) == 0;
}
