/*
 * pepsi-archive: the mailing lists' web archive from the command line
 * (docs/pepsi-archive.8.md).
 *
 *   pepsi-archive [-C CONFIG] import LIST MBOX|MLMMJ-DIRECTORY|-
 *   pepsi-archive [-C CONFIG] export LIST [FILE|-]
 *   pepsi-archive [-C CONFIG] reindex LIST
 *   pepsi-archive [-C CONFIG] [--json] search LIST QUERY | count LIST QUERY
 *   pepsi-archive [-C CONFIG] set LIST SETTING VALUE
 *
 * The parsing, threading and indexing are the extension's (archive_store,
 * which an import calls through archive_store_batch, up to 500 messages a
 * call; archive_reindex): this program only splits an mbox (or reads an
 * mlmmj list's archive/ directory, one message a file) and writes one back.  An
 * import is one transaction, all or nothing, and every command that changes
 * or copies the archive is audited in event_log.  Connects as [database]
 * CONFIG_CONNINFO (pepsi_config).
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <libpq-fe.h>

#include "base/buf.h"
#include "base/xalloc.h"
#include "config/config.h"
#include "process/cli.h"
#include "runtime/db.h"

int pepsi_archive_main(int argc, char **argv);

#define ARCHIVE_PROGRAM "pepsi-archive"
/* An mlmmj archive directory holds numbered files; more are refused. */
#define ARCHIVE_MLMMJ_MAX_FILES 10000000

static void
archive_usage(FILE *out)
{
	fprintf(out, "usage: " ARCHIVE_PROGRAM " [-C CONFIG] import LIST MBOX|MLMMJ-DIRECTORY|-\n"
				 "       " ARCHIVE_PROGRAM " [-C CONFIG] export LIST [FILE|-]\n"
				 "       " ARCHIVE_PROGRAM " [-C CONFIG] reindex LIST\n"
				 "       " ARCHIVE_PROGRAM " [-C CONFIG] [--json] search LIST QUERY\n"
				 "       " ARCHIVE_PROGRAM " [-C CONFIG] count LIST QUERY\n"
				 "       " ARCHIVE_PROGRAM " [-C CONFIG] set LIST SETTING VALUE\n");
}

struct archive_command
{
	const char *name;
	int			args; /* words after the command: exactly, or (export) at most */
};

static const struct archive_command archive_commands[] = {
	{"import", 2}, {"export", 2}, {"reindex", 1}, {"search", 2}, {"count", 2}, {"set", 3}, {NULL, 0}};

/* A statement's result, or NULL (why printed, *rc set) on an error. */
static PGresult *
archive_exec(PGconn *conn, const char *sql, int nparams, const char *const *values, int *rc)
{
	PGresult *res = db_exec(conn, sql, nparams, values);

	if (PQresultStatus(res) != PGRES_TUPLES_OK && PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		*rc = cli_db_exit_code(res, conn);
		cli_db_error(ARCHIVE_PROGRAM, res, conn);
		PQclear(res);
		return NULL;
	}
	return res;
}

/* The id of the list at address, as text; NULL (and why printed) when none. */
static char *
archive_list_id(PGconn *conn, const char *address, int *rc)
{
	const char *values[1] = {address};
	PGresult   *res = archive_exec(conn, "SELECT id FROM pepsi.mailing_list WHERE address = lower($1)", 1, values, rc);
	char	   *id = NULL;

	if (res && PQntuples(res) == 0)
	{
		fprintf(stderr, ARCHIVE_PROGRAM ": no list %s (pepsi-list lists shows them)\n", address);
		*rc = CLI_EX_DATAERR;
	}
	else if (res)
		id = xstrdup(PQgetvalue(res, 0, 0));
	PQclear(res);
	return id;
}

/*
 * An import sends its messages in batches, one call of archive_store_batch
 * (one round trip) each: at most ARCHIVE_BATCH_MESSAGES messages, and no
 * more bytes than ARCHIVE_BATCH_BYTES past the message that reached it.
 */
#define ARCHIVE_BATCH_MESSAGES 500
#define ARCHIVE_BATCH_BYTES (16 * 1024 * 1024)
/* PostgreSQL's type oid of bytea, the batch's element type. */
#define ARCHIVE_BYTEA_OID 17

/* An import in progress: one transaction, its counts, the batch being filled. */
struct archive_import
{
	PGconn	   *conn;
	const char *list;
	const char *source;
	long		messages;
	long		duplicates;
	int			rc;
	struct buf	batch; /* the elements of a binary bytea[]: length, bytes; ... */
	int			batched;
};

