/*
 * pepsi-httpd: the administrative web server (httpd.h).
 *
 *   pepsi-httpd [-c CONFIG] [-v]          serve
 *   pepsi-httpd [-c CONFIG] passwd NAME [ROLE]  set an administrator's password
 *                                         (read from standard input), and role
 *   pepsi-httpd [-c CONFIG] token NAME [ROLE]   create an API token, printed once
 *
 * ROLE is admin (every action) or viewer (reads only); a new account or
 * token without one is an admin, an existing account keeps its role.
 *
 * Start-up, in this order: read [httpd] (the file only: like the SMTP
 * listeners, where it listens, its certificate and its database role are
 * never taken from the database); read the certificate and key; bind;
 * drop privileges; start serving; connect to the database.  SIGHUP
 * re-reads the file: the certificate, the session lifetime, the server
 * names and the metrics' authentication change without dropping a
 * connection; a bad new file, or one that changes what only a restart
 * applies (where it listens, its user, its database), is refused with the
 * reason and the old settings stay.  The key is read again then, as [httpd] USER: it must be
 * readable by that user (its own, or root's with its group, mode 0640;
 * checked after the privilege drop) and no one else (secret_key_open).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth/password.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "config/log_config.h"
#include "httpd.h"
#include "options.h"
#include "process/cli.h"
#include "process/https_server.h"
#include "process/privilege.h"
#include "process/secret.h"
#include "process/service.h"
#include "runtime/db.h"

/* Request headers past this much memory get 431. */
#define HTTPD_MAX_HEADER_MEMORY (32 * 1024)

int pepsi_httpd_main(int argc, char **argv);

struct httpd httpd;

/*
 * What [httpd] says that may change on SIGHUP.  The TLS material is kept
 * in memory as PEM strings, which is what libmicrohttpd takes.
 */
struct httpd_settings
{
	long  session_lifetime_s;
	bool  metrics_need_token;
	char *certificate;
	char *key;
	char *server_names;
};

/*
 * One request at a time: during a reload the old server's thread may
 * still finish a request while the new one's starts, and both use
 * httpd.conn and httpd.cfg.
 */
static pthread_mutex_t httpd_serving = PTHREAD_MUTEX_INITIALIZER;

static void
httpd_usage(FILE *out)
{
	fprintf(out, "usage: pepsi-httpd [-c CONFIG] [-v] [passwd NAME [ROLE] | token NAME [ROLE]]\n"
				 "  CONFIG defaults to $PEPSI_CONFIG, then %s.\n"
				 "  passwd NAME reads the new password from standard input.\n"
				 "  ROLE is admin (the default for a new one) or viewer (may read, not act).\n",
			PEPSI_CONFIG_DEFAULT_PATH);
}

/* Read them; false with err (naming the file, line and option) when one is bad. */
static bool
httpd_load_settings(struct pepsi_config *cfg, struct httpd_settings *set, char *err, size_t errlen)
{
	const char *certificate = config_get(cfg, "httpd", "CERTIFICATE");
	const char *key = config_get(cfg, "httpd", "KEY");

	/* A failure leaves session_lifetime_s 0, which httpd_reload tests. */
	memset(set, 0, sizeof(*set));
	if ((certificate == NULL) != (key == NULL))
	{
		snprintf(err, errlen, "%s: [httpd] CERTIFICATE and KEY go together", cfg->path);
		return false;
	}
	if (certificate)
	{
		if ((set->certificate = https_server_read_pem(certificate, false, err, errlen)) == NULL)
			return false;
		if ((set->key = https_server_read_pem(key, true, err, errlen)) == NULL)
		{
			free(set->certificate);
			set->certificate = NULL;
			return false;
		}
	}
	set->session_lifetime_s = config_duration_ms(cfg, "httpd", "SESSION_LIFETIME") / 1000;
	set->metrics_need_token = config_bool(cfg, "httpd", "METRICS_AUTH");
	if (config_text(cfg, "httpd", "SERVER_NAMES"))
		set->server_names = xstrdup(config_text(cfg, "httpd", "SERVER_NAMES"));
	return true;
}

