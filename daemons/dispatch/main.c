/*
 * main.c: pepsi-dispatch's entry point, signals and timers.
 *
 *   pepsi-dispatch [-c CONFIG] [-v]
 *
 * Runs in the foreground (a service manager supervises it).  SIGTERM and
 * SIGINT stop the workers, put every row they held back to pending, flush
 * the statistics and exit 0; SIGHUP (like a config_changed notification)
 * re-reads the configuration and retires the workers so that their
 * replacements read it too.  A configuration whose stage graph is broken
 * is refused at start, and ignored (with a warning) on a reload.  Started
 * as root it runs as [dispatch] USER (privilege_drop), never as root.
 */
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "config/log_config.h"
#include "dispatch.h"
#include "process/cli.h"
#include "process/privilege.h"
#include "process/service.h"

#define DISPATCH_HOUSEKEEPING_INTERVAL 0.1
#define DISPATCH_STOP_GRACE 10.0

int pepsi_dispatch_main(int argc, char **argv);

struct dispatcher dispatcher;

static ev_timer	 housekeeping_timer;
static ev_timer	 heartbeat_timer;
static ev_signal sigterm_watcher;
static ev_signal sigint_watcher;
static ev_signal sighup_watcher;
static double	 stop_requested_at;

double
now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Take a checked configuration into use (the dispatcher owns cfg from here). */
void
dispatch_apply_config(struct pepsi_config *cfg)
{
	char			   err[1024];
	struct stage_spec *specs;
	size_t			   count;
	static bool		   applied;
	bool			   starting = !applied;

	if (!graph_load(cfg, &specs, &count, err, sizeof(err)))
		count = 0, specs = NULL;
	else if (!graph_select_stages(cfg, specs, &count, err, sizeof(err)) || !dispatch_options_load(cfg, err, sizeof(err)))
	{
		graph_free(specs, count);
		specs = NULL;
	}
	if (specs == NULL)
	{
		if (starting)
			fatalx("%s", err);
		log_warnx("configuration not reloaded: %s", err);
		config_free(cfg);
		return;
	}
	pools_configure(specs, count);
	graph_free(specs, count);
	applied = true;
	if (dispatcher.cfg != cfg)
		config_free(dispatcher.cfg);
	dispatcher.cfg = cfg;
	ev_timer_set(&heartbeat_timer, dispatcher.poll_interval, dispatcher.poll_interval);
	ev_timer_again(dispatcher.loop, &heartbeat_timer);
	if (!starting)
		log_info("configuration reloaded; workers retire so their replacements read it");
	dbconn_want_claim(true);
}

void
dispatch_stop_requested(void)
{
	if (dispatcher.shutting_down)
		return;
	log_info("stopping: workers are stopped and their rows go back to pending");
	service_stopping();
	dispatcher.shutting_down = true;
	stop_requested_at = now_seconds();
	pools_stop_all();
}

static void
on_housekeeping(struct ev_loop *loop, ev_timer *watcher, int revents)
{
	double now = now_seconds();

	if (dispatcher.shutting_down)
	{
		if (now - stop_requested_at > DISPATCH_STOP_GRACE)
			pools_kill_all();
		if (pools_all_stopped())
		{
			dbconn_finish();
			ev_break(loop, EVBREAK_ALL);
		}
		return;
	}
	pools_housekeeping(now);
	maintenance_watch(now);
	/* Statistics: about once STATS_INTERVAL, and whenever the pipeline goes idle. */
	if (now - dispatcher.last_flush > dispatcher.stats_interval
		|| (pools_inflight() == 0 && dispatcher.last_activity > dispatcher.last_flush
			&& now - dispatcher.last_activity > 0.2))
		dbconn_flush_stats(false);
}

static void
on_heartbeat(struct ev_loop *loop, ev_timer *watcher, int revents)
{
	dbconn_want_claim(true);
}

static void
on_stop_signal(struct ev_loop *loop, ev_signal *watcher, int revents)
{
	dispatch_stop_requested();
}

