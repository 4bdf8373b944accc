/* cli.c: see cli.h. */
#include "process/cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "runtime/db.h"

#ifndef PEPSI_VERSION
#error "the Makefile defines PEPSI_VERSION (META.json's version)"
#endif

const char *
pepsi_version(void)
{
	return PEPSI_VERSION;
}

bool
cli_version_option(const char *program, int argc, char **argv)
{
	if (argc < 2 || strcmp(argv[1], "--version") != 0)
		return false;
	printf("%s (Pepsi) %s\n", program, PEPSI_VERSION);
	fflush(stdout);
	return true;
}

bool
cli_is_help(const char *arg)
{
	return strcmp(arg, "--help") == 0;
}

const char *
cli_config_path(const char *given)
{
	if (given == NULL)
		given = getenv("PEPSI_CONFIG");
	return given ? given : PEPSI_CONFIG_DEFAULT_PATH;
}

bool
cli_daemon_options(int argc, char **argv, const char **config_path, bool *help)
{
	int opt;

	*config_path = NULL;
	*help = false;
	while ((opt = getopt(argc, argv, "c:vh")) != -1)
		switch (opt)
		{
			case 'c':
				*config_path = optarg;
				break;
			case 'v':
				log_setverbose(log_getverbose() + 1);
				break;
			case 'h':
				*help = true;
				return true;
			default:
				return false;
		}
	*config_path = cli_config_path(*config_path);
	return true;
}

bool
cli_command_options(int argc, char **argv, void (*usage)(FILE *), bool command_required,
					const char **config_path, bool *as_json, const char **section, int *rc)
{
	static const struct option with_section[] = {{"config", required_argument, NULL, 'C'},
												 {"json", no_argument, NULL, 'j'},
												 {"section", required_argument, NULL, 's'},
												 {"help", no_argument, NULL, 'h'},
												 {NULL, 0, NULL, 0}};
	static const struct option plain[] = {{"config", required_argument, NULL, 'C'},
										  {"json", no_argument, NULL, 'j'},
										  {"help", no_argument, NULL, 'h'},
										  {NULL, 0, NULL, 0}};
	int						   opt;

	*config_path = NULL;
	*as_json = false;
	if (section)
		*section = NULL;
	while ((opt = getopt_long(argc, argv, section ? "+C:js:h" : "+C:jh", section ? with_section : plain, NULL)) != -1)
		switch (opt)
		{
			case 'C':
				*config_path = optarg;
				break;
			case 'j':
				*as_json = true;
				break;
			case 's':
				*section = optarg;
				break;
			case 'h':
				usage(stdout);
				*rc = CLI_EX_OK;
				return false;
			default:
				usage(stderr);
				*rc = CLI_EX_USAGE;
				return false;
		}
	if (command_required && optind >= argc)
	{
		usage(stderr);
		*rc = CLI_EX_USAGE;
		return false;
	}
	return true;
}

PGconn *
cli_connect(const char *program, const char *config_path, enum cli_role role,
			struct pepsi_config **cfg, int *rc)
{
	const char *option = role == CLI_ROLE_MONITOR ? "MONITOR_CONNINFO" : "CONFIG_CONNINFO";
	char		err[1024];
	PGconn	   *conn;

	config_path = cli_config_path(config_path);
	if ((*cfg = config_load(config_path, err, sizeof(err))) == NULL)
	{
		fprintf(stderr, "%s: %s\n", program, err);
		*rc = CLI_EX_CONFIG;
		return NULL;
	}
	if ((conn = db_connect_as(*cfg, "database", option, program, err, sizeof(err))) == NULL)
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
	char *end;

	if (text[0] < '0' || text[0] > '9' || strlen(text) > 19)
		return false;
	errno = 0;
	*id = strtoll(text, &end, 10);
	return *end == '\0' && errno == 0 && *id > 0;
}

bool
cli_parse_int_range(const char *text, long min, long max, long *value)
{
	char *end;
	long  v;

	if (!((text[0] >= '0' && text[0] <= '9') || (text[0] == '-' && min < 0)))
		return false;
	errno = 0;
	v = strtol(text, &end, 10);
	if (end == text || *end != '\0' || errno != 0 || v < min || v > max)
		return false;
	*value = v;
	return true;
}

