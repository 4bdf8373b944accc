/*
 * https_server.h: what the programs that serve HTTPS with libmicrohttpd
 * (pepsi-httpd, the telemetry collector pepsi-telemetry) share: the
 * listening socket, bound before privileges are dropped; the certificate
 * and key as the PEM strings libmicrohttpd takes; and its log, at debug.
 */
#ifndef PEPSI_HTTPS_SERVER_H
#define PEPSI_HTTPS_SERVER_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

/*
 * A TCP socket listening on address (numeric) and port; fatal, naming
 * section ("httpd") and the file, when it cannot be.
 */
int https_server_listen(const char *address, long long port, const char *section, const char *path);

/*
 * A PEM file as a string (at most 1 MiB); a key is opened as
 * secret_key_open checks it.  NULL with err.  A key is the caller's to
 * wipe.
 */
char *https_server_read_pem(const char *path, bool key, char *err, size_t errlen);

/* libmicrohttpd's MHD_OPTION_EXTERNAL_LOGGER: its messages at debug level. */
void https_server_log(void *cls, const char *fmt, va_list ap);

#endif
