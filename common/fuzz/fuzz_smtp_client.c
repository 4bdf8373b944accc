/*
 * fuzz_smtp_client.c: libFuzzer target for what the relay stages' SMTP
 * and LMTP client (common/smtp/smtp_client.c, smtp_client_io.c,
 * smtp_transaction.c) reads from the server: the greeting, multi-line
 * replies and their enhanced status codes, the EHLO keywords (SIZE, AUTH,
 * CHUNKING, ...), the 334 challenges of AUTH, the replies to a pipelined
 * envelope, LMTP's reply per recipient after the data.  "make fuzz" runs
 * it.
 *
 * The server is a thread of this program on a Unix socket (the client
 * takes a path for a host, as for LMTP): for each connection it writes the
 * input, closes its sending side, and reads what the client sends until
 * the client hangs up.  No network, no DNS: opportunistic STARTTLS, when
 * the input offers it, fails its handshake on the rest of the input.
 *
 * Input: one byte of flags (bit 0: LMTP; 1: AUTH as a user; 2: STARTTLS
 * when offered; 3: an 8-bit body; 4: SMTPUTF8 wanted; 5: DSN parameters;
 * 6: REQUIRETLS), then the server's side of the session.
 */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "smtp/smtp_client.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char			   fuzz_path[108];
static int			   fuzz_listener = -1;
static pthread_mutex_t fuzz_lock = PTHREAD_MUTEX_INITIALIZER;
static const uint8_t  *fuzz_script;
static size_t		   fuzz_script_len;
static sem_t		   fuzz_done;

static void
fuzz_cleanup(void)
{
	unlink(fuzz_path);
}

static void *
fuzz_server(void *arg)
{
	for (;;)
	{
		int		fd = accept(fuzz_listener, NULL, NULL);
		char	sink[4096];
		size_t	off = 0;
		ssize_t n;

		if (fd < 0)
		{
			if (errno == EINTR)
				continue;
			abort();
		}
		pthread_mutex_lock(&fuzz_lock);
		while (off < fuzz_script_len && (n = write(fd, fuzz_script + off, fuzz_script_len - off)) > 0)
			off += (size_t) n;
		pthread_mutex_unlock(&fuzz_lock);
		shutdown(fd, SHUT_WR);
		while ((n = read(fd, sink, sizeof(sink))) > 0 || (n < 0 && errno == EINTR))
			;
		close(fd);
		sem_post(&fuzz_done);
	}
	return arg;
}

static void
fuzz_start(void)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	pthread_t		   thread;

	snprintf(fuzz_path, sizeof(fuzz_path), "/tmp/pepsi-fuzz-smtp-client.%d", (int) getpid());
	memcpy(sun.sun_path, fuzz_path, strlen(fuzz_path) + 1);
	unlink(fuzz_path);
	fuzz_listener = socket(AF_UNIX, SOCK_STREAM, 0);
	if (fuzz_listener < 0 || bind(fuzz_listener, (struct sockaddr *) &sun, sizeof(sun)) != 0
		|| listen(fuzz_listener, 4) != 0)
		abort();
	atexit(fuzz_cleanup);
	signal(SIGPIPE, SIG_IGN); /* a client that hung up early */
	sem_init(&fuzz_done, 0, 0);
	if (pthread_create(&thread, NULL, fuzz_server, NULL) != 0)
		abort();
	pthread_detach(thread);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const   rcpt[] = {"bob@example.net", "carol@example.net"};
	static const char *const   notify[] = {"SUCCESS,FAILURE", "NEVER"};
	static const char *const   orcpt[] = {"rfc822;bob@example.net", "rfc822;carol+x@example.net"};
	static const char		   plain[] = "From: alice@example.org\r\nTo: bob@example.net\r\nSubject: hi\r\n\r\n"
										 "Hello\r\n.leading dot\r\n";
	static const char		   eight[] = "From: alice@example.org\r\nMIME-Version: 1.0\r\nContent-Type: text/plain;"
										 " charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\ncaf\xc3\xa9\r\n";
	struct smtp_client_options opt;
	struct smtp_envelope	   env;
	struct smtp_client		  *c;
	struct smtp_result		   res;
	struct timespec			   until;
	uint8_t					   flags;

	if (size < 1)
		return 0;
	if (fuzz_listener < 0)
		fuzz_start();
	flags = data[0];
	pthread_mutex_lock(&fuzz_lock);
	fuzz_script = data + 1;
	fuzz_script_len = size - 1;
	pthread_mutex_unlock(&fuzz_lock);

	memset(&opt, 0, sizeof(opt));
	opt.host = fuzz_path;
	opt.tls = flags & 4 ? SMTP_TLS_MAY : SMTP_TLS_NONE;
	opt.helo_name = "relay.example.org";
	opt.auth_user = flags & 2 ? "user" : NULL;
	opt.auth_password = flags & 2 ? "secret" : NULL;
	opt.connect_timeout_ms = 2000;
	opt.command_timeout_ms = 2000;
	opt.lmtp = flags & 1;
	memset(&env, 0, sizeof(env));
	env.mail_from = flags & 0x80 ? "" : "alice@example.org";
	env.rcpt = rcpt;
	env.nrcpt = 2;
	env.body_8bit = flags & 8;
	env.smtputf8 = flags & 0x10;
	env.requiretls = flags & 0x40;
	if (flags & 0x20)
	{
		env.ret = "HDRS";
		env.envid = "QQ+id=1";
		env.notify = notify;
		env.orcpt = orcpt;
	}

	c = smtp_client_new(&opt);
	if (flags & 8)
		smtp_client_send(c, &env, eight, sizeof(eight) - 1, &res);
	else
		smtp_client_send(c, &env, plain, sizeof(plain) - 1, &res);
	smtp_result_free(&res);
	smtp_client_free(c);

	/* the server is done with this input before libFuzzer frees it */
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5;
	while (sem_timedwait(&fuzz_done, &until) != 0 && errno == EINTR)
		;
	return 0;
}