int
cli_db_exit_code(PGresult *res, PGconn *conn)
{
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

	if (PQstatus(conn) != CONNECTION_OK || state == NULL)
		return CLI_EX_TEMPFAIL;
	/* connection exceptions, serialization failure and deadlock, shutdown */
	if (strncmp(state, "08", 2) == 0 || strcmp(state, "40001") == 0
		|| strcmp(state, "40P01") == 0 || strncmp(state, "57P", 3) == 0)
		return CLI_EX_TEMPFAIL;
	if (strcmp(state, "42501") == 0)
		return CLI_EX_NOPERM;
	return CLI_EX_DATAERR;
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

/* A JSON string; bytes that are not UTF-8 (a database not in UTF8) become "?". */
static json_t *
cli_json_string(const char *value)
{
	json_t *string = json_string(value);
	char   *copy;

	if (string)
		return string;
	copy = xstrdup(value);
	for (char *p = copy; *p; p++)
		if ((unsigned char) *p >= 0x80)
			*p = '?';
	string = json_string(copy);
	free(copy);
	return string;
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
		case 20: /* int8 */
		case 21: /* int2 */
		case 23: /* int4 */
			return json_integer(atoll(value));
		case 700:  /* float4 */
		case 701:  /* float8 */
		case 1700: /* numeric */
			return json_real(atof(value));
		case 16: /* bool */
			return json_boolean(value[0] == 't');
		case 114:  /* json */
		case 3802: /* jsonb */
		case 1009: /* text[]: sent as JSON by the queries that want it */
			{
				json_t *parsed = json_loads(value, JSON_DECODE_ANY, NULL);

				return parsed ? parsed : cli_json_string(value);
			}
		default:
			return cli_json_string(value);
	}
}

/* Columns a UTF-8 string takes: one per character (not per byte). */
static int
cli_width(const char *text)
{
	int width = 0;

	for (const unsigned char *p = (const unsigned char *) text; *p; p++)
		if ((*p & 0xc0) != 0x80)
			width++;
	return width;
}

/* One cell padded to width columns, then the separator or the line's end. */
static void
cli_print_cell(const char *text, int width, bool last)
{
	fputs(text, stdout);
	for (int pad = width - cli_width(text); pad > 0 && !last; pad--)
		putchar(' ');
	fputs(last ? "\n" : "  ", stdout);
}

/* A value as the table shows it: control characters escaped. */
static char *
cli_cell(const char *value)
{
	struct buf out = BUF_INIT;

	for (const unsigned char *p = (const unsigned char *) value; *p; p++)
	{
		if (*p == '\n')
			buf_append_str(&out, "\\n");
		else if (*p == '\r')
			buf_append_str(&out, "\\r");
		else if (*p == '\t')
			buf_append_str(&out, "\\t");
		else if (*p < 0x20 || *p == 0x7f)
			buf_printf(&out, "\\x%02x", *p);
		else
			buf_append_char(&out, (char) *p);
	}
	return out.data ? out.data : xstrdup("");
}

void
cli_write_escaped(const char *data, size_t len, FILE *out)
{
	const unsigned char *p = (const unsigned char *) data;

	for (size_t i = 0; i < len; i++)
	{
		unsigned char c = p[i];

		if (c == '\t' || c == '\n' || (c == '\r' && i + 1 < len && p[i + 1] == '\n'))
			putc(c, out);
		else if (c < 0x20 || c == 0x7f)
			fprintf(out, "\\x%02x", c);
		else if (c == 0xc2 && i + 1 < len && p[i + 1] >= 0x80 && p[i + 1] <= 0x9f)
		{
			/* a C1 control in UTF-8 (0x9b is CSI on some terminals) */
			fprintf(out, "\\xc2\\x%02x", p[i + 1]);
			i++;
		}
		else if (c >= 0x80 && c <= 0x9f)
			fprintf(out, "\\x%02x", c);
		else
			putc(c, out);
	}
}

void
cli_print(PGresult *res, bool as_json)
{
	int rows = PQntuples(res);
	int cols = PQnfields(res);

	if (as_json)
	{
		json_t *list = json_array();

		for (int r = 0; r < rows; r++)
		{
			json_t *object = json_object();

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
		int	  *width = xcalloc((size_t) cols + 1, sizeof(int));
		char **cell = xcalloc((size_t) rows * (size_t) cols + 1, sizeof(char *));

		for (int c = 0; c < cols; c++)
		{
			width[c] = cli_width(PQfname(res, c));
			for (int r = 0; r < rows; r++)
			{
				int w;

				cell[r * cols + c] = cli_cell(PQgetvalue(res, r, c));
				w = cli_width(cell[r * cols + c]);
				if (w > width[c])
					width[c] = w;
			}
		}
		for (int c = 0; c < cols; c++)
		{
			char *name = xstrdup(PQfname(res, c));

			for (char *p = name; *p; p++)
				*p = (char) (*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
			cli_print_cell(name, c == cols - 1 ? 0 : width[c], c == cols - 1);
			free(name);
		}
		for (int r = 0; r < rows; r++)
			for (int c = 0; c < cols; c++)
			{
				cli_print_cell(cell[r * cols + c], c == cols - 1 ? 0 : width[c], c == cols - 1);
				free(cell[r * cols + c]);
			}
		free(cell);
		free(width);
	}
}

int
cli_show_result(const char *program, PGresult *res, PGconn *conn, bool as_json)
{
	int rc = CLI_EX_OK;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		cli_db_error(program, res, conn);
		rc = cli_db_exit_code(res, conn);
	}
	else
		cli_print(res, as_json);
	PQclear(res);
	return rc;
}