/* The server names move into httpd; the rest is copied. */
static void
httpd_apply_settings(struct httpd_settings *set)
{
	httpd.session_lifetime_s = set->session_lifetime_s;
	httpd.metrics_need_token = set->metrics_need_token;
	httpd.tls = set->certificate != NULL;
	free(httpd.server_names);
	httpd.server_names = set->server_names;
	set->server_names = NULL;
}

/* The key is wiped: it is a secret. */
static void
httpd_settings_free(struct httpd_settings *set)
{
	if (set->key)
	{
		explicit_bzero(set->key, strlen(set->key));
		free(set->key);
	}
	free(set->certificate);
	free(set->server_names);
	set->key = set->certificate = set->server_names = NULL;
}

/*
 * The database: [httpd] CONNINFO when set (pepsi-httpd should connect as
 * a member of pepsi_httpd and nothing more), else [database] CONNINFO.
 */
PGconn *
httpd_db(void)
{
	char err[1024];

	if (httpd.conn && PQstatus(httpd.conn) == CONNECTION_OK)
		return httpd.conn;
	if (httpd.conn)
	{
		PQreset(httpd.conn);
		if (PQstatus(httpd.conn) == CONNECTION_OK)
			return httpd.conn;
		PQfinish(httpd.conn);
		httpd.conn = NULL;
	}
	if ((httpd.conn = db_connect_as(httpd.cfg, "httpd", "CONNINFO", "pepsi-httpd", err,
									sizeof(err)))
		== NULL)
		log_warnx("%s", err);
	return httpd.conn;
}

/*
 * Requests
 */

static enum MHD_Result
httpd_dispatch(struct request *req)
{
	struct principal who;
	const char		*why;
	char			 host[128];

	if (!httpd_host_allowed(req, host, sizeof(host)))
		return reply_error(req, MHD_HTTP_MISDIRECTED_REQUEST,
						   "Host \"%s\" is not a name of this server ([httpd] SERVER_NAMES)", host);
	/* Unauthenticated, like a load balancer's probe: it says only up or down, and why. */
	if (strcmp(req->path, "/healthz") == 0)
	{
		if (strcmp(req->method, "GET") != 0 && strcmp(req->method, "HEAD") != 0)
			return reply_error(req, MHD_HTTP_METHOD_NOT_ALLOWED, "/healthz takes GET");
		return healthz_respond(req);
	}
	if (strcmp(req->path, "/metrics") == 0)
	{
		if (strcmp(req->method, "GET") != 0 && strcmp(req->method, "HEAD") != 0)
			return reply_error(req, MHD_HTTP_METHOD_NOT_ALLOWED, "/metrics takes GET");
		if (httpd.metrics_need_token)
		{
			principal_identify(req, &who);
			if (who.unknown)
				return reply_error(req, MHD_HTTP_SERVICE_UNAVAILABLE, "the database is not answering");
			if (who.kind == PRINCIPAL_NONE)
				return reply_error(req, MHD_HTTP_UNAUTHORIZED, "a bearer token is required");
		}
		return metrics_respond(req);
	}
	if (strcmp(req->path, "/setup") == 0 || strcmp(req->path, "/api/setup") == 0
		|| strcmp(req->path, "/api/setup/log") == 0)
		return setup_web_route(req);
	if (strcmp(req->path, "/confirm") == 0)
		return confirm_route(req);
	if (strcmp(req->path, "/list/unsubscribe") == 0)
		return list_unsubscribe_route(req);
	if (strncmp(req->path, "/list/form/", 11) == 0)
		return list_form_route(req);
	if (strncmp(req->path, "/archive/", 9) == 0)
		return archive_route(req);
	if (strncmp(req->path, "/secure/", 8) == 0)
		return secure_link_route(req);
	if (strncmp(req->path, "/api/", 5) != 0)
		return www_respond(req);

	if (req->body_too_large)
		return reply_error(req, MHD_HTTP_CONTENT_TOO_LARGE, "the request body is larger than %d bytes",
						   HTTPD_MAX_BODY);
	if (strcmp(req->path, "/api/login") == 0)
	{
		if (strcmp(req->method, "POST") != 0)
			return reply_error(req, MHD_HTTP_METHOD_NOT_ALLOWED, "/api/login takes POST");
		return session_login(req);
	}

	principal_identify(req, &who);
	if (who.unknown)
		return reply_error(req, MHD_HTTP_SERVICE_UNAVAILABLE, "the database is not answering");
	if (who.kind == PRINCIPAL_NONE)
		return reply_error(req, MHD_HTTP_UNAUTHORIZED,
						   "log in, or send an API token as Authorization: Bearer");
	if (strcmp(req->method, "GET") != 0 && strcmp(req->method, "HEAD") != 0
		&& !principal_may_change(req, &who, &why))
		return reply_error(req, MHD_HTTP_FORBIDDEN, "%s", why);
	if (strcmp(req->path, "/api/session") == 0)
	{
		if (strcmp(req->method, "GET") == 0)
			return session_describe(req, &who);
		if (strcmp(req->method, "DELETE") == 0)
			return session_logout(req, &who);
		return reply_error(req, MHD_HTTP_METHOD_NOT_ALLOWED, "/api/session takes GET or DELETE");
	}
	return api_route(req, &who);
}