/* value as the four bytes of a network-order int32 at out */
static void
archive_be32(unsigned char *out, uint32_t value)
{
	out[0] = (unsigned char) (value >> 24);
	out[1] = (unsigned char) (value >> 16);
	out[2] = (unsigned char) (value >> 8);
	out[3] = (unsigned char) value;
}

static void
archive_put_int32(struct buf *out, uint32_t value)
{
	unsigned char be[4];

	archive_be32(be, value);
	buf_append(out, be, sizeof(be));
}

/* Archive the batch filled so far, in one call (nothing when empty). */
static bool
archive_flush(struct archive_import *run)
{
	struct buf	array = BUF_INIT;
	const char *values[2] = {run->list, NULL};
	int			lengths[2] = {0, 0};
	int			formats[2] = {0, 1};
	PGresult   *res;
	bool		ok;

	if (run->batched == 0)
		return true;
	/* the binary form of a one-dimensional bytea[] with no NULL: its header, then the elements */
	archive_put_int32(&array, 1);
	archive_put_int32(&array, 0);
	archive_put_int32(&array, ARCHIVE_BYTEA_OID);
	archive_put_int32(&array, (uint32_t) run->batched);
	archive_put_int32(&array, 1);
	buf_append(&array, run->batch.data, run->batch.len);
	values[1] = array.data;
	lengths[1] = (int) array.len;
	res = PQexecParams(run->conn, "SELECT pepsi.archive_store_batch($1::bigint, $2::bytea[])", 2, NULL, values, lengths,
					   formats, 0);
	ok = PQresultStatus(res) == PGRES_TUPLES_OK;
	if (!ok)
	{
		run->rc = cli_db_exit_code(res, run->conn);
		cli_db_error(ARCHIVE_PROGRAM, res, run->conn);
	}
	else
	{
		long stored = strtol(PQgetvalue(res, 0, 0), NULL, 10);

		run->messages += stored;
		run->duplicates += run->batched - stored;
	}
	PQclear(res);
	buf_free(&array);
	run->batch.len = 0;
	run->batched = 0;
	return ok;
}

/* Add one message (LF or CRLF line ends; stored with CRLF) to the batch, archiving the batch when full. */
static bool
archive_store_one(struct archive_import *run, const struct buf *message)
{
	size_t length_at = run->batch.len;
	size_t start_len;

	archive_put_int32(&run->batch, 0); /* its length, filled in below */
	start_len = run->batch.len;
	for (size_t start = 0, i = 0; i <= message->len; i++)
		if (i == message->len || (message->data[i] == '\n' && (i == 0 || message->data[i - 1] != '\r')))
		{
			buf_append(&run->batch, message->data + start, i - start);
			if (i < message->len)
				buf_append(&run->batch, "\r", 1);
			start = i;
		}
	if (run->batch.len - start_len > INT32_MAX)
	{
		fprintf(stderr, ARCHIVE_PROGRAM ": %s: a message of %zu bytes is too large to archive\n", run->source,
				run->batch.len - start_len);
		run->rc = CLI_EX_DATAERR;
		return false;
	}
	archive_be32((unsigned char *) run->batch.data + length_at, (uint32_t) (run->batch.len - start_len));
	run->batched++;
	if (run->batched >= ARCHIVE_BATCH_MESSAGES || run->batch.len >= ARCHIVE_BATCH_BYTES)
		return archive_flush(run);
	return true;
}

/*
 * Split an mbox at its "From " lines and archive each message; a line
 * ">From " (any number of '>') loses one '>' (mboxrd, which also reads
 * mboxo right for every line that was not ">From " to begin with).
 */
static bool
archive_import_mbox(struct archive_import *run, FILE *in)
{
	struct buf message = BUF_INIT;
	char	  *line = NULL;
	size_t	   size = 0;
	ssize_t	   len;
	long	   number = 0;
	bool	   started = false;
	bool	   ok = true;

	while (ok && (len = getline(&line, &size, in)) != -1)
	{
		number++;
		if (strncmp(line, "From ", 5) == 0)
		{
			if (started && message.len > 0)
				ok = archive_store_one(run, &message);
			message.len = 0;
			started = true;
			continue;
		}
		if (!started)
		{
			fprintf(stderr, ARCHIVE_PROGRAM ": %s:%ld: not an mbox: the first line is not a \"From \" line\n",
					run->source, number);
			run->rc = CLI_EX_DATAERR;
			ok = false;
			break;
		}
		{
			size_t quotes = strspn(line, ">");

			if (quotes > 0 && strncmp(line + quotes, "From ", 5) == 0)
				buf_append(&message, line + 1, (size_t) len - 1);
			else
				buf_append(&message, line, (size_t) len);
		}
	}
	if (ok && started && message.len > 0)
	{
		/* the blank line mbox puts between messages is not the message's */
		if (message.len >= 2 && message.data[message.len - 1] == '\n' && message.data[message.len - 2] == '\n')
			message.len--;
		ok = archive_store_one(run, &message);
	}
	free(line);
	buf_free(&message);
	return ok;
}

