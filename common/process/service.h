/*
 * service.h: telling systemd how a daemon is doing (sd_notify(3)), for
 * the Type=notify units in dist/systemd.  Without systemd (make run, the
 * tests) NOTIFY_SOCKET is unset and every call does nothing.
 */
#ifndef PEPSI_SERVICE_H
#define PEPSI_SERVICE_H

/* Start-up is complete: the daemon serves. */
void service_ready(void);
/* A reload (SIGHUP) begins, and ends. */
void service_reloading(void);
void service_reloaded(void);
/* Shutdown has begun. */
void service_stopping(void);
/* A one-line status for systemctl status. */
void service_status(const char *status);
/*
 * The watchdog: the interval at which service_watchdog_ping must be called
 * (half of WatchdogSec), in seconds; 0 when no watchdog is configured.
 */
double service_watchdog_interval(void);
void   service_watchdog_ping(void);

struct ev_loop;

/*
 * For the libev daemons: ping the watchdog from the loop, so that a loop
 * that stops turning (a handler stuck) is what systemd notices.
 */
void service_watchdog_start(struct ev_loop *loop);

#endif