static enum MHD_Result
httpd_access(void *cls, struct MHD_Connection *connection, const char *url, const char *method,
			 const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls)
{
	struct request *req = *con_cls;
	enum MHD_Result result;

	if (req == NULL)
	{
		const union MHD_ConnectionInfo *info;

		req = xcalloc(1, sizeof(*req));
		req->connection = connection;
		info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
		if (info && info->client_addr)
		{
			getnameinfo(info->client_addr,
						info->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
																 : sizeof(struct sockaddr_in),
						req->client, sizeof(req->client), NULL, 0, NI_NUMERICHOST);
			client_key(info->client_addr, req->client_key, sizeof(req->client_key));
		}
		info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
		if (info)
		{
			socklen_t len = sizeof(req->local);

			if (getsockname(info->connect_fd, (struct sockaddr *) &req->local, &len) != 0)
				req->local.ss_family = AF_UNSPEC;
		}
		*con_cls = req;
		return MHD_YES;
	}
	if (*upload_data_size > 0)
	{
		if (req->body.len + *upload_data_size > HTTPD_MAX_BODY)
			req->body_too_large = true;
		else
			buf_append(&req->body, upload_data, *upload_data_size);
		*upload_data_size = 0;
		return MHD_YES;
	}
	req->method = method;
	req->path = url;
	if (req->body.data == NULL)
		buf_append(&req->body, "", 0);
	pthread_mutex_lock(&httpd_serving);
	result = httpd_dispatch(req);
	pthread_mutex_unlock(&httpd_serving);
	return result;
}

static void
httpd_completed(void *cls, struct MHD_Connection *connection, void **con_cls,
				enum MHD_RequestTerminationCode toe)
{
	struct request *req = *con_cls;

	if (req == NULL)
		return;
	if (req->body.data)
		explicit_bzero(req->body.data, req->body.len); /* may hold a password */
	buf_free(&req->body);
	free(req);
	*con_cls = NULL;
}

static struct MHD_Daemon *
httpd_start(int listen_fd, const struct httpd_settings *set)
{
	/* (MHD_USE_ITC: a reload hands the socket over with MHD_quiesce_daemon.) */
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG
					 | MHD_USE_ITC;
	struct MHD_OptionItem options[] = {
		{MHD_OPTION_LISTEN_SOCKET, listen_fd, NULL},
		{MHD_OPTION_NOTIFY_COMPLETED, (intptr_t) httpd_completed, NULL},
		{MHD_OPTION_EXTERNAL_LOGGER, (intptr_t) https_server_log, NULL},
		/* Headers beyond this get 431; slow clients are cut. */
		{MHD_OPTION_CONNECTION_MEMORY_LIMIT, HTTPD_MAX_HEADER_MEMORY, NULL},
		{MHD_OPTION_CONNECTION_TIMEOUT, 30, NULL},
		{MHD_OPTION_CONNECTION_LIMIT, 256, NULL},
		{MHD_OPTION_PER_IP_CONNECTION_LIMIT, 32, NULL},
		{MHD_OPTION_END, 0, NULL}, /* room for the TLS pair */
		{MHD_OPTION_END, 0, NULL},
		{MHD_OPTION_END, 0, NULL},
	};

	if (set->certificate)
	{
		size_t n = 7;

		flags |= MHD_USE_TLS;
		options[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, set->certificate};
		options[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, set->key};
	}
	return MHD_start_daemon(flags, 0, NULL, NULL, httpd_access, NULL,
							MHD_OPTION_ARRAY, options, MHD_OPTION_END);
}

