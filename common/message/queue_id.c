/* queue_id.c: see queue_id.h. */
#include "message/queue_id.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Postfix's long queue id alphabet: 52 symbols, no vowels. */
static const char queue_id_digits[] = "0123456789BCDFGHJKLMNPQRSTVWXYZbcdfghjklmnpqrstvwxyz";
#define QUEUE_ID_BASE 52
/* Ids one process makes in one second (three characters). */
#define QUEUE_ID_PER_SECOND (QUEUE_ID_BASE * QUEUE_ID_BASE * QUEUE_ID_BASE)

static pthread_mutex_t queue_id_lock = PTHREAD_MUTEX_INITIALIZER;
static time_t		   queue_id_second;
static unsigned		   queue_id_count;

/* value in width base-52 digits, most significant first (value below 52^width). */
static void
queue_id_put(char *out, unsigned long long value, int width)
{
	for (int i = width - 1; i >= 0; i--)
	{
		out[i] = queue_id_digits[value % QUEUE_ID_BASE];
		value /= QUEUE_ID_BASE;
	}
}

unsigned
queue_id_host(const struct pepsi_config *cfg)
{
	const char *name;
	uint32_t	hash = 2166136261u; /* FNV-1a */

	if (config_get(cfg, "pepsi", "HOST_ID"))
		return (unsigned) config_int(cfg, "pepsi", "HOST_ID");
	for (name = config_hostname(cfg); *name; name++)
	{
		hash ^= (unsigned char) (*name | 0x20);
		hash *= 16777619u;
	}
	return hash % QUEUE_ID_HOSTS;
}

void
queue_id_make(unsigned host, char *out)
{
	struct timespec now;
	unsigned		count;

	pthread_mutex_lock(&queue_id_lock);
	for (;;)
	{
		clock_gettime(CLOCK_REALTIME, &now);
		if (now.tv_sec != queue_id_second)
		{
			queue_id_second = now.tv_sec;
			queue_id_count = 0;
		}
		if (queue_id_count < QUEUE_ID_PER_SECOND)
			break;
		/* This second's ids are spent (140,608 of them): the next second has more. */
		nanosleep(&(struct timespec){.tv_nsec = 1000000000L - now.tv_nsec}, NULL);
	}
	count = queue_id_count++;
	pthread_mutex_unlock(&queue_id_lock);
	queue_id_put(out, (unsigned long long) now.tv_sec, 6);
	queue_id_put(out + 6, host % QUEUE_ID_HOSTS, 2);
	/* pid_max is at most 2^22, below 52^4 */
	queue_id_put(out + 8, (unsigned long long) getpid(), 4);
	queue_id_put(out + 12, count, 3);
	out[QUEUE_ID_LEN] = '\0';
}

bool
queue_id_valid(const char *s)
{
	return strlen(s) == QUEUE_ID_LEN && strspn(s, queue_id_digits) == QUEUE_ID_LEN;
}

const char *
queue_id_of(json_t *state, long long row_id, char *buf, size_t buflen)
{
	const char *id = json_string_value(json_object_get(state, "queue_id"));

	if (id && *id)
		return id;
	snprintf(buf, buflen, "%lld", row_id);
	return buf;
}
