/*
 * settings.c: see settings.h.
 */
#include "settings.h"

#include <stdio.h>

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
