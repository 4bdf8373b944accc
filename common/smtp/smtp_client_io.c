/*
 * smtp_client_io.c: the SMTP client's I/O layer: connecting, the TLS
 * handshake, and reading and writing with a deadline.  The socket is
 * non-blocking and every wait is a poll() with a deadline, for plain and
 * TLS sessions alike; the protocol on top is in smtp_client.c.
 */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "smtp/smtp_client_internal.h"
#include "smtp/tls_policy.h"

/* ---------------------------------------------------------------------------
 * The clock and replies
 * ------------------------------------------------------------------------- */

long long
smtp_io_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
smtp_reply_reset(struct smtp_reply *r)
{
	r->code = 0;
	r->enhanced[0] = '\0';
	buf_reset(&r->text);
	buf_append_str(&r->text, "");
}

/*
 * One reply line: "250-text", "250 text" or "250".  Sets *last for the
 * final line, *text to what follows the separator.
 */
bool
smtp_reply_parse_line(const char *line, size_t len, int *code, bool *last, const char **text)
{
	if (len < 3 || line[0] < '2' || line[0] > '5' || line[1] < '0' || line[1] > '9'
		|| line[2] < '0' || line[2] > '9')
		return false;
	if (len > 3 && line[3] != ' ' && line[3] != '-')
		return false;
	*code = (line[0] - '0') * 100 + (line[1] - '0') * 10 + (line[2] - '0');
	*last = len == 3 || line[3] == ' ';
	*text = len > 4 ? line + 4 : line + len;
	return true;
}

/* "5.1.1 text": an enhanced status code whose class matches the reply's. */
static void
smtp_reply_enhanced(struct smtp_reply *r)
{
	const char *t = r->text.data;
	size_t		n = 0;
	int			dots = 0;
	int			digits = 0;

	if (t == NULL || t[0] != '0' + r->code / 100 || t[1] != '.')
		return;
	for (n = 0; t[n] && t[n] != ' '; n++)
	{
		if (t[n] == '.')
		{
			if (digits == 0)
				return;
			dots++;
			digits = 0;
		}
		else if (t[n] >= '0' && t[n] <= '9' && digits < 3)
			digits++;
		else
			return;
	}
	if (dots != 2 || digits == 0 || n >= sizeof(r->enhanced))
		return;
	memcpy(r->enhanced, t, n);
	r->enhanced[n] = '\0';
}

/* ---------------------------------------------------------------------------
 * I/O with deadlines
 * ------------------------------------------------------------------------- */

void
smtp_io_set_error(struct smtp_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void
smtp_io_set_error(struct smtp_client *c, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->error, sizeof(c->error), fmt, ap);
	va_end(ap);
}

const char *
smtp_io_ssl_error(void)
{
	static char	  text[200];
	unsigned long e = ERR_get_error();

	if (e == 0)
		return "TLS error";
	ERR_error_string_n(e, text, sizeof(text));
	ERR_clear_error();
	return text;
}

static bool
smtp_wait(struct smtp_client *c, short events, long long deadline)
{
	struct pollfd pfd = {.fd = c->fd, .events = events};

	for (;;)
	{
		long long left = deadline - smtp_io_now_ms();
		int		  n;

		if (left <= 0)
		{
			smtp_io_set_error(c, "timed out talking to %s", c->peer);
			return false;
		}
		n = poll(&pfd, 1, (int) (left > 1000000 ? 1000000 : left));
		if (n > 0)
			return true;
		if (n < 0 && errno != EINTR)
		{
			smtp_io_set_error(c, "poll: %s", strerror(errno));
			return false;
		}
	}
}

/*
 * After an OpenSSL call that returned n without finishing: when it wants
 * the socket readable or writable, wait for that (until deadline) and say
 * to call it again; otherwise return the error for the caller to report.
 * Returns 1 to retry, 0 when the wait failed (the error is set), or -1
 * with *ssl_error set.
 */
static int
smtp_tls_retry(struct smtp_client *c, int n, long long deadline, int *ssl_error)
{
	*ssl_error = SSL_get_error(c->ssl, n);
	if (*ssl_error == SSL_ERROR_WANT_READ)
		return smtp_wait(c, POLLIN, deadline) ? 1 : 0;
	if (*ssl_error == SSL_ERROR_WANT_WRITE)
		return smtp_wait(c, POLLOUT, deadline) ? 1 : 0;
	return -1;
}