static int
archive_number_order(const void *a, const void *b)
{
	long x = *(const long *) a;
	long y = *(const long *) b;

	return (x > y) - (x < y);
}

/* Read one whole file into message. */
static bool
archive_read_file(const char *path, struct buf *message)
{
	FILE  *in = fopen(path, "r");
	char   chunk[65536];
	size_t got;
	bool   ok;

	if (in == NULL)
		return false;
	while ((got = fread(chunk, 1, sizeof(chunk), in)) > 0)
		buf_append(message, chunk, got);
	ok = !ferror(in);
	fclose(in);
	return ok;
}

/* An mlmmj list's archive: dir (the list's directory or its archive/), one message a numbered file, in order. */
static bool
archive_import_mlmmj(struct archive_import *run, const char *dir)
{
	char		  *archive_dir = xasprintf("%s/archive", dir);
	struct stat	   st;
	DIR			  *d;
	struct dirent *e;
	long		  *numbers = NULL;
	size_t		   count = 0, room = 0;
	bool		   ok = true;

	if (stat(archive_dir, &st) != 0 || !S_ISDIR(st.st_mode))
	{
		free(archive_dir);
		archive_dir = xstrdup(dir);
	}
	if ((d = opendir(archive_dir)) == NULL)
	{
		fprintf(stderr, ARCHIVE_PROGRAM ": %s: %s\n", archive_dir, strerror(errno));
		run->rc = CLI_EX_DATAERR;
		free(archive_dir);
		return false;
	}
	while ((e = readdir(d)) != NULL && count < ARCHIVE_MLMMJ_MAX_FILES)
	{
		if (e->d_name[0] == '\0' || strspn(e->d_name, "0123456789") != strlen(e->d_name))
			continue;
		if (count == room)
			numbers = xrealloc(numbers, (room = room ? room * 2 : 256) * sizeof(*numbers));
		numbers[count++] = strtol(e->d_name, NULL, 10);
	}
	closedir(d);
	qsort(numbers, count, sizeof(*numbers), archive_number_order);
	for (size_t i = 0; ok && i < count; i++)
	{
		char	  *path = xasprintf("%s/%ld", archive_dir, numbers[i]);
		struct buf message = BUF_INIT;

		if (!archive_read_file(path, &message))
		{
			fprintf(stderr, ARCHIVE_PROGRAM ": %s: %s\n", path, strerror(errno));
			run->rc = CLI_EX_DATAERR;
			ok = false;
		}
		else
			ok = archive_store_one(run, &message);
		buf_free(&message);
		free(path);
	}
	if (ok && count == 0)
	{
		fprintf(stderr, ARCHIVE_PROGRAM ": %s: no numbered message files: not an mlmmj archive\n", archive_dir);
		run->rc = CLI_EX_DATAERR;
		ok = false;
	}
	free(numbers);
	free(archive_dir);
	return ok;
}