static void
on_reload_signal(struct ev_loop *loop, ev_signal *watcher, int revents)
{
	dbconn_reload_config();
}

static char *
dispatch_self_exe(void)
{
	char	path[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);

	if (n <= 0)
		fatal("cannot find my own executable");
	path[n] = '\0';
	return xstrdup(path);
}

static void
usage(FILE *out)
{
	fprintf(out, "usage: pepsi-dispatch [-c CONFIG] [-v]\n"
				 "  CONFIG defaults to $PEPSI_CONFIG, then %s.\n",
			PEPSI_CONFIG_DEFAULT_PATH);
}

int
pepsi_dispatch_main(int argc, char **argv)
{
	const char *config_path;
	char		err[1024];
	char		resolved[PATH_MAX];
	const char *base;
	bool		help;

	log_init("pepsi-dispatch", false);
	if (argc >= 2 && cli_is_help(argv[1]))
	{
		usage(stdout);
		return 0;
	}
	if (!cli_daemon_options(argc, argv, &config_path, &help) || help)
	{
		usage(help ? stdout : stderr);
		return help ? 0 : 64;
	}
	/* Workers get the same file, whatever their working directory. */
	dispatcher.config_path = xstrdup(realpath(config_path, resolved) ? resolved : config_path);
	if ((dispatcher.cfg = config_load(dispatcher.config_path, err, sizeof(err))) == NULL
		|| !log_configure(dispatcher.cfg, err, sizeof(err)))
		fatalx("%s", err);
	{
		/* Check the file alone first: refuse to start before touching the database. */
		struct stage_spec *specs;
		size_t			   count;

		if (!graph_load(dispatcher.cfg, &specs, &count, err, sizeof(err))
			|| !graph_select_stages(dispatcher.cfg, specs, &count, err, sizeof(err))
			|| !dispatch_options_load(dispatcher.cfg, err, sizeof(err)))
			fatalx("%s", err);
		graph_free(specs, count);
	}
	dispatcher.self_exe = dispatch_self_exe();
	base = strrchr(dispatcher.self_exe, '/');
	dispatcher.self_multicall = strcmp(base ? base + 1 : dispatcher.self_exe, "pepsi") == 0;
	/*
	 * Stage workers parse mail and talk to the internet: started as root,
	 * the dispatcher becomes [dispatch] USER before it connects or starts
	 * one, and so do they.  What they read (this file on a reload, keys,
	 * secrets, the database's password file) must be readable by USER.
	 */
	privilege_drop(dispatcher.cfg, "dispatch");
	srandom((unsigned) (getpid() ^ time(NULL)));
	signal(SIGPIPE, SIG_IGN);

	dispatcher.loop = ev_default_loop(EVFLAG_AUTO);
	dispatcher.last_flush = now_seconds();
	ev_timer_init(&housekeeping_timer, on_housekeeping, DISPATCH_HOUSEKEEPING_INTERVAL,
				  DISPATCH_HOUSEKEEPING_INTERVAL);
	ev_timer_start(dispatcher.loop, &housekeeping_timer);
	ev_init(&heartbeat_timer, on_heartbeat);
	ev_signal_init(&sigterm_watcher, on_stop_signal, SIGTERM);
	ev_signal_start(dispatcher.loop, &sigterm_watcher);
	ev_signal_init(&sigint_watcher, on_stop_signal, SIGINT);
	ev_signal_start(dispatcher.loop, &sigint_watcher);
	ev_signal_init(&sighup_watcher, on_reload_signal, SIGHUP);
	ev_signal_start(dispatcher.loop, &sighup_watcher);

	log_info("starting (configuration %s; serving %s%s)", dispatcher.config_path,
			 dispatcher.stage_set_names, dispatcher.standby ? ", as a standby until the active dispatcher goes" : "");
	dbconn_start();
	/* Ready once started: it connects (and reconnects) to the database itself. */
	service_watchdog_start(dispatcher.loop);
	service_ready();
	ev_run(dispatcher.loop, 0);
	log_info("stopped");
	return 0;
}