/* Read what is available into c->in; false on EOF, error or timeout. */
bool
smtp_io_fill(struct smtp_client *c, long long deadline)
{
	char chunk[16384];

	for (;;)
	{
		if (c->ssl)
		{
			int n = SSL_read(c->ssl, chunk, sizeof(chunk));
			int ssl_error;

			if (n > 0)
			{
				buf_append(&c->in, chunk, (size_t) n);
				return true;
			}
			switch (smtp_tls_retry(c, n, deadline, &ssl_error))
			{
				case 1:
					continue;
				case 0:
					return false;
			}
			if (ssl_error == SSL_ERROR_ZERO_RETURN)
				smtp_io_set_error(c, "%s closed the TLS session", c->peer);
			else
				smtp_io_set_error(c, "lost the TLS session with %s: %s", c->peer, smtp_io_ssl_error());
			return false;
		}
		else
		{
			ssize_t n = read(c->fd, chunk, sizeof(chunk));

			if (n > 0)
			{
				buf_append(&c->in, chunk, (size_t) n);
				return true;
			}
			if (n == 0)
			{
				smtp_io_set_error(c, "%s closed the connection", c->peer);
				return false;
			}
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
			{
				smtp_io_set_error(c, "lost the connection with %s: %s", c->peer, strerror(errno));
				return false;
			}
			if (!smtp_wait(c, POLLIN, deadline))
				return false;
		}
	}
}

/* Write all of data; the deadline moves on with every bit of progress. */
bool
smtp_io_write(struct smtp_client *c, const char *data, size_t len)
{
	size_t	  off = 0;
	long long deadline = smtp_io_now_ms() + c->opt.command_timeout_ms;

	while (off < len)
	{
		size_t chunk = len - off > 1 << 20 ? 1 << 20 : len - off;

		if (c->ssl)
		{
			int n = SSL_write(c->ssl, data + off, (int) chunk);
			int ssl_error;

			if (n > 0)
			{
				off += (size_t) n;
				deadline = smtp_io_now_ms() + c->opt.command_timeout_ms;
				continue;
			}
			switch (smtp_tls_retry(c, n, deadline, &ssl_error))
			{
				case 1:
					continue;
				case 0:
					return false;
			}
			smtp_io_set_error(c, "lost the TLS session with %s: %s", c->peer, smtp_io_ssl_error());
			return false;
		}
		else
		{
			ssize_t n = send(c->fd, data + off, chunk, MSG_NOSIGNAL);

			if (n > 0)
			{
				off += (size_t) n;
				deadline = smtp_io_now_ms() + c->opt.command_timeout_ms;
				continue;
			}
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			{
				if (!smtp_wait(c, POLLOUT, deadline))
					return false;
				continue;
			}
			smtp_io_set_error(c, "lost the connection with %s: %s", c->peer,
							  n < 0 ? strerror(errno) : "short write");
			return false;
		}
	}
	return true;
}

/* Read one whole (possibly multi-line) reply into r; false on I/O error. */
bool
smtp_io_read_reply(struct smtp_client *c, struct smtp_reply *r)
{
	long long deadline = smtp_io_now_ms() + c->opt.command_timeout_ms;
	size_t	  total = 0;
	int		  lines = 0;

	smtp_reply_reset(r);
	for (;;)
	{
		char	   *nl = c->in.len ? memchr(c->in.data, '\n', c->in.len) : NULL;
		size_t		len;
		int			code;
		bool		last;
		const char *text;

		if (nl == NULL)
		{
			if (c->in.len > SMTP_LINE_MAX * 4)
			{
				smtp_io_set_error(c, "%s sent a reply line without an end", c->peer);
				return false;
			}
			if (!smtp_io_fill(c, deadline))
				return false;
			continue;
		}
		len = (size_t) (nl - c->in.data);
		total += len + 1;
		if (len > 0 && c->in.data[len - 1] == '\r')
			len--;
		if (!smtp_reply_parse_line(c->in.data, len, &code, &last, &text))
		{
			smtp_io_set_error(c, "%s sent a malformed reply \"%.*s\"", c->peer,
							  (int) (len > 80 ? 80 : len), c->in.data);
			return false;
		}
		if (r->code == 0)
			r->code = code;
		if (lines++ > 0)
			buf_append_char(&r->text, '\n');
		{
			size_t tlen = len - (size_t) (text - c->in.data);

			if (tlen > SMTP_LINE_MAX)
				tlen = SMTP_LINE_MAX;
			buf_append(&r->text, text, tlen);
		}
		buf_consume(&c->in, (size_t) (nl - c->in.data) + 1);
		if (total > SMTP_REPLY_MAX)
		{
			smtp_io_set_error(c, "%s sent a reply longer than %d bytes", c->peer, SMTP_REPLY_MAX);
			return false;
		}
		if (last)
			break;
	}
	smtp_reply_enhanced(r);
	return true;
}