/* Import path (an mbox, "-", or an mlmmj directory) into list, all or nothing. */
static int
archive_import(PGconn *conn, const char *list, const char *path)
{
	struct archive_import run = {conn, list, path, 0, 0, CLI_EX_OK, BUF_INIT, 0};
	struct stat			  st;
	PGresult			 *res;
	char				 *import_id = NULL;
	bool				  ok;

	if (strcmp(path, "-") != 0 && stat(path, &st) != 0)
	{
		fprintf(stderr, ARCHIVE_PROGRAM ": %s: %s\n", path, strerror(errno));
		return CLI_EX_DATAERR;
	}
	if ((res = archive_exec(conn, "BEGIN", 0, NULL, &run.rc)) == NULL)
		return run.rc;
	PQclear(res);
	{
		const char *values[2] = {list, path};

		if ((res = archive_exec(conn, "SELECT pepsi.archive_import_begin($1::bigint, $2)", 2, values, &run.rc)) == NULL)
			goto fail;
		import_id = xstrdup(PQgetvalue(res, 0, 0));
		PQclear(res);
	}
	if (strcmp(path, "-") == 0)
		ok = archive_import_mbox(&run, stdin);
	else if (S_ISDIR(st.st_mode))
		ok = archive_import_mlmmj(&run, path);
	else
	{
		FILE *in = fopen(path, "r");

		if (in == NULL)
		{
			fprintf(stderr, ARCHIVE_PROGRAM ": %s: %s\n", path, strerror(errno));
			run.rc = CLI_EX_DATAERR;
			goto fail;
		}
		ok = archive_import_mbox(&run, in);
		fclose(in);
	}
	if (!ok || !archive_flush(&run))
		goto fail;
	{
		char		messages[32], duplicates[32];
		const char *values[3] = {import_id, messages, duplicates};

		snprintf(messages, sizeof(messages), "%ld", run.messages);
		snprintf(duplicates, sizeof(duplicates), "%ld", run.duplicates);
		if ((res = archive_exec(conn, "SELECT pepsi.archive_import_finish($1::bigint, $2::integer, $3::integer)", 3,
								values, &run.rc))
			== NULL)
			goto fail;
		PQclear(res);
	}
	if ((res = archive_exec(conn, "COMMIT", 0, NULL, &run.rc)) == NULL)
		goto fail;
	PQclear(res);
	printf("%ld message(s) archived, %ld already there\n", run.messages, run.duplicates);
	buf_free(&run.batch);
	free(import_id);
	return CLI_EX_OK;
fail:
	PQclear(PQexec(conn, "ROLLBACK"));
	buf_free(&run.batch);
	fprintf(stderr, ARCHIVE_PROGRAM ": %s: nothing imported\n", path);
	free(import_id);
	return run.rc != CLI_EX_OK ? run.rc : CLI_EX_DATAERR;
}

/* One archived message as an mbox entry: From_ line, LF line ends, ">From " quoting (mboxrd). */
static void
archive_write_mbox_entry(FILE *out, const char *sender, const char *date, const unsigned char *raw, size_t len)
{
	bool line_start = true;

	fprintf(out, "From %s %s\n", sender && *sender ? sender : "MAILER-DAEMON", date);
	for (size_t i = 0; i < len; i++)
	{
		if (line_start)
		{
			size_t quotes = 0;

			while (i + quotes < len && raw[i + quotes] == '>')
				quotes++;
			if (i + quotes + 5 <= len && memcmp(raw + i + quotes, "From ", 5) == 0)
				fputc('>', out);
		}
		line_start = raw[i] == '\n';
		if (raw[i] == '\r' && i + 1 < len && raw[i + 1] == '\n')
			continue;
		fputc(raw[i], out);
	}
	if (len > 0 && raw[len - 1] != '\n')
		fputc('\n', out);
	fputc('\n', out);
}

