/*
 * pepsi-telemetry: the collector (telemetry.h).
 *
 *   pepsi-telemetry [-c CONFIG] [-v]
 *
 * CONFIG defaults to /etc/pepsi-telemetry/pepsi-telemetry.conf: the
 * collector's own file ([telemetry-collector]), on its own host, not the
 * mail system's pepsi.conf.  Start-up: read the file (CONNINFO,
 * CERTIFICATE and KEY are required: it speaks HTTPS only), read the
 * certificate and key, bind, drop privileges (USER, GROUP), serve, and
 * connect to the database.  A change of the file takes a restart.
 *
 *   POST /report   a report (application/json): 200 stored; 400 with the
 *                  reason when it is not on the allow-list (validate.c) or
 *                  larger than MAX_BODY; 429 when its install id reported
 *                  within MIN_INTERVAL; 503 when the database is down
 *   GET /          the totals page (installs, versions, volumes by day)
 */
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "config/log_config.h"
#include "process/https_server.h"
#include "process/privilege.h"
#include "process/secret.h"
#include "process/service.h"
#include "telemetry.h"

#define COLLECTOR_PROGRAM "pepsi-telemetry"
#define COLLECTOR_DEFAULT_CONFIG "/etc/pepsi-telemetry/pepsi-telemetry.conf"
#define COLLECTOR_SECTION "telemetry-collector"

int pepsi_telemetry_main(int argc, char **argv);

static struct
{
	struct pepsi_config	   *cfg;
	struct telemetry_limits limits;
	size_t					max_body;
	char				   *certificate;
	char				   *key;
} collector;

/* One request's body, as it arrives. */
struct collector_request
{
	struct buf body;
	bool	   too_large;
};

static void
collector_usage(FILE *out)
{
	fprintf(out, "usage: " COLLECTOR_PROGRAM " [-c CONFIG] [-v]\n"
				 "  the telemetry collector; CONFIG defaults to " COLLECTOR_DEFAULT_CONFIG "\n");
}

/* Every answer carries these: nothing is framed, sniffed, cached or loaded from elsewhere. */
static enum MHD_Result
collector_reply(struct MHD_Connection *connection, unsigned status, const char *content_type, const char *body,
				const char *allow)
{
	struct MHD_Response *response;
	enum MHD_Result		 result;

	response = MHD_create_response_from_buffer(strlen(body), (void *) (uintptr_t) body, MHD_RESPMEM_MUST_COPY);
	if (response == NULL)
		return MHD_NO;
	MHD_add_response_header(response, "Content-Type", content_type);
	MHD_add_response_header(response, "X-Content-Type-Options", "nosniff");
	MHD_add_response_header(response, "X-Frame-Options", "DENY");
	MHD_add_response_header(response, "Referrer-Policy", "no-referrer");
	MHD_add_response_header(response, "Cache-Control", "no-store");
	/* The page is one HTML document: no script, no style, no image, no form. */
	MHD_add_response_header(response, "Content-Security-Policy",
							"default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
	if (allow)
		MHD_add_response_header(response, "Allow", allow);
	result = MHD_queue_response(connection, status, response);
	MHD_destroy_response(response);
	return result;
}

/* {"error": why}, or {"stored": true} (why NULL). */
static enum MHD_Result
collector_answer(struct MHD_Connection *connection, unsigned status, const char *why)
{
	const char *allow = NULL;

	json_t		   *body = why ? json_pack("{s:s}", "error", why) : json_pack("{s:b}", "stored", 1);
	char		   *text = json_dumps(body, JSON_COMPACT);
	enum MHD_Result result;

	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		allow = why && strncmp(why, "/report", 7) == 0 ? "POST" : "GET, HEAD";
	else if (why)
		log_info("refused (%u): %s", status, why);
	result = collector_reply(connection, status, "application/json", text, allow);
	free(text);
	json_decref(body);
	return result;
}

static enum MHD_Result
collector_report(struct MHD_Connection *connection, struct collector_request *req)
{
	const char	*type = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, "Content-Type");
	json_error_t error;
	json_t		*report;
	char		 why[512];
	char		*canonical;
	unsigned	 status;

	if (req->too_large)
	{
		snprintf(why, sizeof(why), "the body is larger than %zu bytes ([telemetry-collector] MAX_BODY)",
				 collector.max_body);
		return collector_answer(connection, MHD_HTTP_BAD_REQUEST, why);
	}
	if (type == NULL || strncasecmp(type, "application/json", 16) != 0 || (type[16] != '\0' && type[16] != ';'))
		return collector_answer(connection, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, "the report must be application/json");
	report = json_loadb(req->body.data, req->body.len, JSON_REJECT_DUPLICATES, &error);
	if (report == NULL)
	{
		snprintf(why, sizeof(why), "not JSON: %s (line %d)", error.text, error.line);
		return collector_answer(connection, MHD_HTTP_BAD_REQUEST, why);
	}
	if (!telemetry_validate(report, &collector.limits, why, sizeof(why)))
	{
		json_decref(report);
		return collector_answer(connection, MHD_HTTP_BAD_REQUEST, why);
	}
	canonical = json_dumps(report, JSON_COMPACT);
	json_decref(report);
	switch (collector_store(collector.cfg, canonical, why, sizeof(why)))
	{
		case STORE_OK:
			status = MHD_HTTP_OK;
			break;
		case STORE_RATE_LIMITED:
			status = MHD_HTTP_TOO_MANY_REQUESTS;
			break;
		default:
			status = MHD_HTTP_SERVICE_UNAVAILABLE;
	}
	free(canonical);
	return collector_answer(connection, status, status == MHD_HTTP_OK ? NULL : why);
}