bool
smtp_io_command(struct smtp_client *c, struct smtp_reply *r, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

bool
smtp_io_command(struct smtp_client *c, struct smtp_reply *r, const char *fmt, ...)
{
	struct buf line = BUF_INIT;
	va_list	   ap;
	char	   text[2048];
	bool	   ok;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	buf_printf(&line, "%s\r\n", text);
	ok = smtp_io_write(c, line.data, line.len) && smtp_io_read_reply(c, r);
	buf_free(&line);
	return ok;
}

/* ---------------------------------------------------------------------------
 * Connecting and TLS
 * ------------------------------------------------------------------------- */

void
smtp_io_drop(struct smtp_client *c)
{
	if (c->ssl)
	{
		SSL_free(c->ssl);
		c->ssl = NULL;
	}
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	buf_reset(&c->in);
	c->state = SMTP_DISCONNECTED;
	c->need_rset = false;
}

static bool
smtp_connect_address(struct smtp_client *c, const struct addrinfo *ai, long long deadline)
{
	int		  fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
						  ai->ai_protocol);
	int		  one = 1;
	int		  soerr = 0;
	socklen_t slen = sizeof(soerr);

	if (fd < 0)
	{
		smtp_io_set_error(c, "socket: %s", strerror(errno));
		return false;
	}
	c->fd = fd;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0)
	{
		if (errno != EINPROGRESS)
		{
			smtp_io_set_error(c, "cannot connect to %s: %s", c->peer, strerror(errno));
			goto err;
		}
		if (!smtp_wait(c, POLLOUT, deadline))
		{
			smtp_io_set_error(c, "cannot connect to %s: timed out", c->peer);
			goto err;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &slen) != 0 || soerr != 0)
		{
			smtp_io_set_error(c, "cannot connect to %s: %s", c->peer, strerror(soerr ? soerr : errno));
			goto err;
		}
	}
	c->local_address[0] = '\0';
	if (ai->ai_family != AF_UNIX)
	{
		struct sockaddr_storage local;
		socklen_t				local_len = sizeof(local);

		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		/* The address we sent from, for TLS reports' sending-mta-ip (RFC 8460 4.3); best effort. */
		if (getsockname(fd, (struct sockaddr *) &local, &local_len) != 0
			|| getnameinfo((struct sockaddr *) &local, local_len, c->local_address, sizeof(c->local_address),
						   NULL, 0, NI_NUMERICHOST)
				   != 0)
			c->local_address[0] = '\0';
	}
	return true;
err:
	close(fd);
	c->fd = -1;
	return false;
}

/* A host that is a path: the Unix socket of a local server (LMTP, usually). */
static bool
smtp_connect_unix(struct smtp_client *c)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	struct addrinfo	   ai = {.ai_family = AF_UNIX, .ai_socktype = SOCK_STREAM};

	snprintf(c->peer, sizeof(c->peer), "unix:%s", c->opt.host);
	if (strlen(c->opt.host) >= sizeof(sun.sun_path))
	{
		smtp_io_set_error(c, "the socket path %s is longer than %zu bytes", c->opt.host,
						  sizeof(sun.sun_path) - 1);
		return false;
	}
	memcpy(sun.sun_path, c->opt.host, strlen(c->opt.host) + 1);
	ai.ai_addr = (struct sockaddr *) &sun;
	ai.ai_addrlen = sizeof(sun);
	return smtp_connect_address(c, &ai, smtp_io_now_ms() + c->opt.connect_timeout_ms);
}

bool
smtp_io_connect(struct smtp_client *c)
{
	struct addrinfo	 hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = c->opt.address ? AI_NUMERICHOST : 0};
	struct addrinfo *res = NULL;
	const char		*port = c->opt.port ? c->opt.port : "25";
	int				 rc;

	if (c->opt.host[0] == '/')
		return smtp_connect_unix(c);
	rc = getaddrinfo(c->opt.address ? c->opt.address : c->opt.host, port, &hints, &res);
	if (rc != 0)
	{
		smtp_io_set_error(c, "cannot resolve %s: %s", c->opt.host, gai_strerror(rc));
		return false;
	}
	for (struct addrinfo *ai = res; ai; ai = ai->ai_next)
	{
		char	  addr[INET6_ADDRSTRLEN] = "?";
		long long deadline = smtp_io_now_ms() + c->opt.connect_timeout_ms;

		getnameinfo(ai->ai_addr, ai->ai_addrlen, addr, sizeof(addr), NULL, 0, NI_NUMERICHOST);
		snprintf(c->peer, sizeof(c->peer), "%s[%s]:%s", c->opt.host, addr, port);
		if (smtp_connect_address(c, ai, deadline))
		{
			freeaddrinfo(res);
			return true;
		}
	}
	freeaddrinfo(res);
	return false;
}

/*
 * The TLS context of the session, made once: for a policy, DANE enabled
 * and the WebPKI trust anchors loaded (tls_policy.h); else as the tls
 * option says.
 */