/*
 * Administration from the command line
 */

/*
 * The administrative commands connect as [database] CONFIG_CONNINFO says
 * (a member of pepsi_config), not as the server's own role: pepsi_httpd
 * may read the credentials but not write them.
 */
static PGconn *
httpd_admin_connect(void)
{
	char	err[1024];
	PGconn *conn = db_connect_as(httpd.cfg, "database", "CONFIG_CONNINFO", "pepsi-httpd", err,
								 sizeof(err));

	if (conn == NULL)
		log_warnx("%s", err);
	return conn;
}

/* A role named on the command line: NULL (and a message) unless known. */
static bool
httpd_role_valid(const char *command, const char *role)
{
	if (role == NULL || strcmp(role, "admin") == 0 || strcmp(role, "viewer") == 0)
		return true;
	log_warnx("%s: the role must be \"admin\" or \"viewer\", not \"%s\"", command, role);
	return false;
}

/* role NULL: a new account is an admin, an existing one keeps its role. */
static int
httpd_passwd(const char *name, const char *role)
{
	char		line[1024];
	char	   *hash;
	const char *values[3];
	PGconn	   *conn;
	PGresult   *res;
	size_t		n;
	int			rc = 0;

	if (!httpd_role_valid("passwd", role))
		return 64;
	if (fgets(line, sizeof(line), stdin) == NULL)
		fatalx("passwd: no password on standard input");
	n = strcspn(line, "\r\n");
	line[n] = '\0';
	if (n < 8)
		fatalx("passwd: a password needs at least 8 characters");
	hash = password_hash(line);
	explicit_bzero(line, sizeof(line));
	if (hash == NULL)
		fatalx("passwd: Argon2id hashing failed");
	if ((conn = httpd_admin_connect()) == NULL)
		return 75;
	values[0] = name;
	values[1] = hash;
	values[2] = role;
	res = role ? db_exec(conn, "SELECT pepsi.admin_account_set($1, $2, $3)", 3, values)
			   : db_exec(conn, "SELECT pepsi.admin_account_set($1, $2)", 2, values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_warnx("passwd: %s", db_error(res, conn));
		rc = 65;
	}
	PQclear(res);
	PQfinish(conn);
	free(hash);
	return rc;
}

static int
httpd_token(const char *name, const char *role)
{
	const char *values[2] = {name, role};
	PGconn	   *conn;
	PGresult   *res;
	int			rc = 0;

	if (!httpd_role_valid("token", role))
		return 64;
	if ((conn = httpd_admin_connect()) == NULL)
		return 75;
	res = role ? db_exec(conn, "SELECT pepsi.api_token_create($1, $2)", 2, values)
			   : db_exec(conn, "SELECT pepsi.api_token_create($1)", 1, values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_warnx("token: %s", db_error(res, conn));
		rc = 65;
	}
	else
		printf("%s\n", PQgetvalue(res, 0, 0));
	PQclear(res);
	PQfinish(conn);
	return rc;
}

/*
 * Serving
 */

static struct pepsi_config *
httpd_config_load(const char *path)
{
	char				 err[1024];
	struct pepsi_config *cfg = config_load(path, err, sizeof(err));

	if (cfg == NULL)
		log_warnx("%s", err);
	return cfg;
}

/*
 * The options of [httpd] a reload applies ([pepsi] HOSTNAME, a default
 * server name, is read at each request too).  Every other one of [httpd],
 * the database it connects to and [pepsi] LOG and LOG_FORMAT are read at
 * start only: a reload that changes one is refused, naming it, rather
 * than answering "reloaded" while ignoring it.
 */
