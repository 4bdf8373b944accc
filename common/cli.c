/* cli.c: see cli.h. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "db.h"
#include "log.h"

PGconn *
cli_connect(const char *program, const char *config_path, struct pepsi_config **cfg, int *rc)
{
	char		err[1024];
	PGconn	   *conn;

	if (config_path == NULL)
		config_path = getenv("PEPSI_CONFIG");
	if (config_path == NULL)
		config_path = PEPSI_CONFIG_DEFAULT_PATH;
	if ((*cfg = config_load(config_path, err, sizeof(err))) == NULL)
	{
		fprintf(stderr, "%s: %s\n", program, err);
		*rc = CLI_EX_CONFIG;
		return NULL;
	}
	if ((conn = db_connect(*cfg, program, err, sizeof(err))) == NULL)
	{
		fprintf(stderr, "%s: %s\n", program, err);
		*rc = CLI_EX_TEMPFAIL;
		return NULL;
	}
	return conn;
}

bool
cli_parse_id(const char *text, long long *id)
{
	char	   *end;

	if (text[0] < '0' || text[0] > '9' || strlen(text) > 19)
		return false;
	*id = strtoll(text, &end, 10);
	return *end == '\0' && *id > 0;
}

void
cli_db_error(const char *program, PGresult *res, PGconn *conn)
{
	const char *detail = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL) : NULL;
	const char *hint = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_HINT) : NULL;
	const char *primary = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;

	fprintf(stderr, "%s: %s\n", program, primary ? primary : db_error(res, conn));
	if (detail)
		fprintf(stderr, "  %s\n", detail);
	if (hint)
		fprintf(stderr, "  hint: %s\n", hint);
}

static json_t *
cli_json_value(PGresult *res, int row, int col)
{
	Oid			type = PQftype(res, col);
	const char *value = PQgetvalue(res, row, col);

	if (PQgetisnull(res, row, col))
		return json_null();
	switch (type)
	{
		case 20:				/* int8 */
		case 21:				/* int2 */
		case 23:				/* int4 */
			return json_integer(atoll(value));
		case 700:				/* float4 */
		case 701:				/* float8 */
		case 1700:				/* numeric */
			return json_real(atof(value));
		case 16:				/* bool */
			return json_boolean(value[0] == 't');
		case 114:				/* json */
		case 3802:				/* jsonb */
		case 1009:				/* text[]: sent as JSON by the queries that want it */
			{
				json_t	   *parsed = json_loads(value, JSON_DECODE_ANY, NULL);

				return parsed ? parsed : json_string(value);
			}
		default:
			return json_string(value);
	}
}

void
cli_print(PGresult *res, bool as_json)
{
	int			rows = PQntuples(res);
	int			cols = PQnfields(res);

	if (as_json)
	{
		json_t	   *list = json_array();

		for (int r = 0; r < rows; r++)
		{
			json_t	   *object = json_object();

			for (int c = 0; c < cols; c++)
				json_object_set_new(object, PQfname(res, c), cli_json_value(res, r, c));
			json_array_append_new(list, object);
		}
		json_dumpf(list, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
		putchar('\n');
		json_decref(list);
		return;
	}
	{
		int		   *width = xcalloc((size_t) cols + 1, sizeof(int));

		for (int c = 0; c < cols; c++)
		{
			width[c] = (int) strlen(PQfname(res, c));
			for (int r = 0; r < rows; r++)
				if (PQgetlength(res, r, c) > width[c])
					width[c] = PQgetlength(res, r, c);
		}
		for (int c = 0; c < cols; c++)
		{
			char	   *name = xstrdup(PQfname(res, c));

			for (char *p = name; *p; p++)
				*p = (char) (*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
			printf("%-*s%s", c == cols - 1 ? 0 : width[c], name, c == cols - 1 ? "\n" : "  ");
			free(name);
		}
		for (int r = 0; r < rows; r++)
			for (int c = 0; c < cols; c++)
				printf("%-*s%s", c == cols - 1 ? 0 : width[c], PQgetvalue(res, r, c),
					   c == cols - 1 ? "\n" : "  ");
		free(width);
	}
}