/* Export list's archive as an mbox to path ("-": standard output), in date order; audited. */
static int
archive_export(PGconn *conn, const char *list, const char *path)
{
	FILE	   *out = strcmp(path, "-") == 0 ? stdout : fopen(path, "w");
	const char *values[1] = {list};
	PGresult   *res;
	long		written = 0;
	int			rc = CLI_EX_OK;

	if (out == NULL)
	{
		fprintf(stderr, ARCHIVE_PROGRAM ": %s: %s\n", path, strerror(errno));
		return CLI_EX_DATAERR;
	}
	if ((res = archive_exec(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ", 0, NULL, &rc)) == NULL)
		goto out;
	PQclear(res);
	if ((res = archive_exec(conn,
							"DECLARE archive_export CURSOR FOR SELECT from_address,"
							" to_char(sent_at AT TIME ZONE 'UTC', 'Dy Mon DD HH24:MI:SS YYYY'), raw"
							" FROM pepsi.archive_message WHERE list_id = $1::bigint ORDER BY sent_at, id",
							1, values, &rc))
		== NULL)
		goto out;
	PQclear(res);
	for (;;)
	{
		int rows;

		res = PQexecParams(conn, "FETCH 500 FROM archive_export", 0, NULL, NULL, NULL, NULL, 1);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			rc = cli_db_exit_code(res, conn);
			cli_db_error(ARCHIVE_PROGRAM, res, conn);
			PQclear(res);
			goto out;
		}
		rows = PQntuples(res);
		for (int i = 0; i < rows; i++, written++)
			archive_write_mbox_entry(out, PQgetisnull(res, i, 0) ? NULL : PQgetvalue(res, i, 0), PQgetvalue(res, i, 1),
									 (const unsigned char *) PQgetvalue(res, i, 2), (size_t) PQgetlength(res, i, 2));
		PQclear(res);
		if (rows == 0)
			break;
	}
	if (fflush(out) != 0 || ferror(out))
	{
		fprintf(stderr, ARCHIVE_PROGRAM ": %s: %s\n", path, strerror(errno));
		rc = CLI_EX_DATAERR;
		goto out;
	}
	{
		char		count[32];
		const char *logged[3] = {list, count, path};

		snprintf(count, sizeof(count), "%ld", written);
		if ((res = archive_exec(conn, "SELECT pepsi.archive_exported($1::bigint, $2::bigint, $3)", 3, logged, &rc)))
		{
			PQclear(res);
			if ((res = archive_exec(conn, "COMMIT", 0, NULL, &rc)))
				PQclear(res);
		}
	}
	if (rc == CLI_EX_OK && out != stdout)
		printf("%ld message(s) exported to %s\n", written, path);
out:
	if (rc != CLI_EX_OK)
		PQclear(PQexec(conn, "ROLLBACK"));
	if (out != stdout)
		fclose(out);
	return rc;
}

static int
archive_run(PGconn *conn, const char *command, int nargs, char **argv, bool as_json)
{
	int			rc = CLI_EX_OK;
	char	   *id = archive_list_id(conn, argv[0], &rc);
	const char *values[3] = {id, nargs > 1 ? argv[1] : NULL, nargs > 2 ? argv[2] : NULL};
	PGresult   *res;

	if (id == NULL)
		return rc;
	if (strcmp(command, "import") == 0)
		rc = archive_import(conn, id, argv[1]);
	else if (strcmp(command, "export") == 0)
		rc = archive_export(conn, id, nargs > 1 ? argv[1] : "-");
	else if (strcmp(command, "reindex") == 0)
	{
		if ((res = archive_exec(conn, "SELECT pepsi.archive_reindex($1::bigint)", 1, values, &rc)))
		{
			printf("%s message(s) reindexed\n", PQgetvalue(res, 0, 0));
			PQclear(res);
		}
	}
	else if (strcmp(command, "search") == 0)
		rc = cli_show_result(ARCHIVE_PROGRAM,
							 db_exec(conn, "SELECT * FROM pepsi.archive_search($1::bigint, $2, 1000)", 2, values),
							 conn, as_json);
	else if (strcmp(command, "count") == 0)
	{
		if ((res = archive_exec(conn, "SELECT pepsi.archive_search_count($1::bigint, $2)", 2, values, &rc)))
		{
			printf("%s\n", PQgetvalue(res, 0, 0));
			PQclear(res);
		}
	}
	else if (strcmp(command, "set") == 0)
	{
		if ((res = archive_exec(conn, "SELECT pepsi.archive_policy_set($1::bigint, $2, $3)", 3, values, &rc)))
		{
			printf("%s: archive %s set\n", argv[0], argv[1]);
			PQclear(res);
		}
	}
	free(id);
	return rc;
}

int
pepsi_archive_main(int argc, char **argv)
{
	const char					 *config_path = NULL;
	bool						  as_json = false;
	struct pepsi_config			 *cfg = NULL;
	const struct archive_command *c;
	PGconn						 *conn;
	int							  nargs;
	int							  rc = CLI_EX_OK;

	if (!cli_command_options(argc, argv, archive_usage, true, &config_path, &as_json, NULL, &rc))
		return rc;
	for (c = archive_commands; c->name && strcmp(c->name, argv[optind]) != 0; c++)
		;
	nargs = argc - optind - 1;
	if (c->name == NULL)
	{
		fprintf(stderr, ARCHIVE_PROGRAM ": unknown command \"%s\"\n", argv[optind]);
		archive_usage(stderr);
		return CLI_EX_USAGE;
	}
	if (strcmp(c->name, "export") == 0 ? (nargs < 1 || nargs > c->args) : nargs != c->args)
	{
		fprintf(stderr, ARCHIVE_PROGRAM ": %s takes %d argument(s), not %d\n", c->name, c->args, nargs);
		archive_usage(stderr);
		return CLI_EX_USAGE;
	}
	if ((conn = cli_connect(ARCHIVE_PROGRAM, config_path, CLI_ROLE_CONFIG, &cfg, &rc)) == NULL)
		return rc;
	rc = archive_run(conn, c->name, nargs, argv + optind + 1, as_json);
	PQfinish(conn);
	config_free(cfg);
	return rc;
}