static const char *const httpd_reload_applies[] = {"CERTIFICATE", "KEY", "SESSION_LIFETIME",
												   "METRICS_AUTH", "SERVER_NAMES"};

static bool
httpd_restart_options_unchanged(const struct pepsi_config *cfg, char *err, size_t errlen)
{
	static const char *const pepsi_read_at_start[] = {"LOG", "LOG_FORMAT"};
	char					 origin[512];

	for (size_t i = 0; i < option_count; i++)
	{
		const struct option_def *def = &option_table[i];
		bool					 applied = false;

		if (strcmp(def->where, "httpd") != 0)
			continue;
		for (size_t j = 0; j < sizeof(httpd_reload_applies) / sizeof(httpd_reload_applies[0]); j++)
			applied |= strcmp(def->name, httpd_reload_applies[j]) == 0;
		if (!applied && config_option_changed(httpd.cfg, cfg, "httpd", def->name))
		{
			snprintf(err, errlen, "[httpd] %s changed (%s): only a restart of pepsi-httpd applies it",
					 def->name, config_origin(cfg, "httpd", def->name, origin, sizeof(origin)));
			return false;
		}
	}
	for (size_t i = 0; i < sizeof(pepsi_read_at_start) / sizeof(pepsi_read_at_start[0]); i++)
		if (config_option_changed(httpd.cfg, cfg, "pepsi", pepsi_read_at_start[i]))
		{
			snprintf(err, errlen, "[pepsi] %s changed: only a restart of pepsi-httpd applies it",
					 pepsi_read_at_start[i]);
			return false;
		}
	/* (Its own CONNINFO was compared above; this is the default it falls back to.) */
	if (strcmp(db_conninfo(httpd.cfg, "httpd", "CONNINFO"), db_conninfo(cfg, "httpd", "CONNINFO")) != 0)
	{
		snprintf(err, errlen,
				 "[database] CONNINFO changed: only a restart of pepsi-httpd applies it");
		return false;
	}
	return true;
}

/*
 * SIGHUP: read the file again.  A new certificate needs a new server on
 * the same socket: the old one stops accepting (MHD_quiesce_daemon), the
 * new one starts, and the old one is stopped once its connections are
 * done (or after a few seconds, closing idle keep-alive connections,
 * which clients simply open again).
 */
static struct MHD_Daemon *
httpd_reload(const char *path, struct MHD_Daemon *daemon, int listen_fd)
{
	struct pepsi_config	 *cfg;
	struct pepsi_config	 *old_cfg;
	struct httpd_settings set;
	struct MHD_Daemon	 *fresh;
	char				  err[1024];

	service_reloading();
	if ((cfg = config_load(path, err, sizeof(err))) == NULL)
	{
		log_warnx("reload refused: %s; the old configuration stays", err);
		service_reloaded();
		return daemon;
	}
	if (httpd_load_settings(cfg, &set, err, sizeof(err))
		&& (httpd.tls != (set.certificate != NULL)
			|| !httpd_restart_options_unchanged(cfg, err, sizeof(err))))
	{
		if (httpd.tls != (set.certificate != NULL))
			snprintf(err, sizeof(err), "switching TLS on or off needs a restart");
		httpd_settings_free(&set);
		set.session_lifetime_s = 0;
	}
	if (set.session_lifetime_s == 0)
	{
		log_warnx("reload refused: %s; the old configuration stays", err);
		httpd_settings_free(&set);
		config_free(cfg);
		service_reloaded();
		return daemon;
	}
	if (MHD_quiesce_daemon(daemon) < 0 || (fresh = httpd_start(listen_fd, &set)) == NULL)
		fatalx("reload: cannot hand the socket to a server with the new settings");
	pthread_mutex_lock(&httpd_serving);
	old_cfg = httpd.cfg;
	httpd.cfg = cfg;
	httpd_apply_settings(&set);
	pthread_mutex_unlock(&httpd_serving);
	httpd_settings_free(&set);
	log_info("reloading %s: new connections get the new settings", path);
	for (int waited = 0; waited < 50; waited++)
	{
		const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);

		if (info == NULL || info->num_connections == 0)
			break;
		usleep(100 * 1000);
	}
	MHD_stop_daemon(daemon);
	config_free(old_cfg);
	log_info("reloaded %s", path);
	service_reloaded();
	return fresh;
}

