/*
 * httpd.h: pepsi-httpd, the administrative web server: Prometheus
 * /metrics, a JSON API over the operator functions, and a small web page
 * (docs/architecture.md, "Operating Pepsi").
 *
 * libmicrohttpd parses HTTP and runs every request on one internal
 * thread, so the handlers share one database connection without locking;
 * an administrative server does not need more, and a slow statement only
 * delays other administrators.
 */
#ifndef PEPSI_HTTPD_H
#define PEPSI_HTTPD_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>
#include <libpq-fe.h>
#include <microhttpd.h>

#include "base/buf.h"
#include "config/config.h"
#include "smtp/client_key.h"

/* Request bodies larger than this get 413: the API takes small JSON. */
#define HTTPD_MAX_BODY (64 * 1024)

struct httpd
{
	struct pepsi_config *cfg;
	PGconn				*conn;
	PGconn				*reader; /* [httpd] READ_CONNINFO's, when set (replica.c) */
	long				 session_lifetime_s;
	bool				 tls;				 /* cookies get Secure */
	bool				 metrics_need_token; /* [httpd] METRICS_AUTH */
	char				*server_names;		 /* [httpd] SERVER_NAMES; NULL: the default */
};
extern struct httpd httpd;

/* Who is asking: nobody, an API token, or a logged-in administrator. */
enum principal_kind
{
	PRINCIPAL_NONE,
	PRINCIPAL_TOKEN,
	PRINCIPAL_SESSION,
};

struct principal
{
	enum principal_kind kind;
	char				name[128]; /* "token:<name>" or the account's name */
	char				csrf[65];  /* the session's CSRF token (hex), sessions only */
	bool				unknown;   /* NONE because the database could not say: 503, not 401 */
	bool				viewer;	   /* the role "viewer": may read, not act (api.c) */
};

/* One request as the handlers see it. */
struct request
{
	struct MHD_Connection  *connection;
	const char			   *method;
	const char			   *path;
	struct buf				body;
	bool					body_too_large;
	char					client[64];					 /* the peer's address, for logs */
	char					client_key[CLIENT_KEY_SIZE]; /* its address or /64, for throttling */
	struct sockaddr_storage local;						 /* the address it came in on */
};

/* Replies: each queues the response and returns MHD's result. */
enum MHD_Result reply_json(struct request *req, unsigned status, json_t *body); /* body is stolen */
enum MHD_Result reply_json_text(struct request *req, unsigned status, const char *json);
enum MHD_Result reply_error(struct request *req, unsigned status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
enum MHD_Result reply_bytes(struct request *req, unsigned status, const char *content_type,
							const void *data, size_t len, bool copy);
/* Add the headers every response carries (no sniffing, no framing, CSP). */
void reply_add_security_headers(struct MHD_Response *response);
/* The same, for a page whose form posts to this server (form-action 'self'). */
void reply_add_form_security_headers(struct MHD_Response *response);
/* text into out, escaped for HTML text and attribute values. */
void reply_html_escape(struct buf *out, const char *text);
/* An HTML page whose form posts back to this server (the secretary's confirmation page). */
enum MHD_Result reply_form_page(struct request *req, unsigned status, const char *html);

/* host.c: does Host name this server?  false with the header, printable, in shown. */
bool httpd_host_allowed(const struct request *req, char *shown, size_t shownlen);

/* The database connection, reconnected when it was lost. */
PGconn *httpd_db(void);
/*
 * replica.c: the connection the read-only views read through: [httpd]
 * READ_CONNINFO's (a standby may answer), else httpd_db()'s; and
 * GET /api/replica, whether that is a standby and how far behind.
 */
PGconn		   *httpd_db_read(void);
enum MHD_Result replica_respond(struct request *req);

/* session.c: authentication, sessions, CSRF. */
void principal_identify(struct request *req, struct principal *who);
/* For a state-changing request by a session: the CSRF token and Origin check. */
bool			principal_may_change(struct request *req, const struct principal *who,
									 const char **why);
enum MHD_Result session_login(struct request *req);
enum MHD_Result session_logout(struct request *req, const struct principal *who);
enum MHD_Result session_describe(struct request *req, const struct principal *who);

/* metrics.c: GET /metrics. */
enum MHD_Result metrics_respond(struct request *req);
/* GET /healthz: 200 when the database answers and a dispatcher runs, else 503 and why. */
enum MHD_Result healthz_respond(struct request *req);

/* api.c: every /api/ route but the session's. */
enum MHD_Result api_route(struct request *req, const struct principal *who);
/*
 * A query whose one row and column is JSON text: that text, as the reply
 * (none: 404 when not_found_on_null, else []).
 */
enum MHD_Result api_json_query(struct request *req, const char *sql, int nparams,
							   const char *const *values, bool not_found_on_null);
/* The same on httpd_db_read(): for the read-only views, which a standby may serve. */
enum MHD_Result api_json_read(struct request *req, const char *sql, int nparams,
							  const char *const *values, bool not_found_on_null);

/* views.c: the page's views besides the queue (reads only); handled false for another path. */
enum MHD_Result views_route(struct request *req, const struct principal *who, bool *handled);

/* www.c: the web page's static files. */
enum MHD_Result www_respond(struct request *req);
/* The setup page (www/setup.html), which only setup_web.c serves. */
void www_setup_page(const char **html, size_t *len);

/* confirm.c: /confirm, the page of the secretary's challenge link (GET shows, POST releases). */
enum MHD_Result confirm_route(struct request *req);

/* setup_web.c: /setup, /api/setup and /api/setup/log, the first-run setup page. */
enum MHD_Result setup_web_route(struct request *req);
/* list_unsubscribe.c: RFC 8058 one-click unsubscribe (/list/unsubscribe). */
enum MHD_Result list_unsubscribe_route(struct request *req);
/* list_form.c: the lists' subscribe / unsubscribe forms (/list/form/...). */
enum MHD_Result list_form_route(struct request *req);
/* archive_pages.c: a list's public archive (/archive/LIST/...). */
enum MHD_Result archive_route(struct request *req);
/* secure_link.c: the secure-link portal's pages (/secure/SECRET/...). */
enum MHD_Result secure_link_route(struct request *req);

#endif
