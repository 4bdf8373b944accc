/*
 * settings.c: see settings.h.
 */
#include "settings.h"

#include <stdio.h>

#include "buf.h"
#include "db.h"

json_t *
settings_for_address(PGconn *conn, const char *address, char *err, size_t errlen)
{
	const char *values[1] = {address};
	PGresult   *res = db_exec(conn, "SELECT option, value FROM pepsi.settings WHERE address = lower($1)",
							  1, values);
	json_t	   *settings;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		snprintf(err, errlen, "reading the settings of %s: %s", address, db_error(res, conn));
		PQclear(res);
		return NULL;
	}
	settings = json_object();
	for (int i = 0; i < PQntuples(res); i++)
		json_object_set_new(settings, PQgetvalue(res, i, 0), json_string(PQgetvalue(res, i, 1)));
	PQclear(res);
	return settings;
}

/* The addresses as a text[] literal: each element quoted, " and \ escaped. */
static void
settings_array_literal(struct buf *out, const char *const *addresses, size_t count)
{
	buf_append_char(out, '{');
	for (size_t i = 0; i < count; i++)
	{
		if (i > 0)
			buf_append_char(out, ',');
		buf_append_char(out, '"');
		for (const char *p = addresses[i]; *p; p++)
		{
			if (*p == '"' || *p == '\\')
				buf_append_char(out, '\\');
			buf_append_char(out, *p);
		}
		buf_append_char(out, '"');
	}
	buf_append_char(out, '}');
}

json_t *
settings_for_addresses(PGconn *conn, const char *const *addresses, size_t count, char *err, size_t errlen)
{
	struct buf	array = BUF_INIT;
	const char *values[1];
	PGresult   *res;
	json_t	   *all = json_object();

	settings_array_literal(&array, addresses, count);
	values[0] = array.data;
	res = db_exec(conn,
				  "SELECT a.address, s.option, s.value FROM unnest($1::text[]) AS a(address)"
				  " JOIN pepsi.settings s ON s.address = lower(a.address)",
				  1, values);
	buf_free(&array);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		snprintf(err, errlen, "reading the settings of %zu addresses: %s", count, db_error(res, conn));
		PQclear(res);
		json_decref(all);
		return NULL;
	}
	for (size_t i = 0; i < count; i++)
		if (json_object_get(all, addresses[i]) == NULL)
			json_object_set_new(all, addresses[i], json_object());
	for (int i = 0; i < PQntuples(res); i++)
		json_object_set_new(json_object_get(all, PQgetvalue(res, i, 0)), PQgetvalue(res, i, 1),
							json_string(PQgetvalue(res, i, 2)));
	PQclear(res);
	return all;
}
