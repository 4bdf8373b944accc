/*
 * noop-milter: the filter of bench/milter, a milter that asks for every
 * protocol step and answers each with CONTINUE, so the benchmark measures
 * the two MTAs' side of the protocol rather than a filter.  One thread
 * per connection; it changes nothing.  On SIGUSR1 it prints how many
 * messages it has seen, so the benchmark can check that each side's
 * messages did go through it.
 *
 *   noop-milter PORT
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static unsigned long messages_seen;

/* write(2) alone: a signal handler may not use stdio. */
static void
print_count(int signo)
{
	char		line[32] = "messages ";
	char		digits[24];
	unsigned long n = __atomic_load_n(&messages_seen, __ATOMIC_RELAXED);
	size_t		len = 0;
	size_t		at = 9;

	(void) signo;
	do
		digits[len++] = (char) ('0' + n % 10);
	while ((n /= 10) > 0);
	while (len > 0)
		line[at++] = digits[--len];
	line[at++] = '\n';
	if (write(STDOUT_FILENO, line, at) < 0)
		return;
}

static int
read_exact(int fd, void *buffer, size_t len)
{
	size_t		done = 0;

	while (done < len)
	{
		ssize_t		n = read(fd, (char *) buffer + done, len - done);

		if (n <= 0)
			return -1;
		done += (size_t) n;
	}
	return 0;
}

static int
reply(int fd, char command, const void *payload, uint32_t len)
{
	unsigned char head[5];
	uint32_t	total = htonl(len + 1);

	memcpy(head, &total, 4);
	head[4] = (unsigned char) command;
	if (write(fd, head, 5) != 5)
		return -1;
	return len && write(fd, payload, len) != (ssize_t) len ? -1 : 0;
}

static void *
serve(void *arg)
{
	int			fd = (int) (intptr_t) arg;
	char	   *packet = malloc(1 << 20);

	for (;;)
	{
		uint32_t	len;

		if (read_exact(fd, &len, 4) != 0)
			break;
		len = ntohl(len);
		if (len == 0 || len > (1 << 20) || read_exact(fd, packet, len) != 0)
			break;
		switch (packet[0])
		{
			case 'O':
				{
					uint32_t	options[3] = {htonl(6), 0, 0};

					if (reply(fd, 'O', options, sizeof(options)) != 0)
						goto done;
				}
				break;
			case 'D':			/* macros, abort, quit-new-connection: no reply */
			case 'A':
			case 'K':
				break;
			case 'Q':
				goto done;
			case 'E':
				__atomic_add_fetch(&messages_seen, 1, __ATOMIC_RELAXED);
				/* FALLTHROUGH */
			default:
				if (reply(fd, 'c', NULL, 0) != 0)
					goto done;
		}
	}
done:
	free(packet);
	close(fd);
	return NULL;
}

int
main(int argc, char **argv)
{
	struct sockaddr_in sin = {.sin_family = AF_INET};
	int			listener = socket(AF_INET, SOCK_STREAM, 0);
	int			one = 1;

	if (argc != 2)
	{
		fprintf(stderr, "usage: noop-milter PORT\n");
		return 2;
	}
	signal(SIGUSR1, print_count);
	signal(SIGPIPE, SIG_IGN);
	sin.sin_port = htons((uint16_t) atoi(argv[1]));
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(listener, (struct sockaddr *) &sin, sizeof(sin)) != 0 || listen(listener, 256) != 0)
	{
		perror("noop-milter");
		return 1;
	}
	for (;;)
	{
		int			fd = accept(listener, NULL, NULL);
		pthread_t	thread;

		if (fd < 0)
			continue;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (pthread_create(&thread, NULL, serve, (void *) (intptr_t) fd) != 0)
			close(fd);
		else
			pthread_detach(thread);
	}
}
