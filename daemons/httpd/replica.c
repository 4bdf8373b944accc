/*
 * replica.c: the read-only views on a standby (docs/scaling.md).
 *
 * [httpd] READ_CONNINFO names where the views read (the queue, the
 * summary, the charts, the logs, the configuration in force: every GET of
 * the API that only reads), as pepsi-httpd's own role.  It may list
 * standbys first (target_session_attrs=prefer-standby, or standby): the
 * reads then cost the primary nothing.  The sessions, every action and
 * /metrics (whose /healthz asks whether a dispatcher holds its lock on the
 * primary) stay on [httpd] CONNINFO, the primary.  A standby is behind the
 * primary by its replication lag: GET /api/replica says how far, and the
 * page shows it, so that an administrator who has just acted knows why
 * the queue does not show it yet.
 */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "httpd.h"
#include "runtime/db.h"

PGconn *
httpd_db_read(void)
{
	char err[1024];

	if (config_text(httpd.cfg, "httpd", "READ_CONNINFO") == NULL)
		return httpd_db();
	if (httpd.reader && PQstatus(httpd.reader) == CONNECTION_OK)
		return httpd.reader;
	if (httpd.reader)
	{
		PQfinish(httpd.reader);
		httpd.reader = NULL;
	}
	/* A reconnection looks again: after a failover the standby listed first may be the primary. */
	if ((httpd.reader = db_connect_as(httpd.cfg, "httpd", "READ_CONNINFO", "pepsi-httpd views", err,
									  sizeof(err)))
		== NULL)
		log_warnx("%s", err);
	else
		log_info("the views read from %s port %s%s", PQhost(httpd.reader), PQport(httpd.reader),
				 db_is_standby(httpd.reader) ? " (a standby)" : "");
	return httpd.reader;
}

enum MHD_Result
replica_respond(struct request *req)
{
	PGconn *conn = httpd_db_read();
	char   *lag;
	json_t *body;

	if (conn == NULL)
		return reply_error(req, MHD_HTTP_SERVICE_UNAVAILABLE, "the database is not answering");
	lag = db_standby_lag(conn);
	body = json_pack("{s:b, s:s, s:s}", "standby", lag != NULL, "host", PQhost(conn), "port", PQport(conn));
	json_object_set_new(body, "lag_seconds", lag ? json_real(atof(lag)) : json_null());
	free(lag);
	return reply_json(req, MHD_HTTP_OK, body);
}
