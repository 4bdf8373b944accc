/*
 * smtp-mix: the client of bench/ingress/policy.sh.  SESSIONS processes,
 * each one SMTP connection reused for its share of TRANSACTIONS, each
 * transaction one MAIL, one RCPT and (when the RCPT is taken) SIZE octets
 * of DATA.  The sessions have roles, by their number modulo 10:
 *   0-4  local:   from OTHER_ADDRESS, to an existing local mailbox
 *   5    unknown: from OTHER_ADDRESS, to a local user that does not exist
 *                 (refused at RCPT: the client sends RSET)
 *   6-9  relay:   from RELAY_ADDRESS, to a remote domain
 * so half the transactions are local and valid, a tenth unknown, the rest
 * relayed.  With -u USER -p PASSWORD a relay session authenticates before
 * its first transaction: EHLO, STARTTLS (the server's certificate is not
 * verified: a loopback benchmark), EHLO again, AUTH PLAIN; without them
 * the server must trust RELAY_ADDRESS.  Prints "accepted refused seconds"
 * when every session is done; any reply it does not expect (a refused
 * local or relay recipient, a refused message, a failed AUTH) is an error.
 * Blocking sockets, one process per session, as smtp-source does.
 *
 * With -r it sends no mail and checks that the server is no open relay:
 * one session from ADDRESS (with -t, after STARTTLS, still without AUTH)
 * gives MAIL and a RCPT to a remote domain, prints the reply to the RCPT,
 * and exits 0 when it refused it (454 or 554), 1 otherwise.
 *
 * usage: smtp-mix [-u USER -p PASSWORD] HOST PORT SESSIONS TRANSACTIONS SIZE
 *                 LOCAL_DOMAIN MAILBOXES RELAY_ADDRESS OTHER_ADDRESS
 *        smtp-mix -r [-t] HOST PORT ADDRESS
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* AUTH PLAIN's "\0user\0password", before base64. */
#define AUTH_MAX 512

struct session
{
	int			fd;
	SSL		   *ssl;			/* after STARTTLS */
	char		in[8192];
	size_t		have;
	char		last[512];		/* the last line of the last reply */
};

static void
die(const char *what)
{
	perror(what);
	exit(2);
}

static void
tls_die(const char *what)
{
	fprintf(stderr, "smtp-mix: %s failed\n", what);
	ERR_print_errors_fp(stderr);
	exit(2);
}

static ssize_t
session_read(struct session *s, char *buf, size_t len)
{
	if (s->ssl)
	{
		int			n = SSL_read(s->ssl, buf, (int) len);

		return n > 0 ? n : -1;
	}
	return read(s->fd, buf, len);
}

/* One reply (every line of it); returns its code. */
static int
reply(struct session *s)
{
	for (;;)
	{
		char	   *nl;

		while ((nl = memchr(s->in, '\n', s->have)) != NULL)
		{
			size_t		line = (size_t) (nl - s->in) + 1;
			int			code = atoi(s->in);
			char		more = line > 3 ? s->in[3] : ' ';

			snprintf(s->last, sizeof(s->last), "%.*s", (int) (line > 1 && nl[-1] == '\r' ? line - 2 : line - 1),
					 s->in);
			memmove(s->in, s->in + line, s->have - line);
			s->have -= line;
			if (more != '-')
				return code;
		}
		{
			ssize_t		n = session_read(s, s->in + s->have, sizeof(s->in) - s->have);

			if (n <= 0)
				die("read");
			s->have += (size_t) n;
		}
	}
}

