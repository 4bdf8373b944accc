/*
 * smtp-mix: the client of bench/ingress/policy.sh.  SESSIONS processes,
 * each one SMTP connection reused for its share of TRANSACTIONS, each
 * transaction one MAIL, one RCPT and (when the RCPT is taken) SIZE octets
 * of DATA.  The sessions have roles, by their number modulo 10:
 *   0-4  local:   from UNTRUSTED_ADDRESS, to an existing local mailbox
 *   5    unknown: from UNTRUSTED_ADDRESS, to a local user that does not
 *                 exist (refused at RCPT: the client sends RSET)
 *   6-9  relay:   from TRUSTED_ADDRESS, to a remote domain
 * so half the transactions are local and valid, a tenth unknown, the rest
 * relayed.  Prints "accepted refused seconds" when every session is done;
 * any reply it does not expect (a refused local or relay recipient, a
 * refused message) is an error.  Blocking sockets, one process per
 * session, as smtp-source does.
 *
 * usage: smtp-mix HOST PORT SESSIONS TRANSACTIONS SIZE LOCAL_DOMAIN MAILBOXES
 *                 TRUSTED_ADDRESS UNTRUSTED_ADDRESS
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct session
{
	int			fd;
	char		in[8192];
	size_t		have;
};

static void
die(const char *what)
{
	perror(what);
	exit(2);
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

			memmove(s->in, s->in + line, s->have - line);
			s->have -= line;
			if (more != '-')
				return code;
		}
		{
			ssize_t		n = read(s->fd, s->in + s->have, sizeof(s->in) - s->have);

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
		ssize_t		n = write(s->fd, data, len);

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
expect(int got, int want, const char *what)
{
	if (got != want)
	{
		fprintf(stderr, "smtp-mix: %s: %d, expected %d\n", what, got, want);
		exit(1);
	}
}

static int
session_run(int index, int count, const char *host, int port, const char *content,
			const char *domain, int mailboxes, const char *trusted, const char *untrusted)
{
	int			role = index % 10;
	const char *from = role >= 6 ? trusted : untrusted;
	struct sockaddr_in local = {.sin_family = AF_INET};
	struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons((uint16_t) port)};
	struct session s = {0};
	char		line[512];
	int			one = 1;

	inet_pton(AF_INET, from, &local.sin_addr);
	inet_pton(AF_INET, host, &peer.sin_addr);
	if ((s.fd = socket(AF_INET, SOCK_STREAM, 0)) < 0)
		die("socket");
	setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (bind(s.fd, (struct sockaddr *) &local, sizeof(local)) != 0)
		die("bind");
	if (connect(s.fd, (struct sockaddr *) &peer, sizeof(peer)) != 0)
		die("connect");
	expect(reply(&s), 220, "banner");
	expect(command(&s, "EHLO client.bench.test\r\n"), 250, "EHLO");
	for (int i = 0; i < count; i++)
	{
		int			code;

		expect(command(&s, "MAIL FROM:<sender@client.bench.test>\r\n"), 250, "MAIL");
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
			expect(code, 550, "RCPT of an unknown local user");
			expect(command(&s, "RSET\r\n"), 250, "RSET");
			continue;
		}
		expect(code, 250, role < 5 ? "RCPT of a local mailbox" : "RCPT of a relayed recipient");
		expect(command(&s, "DATA\r\n"), 354, "DATA");
		send_all(&s, content, strlen(content));
		expect(command(&s, ".\r\n"), 250, "end of DATA");
	}
	command(&s, "QUIT\r\n");
	close(s.fd);
	return 0;
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

	if (argc != 10)
	{
		fprintf(stderr, "usage: smtp-mix HOST PORT SESSIONS TRANSACTIONS SIZE LOCAL_DOMAIN "
				"MAILBOXES TRUSTED_ADDRESS UNTRUSTED_ADDRESS\n");
		return 64;
	}
	sessions = atoi(argv[3]);
	transactions = atoi(argv[4]);
	size = atoi(argv[5]);
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
			_exit(session_run(i, count, argv[1], atoi(argv[2]), content, argv[6], atoi(argv[7]),
							  argv[8], argv[9]));
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
