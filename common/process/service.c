/*
 * service.c: see service.h.  libsystemd's sd_notify speaks the protocol;
 * this file only fixes the messages, so the daemons say the same things.
 */
#include "process/service.h"

#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include <ev.h>
#include <systemd/sd-daemon.h>

void
service_ready(void)
{
	sd_notify(0, "READY=1");
}

void
service_reloading(void)
{
	char			message[64];
	struct timespec now;

	/* systemd 253 wants the monotonic time with RELOADING; older ones ignore it. */
	clock_gettime(CLOCK_MONOTONIC, &now);
	snprintf(message, sizeof(message), "RELOADING=1\nMONOTONIC_USEC=%llu",
			 (unsigned long long) now.tv_sec * 1000000ULL + (unsigned long long) now.tv_nsec / 1000);
	sd_notify(0, message);
}

void
service_reloaded(void)
{
	sd_notify(0, "READY=1");
}

void
service_stopping(void)
{
	sd_notify(0, "STOPPING=1");
}

void
service_status(const char *status)
{
	sd_notifyf(0, "STATUS=%s", status);
}

double
service_watchdog_interval(void)
{
	uint64_t usec = 0;

	if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
		return 0;
	return (double) usec / 2e6;
}

void
service_watchdog_ping(void)
{
	sd_notify(0, "WATCHDOG=1");
}

static void
service_on_watchdog(struct ev_loop *loop, ev_timer *timer, int revents)
{
	service_watchdog_ping();
}

void
service_watchdog_start(struct ev_loop *loop)
{
	static ev_timer watchdog;
	double			interval = service_watchdog_interval();

	if (interval <= 0)
		return;
	ev_timer_init(&watchdog, service_on_watchdog, interval, interval);
	ev_timer_start(loop, &watchdog);
	/* The loop must not stay alive for the watchdog alone. */
	ev_unref(loop);
}
