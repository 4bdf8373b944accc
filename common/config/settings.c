/*
 * settings.c: see settings.h.
 */
#include "config/settings.h"

#include <stdio.h>
#include <string.h>

#include "base/buf.h"
#include "options.h"
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
	/* The domain's rows first, so that the address's own replace them below. */
	res = db_exec(conn,
				  "SELECT a.address, s.option, s.value FROM unnest($1::text[]) AS a(address)"
				  " JOIN pepsi.settings s ON s.address = lower(a.address)"
				  " OR s.address = regexp_replace(lower(a.address), '^.*@', '@')"
				  " ORDER BY s.address LIKE '@%' DESC",
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

const char *
settings_owner_value(const json_t *settings, const char *option)
{
	const json_t *own = json_object_get(settings, option);

	if (!json_is_string(own) || option_owner_find(option, NULL) == NULL)
		return NULL;
	return json_string_value(own);
}

const char *
settings_text_for(const struct pepsi_config *cfg, const char *section, const json_t *settings, const char *option,
				  const char *address)
{
	const char *own = settings_owner_value(settings, option);
	const char *at = strrchr(address, '@');

	if (own != NULL)
		return own;
	return config_text_for(cfg, section, option, at ? at + 1 : NULL, address);
}
