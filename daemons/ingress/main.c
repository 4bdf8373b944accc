/*
 * pepsi-ingress: the SMTP server that admits mail into the queue
 * (docs/architecture.md 5).
 *
 * Start-up, in this order: read the configuration (and the overlay, for
 * every section but [database] and [listener-*]); load certificates and
 * credentials; bind every listener; drop privileges; then serve from one
 * libev loop until SIGTERM, when listeners close, sessions get a 421, and
 * messages already handed to the database are answered before exiting.
 */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <netdb.h>
#include <pwd.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include "admit.h"
#include "auth_throttle.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "config/log_config.h"
#include "db_query.h"
#include "ingress.h"
#include "message/queue_id.h"
#include "process/cli.h"
#include "process/privilege.h"
#include "process/secret.h"
#include "process/service.h"
#include "runtime/db.h"
#include "screen.h"
#include "sender_login.h"

#define INGRESS_SHUTDOWN_GRACE 10.0
#define LISTENER_ACCEPT_BACKOFF 1.0 /* seconds a listener rests when out of descriptors */
#define INGRESS_REPORT_INTERVAL 5.0 /* seconds between reports to pepsi.ingress_stats */

int pepsi_ingress_main(int argc, char **argv);

struct ingress ingress;

static ev_timer ingress_grace_timer;

static void
ingress_usage(FILE *out)
{
	fprintf(out, "usage: pepsi-ingress [-c CONFIG] [-v]\n"
				 "  CONFIG defaults to $PEPSI_CONFIG, then %s.\n",
			PEPSI_CONFIG_DEFAULT_PATH);
}

/*
 * Listeners
 */

/*
 * The limits of [section] from cfg, set in l (the listener being opened,
 * or a running one on reload: a session started before keeps reading
 * them).  All are read before any is set: false with err, and l as it
 * was, when one is bad.
 */
bool
listener_limits_apply(const struct pepsi_config *cfg, const char *section, struct listener *l,
					  char *err, size_t errlen)
{
	char problem[512];

	/* Checked against schema/options.def when cfg was loaded; MILTERS's braces are checked here. */
	l->policy.max_size = (size_t) config_size(cfg, section, "MAX_SIZE");
	l->policy.max_recipients = (size_t) config_int(cfg, section, "MAX_RECIPIENTS");
	l->policy.max_line_length = (size_t) config_int(cfg, section, "MAX_LINE_LENGTH");
	l->policy.max_header_fields = (size_t) config_int(cfg, section, "MAX_HEADER_FIELDS");
	l->policy.max_header_size = (size_t) config_size(cfg, section, "MAX_HEADER_SIZE");
	l->policy.max_errors = (unsigned) config_int(cfg, section, "MAX_ERRORS");
	l->policy.command_rate = (unsigned) config_int(cfg, section, "COMMAND_RATE");
	l->idle_timeout = config_duration_ms(cfg, section, "IDLE_TIMEOUT") / 1000.0;
	l->session_deadline = config_duration_ms(cfg, section, "SESSION_DEADLINE") / 1000.0;
	l->min_data_rate = (double) config_int(cfg, section, "MIN_DATA_RATE");
	l->max_sessions = (size_t) config_int(cfg, section, "MAX_SESSIONS");
	l->max_sessions_per_client = (size_t) config_int(cfg, section, "MAX_SESSIONS_PER_CLIENT");
	l->pregreet_wait = config_duration_ms(cfg, section, "PREGREET_WAIT") / 1000.0;
	l->greylist = config_bool(cfg, section, "GREYLIST");
	l->greylist_delay = config_duration_ms(cfg, section, "GREYLIST_DELAY") / 1000.0;
	l->greylist_expire = config_duration_ms(cfg, section, "GREYLIST_EXPIRE") / 1000.0;
	l->greylist_auto_whitelist = config_duration_ms(cfg, section, "GREYLIST_AUTO_WHITELIST") / 1000.0;
	/* l is fresh (start) or a reload's staged copy: no list of its own yet. */
	l->milters = (struct milter_gate_list){0};
	if (!milter_gate_list_load(config_get(cfg, section, "MILTERS"), &l->milters, problem, sizeof(problem)))
	{
		snprintf(err, errlen, "%s: [%s] %s", cfg->path, section, problem);
		return false;
	}
	l->policy.helo_accepted = l->milters.count ? session_milter_helo : NULL;
	l->policy.milter_envelope = l->milters.count ? session_milter_envelope : NULL;
	return true;
}