int
pepsi_httpd_main(int argc, char **argv)
{
	const char			 *path;
	struct httpd_settings set;
	struct MHD_Daemon	 *daemon;
	char				  err[1024];
	int					  listen_fd, rc = 0;
	bool				  help;
	sigset_t			  signals;
	double				  watchdog;

	log_init("pepsi-httpd", false);
	if (argc >= 2 && cli_is_help(argv[1]))
	{
		httpd_usage(stdout);
		return 0;
	}
	if (!cli_daemon_options(argc, argv, &path, &help) || help)
	{
		httpd_usage(help ? stdout : stderr);
		return help ? 0 : 64;
	}
	argc -= optind;
	argv += optind;
	if ((httpd.cfg = httpd_config_load(path)) == NULL)
		return 78;
	if (!log_configure(httpd.cfg, err, sizeof(err)))
		fatalx("%s", err);

	if ((argc == 2 || argc == 3) && strcmp(argv[0], "passwd") == 0)
		rc = httpd_passwd(argv[1], argc == 3 ? argv[2] : NULL);
	else if ((argc == 2 || argc == 3) && strcmp(argv[0], "token") == 0)
		rc = httpd_token(argv[1], argc == 3 ? argv[2] : NULL);
	else if (argc != 0)
	{
		httpd_usage(stderr);
		rc = 64;
	}
	if (argc != 0)
	{
		config_free(httpd.cfg);
		return rc;
	}

	if (!httpd_load_settings(httpd.cfg, &set, err, sizeof(err)))
		fatalx("%s", err);
	httpd_apply_settings(&set);
	/* Loopback unless told otherwise ([httpd] ADDRESS): the API acts on the mail queue. */
	listen_fd = https_server_listen(config_text(httpd.cfg, "httpd", "ADDRESS"), config_int(httpd.cfg, "httpd", "PORT"),
									"httpd", httpd.cfg->path);
	privilege_drop(httpd.cfg, "httpd");
	/* Root read the key; a reload will read it as this user. */
	if (config_get(httpd.cfg, "httpd", "KEY") && access(config_get(httpd.cfg, "httpd", "KEY"), R_OK) != 0)
		fatal("[httpd] KEY %s cannot be read as [httpd] USER, so no reload could load it: make it "
			  "that user's, or give it the user's group with mode 0640",
			  config_get(httpd.cfg, "httpd", "KEY"));

	/* The signals are taken by sigtimedwait below, in this thread only. */
	sigemptyset(&signals);
	sigaddset(&signals, SIGTERM);
	sigaddset(&signals, SIGINT);
	sigaddset(&signals, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &signals, NULL);
	signal(SIGPIPE, SIG_IGN);

	if ((daemon = httpd_start(listen_fd, &set)) == NULL)
		fatalx("cannot start the HTTP server");
	httpd_settings_free(&set);
	if (httpd_db() == NULL)
		log_warnx("no database yet: requests get 503 until it answers");
	log_info("ready%s", httpd.tls ? " (TLS)" : "");
	service_ready();

	watchdog = service_watchdog_interval();
	for (;;)
	{
		struct timespec wait = {watchdog > 0 ? (time_t) watchdog : 3600, 0};
		int				sig = sigtimedwait(&signals, NULL, &wait);

		if (sig < 0)
		{
			if (errno == EAGAIN && watchdog > 0)
				service_watchdog_ping();
			continue;
		}
		if (sig == SIGHUP)
		{
			daemon = httpd_reload(path ? path : PEPSI_CONFIG_DEFAULT_PATH, daemon, listen_fd);
			continue;
		}
		break;
	}
	service_stopping();
	log_info("stopping");
	MHD_stop_daemon(daemon);
	close(listen_fd);
	if (httpd.conn)
		PQfinish(httpd.conn);
	if (httpd.reader)
		PQfinish(httpd.reader);
	config_free(httpd.cfg);
	free(httpd.server_names);
	return 0;
}