static enum MHD_Result
collector_route(struct MHD_Connection *connection, const char *url, const char *method,
				struct collector_request *req)
{
	struct buf		page = BUF_INIT;
	enum MHD_Result result;

	if (strcmp(url, "/report") == 0)
	{
		if (strcmp(method, "POST") != 0)
			return collector_answer(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "/report takes POST");
		return collector_report(connection, req);
	}
	if (strcmp(url, "/") != 0)
		return collector_answer(connection, MHD_HTTP_NOT_FOUND, "no such page: / is the totals, /report takes reports");
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
		return collector_answer(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "/ takes GET");
	if (!collector_totals_page(collector.cfg, &page))
	{
		buf_free(&page);
		return collector_answer(connection, MHD_HTTP_SERVICE_UNAVAILABLE, "the collector's database is not answering");
	}
	buf_append(&page, "", 0);
	result = collector_reply(connection, MHD_HTTP_OK, "text/html; charset=utf-8", page.data, NULL);
	buf_free(&page);
	return result;
}

static enum MHD_Result
collector_access(void *cls, struct MHD_Connection *connection, const char *url, const char *method,
				 const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls)
{
	struct collector_request *req = *con_cls;

	if (req == NULL)
	{
		*con_cls = xcalloc(1, sizeof(*req));
		return MHD_YES;
	}
	if (*upload_data_size > 0)
	{
		/* Past the limit the rest is read and dropped, so the answer can say why. */
		if (req->body.len + *upload_data_size > collector.max_body)
			req->too_large = true;
		else
			buf_append(&req->body, upload_data, *upload_data_size);
		*upload_data_size = 0;
		return MHD_YES;
	}
	if (req->body.data == NULL)
		buf_append(&req->body, "", 0);
	return collector_route(connection, url, method, req);
}

static void
collector_completed(void *cls, struct MHD_Connection *connection, void **con_cls,
					enum MHD_RequestTerminationCode toe)
{
	struct collector_request *req = *con_cls;

	if (req == NULL)
		return;
	buf_free(&req->body);
	free(req);
	*con_cls = NULL;
}

/* A PEM file of the file's, required: the collector speaks HTTPS only. */
static char *
collector_read_pem(const char *option, bool key)
{
	const char *path = config_text(collector.cfg, COLLECTOR_SECTION, option);
	char		err[1024];
	char	   *pem;

	if (path == NULL)
		fatalx("%s: [" COLLECTOR_SECTION "] %s is required: the collector speaks HTTPS only", collector.cfg->path,
			   option);
	if ((pem = https_server_read_pem(path, key, err, sizeof(err))) == NULL)
		fatalx("[" COLLECTOR_SECTION "] %s: %s", option, err);
	return pem;
}