/*
 * The TLS context of [section] from cfg: *ctx NULL when it has no
 * CERTIFICATE (plain smtp); false with err when the pair is incomplete,
 * unreadable or does not match, or the mode needs TLS and has none.
 * (Also what a reload reads, so nothing here is fatal.)
 *
 * The key is read again at every reload, by then as [ingress] USER: it
 * must be readable by that user (its own, or root's with the user's
 * group, mode 0640), which pepsi_ingress_main checks right after the
 * privilege drop, and by no one else (secret_key_open).  A privileged
 * parent holding the keys (OpenSMTPD's other way) would keep a root
 * process beside the network one for the sake of one file; a key the
 * daemon may read keeps pepsi-ingress one unprivileged process.
 */
bool
listener_tls_load(const struct pepsi_config *cfg, const char *section, enum listener_mode mode,
				  SSL_CTX **ctx, char *err, size_t errlen)
{
	const char *certificate = config_get(cfg, section, "CERTIFICATE");
	const char *key = config_get(cfg, section, "KEY");
	char		reason[512] = "";
	EVP_PKEY   *private_key = NULL;
	FILE	   *key_file;

	*ctx = NULL;
	if (certificate == NULL && key == NULL)
	{
		if (mode == LISTENER_SMTP)
			return true;
		snprintf(err, errlen, "%s: [%s] MODE = %s needs CERTIFICATE and KEY", cfg->path, section,
				 mode == LISTENER_SMTPS ? "smtps" : "submission");
		return false;
	}
	if (certificate == NULL || key == NULL)
	{
		snprintf(err, errlen, "%s: [%s] needs both CERTIFICATE and KEY", cfg->path, section);
		return false;
	}
	if ((key_file = secret_key_open(key, reason, sizeof(reason))) == NULL)
	{
		snprintf(err, errlen, "[%s] KEY %s", section, reason);
		return false;
	}
	private_key = PEM_read_PrivateKey(key_file, NULL, NULL, NULL);
	fclose(key_file);
	if ((*ctx = SSL_CTX_new(TLS_server_method())) == NULL)
		goto err;
	SSL_CTX_set_min_proto_version(*ctx, TLS1_2_VERSION);
	/* Idle TLS sessions give their record buffers back. */
	SSL_CTX_set_mode(*ctx, SSL_MODE_RELEASE_BUFFERS | SSL_MODE_ENABLE_PARTIAL_WRITE
							   | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	SSL_CTX_set_options(*ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
	/*
	 * A record in one read() rather than two (its header, then the rest),
	 * and the records a client pipelined in that same read.
	 */
	SSL_CTX_set_read_ahead(*ctx, 1);
	if (SSL_CTX_use_certificate_chain_file(*ctx, certificate) != 1
		|| private_key == NULL || SSL_CTX_use_PrivateKey(*ctx, private_key) != 1
		|| SSL_CTX_check_private_key(*ctx) != 1)
		goto err;
	EVP_PKEY_free(private_key); /* the context holds its own reference */
	SSL_CTX_set_session_id_context(*ctx, (const unsigned char *) section, (unsigned) strlen(section));
	return true;

err:
	ERR_error_string_n(ERR_get_error(), reason, sizeof(reason));
	ERR_clear_error();
	snprintf(err, errlen, "[%s] cannot load CERTIFICATE %s / KEY %s: %s", section, certificate, key,
			 reason);
	EVP_PKEY_free(private_key);
	SSL_CTX_free(*ctx);
	*ctx = NULL;
	return false;
}

static void
listener_on_accept(struct ev_loop *loop, ev_io *w, int revents)
{
	struct listener *l = w->data;

	for (int i = 0; i < 64; i++)
	{
		struct sockaddr_storage addr;
		socklen_t				len = sizeof(addr);
		int						fd = accept4(l->fd, (struct sockaddr *) &addr, &len,
											 SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0)
		{
			/*
			 * Out of descriptors the connection stays pending and the socket
			 * stays readable: without a pause the loop would spin on it.
			 */
			if (errno == EMFILE || errno == ENFILE)
			{
				log_warn("listener %s: accept; pausing it for %.0f s", l->name,
						 LISTENER_ACCEPT_BACKOFF);
				ev_io_stop(loop, &l->io);
				ev_timer_start(loop, &l->backoff);
			}
			return;
		}
		session_accept(l, fd, (struct sockaddr *) &addr);
	}
}

static void
listener_on_backoff(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct listener *l = w->data;

	if (!ingress.stopping)
		ev_io_start(loop, &l->io);
}

static int
listener_bind(const char *section, const char *address, long port)
{
	struct addrinfo	 hints = {.ai_flags = AI_PASSIVE | AI_NUMERICSERV, .ai_socktype = SOCK_STREAM};
	struct addrinfo *res = NULL;
	char			 service[16];
	int				 fd = -1;
	int				 on = 1;
	int				 rc;

	snprintf(service, sizeof(service), "%ld", port);
	if ((rc = getaddrinfo(strcmp(address, "*") == 0 ? NULL : address, service, &hints, &res)) != 0)
		fatalx("[%s] ADDRESS %s: %s", section, address, gai_strerror(rc));
	fd = socket(res->ai_family, res->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, res->ai_protocol);
	if (fd < 0)
		goto err;
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) != 0)
		goto err;
	if (bind(fd, res->ai_addr, res->ai_addrlen) != 0)
		goto err;
	if (listen(fd, 4096) != 0)
		goto err;
	freeaddrinfo(res);
	return fd;

err:
	fatal("[%s] cannot listen on %s port %ld", section, address, port);
}