static void
send_all(struct session *s, const char *data, size_t len)
{
	while (len > 0)
	{
		ssize_t		n;

		if (s->ssl)
		{
			/* Blocking, without partial writes: all of it or an error. */
			if (SSL_write(s->ssl, data, (int) len) <= 0)
				tls_die("SSL_write");
			return;
		}
		n = write(s->fd, data, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("write");
		data += n;
		len -= (size_t) n;
	}
}

static int
command(struct session *s, const char *line)
{
	send_all(s, line, strlen(line));
	return reply(s);
}

static void
expect(struct session *s, int got, int want, const char *what)
{
	if (got != want)
	{
		fprintf(stderr, "smtp-mix: %s: %d, expected %d (%s)\n", what, got, want, s->last);
		exit(1);
	}
}

/* Connect from address FROM and read the banner. */
static void
session_open(struct session *s, const char *host, int port, const char *from)
{
	struct sockaddr_in local = {.sin_family = AF_INET};
	struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons((uint16_t) port)};
	int			one = 1;

	memset(s, 0, sizeof(*s));
	if (inet_pton(AF_INET, from, &local.sin_addr) != 1 || inet_pton(AF_INET, host, &peer.sin_addr) != 1)
	{
		fprintf(stderr, "smtp-mix: %s or %s is not an IPv4 address\n", from, host);
		exit(64);
	}
	if ((s->fd = socket(AF_INET, SOCK_STREAM, 0)) < 0)
		die("socket");
	setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (bind(s->fd, (struct sockaddr *) &local, sizeof(local)) != 0)
		die("bind");
	if (connect(s->fd, (struct sockaddr *) &peer, sizeof(peer)) != 0)
		die("connect");
	expect(s, reply(s), 220, "banner");
	expect(s, command(s, "EHLO client.bench.test\r\n"), 250, "EHLO");
}

/* STARTTLS and the new EHLO it calls for (RFC 3207 4.2). */
static void
session_starttls(struct session *s)
{
	SSL_CTX    *ctx;

	expect(s, command(s, "STARTTLS\r\n"), 220, "STARTTLS");
	if (s->have != 0)
	{
		fprintf(stderr, "smtp-mix: the server sent more after its reply to STARTTLS\n");
		exit(1);
	}
	if ((ctx = SSL_CTX_new(TLS_client_method())) == NULL)
		tls_die("SSL_CTX_new");
	SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
	s->ssl = SSL_new(ctx);
	SSL_CTX_free(ctx);			/* the SSL holds its own reference */
	if (s->ssl == NULL || SSL_set_fd(s->ssl, s->fd) != 1 || SSL_connect(s->ssl) != 1)
		tls_die("the TLS handshake");
	expect(s, command(s, "EHLO client.bench.test\r\n"), 250, "EHLO after STARTTLS");
}

static void
session_auth_plain(struct session *s, const char *user, const char *password)
{
	unsigned char plain[AUTH_MAX];
	unsigned char encoded[AUTH_MAX / 3 * 4 + 8];
	char		line[sizeof(encoded) + 16];
	size_t		ulen = strlen(user),
				plen = strlen(password);

	plain[0] = '\0';
	memcpy(plain + 1, user, ulen);
	plain[1 + ulen] = '\0';
	memcpy(plain + 2 + ulen, password, plen);
	EVP_EncodeBlock(encoded, plain, (int) (ulen + plen + 2));
	snprintf(line, sizeof(line), "AUTH PLAIN %s\r\n", (const char *) encoded);
	expect(s, command(s, line), 235, "AUTH PLAIN");
}

static void
session_close(struct session *s)
{
	command(s, "QUIT\r\n");
	if (s->ssl)
		SSL_free(s->ssl);
	close(s->fd);
}

static int
session_run(int index, int count, const char *host, int port, const char *content,
			const char *domain, int mailboxes, const char *relay_address, const char *other_address,
			const char *user, const char *password)
{
	int			role = index % 10;
	struct session s;
	char		line[512];

	session_open(&s, host, port, role >= 6 ? relay_address : other_address);
	if (role >= 6 && user != NULL)
	{
		session_starttls(&s);
		session_auth_plain(&s, user, password);
	}
	for (int i = 0; i < count; i++)
	{
		int			code;

		expect(&s, command(&s, "MAIL FROM:<sender@client.bench.test>\r\n"), 250, "MAIL");
		if (role < 5)
			snprintf(line, sizeof(line), "RCPT TO:<u%d@%s>\r\n", (index * 7919 + i) % mailboxes + 1,
					 domain);
		else if (role == 5)
			snprintf(line, sizeof(line), "RCPT TO:<nobody%d@%s>\r\n", i, domain);
		else
			snprintf(line, sizeof(line), "RCPT TO:<r%d@remote%d.example>\r\n", i, index);
		code = command(&s, line);
		if (role == 5)
		{
			expect(&s, code, 550, "RCPT of an unknown local user");
			expect(&s, command(&s, "RSET\r\n"), 250, "RSET");
			continue;
		}
		expect(&s, code, 250, role < 5 ? "RCPT of a local mailbox" : "RCPT of a relayed recipient");
		expect(&s, command(&s, "DATA\r\n"), 354, "DATA");
		send_all(&s, content, strlen(content));
		expect(&s, command(&s, ".\r\n"), 250, "end of DATA");
	}
	session_close(&s);
	return 0;
}