static struct MHD_Daemon *
collector_start(int listen_fd)
{
	return MHD_start_daemon(
		MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG | MHD_USE_TLS, 0, NULL, NULL,
		collector_access, NULL, MHD_OPTION_LISTEN_SOCKET, listen_fd, MHD_OPTION_NOTIFY_COMPLETED,
		collector_completed, NULL, MHD_OPTION_EXTERNAL_LOGGER, https_server_log, NULL,
		MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t) (32 * 1024), MHD_OPTION_CONNECTION_TIMEOUT, 30u,
		MHD_OPTION_CONNECTION_LIMIT, 256u, MHD_OPTION_PER_IP_CONNECTION_LIMIT, 16u, MHD_OPTION_HTTPS_MEM_CERT,
		collector.certificate, MHD_OPTION_HTTPS_MEM_KEY, collector.key, MHD_OPTION_END);
}

/* -c CONFIG, -v, -h; the path, or NULL after printing the usage (*rc set). */
static const char *
collector_options(int argc, char **argv, int *rc)
{
	static const struct option longopts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
	const char				  *path = COLLECTOR_DEFAULT_CONFIG;
	int						   c;

	while ((c = getopt_long(argc, argv, "c:vh", longopts, NULL)) != -1)
		switch (c)
		{
			case 'c':
				path = optarg;
				break;
			case 'v':
				log_setverbose(log_getverbose() + 1);
				break;
			case 'h':
				collector_usage(stdout);
				*rc = 0;
				return NULL;
			default:
				collector_usage(stderr);
				*rc = 64;
				return NULL;
		}
	if (optind != argc)
	{
		collector_usage(stderr);
		*rc = 64;
		return NULL;
	}
	return path;
}

/* Read the file and what it names; fatal with the reason when one is bad. */
static void
collector_configure(const char *path)
{
	char err[1024];

	if ((collector.cfg = config_load(path, err, sizeof(err))) == NULL)
		fatalx("%s", err);
	if (!log_configure(collector.cfg, err, sizeof(err)))
		fatalx("%s", err);
	if (config_text(collector.cfg, COLLECTOR_SECTION, "CONNINFO") == NULL)
		fatalx("%s: [" COLLECTOR_SECTION "] CONNINFO is required: the collector's own database, never the "
			   "mail system's",
			   path);
	collector.limits.max_days = config_int(collector.cfg, COLLECTOR_SECTION, "MAX_DAYS");
	collector.limits.max_stages = config_int(collector.cfg, COLLECTOR_SECTION, "MAX_STAGES");
	collector.max_body = (size_t) config_size(collector.cfg, COLLECTOR_SECTION, "MAX_BODY");
	collector.certificate = collector_read_pem("CERTIFICATE", false);
	collector.key = collector_read_pem("KEY", true);
}

int
pepsi_telemetry_main(int argc, char **argv)
{
	struct MHD_Daemon *daemon;
	const char		  *path;
	sigset_t		   signals;
	int				   listen_fd, rc = 0;
	double			   watchdog;

	log_init(COLLECTOR_PROGRAM, false);
	if ((path = collector_options(argc, argv, &rc)) == NULL)
		return rc;
	collector_configure(path);
	listen_fd = https_server_listen(config_text(collector.cfg, COLLECTOR_SECTION, "ADDRESS"),
									config_int(collector.cfg, COLLECTOR_SECTION, "PORT"), COLLECTOR_SECTION, path);
	privilege_drop(collector.cfg, COLLECTOR_SECTION);

	sigemptyset(&signals);
	sigaddset(&signals, SIGTERM);
	sigaddset(&signals, SIGINT);
	pthread_sigmask(SIG_BLOCK, &signals, NULL);
	signal(SIGPIPE, SIG_IGN);
	if ((daemon = collector_start(listen_fd)) == NULL)
		fatalx("cannot start the HTTPS server (is [" COLLECTOR_SECTION "] KEY the key of CERTIFICATE?)");
	explicit_bzero(collector.key, strlen(collector.key));
	if (collector_db(collector.cfg) == NULL)
		log_warnx("no database yet: reports get 503 until it answers");
	log_info("ready");
	service_ready();
	watchdog = service_watchdog_interval();
	for (;;)
	{
		struct timespec wait = {watchdog > 0 ? (time_t) watchdog : 3600, 0};

		if (sigtimedwait(&signals, NULL, &wait) >= 0)
			break;
		if (errno == EAGAIN && watchdog > 0)
			service_watchdog_ping();
	}
	service_stopping();
	log_info("stopping");
	MHD_stop_daemon(daemon);
	close(listen_fd);
	config_free(collector.cfg);
	free(collector.certificate);
	free(collector.key);
	return 0;
}