/* The listener's own TRUSTED_NETWORKS, else [ingress]'s, else loopback only. */
bool
listener_trusted_networks_load(const struct pepsi_config *cfg, const char *section,
							   struct trusted_networks *out, char *err, size_t errlen)
{
	const char *where = section;
	const char *list = config_get(cfg, section, "TRUSTED_NETWORKS");
	char		reason[512];
	char		origin[512];

	if (list == NULL)
	{
		where = "ingress";
		list = config_get(cfg, "ingress", "TRUSTED_NETWORKS");
	}
	if (list == NULL)
		list = RELAY_DEFAULT_TRUSTED_NETWORKS;
	if (trusted_networks_parse(list, out, reason, sizeof(reason)))
		return true;
	snprintf(err, errlen, "%s: [%s] TRUSTED_NETWORKS: %s",
			 config_origin(cfg, where, "TRUSTED_NETWORKS", origin, sizeof(origin)), where, reason);
	return false;
}

/*
 * Everything [section] of cfg sets in a listener but its socket (ADDRESS,
 * PORT) and MODE, which l has: at start, and on reload into a copy that
 * replaces the running listener's settings as a whole (reload.c).  auth:
 * [ingress] CREDENTIALS are loaded.  False with err when a value is bad;
 * what was loaded into l is then freed by the caller (listener_settings_free).
 */
bool
listener_configure(const struct pepsi_config *cfg, const char *section, bool auth,
				   struct listener *l, char *err, size_t errlen)
{
	if (!listener_tls_load(cfg, section, l->mode, &l->tls, err, errlen)
		|| !listener_limits_apply(cfg, section, l, err, errlen)
		|| !listener_trusted_networks_load(cfg, section, &l->trusted, err, errlen)
		|| !verify_listener_policy(cfg, section, &l->verify, err, errlen))
		return false;
	l->policy.hostname = ingress.hostname;
	l->policy.rcpt_check = session_rcpt_check;
	l->policy.memory_in_flight = &ingress.memory_in_flight;
	l->policy.memory_limit = ingress.memory_limit;
	l->policy.srs_reverse = srs_rcpt_enabled() ? srs_rcpt_reverse : NULL;
	l->policy.mail_accepted = session_mail_accepted;
	l->policy.screen = l->mode == LISTENER_SMTP ? session_screen_verdict : NULL;
	l->policy.violation = l->mode == LISTENER_SMTP ? session_screen_violation : NULL;
	l->policy.starttls = l->tls != NULL && l->mode != LISTENER_SMTPS;
	l->policy.auth = auth;
	l->policy.auth_required = l->mode != LISTENER_SMTP;
	if (l->policy.auth_required && !l->policy.auth)
	{
		snprintf(err, errlen, "%s: [%s] MODE = %s needs [ingress] CREDENTIALS", cfg->path, section,
				 l->mode == LISTENER_SMTPS ? "smtps" : "submission");
		return false;
	}
	listener_gates_set(l);
	return true;
}

/* The hooks that depend on [ingress]'s sender login settings as well (sender_login.h). */
void
listener_gates_set(struct listener *l)
{
	l->policy.rcpt_gate = l->greylist || sender_login_limit_messages() > 0
								  || sender_login_limit_recipients() > 0
							  ? session_rcpt_gate
							  : NULL;
	l->policy.mail_gate = sender_login_enabled() ? session_mail_gate : NULL;
}

