/*
 * https_server.c: the listening socket, the PEM files and the log of a
 * libmicrohttpd server (https_server.h).
 */
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/log.h"
#include "process/https_server.h"
#include "process/secret.h"

int
https_server_listen(const char *address, long long port, const char *section, const char *path)
{
	char			service[16];
	struct addrinfo hints = {0}, *res;
	int				fd, rc, on = 1;

	snprintf(service, sizeof(service), "%lld", port);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
	if ((rc = getaddrinfo(address, service, &hints, &res)) != 0)
		fatalx("%s: [%s] ADDRESS %s: %s", path, section, address, gai_strerror(rc));
	fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		fatal("socket");
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
	if (bind(fd, res->ai_addr, res->ai_addrlen) != 0)
		fatal("[%s] cannot listen on %s port %lld", section, address ? address : "127.0.0.1", port);
	if (listen(fd, 64) != 0)
		fatal("listen");
	freeaddrinfo(res);
	log_info("listening on %s port %lld", address ? address : "127.0.0.1", port);
	return fd;
}

char *
https_server_read_pem(const char *path, bool key, char *err, size_t errlen)
{
	struct buf content = BUF_INIT;
	FILE	  *f = NULL;
	bool	   ok;

	if (key && (f = secret_key_open(path, err, errlen)) == NULL)
		return NULL;
	ok = key ? buf_append_stream(&content, f, path, 1024 * 1024, err, errlen)
			 : buf_append_file(&content, path, 1024 * 1024, err, errlen);
	if (f)
		fclose(f);
	if (!ok)
	{
		explicit_bzero(content.data, content.len);
		buf_free(&content);
		return NULL;
	}
	return content.data;
}

void
https_server_log(void *cls, const char *fmt, va_list ap)
{
	char   message[1024];
	size_t n;

	vsnprintf(message, sizeof(message), fmt, ap);
	n = strlen(message);
	while (n > 0 && message[n - 1] == '\n')
		message[--n] = '\0';
	log_debug("libmicrohttpd: %s", message);
}