/* -r: may ADDRESS relay without AUTH?  0 when the server refuses. */
static int
relay_probe(const char *host, int port, const char *address, bool tls)
{
	struct session s;
	int			code;

	session_open(&s, host, port, address);
	if (tls)
		session_starttls(&s);
	expect(&s, command(&s, "MAIL FROM:<sender@client.bench.test>\r\n"), 250, "MAIL");
	code = command(&s, "RCPT TO:<probe@remote.example>\r\n");
	printf("%s\n", s.last);
	session_close(&s);
	return code == 454 || code == 554 ? 0 : 1;
}

static void
usage(void)
{
	fprintf(stderr, "usage: smtp-mix [-u USER -p PASSWORD] HOST PORT SESSIONS TRANSACTIONS SIZE "
			"LOCAL_DOMAIN MAILBOXES RELAY_ADDRESS OTHER_ADDRESS\n"
			"       smtp-mix -r [-t] HOST PORT ADDRESS\n");
	exit(64);
}

int
main(int argc, char **argv)
{
	struct timespec start,
				end;
	int			sessions,
				transactions,
				size;
	char	   *content;
	size_t		len = 0;
	int			failed = 0;
	long		accepted = 0,
				refused = 0;
	const char *user = NULL,
			   *password = NULL;
	bool		probe = false,
				tls = false;
	int			opt;

	while ((opt = getopt(argc, argv, "p:rtu:")) != -1)
	{
		switch (opt)
		{
			case 'p':
				password = optarg;
				break;
			case 'r':
				probe = true;
				break;
			case 't':
				tls = true;
				break;
			case 'u':
				user = optarg;
				break;
			default:
				usage();
		}
	}
	argc -= optind;
	argv += optind;
	if (probe)
	{
		if (argc != 3 || user || password)
			usage();
		return relay_probe(argv[0], atoi(argv[1]), argv[2], tls);
	}
	if (argc != 9 || tls || (user == NULL) != (password == NULL))
		usage();
	if (user && strlen(user) + strlen(password) + 2 > AUTH_MAX)
	{
		fprintf(stderr, "smtp-mix: USER and PASSWORD are too long\n");
		return 64;
	}
	sessions = atoi(argv[2]);
	transactions = atoi(argv[3]);
	size = atoi(argv[4]);
	content = malloc((size_t) size + 256);
	len = (size_t) sprintf(content, "From: <sender@client.bench.test>\r\nSubject: bench\r\n\r\n");
	while (len + 80 < (size_t) size)
	{
		memcpy(content + len, "0123456789012345678901234567890123456789012345678901234567890123456789012345\r\n", 78);
		len += 78;
	}
	content[len] = '\0';

	clock_gettime(CLOCK_MONOTONIC, &start);
	for (int i = 0; i < sessions; i++)
	{
		int			count = transactions / sessions + (i < transactions % sessions);
		pid_t		pid = fork();

		if (pid < 0)
			die("fork");
		if (pid == 0)
			_exit(session_run(i, count, argv[0], atoi(argv[1]), content, argv[5], atoi(argv[6]),
							  argv[7], argv[8], user, password));
		if (i % 10 == 5)
			refused += count;
		else
			accepted += count;
	}
	for (int i = 0; i < sessions; i++)
	{
		int			status;

		if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
			failed++;
	}
	clock_gettime(CLOCK_MONOTONIC, &end);
	if (failed)
	{
		fprintf(stderr, "smtp-mix: %d sessions failed\n", failed);
		return 1;
	}
	printf("%ld %ld %.3f\n", accepted, refused,
		   (double) (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9);
	return 0;
}