/* What listener_configure allocated. */
void
listener_settings_free(struct listener *l)
{
	SSL_CTX_free(l->tls);
	l->tls = NULL;
	trusted_networks_free(&l->trusted);
	/* A transaction in flight copied what it uses (milter_gate_start). */
	milter_gate_list_free(&l->milters);
}

static struct listener *
listener_open(const char *section)
{
	struct listener *l = xcalloc(1, sizeof(*l));
	const char		*mode = config_text(ingress.cfg, section, "MODE");
	const char		*address = config_get(ingress.cfg, section, "ADDRESS");
	/* enum listener_mode is in the order of MODE's choices (schema/options.def). */
	static const long default_ports[] = {[LISTENER_SMTP] = 25, [LISTENER_SUBMISSION] = 587, [LISTENER_SMTPS] = 465};
	long			  port;
	char			  err[1024];

	l->name = xstrdup(section + strlen("listener-"));
	l->mode = (enum listener_mode) config_enum(ingress.cfg, section, "MODE");
	port = config_get(ingress.cfg, section, "PORT") ? (long) config_int(ingress.cfg, section, "PORT")
													: default_ports[l->mode];
	if (!listener_configure(ingress.cfg, section, ingress.credentials != NULL, l, err, sizeof(err)))
		fatalx("%s", err);
	l->fd = listener_bind(section, address ? address : "*", port);
	ev_io_init(&l->io, listener_on_accept, l->fd, EV_READ);
	l->io.data = l;
	ev_timer_init(&l->backoff, listener_on_backoff, LISTENER_ACCEPT_BACKOFF, 0);
	l->backoff.data = l;
	log_info("listener %s: %s on %s port %ld", l->name, mode, address ? address : "*", port);
	return l;
}

/*
 * After the privilege drop: a key this user cannot read would load now
 * (root read it) and fail at every reload, which is found out here
 * rather than at the first SIGHUP (listener_key_private).
 */
static void
ingress_check_keys_readable(void)
{
	for (struct listener *l = ingress.listeners; l; l = l->next)
	{
		char	   *section = xasprintf("listener-%s", l->name);
		const char *key = config_get(ingress.cfg, section, "KEY");

		if (key && access(key, R_OK) != 0)
			fatal("[%s] KEY %s cannot be read as [ingress] USER, so no reload could load it: "
				  "make it that user's, or give it the user's group with mode 0640",
				  section, key);
		free(section);
	}
}

/* A thousand sessions need more descriptors than the usual soft limit. */
static void
ingress_raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max)
	{
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
			log_warn("cannot raise the descriptor limit");
	}
}

/*
 * Stopping
 */

/* While stopping: done once every session and admission is, or time is up. */
static void
ingress_on_grace(struct ev_loop *loop, ev_timer *w, int revents)
{
	static double waited;

	waited += w->repeat;
	if (ingress.sessions == 0 && admit_pending() == 0)
		ev_break(loop, EVBREAK_ALL);
	else if (waited >= INGRESS_SHUTDOWN_GRACE)
	{
		log_warnx("stopping with %zu sessions still open", ingress.sessions);
		ev_break(loop, EVBREAK_ALL);
	}
}

static void
ingress_on_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
	if (ingress.stopping)
		return;
	log_info("stopping on signal %d", w->signum);
	service_stopping();
	ingress.stopping = true;
	for (struct listener *l = ingress.listeners; l; l = l->next)
	{
		ev_io_stop(loop, &l->io);
		ev_timer_stop(loop, &l->backoff);
		close(l->fd);
	}
	session_shutdown_all();
	if (ingress.sessions == 0 && admit_pending() == 0)
	{
		ev_break(loop, EVBREAK_ALL);
		return;
	}
	ev_timer_init(&ingress_grace_timer, ingress_on_grace, 0.1, 0.1);
	ev_timer_start(loop, &ingress_grace_timer);
}

/*
 * The overlay into cfg, if the database is there now (a later start or
 * reload picks it up otherwise); false with err when a row is refused.
 */
bool
ingress_load_overrides_into(struct pepsi_config *cfg, char *err, size_t errlen)
{
	PGconn *conn = db_connect_as(cfg, "ingress", "CONNINFO", "pepsi-ingress", err, errlen);
	bool	ok;

	if (conn == NULL)
	{
		log_warnx("%s; going on without pepsi.config_override", err);
		return true;
	}
	ok = db_load_overrides(conn, cfg, err, errlen);
	PQfinish(conn);
	return ok;
}

