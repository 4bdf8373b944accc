/*
 * settings.c: see settings.h.
 */
#include "config/settings.h"

#include <stdio.h>

#include "base/buf.h"
#include "runtime/db.h"

json_t *
settings_for_address(PGconn *conn, const char *address, char *err, size_t errlen)
{
	json_t *all = settings_for_addresses(conn, &address, 1, err, errlen);
	json_t *settings;

	if (all == NULL)
		return NULL;
	/* Every address asked for has its entry, an empty object for none. */
	settings = json_object_get(all, address);
	settings = settings ? json_incref(settings) : json_object();
	json_decref(all);
	return settings;
}

json_t *
settings_for_addresses(PGconn *conn, const char *const *addresses, size_t count, char *err, size_t errlen)
{
	struct buf	array = BUF_INIT;
	const char *values[1];
	PGresult   *res;
	json_t	   *all = json_object();

	buf_append_char(&array, '{');
	for (size_t i = 0; i < count; i++)
		db_array_append(&array, addresses[i]);
	buf_append_char(&array, '}');
	values[0] = array.data;
	res = db_exec(conn,
				  "SELECT a.address, s.option, s.value FROM unnest($1::text[]) AS a(address)"
				  " JOIN pepsi.settings s ON s.address = lower(a.address)",
				  1, values);
	buf_free(&array);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		if (count == 1)
			snprintf(err, errlen, "reading the settings of %s: %s", addresses[0], db_error(res, conn));
		else
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
