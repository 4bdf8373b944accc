/*
 * session.c: the SMTP sessions a relay-to-internet worker keeps open
 * across messages, a few per worker, keyed by MX host, address and every
 * option that shapes the connection (its TLS policy among them), so that
 * a message to a destination just delivered to reuses the connection.
 */
#include <stdlib.h>
#include <string.h>

#include "base/xalloc.h"
#include "internet.h"

#define INTERNET_SESSIONS_MAX 64

/* The open sessions of this worker, most recently used last. */
struct internet_session
{
	struct smtp_client *client;
	char			   *key;
};
static struct internet_session internet_sessions[INTERNET_SESSIONS_MAX];
static size_t				   internet_nsessions;
static struct smtp_client	  *internet_kept_client;

/* internet_close_all registered with atexit: the worker that ran us may be another stage's. */
static bool internet_close_at_exit;

struct smtp_client *
internet_session_kept(void)
{
	return internet_kept_client;
}

void
internet_session_keep(struct smtp_client *client)
{
	internet_kept_client = client;
}

void
internet_close_all(void)
{
	for (size_t i = 0; i < internet_nsessions; i++)
	{
		smtp_client_free(internet_sessions[i].client);
		free(internet_sessions[i].key);
	}
	internet_nsessions = 0;
	internet_kept_client = NULL;
}

/* The session for these options: an open one, or a new one (the oldest goes when full). */
struct smtp_client *
internet_session_for(const struct smtp_client_options *o, long long cache_size)
{
	char				   *key = xasprintf("%s|%s|%s|%d|%s|%s|%d|%d|%d|%d", o->host, o->address, o->port, (int) o->tls,
							o->tls_name ? o->tls_name : "", o->helo_name, o->connect_timeout_ms,
											o->command_timeout_ms, o->max_messages_per_connection, o->max_idle_ms);
	size_t					limit = cache_size < 1 ? 1 : cache_size > INTERNET_SESSIONS_MAX ? INTERNET_SESSIONS_MAX
																							: (size_t) cache_size;
	struct internet_session found;

	for (size_t i = 0; i < internet_nsessions; i++)
		if (strcmp(internet_sessions[i].key, key) == 0)
		{
			found = internet_sessions[i];
			memmove(&internet_sessions[i], &internet_sessions[i + 1],
					(internet_nsessions - i - 1) * sizeof(found));
			internet_sessions[internet_nsessions - 1] = found;
			free(key);
			return found.client;
		}
	while (internet_nsessions >= limit)
	{
		if (internet_sessions[0].client == internet_kept_client)
			internet_kept_client = NULL;
		smtp_client_free(internet_sessions[0].client);
		free(internet_sessions[0].key);
		memmove(&internet_sessions[0], &internet_sessions[1], (internet_nsessions - 1) * sizeof(found));
		internet_nsessions--;
	}
	if (!internet_close_at_exit)
		internet_close_at_exit = atexit(internet_close_all) == 0;
	found.client = smtp_client_new(o);
	found.key = key;
	internet_sessions[internet_nsessions++] = found;
	return found.client;
}

/* Close and forget a session (its destination is contended: no idle session to it). */
void
internet_session_close(const struct smtp_client *client)
{
	if (client == internet_kept_client)
		internet_kept_client = NULL;
	for (size_t i = 0; i < internet_nsessions; i++)
		if (internet_sessions[i].client == client)
		{
			smtp_client_free(internet_sessions[i].client);
			free(internet_sessions[i].key);
			memmove(&internet_sessions[i], &internet_sessions[i + 1],
					(internet_nsessions - i - 1) * sizeof(internet_sessions[0]));
			internet_nsessions--;
			return;
		}
}