static const char *ingress_config_path;

static void
ingress_on_reload(struct ev_loop *loop, ev_signal *w, int revents)
{
	ingress_reload(ingress_config_path);
}

/* config_set or config_unset changed pepsi.config_override: as SIGHUP. */
static void
ingress_on_config_changed(void)
{
	log_info("the configuration changed in the database");
	ingress_reload(ingress_config_path);
}

/* Every INGRESS_REPORT_INTERVAL: sessions and counters to pepsi.ingress_stats, for /metrics. */
static void
ingress_on_report(struct ev_loop *loop, ev_timer *w, int revents)
{
	char			   *refusals = smtp_refusals_json();
	struct admit_report r = {w->data, ingress.sessions, ingress.sessions_total, ingress.messages_total,
							 refusals};

	admit_report(&r);
	free(refusals);
}

/* Whether sessions ask the database anything (greylisting, sender logins, DNSBL verdicts kept). */
bool
ingress_session_checks_use_db(void)
{
	for (struct listener *l = ingress.listeners; l; l = l->next)
		if (l->greylist || sender_login_uses_sql() || sender_login_limit_messages() > 0
			|| sender_login_limit_recipients() > 0
			|| (l->mode == LISTENER_SMTP && (screen_enabled() || l->pregreet_wait > 0)))
			return true;
	return false;
}

/* The checks sessions make beyond the protocol: DNSBL (screen.h), and the database's (db_query.h). */
static void
ingress_session_checks_start(void)
{
	char err[1024];

	if (!screen_configure(ingress.cfg, verify_resolver(), err, sizeof(err)))
		fatalx("%s: %s", ingress.cfg->path, err);
	/* A connection of its own, only where sessions ask the database. */
	if (ingress_session_checks_use_db())
		db_query_init(ingress.loop, ingress.cfg);
}