static bool
smtp_tls_context(struct smtp_client *c, bool verify)
{
	char err[256] = "";

	if (c->ssl_ctx)
		return true;
	c->ssl_ctx = SSL_CTX_new(TLS_client_method());
	if (c->ssl_ctx == NULL)
	{
		smtp_io_set_error(c, "cannot create a TLS context: %s", smtp_io_ssl_error());
		return false;
	}
	SSL_CTX_set_min_proto_version(c->ssl_ctx, TLS1_2_VERSION);
	if (c->policy)
	{
		if (tls_policy_prepare_context(c->ssl_ctx, c->policy->ca_file, err, sizeof(err)))
			return true;
	}
	else if (!verify)
		return true;
	else
	{
		SSL_CTX_set_verify(c->ssl_ctx, SSL_VERIFY_PEER, NULL);
		if (c->opt.tls_ca_file ? SSL_CTX_load_verify_locations(c->ssl_ctx, c->opt.tls_ca_file, NULL) == 1
							   : SSL_CTX_set_default_verify_paths(c->ssl_ctx) == 1)
			return true;
		snprintf(err, sizeof(err), "cannot load the trust anchors%s%s: %s", c->opt.tls_ca_file ? " from " : "",
				 c->opt.tls_ca_file ? c->opt.tls_ca_file : "", smtp_io_ssl_error());
	}
	smtp_io_set_error(c, "%s", err);
	SSL_CTX_free(c->ssl_ctx);
	c->ssl_ctx = NULL;
	return false;
}

bool
smtp_io_tls_handshake(struct smtp_client *c, struct smtp_result *res)
{
	const char	   *name = c->opt.tls_name ? c->opt.tls_name : c->opt.host;
	long long		deadline = smtp_io_now_ms() + c->opt.command_timeout_ms;
	bool			verify = c->policy == NULL && c->opt.tls == SMTP_TLS_VERIFY;
	struct in6_addr addr6;
	struct in_addr	addr4;
	bool			is_ip = inet_pton(AF_INET, name, &addr4) == 1 || inet_pton(AF_INET6, name, &addr6) == 1;
	char			err[256];

	c->tls_verified = false;
	if (!smtp_tls_context(c, verify))
		return false;
	c->ssl = SSL_new(c->ssl_ctx);
	if (c->ssl == NULL || SSL_set_fd(c->ssl, c->fd) != 1)
	{
		smtp_io_set_error(c, "cannot start TLS: %s", smtp_io_ssl_error());
		return false;
	}
	if (c->policy)
	{
		if (!tls_policy_prepare(c->policy, c->ssl, err, sizeof(err)))
		{
			smtp_io_set_error(c, "TLS with %s: %s", c->peer, err);
			return false;
		}
	}
	else
	{
		if (!is_ip)
			SSL_set_tlsext_host_name(c->ssl, name);
		if (verify)
		{
			if (is_ip)
				X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), name);
			else
				SSL_set1_host(c->ssl, name);
		}
	}
	for (;;)
	{
		int n = SSL_connect(c->ssl);
		int ssl_error;

		if (n == 1)
			break;
		switch (smtp_tls_retry(c, n, deadline, &ssl_error))
		{
			case 1:
				continue;
			case 0:
				return false;
		}
		{
			long vr = SSL_get_verify_result(c->ssl);

			if (verify && vr != X509_V_OK)
				smtp_io_set_error(c, "TLS with %s failed: certificate not trusted for %s: %s",
								  c->peer, name, X509_verify_cert_error_string(vr));
			else
				smtp_io_set_error(c, "TLS with %s failed: %s", c->peer, smtp_io_ssl_error());
			if (c->policy)
			{
				snprintf(c->tls_outcome, sizeof(c->tls_outcome), "%s handshake failed", tls_policy_name(c->policy));
				snprintf(c->tls_result, sizeof(c->tls_result), "validation-failure");
			}
			return false;
		}
	}
	res->phase = SMTP_PHASE_STARTTLS;
	if (c->policy)
	{
		char reason[300];

		if (!tls_policy_check(c->policy, c->ssl, true, &c->tls_verified, c->tls_outcome,
							  sizeof(c->tls_outcome), c->tls_result, sizeof(c->tls_result), reason,
							  sizeof(reason)))
		{
			smtp_io_set_error(c, "TLS with %s refused by the %s policy: %s", c->peer,
							  tls_policy_name(c->policy), reason);
			return false;
		}
	}
	else
		c->tls_verified = verify;
	snprintf(c->tls, sizeof(c->tls), "%s %s %s", SSL_get_version(c->ssl), SSL_get_cipher_name(c->ssl),
			 c->tls_verified ? "verified" : "unverified");
	log_debug("TLS with %s: %s", c->peer, c->tls);
	return true;
}
