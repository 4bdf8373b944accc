/*
 * smtp-clients: the load generator of bench/ingress-defenses, the same
 * for both sides.  CLIENTS clients, each connecting from its own source
 * address (FIRST_ADDRESS, then the next ones: 127.0.0.11, 127.0.0.12...),
 * each sending an equal share of MESSAGES, PER_CONNECTION transactions a
 * connection (then QUIT and a new connection, so the servers' connection
 * checks run again and again), each transaction one MAIL, one RCPT to
 * RECIPIENT and, when the RCPT is taken, a message of about SIZE octets.
 * A client is one session at a time, except the first BOTS clients (-b),
 * which open SESSIONS (-s) at a time each, as a spam bot does, their share
 * split between them.  A RCPT refused with a 5xx reply (a listed client)
 * is counted refused and followed by RSET; any other reply it does not
 * expect is an error (the run is void).  Blocking sockets, one process a
 * session, as smtp-source does; every loop is bounded by the counts given.
 *
 * Prints one line a client, "client ADDRESS accepted N refused N seconds
 * S" (S when its last session ended), then "total accepted N refused N
 * seconds S accepted_seconds A cpu C": S when the last session ended, A
 * when the last client that had a message taken ended (the rate of taken
 * messages is measured over it), C the CPU seconds the clients used (to
 * tell whether the load generator itself was the bottleneck); all from
 * the first connection.
 *
 * usage: smtp-clients [-b BOTS -s SESSIONS] HOST PORT FIRST_ADDRESS CLIENTS MESSAGES PER_CONNECTION
 *                     SIZE RECIPIENT
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct session
{
	int			fd;
	char		in[8192];
	size_t		have;
	char		last[512];		/* the last line of the last reply */
	const char *from;			/* the source address, for messages */
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
		ssize_t		n;

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
		if (s->have == sizeof(s->in))
		{
			fprintf(stderr, "smtp-clients: %s: a reply line longer than %zu octets\n", s->from, sizeof(s->in));
			exit(1);
		}
		n = read(s->fd, s->in + s->have, sizeof(s->in) - s->have);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("read");
		if (n == 0)
		{
			fprintf(stderr, "smtp-clients: %s: the server closed the connection (last reply: %s)\n", s->from,
					s->last);
			exit(1);
		}
		s->have += (size_t) n;
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
expect(struct session *s, int got, int want, const char *what)
{
	if (got != want)
	{
		fprintf(stderr, "smtp-clients: %s: %s: %d, expected %d (%s)\n", s->from, what, got, want, s->last);
		exit(1);
	}
}

/* Connect from address FROM, read the banner, EHLO. */
static void
session_open(struct session *s, const struct sockaddr_in *peer, const char *from)
{
	struct sockaddr_in local = {.sin_family = AF_INET};
	int			one = 1;

	memset(s, 0, sizeof(*s));
	s->from = from;
	if (inet_pton(AF_INET, from, &local.sin_addr) != 1)
	{
		fprintf(stderr, "smtp-clients: %s is not an IPv4 address\n", from);
		exit(64);
	}
	if ((s->fd = socket(AF_INET, SOCK_STREAM, 0)) < 0)
		die("socket");
	setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	/* Many short connections from one address: let the port be reused at once. */
	setsockopt(s->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(s->fd, (const struct sockaddr *) &local, sizeof(local)) != 0)
		die("bind");
	if (connect(s->fd, (const struct sockaddr *) peer, sizeof(*peer)) != 0)
		die("connect");
	expect(s, reply(s), 220, "banner");
	expect(s, command(s, "EHLO client.bench.example\r\n"), 250, "EHLO");
}

static void
session_close(struct session *s)
{
	expect(s, command(s, "QUIT\r\n"), 221, "QUIT");
	close(s->fd);
}

/* One session's share: "accepted refused seconds" to OUT, seconds since START. */
static void
session_run(const struct sockaddr_in *peer, const char *from, int count, int per_connection,
			const char *content, const char *rcpt_line, const struct timespec *start, FILE *out)
{
	struct session s;
	struct timespec end;
	long		accepted = 0,
				refused = 0;
	int			done = 0;

	while (done < count)
	{
		int			batch = count - done < per_connection ? count - done : per_connection;

		session_open(&s, peer, from);
		for (int i = 0; i < batch; i++)
		{
			int			code;

			expect(&s, command(&s, "MAIL FROM:<sender@client.bench.example>\r\n"), 250, "MAIL");
			code = command(&s, rcpt_line);
			if (code >= 500 && code < 600)
			{
				refused++;
				expect(&s, command(&s, "RSET\r\n"), 250, "RSET");
				continue;
			}
			expect(&s, code, 250, "RCPT");
			expect(&s, command(&s, "DATA\r\n"), 354, "DATA");
			send_all(&s, content, strlen(content));
			expect(&s, command(&s, ".\r\n"), 250, "end of DATA");
			accepted++;
		}
		session_close(&s);
		done += batch;
	}
	clock_gettime(CLOCK_MONOTONIC, &end);
	fprintf(out, "%ld %ld %.3f\n", accepted, refused,
			(double) (end.tv_sec - start->tv_sec) + (end.tv_nsec - start->tv_nsec) / 1e9);
	fflush(out);
}

static void
usage(void)
{
	fprintf(stderr, "usage: smtp-clients [-b BOTS -s SESSIONS] HOST PORT FIRST_ADDRESS CLIENTS MESSAGES "
			"PER_CONNECTION SIZE RECIPIENT\n");
	exit(64);
}