int
pepsi_ingress_main(int argc, char **argv)
{
	const char			*config_path = getenv("PEPSI_CONFIG");
	const char			*sections[256];
	struct admit_options admit_options;
	char				 err[1024];
	double				 local_refresh_interval;
	size_t				 nsections;
	ev_signal			 sigterm,
		sigint,
		sighup;
	ev_timer report_timer;
	char	*instance;
	int		 opt;

	log_init("pepsi-ingress", false);
	if (argc >= 2 && cli_is_help(argv[1]))
	{
		ingress_usage(stdout);
		return 0;
	}
	while ((opt = getopt(argc, argv, "c:v")) != -1)
		switch (opt)
		{
			case 'c':
				config_path = optarg;
				break;
			case 'v':
				log_setverbose(log_getverbose() + 1);
				break;
			default:
				ingress_usage(stderr);
				return 64;
		}
	if (optind != argc)
	{
		ingress_usage(stderr);
		return 64;
	}
	if (config_path == NULL)
		config_path = PEPSI_CONFIG_DEFAULT_PATH;
	signal(SIGPIPE, SIG_IGN);
	srandom((unsigned) time(NULL) ^ (unsigned) getpid());

	if ((ingress.cfg = config_load(config_path, err, sizeof(err))) == NULL
		|| !log_configure(ingress.cfg, err, sizeof(err))
		|| !ingress_load_overrides_into(ingress.cfg, err, sizeof(err)))
		fatalx("%s", err);

	ingress.hostname = config_hostname(ingress.cfg);
	ingress.queue_id_host = queue_id_host(ingress.cfg);
	ingress.authserv_id = config_authserv_id(ingress.cfg);
	admit_options.connections = (int) config_int(ingress.cfg, "ingress", "DATABASE_CONNECTIONS");
	admit_options.batch_size = (int) config_int(ingress.cfg, "ingress", "BATCH_SIZE");
	admit_options.stage = config_text(ingress.cfg, "ingress", "INIT_STAGE");
	admit_options.wake_interval = config_duration_ms(ingress.cfg, "ingress", "DISPATCH_WAKE_INTERVAL") / 1000.0;
	admit_options.bulk_nice = (int) config_int(ingress.cfg, "ingress", "BULK_NICE");
	admit_options.config_changed = ingress_on_config_changed;
	ingress.mail_log = config_bool(ingress.cfg, "pepsi", "MAIL_LOG");

	ingress.max_hops = (unsigned) config_int(ingress.cfg, "ingress", "MAX_HOPS");
	ingress.auth_throttle = auth_throttle_new((unsigned) config_int(ingress.cfg, "ingress", "AUTH_FAILURE_LIMIT"),
											  config_duration_ms(ingress.cfg, "ingress", "AUTH_FAILURE_WINDOW") / 1000.0,
											  config_duration_ms(ingress.cfg, "ingress", "AUTH_FAILURE_DELAY") / 1000.0);
	ingress.memory_limit = (size_t) config_size(ingress.cfg, "ingress", "MAX_MESSAGE_MEMORY");
	ingress.local_domains = xstrdup(local_domains(ingress.cfg, NULL));
	if ((ingress.local_recipients = local_resolver_new(ingress.cfg, err, sizeof(err))) == NULL)
		fatalx("%s", err);
	if (!local_resolver_validates(ingress.local_recipients))
	{
		local_resolver_free(ingress.local_recipients);
		ingress.local_recipients = NULL;
	}
	local_refresh_interval = config_duration_ms(ingress.cfg, "ingress", "LOCAL_RECIPIENTS_REFRESH") / 1000.0;

	if (config_get(ingress.cfg, "ingress", "CREDENTIALS"))
	{
		ingress.credentials = credentials_load(config_get(ingress.cfg, "ingress", "CREDENTIALS"),
											   err, sizeof(err));
		if (ingress.credentials == NULL)
			fatalx("[ingress] CREDENTIALS: %s", err);
	}

	if (!srs_rcpt_init(ingress.cfg, err, sizeof(err)))
		fatalx("%s", err);

	nsections = config_sections(ingress.cfg, "listener-", sections, 256);
	if (nsections == 0)
		fatalx("%s: no [listener-<name>] section: nothing to listen on", ingress.cfg->path);
	if (!sender_login_configure(ingress.cfg, err, sizeof(err)))
		fatalx("%s: %s", ingress.cfg->path, err);
	for (size_t i = 0; i < nsections; i++)
	{
		struct listener *l = listener_open(sections[i]);

		l->next = ingress.listeners;
		ingress.listeners = l;
	}
	ingress_raise_fd_limit();
	privilege_drop(ingress.cfg, "ingress");
	ingress_check_keys_readable();

	ingress.loop = EV_DEFAULT;
	milter_gate_init(ingress.loop, (size_t) config_int(ingress.cfg, "ingress", "MILTER_THREADS"));
	admit_init(ingress.loop, ingress.cfg, &admit_options);
	verify_init(ingress.loop, ingress.cfg);
	ingress_session_checks_start();
	if (local_resolver_uses_virtual(ingress.local_recipients))
		local_refresh_start(local_refresh_interval);
	if (ingress.local_recipients)
		quota_gate_start(local_refresh_interval);
	for (struct listener *l = ingress.listeners; l; l = l->next)
		ev_io_start(ingress.loop, &l->io);
	ev_signal_init(&sigterm, ingress_on_signal, SIGTERM);
	ev_signal_start(ingress.loop, &sigterm);
	ev_signal_init(&sigint, ingress_on_signal, SIGINT);
	ev_signal_start(ingress.loop, &sigint);
	ingress_config_path = config_path;
	ev_signal_init(&sighup, ingress_on_reload, SIGHUP);
	ev_signal_start(ingress.loop, &sighup);
	instance = xasprintf("%s:%ld", ingress.hostname, (long) getpid());
	ev_timer_init(&report_timer, ingress_on_report, 0, INGRESS_REPORT_INTERVAL);
	report_timer.data = instance;
	ev_timer_start(ingress.loop, &report_timer);
	log_info("ready: %zu listener%s, %d database connection%s and one for new clients, batches of up to %d",
			 nsections, nsections == 1 ? "" : "s", admit_options.connections,
			 admit_options.connections == 1 ? "" : "s", admit_options.batch_size);
	service_watchdog_start(ingress.loop);
	service_ready();

	ev_run(ingress.loop, 0);

	ev_timer_stop(ingress.loop, &report_timer);
	admit_shutdown();
	free(instance);
	screen_shutdown();
	db_query_shutdown();
	sender_login_shutdown();
	verify_shutdown();
	local_refresh_stop();
	quota_gate_stop();
	local_resolver_free(ingress.local_recipients);
	credentials_free(ingress.credentials);
	free(ingress.local_domains);
	for (struct listener *l = ingress.listeners; l; l = l->next)
		listener_settings_free(l);
	auth_throttle_free(ingress.auth_throttle);
	log_info("stopped");
	return 0;
}
