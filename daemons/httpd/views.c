/*
 * views.c: the reads behind the web page's views that are not the queue's
 * (api.c): the traffic history and queue depth of the charts, delivery
 * delay percentiles, refusals, destinations, the last delivery log lines,
 * and the configuration in force with where each value comes from.
 *
 * The history is pepsi.stats_minute, which the maintenance worker keeps
 * (pepsi--0.3--0.4.sql): a chart never counts the queue.  Every route is a
 * GET behind the checks every /api/ route passes (main.c: Host, session or
 * token); none acts, so each may read from a standby (httpd_db_read).
 */
#include <string.h>

#include "base/log.h"
#include "httpd.h"
#include "runtime/db.h"

/*
 * A value shown on the page: a connection string that holds a password
 * is not shown (the rest of the configuration names files, not secrets).
 */
static const char *
views_shown_value(const char *option, const char *value)
{
	size_t len = strlen(option);

	if (len >= 8 && strcmp(option + len - 8, "CONNINFO") == 0 && strstr(value, "password") != NULL)
		return "(not shown: it holds a password)";
	return value;
}

/*
 * The configuration in force: each option of the file pepsi-httpd read (at
 * start or its last reload) with its file and line, each override in the
 * database with its scope and who set it, and the default of each option
 * set nowhere.  in_force is false for a file value a global override
 * replaces; a domain's or an address's override applies to its scope.
 */
static enum MHD_Result
views_config(struct request *req)
{
	static const char sql[] =
		"WITH f AS (SELECT * FROM json_to_recordset($1::json)"
		"   AS f (section text, option text, value text, origin text)),"
		" o AS (SELECT c.scope, c.section, c.option, c.value,"
		"   format('pepsi.config_override, set by %s at %s', c.updated_by,"
		"          to_char(c.updated_at, 'YYYY-MM-DD HH24:MI:SS TZ')) AS origin"
		"   FROM pepsi.config_override c),"
		" rows AS ("
		"  SELECT f.section, f.option, 'file' AS scope, f.value, f.origin,"
		"   NOT EXISTS (SELECT FROM o WHERE o.scope = 'global' AND o.section = f.section"
		"               AND o.option = f.option) AS in_force FROM f"
		"  UNION ALL SELECT o.section, o.option, o.scope, o.value, o.origin, true FROM o"
		"  UNION ALL SELECT d.section, d.option, 'default', d.default_value,"
		"   'the default (pepsi.conf(5))', true FROM pepsi.config_option d"
		"   WHERE d.program IS NULL AND d.section !~ '[*]' AND d.default_value IS NOT NULL"
		"   AND NOT EXISTS (SELECT FROM f WHERE f.section = d.section AND f.option = d.option)"
		"   AND NOT EXISTS (SELECT FROM o WHERE o.scope = 'global' AND o.section = d.section"
		"                   AND o.option = d.option))"
		" SELECT json_agg(r ORDER BY r.section, r.option, r.scope <> 'default', r.scope <> 'file',"
		"                 r.scope) FROM rows r";
	const struct pepsi_config *cfg = httpd.cfg;
	json_t					  *file = json_array();
	char					  *text;
	const char				  *values[1];
	enum MHD_Result			   result;

	for (size_t i = 0; i < cfg->count; i++)
	{
		const struct config_entry *e = &cfg->entries[i];
		char					   origin[1024];

		if (e->scope != NULL)
			continue;
		snprintf(origin, sizeof(origin), "%s:%d", cfg->path, e->line);
		json_array_append_new(file, json_pack("{s:s, s:s, s:s, s:s}", "section", e->section, "option",
											  e->option, "value", views_shown_value(e->option, e->value),
											  "origin", origin));
	}
	text = json_dumps(file, JSON_COMPACT);
	json_decref(file);
	values[0] = text;
	result = api_json_read(req, sql, 1, values, false);
	free(text);
	return result;
}

/* ?span=hour (a point a minute) or day (a point every five minutes). */
static enum MHD_Result
views_history(struct request *req)
{
	const char *span = MHD_lookup_connection_value(req->connection, MHD_GET_ARGUMENT_KIND, "span");
	const char *values[2] = {"1 hour", "1 minute"};

	if (span && strcmp(span, "day") == 0)
	{
		values[0] = "1 day";
		values[1] = "5 minutes";
	}
	else if (span && strcmp(span, "hour") != 0)
		return reply_error(req, MHD_HTTP_BAD_REQUEST, "span is \"hour\" or \"day\", not \"%.20s\"", span);
	return api_json_read(req,
						 "SELECT json_agg(json_build_object('at', extract(epoch FROM h.at), 'received',"
						 " h.received, 'sent', h.sent, 'deferred', h.deferred, 'bounced', h.bounced,"
						 " 'expired', h.expired, 'refused', h.refused, 'queue', h.queue) ORDER BY h.at)"
						 " FROM pepsi.stats_history($1::interval, $2::interval) h",
						 2, values, false);
}

enum MHD_Result
views_route(struct request *req, const struct principal *who, bool *handled)
{
	const char				*path = req->path + 5; /* after "/api/" */
	bool					 get = strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0;
	static const char *const paths[] = {"history", "delays", "refusals", "destinations",
										"log", "config/in-force", "replica", NULL};

	(void) who;
	*handled = false;
	for (int i = 0; paths[i]; i++)
		if (strcmp(path, paths[i]) == 0)
			*handled = true;
	if (!*handled)
		return MHD_NO;
	if (!get)
		return reply_error(req, MHD_HTTP_METHOD_NOT_ALLOWED, "%s takes GET", req->path);
	if (strcmp(path, "replica") == 0)
		return replica_respond(req);
	if (strcmp(path, "history") == 0)
		return views_history(req);
	if (strcmp(path, "delays") == 0)
		return api_json_read(req,
							 "SELECT json_build_object("
							 "'hour', (SELECT json_agg(d) FROM pepsi.stats_delivery_delay('1 hour') d),"
							 "'day', (SELECT json_agg(d) FROM pepsi.stats_delivery_delay('1 day') d))",
							 0, NULL, false);
	if (strcmp(path, "refusals") == 0)
		return api_json_read(req, "SELECT json_agg(r ORDER BY r.code) FROM pepsi.smtp_refusal r", 0, NULL,
							 false);
	if (strcmp(path, "destinations") == 0)
		return api_json_read(req, "SELECT json_agg(d) FROM pepsi.destination_overview(100) d", 0, NULL,
							 false);
	if (strcmp(path, "log") == 0)
		return api_json_read(req,
							 "SELECT json_agg(l ORDER BY l.id DESC)"
							 " FROM pepsi.mail_log_read(NULL, 'delivery', 100) l",
							 0, NULL, false);
	return views_config(req);
}