struct client
{
	char		address[INET_ADDRSTRLEN];
	long		accepted;
	long		refused;
	double		seconds;		/* when its last session ended */
};

struct worker
{
	int			client;
	FILE	   *result;
};

int
main(int argc, char **argv)
{
	struct sockaddr_in peer = {.sin_family = AF_INET};
	struct in_addr first;
	struct timespec start,
				end;
	int			clients,
				messages,
				per_connection,
				size,
				bots = 0,
				bot_sessions = 1,
				workers = 0,
				opt;
	char	   *content;
	char		rcpt_line[512];
	size_t		len;
	int			failed = 0;
	long		total_accepted = 0,
				total_refused = 0;
	double		accepted_seconds = 0;
	struct rusage used;
	struct client *client;
	struct worker *worker;

	while ((opt = getopt(argc, argv, "b:s:")) != -1)
	{
		switch (opt)
		{
			case 'b':
				bots = atoi(optarg);
				break;
			case 's':
				bot_sessions = atoi(optarg);
				break;
			default:
				usage();
		}
	}
	argc -= optind;
	argv += optind;
	if (argc != 8)
		usage();
	clients = atoi(argv[3]);
	messages = atoi(argv[4]);
	per_connection = atoi(argv[5]);
	size = atoi(argv[6]);
	if (inet_pton(AF_INET, argv[0], &peer.sin_addr) != 1 || inet_pton(AF_INET, argv[2], &first) != 1
		|| atoi(argv[1]) <= 0 || atoi(argv[1]) > 65535 || clients <= 0 || clients > 200 || messages < clients
		|| per_connection <= 0 || size < 100 || size > 10 * 1024 * 1024 || strlen(argv[7]) > 400 || bots < 0
		|| bots > clients || bot_sessions < 1 || bot_sessions > 100
		|| messages / clients < bot_sessions)
		usage();
	peer.sin_port = htons((uint16_t) atoi(argv[1]));
	snprintf(rcpt_line, sizeof(rcpt_line), "RCPT TO:<%s>\r\n", argv[7]);

	content = malloc((size_t) size + 256);
	client = calloc((size_t) clients, sizeof(*client));
	worker = calloc((size_t) (clients + bots * bot_sessions), sizeof(*worker));
	if (content == NULL || client == NULL || worker == NULL)
		die("malloc");
	len = (size_t) sprintf(content, "From: <sender@client.bench.example>\r\nTo: <%s>\r\nSubject: bench\r\n\r\n",
						   argv[7]);
	while (len + 80 < (size_t) size)
	{
		memcpy(content + len, "0123456789012345678901234567890123456789012345678901234567890123456789012345\r\n", 78);
		len += 78;
	}
	content[len] = '\0';

	clock_gettime(CLOCK_MONOTONIC, &start);
	for (int i = 0; i < clients; i++)
	{
		int			count = messages / clients + (i < messages % clients);
		int			sessions = i < bots ? bot_sessions : 1;
		struct in_addr from = {.s_addr = htonl(ntohl(first.s_addr) + (uint32_t) i)};

		inet_ntop(AF_INET, &from, client[i].address, sizeof(client[i].address));
		for (int j = 0; j < sessions; j++)
		{
			int			share = count / sessions + (j < count % sessions);
			int			fds[2];
			pid_t		pid;

			if (pipe(fds) != 0)
				die("pipe");
			if ((pid = fork()) < 0)
				die("fork");
			if (pid == 0)
			{
				FILE	   *out = fdopen(fds[1], "w");

				close(fds[0]);
				for (int k = 0; k < workers; k++)
					fclose(worker[k].result);
				if (out == NULL)
					die("fdopen");
				session_run(&peer, client[i].address, share, per_connection, content, rcpt_line, &start, out);
				_exit(0);
			}
			close(fds[1]);
			worker[workers].client = i;
			if ((worker[workers++].result = fdopen(fds[0], "r")) == NULL)
				die("fdopen");
		}
	}
	for (int k = 0; k < workers; k++)
	{
		int			status;

		if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
			failed++;
	}
	clock_gettime(CLOCK_MONOTONIC, &end);
	if (failed)
	{
		fprintf(stderr, "smtp-clients: %d sessions failed\n", failed);
		return 1;
	}
	for (int k = 0; k < workers; k++)
	{
		struct client *c = &client[worker[k].client];
		long		accepted,
					refused;
		double		seconds;

		if (fscanf(worker[k].result, "%ld %ld %lf", &accepted, &refused, &seconds) != 3)
		{
			fprintf(stderr, "smtp-clients: a session of client %s reported nothing\n", c->address);
			return 1;
		}
		c->accepted += accepted;
		c->refused += refused;
		if (seconds > c->seconds)
			c->seconds = seconds;
	}
	for (int i = 0; i < clients; i++)
	{
		printf("client %s accepted %ld refused %ld seconds %.3f\n", client[i].address, client[i].accepted,
			   client[i].refused, client[i].seconds);
		total_accepted += client[i].accepted;
		total_refused += client[i].refused;
		if (client[i].accepted > 0 && client[i].seconds > accepted_seconds)
			accepted_seconds = client[i].seconds;
	}
	getrusage(RUSAGE_CHILDREN, &used);
	printf("total accepted %ld refused %ld seconds %.3f accepted_seconds %.3f cpu %.2f\n", total_accepted,
		   total_refused, (double) (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9,
		   accepted_seconds,
		   (double) (used.ru_utime.tv_sec + used.ru_stime.tv_sec)
		   + (used.ru_utime.tv_usec + used.ru_stime.tv_usec) / 1e6);
	return 0;
}
