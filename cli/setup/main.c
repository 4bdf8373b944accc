/*
 * pepsi-setup: from an installed package to a running mail server, as root.
 *
 *   pepsi-setup init [--non-interactive] [--apply-pg-hba] [--root DIR] [--QUESTION VALUE]...
 *       the interview (common/setup/setup_model.h): asks on a terminal, or
 *       takes every answer as an option; checks the answers, the cluster
 *       and the SMTP port before it changes anything; then applies the
 *       plan through the same task kinds apply runs, and prints the
 *       pg_hba.conf / pg_ident.conf lines for the DBA (or, with
 *       --apply-pg-hba and a local cluster, keeps them in a marked block
 *       of its files and reloads it)
 *   pepsi-setup init --web [--lifetime DURATION] [-c CONFIG] [--root DIR]
 *       the same interview in pepsi-httpd's setup page instead: a one-time
 *       link to it (web.c); the page enqueues the plan for apply
 *   pepsi-setup apply [-c CONFIG] [--root DIR]
 *       the grants, re-applied and verified, then every pending row of
 *       pepsi.setup_task
 *   pepsi-setup upgrade [-c CONFIG]
 *       ALTER EXTENSION pepsi UPDATE, then the grants
 *   pepsi-setup dns [-c CONFIG]      the records to publish
 *   pepsi-setup check [-c CONFIG]    the same, looked up through the resolver
 *   pepsi-setup certificate [-c CONFIG] [--root DIR] [--hostname HOST]
 *       [--certificate FILE --key FILE | --webroot DIR | --standalone]
 *       ingress's certificate: given, or obtained with certbot
 *
 * Every step is idempotent: run again, it changes nothing and says so.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/xalloc.h"
#include "process/cli.h"
#include "setup.h"
#include "setup/setup_model.h"

int pepsi_setup_main(int argc, char **argv);

static int
setup_usage(FILE *out)
{
	fprintf(out, "usage: pepsi-setup init [--non-interactive] [--apply-pg-hba] [--root DIR]");
	for (int i = 0; i < SETUP_Q_COUNT; i++)
		fprintf(out, " [--%s VALUE]", setup_questions[i].name);
	fprintf(out, "\n       pepsi-setup init --web [--lifetime DURATION] [-c CONFIG] [--root DIR]"
				 "\n       pepsi-setup apply [-c CONFIG] [--root DIR]\n"
				 "       pepsi-setup upgrade [-c CONFIG] [--root DIR]\n"
				 "       pepsi-setup dns [-c CONFIG] [--root DIR]\n"
				 "       pepsi-setup check [-c CONFIG] [--root DIR]\n"
				 "       pepsi-setup certificate [-c CONFIG] [--root DIR] [--hostname HOST]\n"
				 "           [--certificate FILE --key FILE | [--certbot PATH] [--email ADDRESS]\n"
				 "            (--webroot DIR | --standalone [--http-01-port PORT])]\n");
	return out == stdout ? CLI_EX_OK : CLI_EX_USAGE;
}

/* Ask every question not answered yet, on the terminal. */
static bool
setup_interview(struct setup_answers *answers)
{
	char  *line = NULL;
	size_t capacity = 0;

	for (int q = 0; q < SETUP_Q_COUNT; q++)
	{
		char why[512];

		while (answers->value[q] == NULL)
		{
			const char *fallback = setup_answer_value(answers, q);
			ssize_t		n;

			printf("%s%s%s%s: ", setup_questions[q].prompt, fallback ? " [" : "", fallback ? fallback : "",
				   fallback ? "]" : "");
			fflush(stdout);
			if ((n = getline(&line, &capacity, stdin)) < 0)
			{
				free(line);
				return false;
			}
			line[strcspn(line, "\r\n")] = '\0';
			if (line[0] == '\0' && fallback)
				snprintf(line, capacity, "%s", fallback);
			if (!setup_answer(answers, q, line, why, sizeof(why)))
				printf("  %s\n", why);
		}
	}
	free(line);
	return true;
}

/* Is the SMTP port free?  One in use stops init before it changes anything. */
bool
setup_port_free(const char *address, const char *port, char *why, size_t whylen)
{
	struct sockaddr_storage ss = {0};
	socklen_t				len;
	int						fd;
	int						one = 1;
	bool					free_port = true;

	if (strchr(address, ':'))
	{
		struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *) &ss;

		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = htons((uint16_t) atoi(port));
		inet_pton(AF_INET6, address, &sin6->sin6_addr);
		len = sizeof(*sin6);
	}
	else
	{
		struct sockaddr_in *sin = (struct sockaddr_in *) &ss;

		sin->sin_family = AF_INET;
		sin->sin_port = htons((uint16_t) atoi(port));
		inet_pton(AF_INET, address, &sin->sin_addr);
		len = sizeof(*sin);
	}
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return true;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	/* EACCES (a port below 1024, not as root) says nothing about who holds it. */
	if (bind(fd, (struct sockaddr *) &ss, len) != 0 && errno == EADDRINUSE)
	{
		snprintf(why, whylen, "port %s on %s is in use", port, address);
		free_port = false;
	}
	close(fd);
	return free_port;
}

/* Does the pepsi.conf init wrote before already listen on this port?  Then it is ours. */
static bool
setup_port_ours(const struct setup_layout *layout, const char *port)
{
	char				*path = setup_config_path(layout);
	char				 err[1024];
	struct pepsi_config *cfg = config_load(path, err, sizeof(err));
	bool				 ours;

	free(path);
	if (cfg == NULL)
		return false;
	ours = config_get(cfg, "listener-smtp", "PORT") && strcmp(config_get(cfg, "listener-smtp", "PORT"), port) == 0;
	config_free(cfg);
	return ours;
}

/* Connect as the owner, checking that the cluster has the extension's files. */
static PGconn *
setup_connect_owner(const char *conninfo, bool need_files, int *rc)
{
	PGconn	 *db = PQconnectdb(conninfo);
	PGresult *res;

	if (PQstatus(db) != CONNECTION_OK)
	{
		fprintf(stderr, "pepsi-setup: conninfo \"%s\" does not connect: %s", conninfo, PQerrorMessage(db));
		PQfinish(db);
		*rc = SETUP_EX_UNAVAILABLE;
		return NULL;
	}
	PQclear(PQexec(db, "SET client_min_messages = warning"));
	res = PQexec(db, "SELECT default_version FROM pg_available_extensions WHERE name = 'pepsi'");
	if (need_files && (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1))
	{
		fprintf(stderr, "pepsi-setup: the cluster at \"%s\" has no pepsi extension files (install the package "
						"postgresql-15-pepsi for this cluster's version, or make -C extension install)\n",
				conninfo);
		PQclear(res);
		PQfinish(db);
		*rc = SETUP_EX_UNAVAILABLE;
		return NULL;
	}
	PQclear(res);
	return db;
}

static enum setup_outcome
setup_create_extension(PGconn *db)
{
	PGresult *res = PQexec(db, "SELECT 1 FROM pg_extension WHERE extname = 'pepsi'");
	bool	  exists = PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1;

	PQclear(res);
	if (exists)
	{
		printf("  extension pepsi: installed already\n");
		return SETUP_UNCHANGED;
	}
	res = PQexec(db, "CREATE EXTENSION pepsi");
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		printf("  failed: CREATE EXTENSION pepsi: %s", PQresultErrorMessage(res));
		PQclear(res);
		return SETUP_FAILED;
	}
	PQclear(res);
	printf("  extension pepsi: created\n");
	return SETUP_DONE;
}

static int
setup_init(int argc, char **argv, const char *root)
{
	struct setup_answers answers = {0};
	struct setup_layout	 layout = {root, geteuid() == 0};
	struct setup_ctx	 ctx = {root, geteuid() == 0, NULL, 0};
	bool				 interactive = isatty(STDIN_FILENO);
	bool				 apply_hba = false;
	struct setup_hba	 hba = {0};
	struct buf			 hba_lines = BUF_INIT;
	char				*ident_lines = NULL;
	const char			*database = NULL;
	char				 why[1024];
	json_t				*plan = NULL;
	size_t				 i;
	json_t				*task;
	int					 changes = 0;
	int					 failures = 0;
	int					 rc = CLI_EX_OK;

	for (int a = 0; a < argc; a++)
	{
		const char *arg = argv[a];
		int			q;

		if (strcmp(arg, "--non-interactive") == 0)
		{
			interactive = false;
			continue;
		}
		if (strcmp(arg, "--apply-pg-hba") == 0)
		{
			apply_hba = true;
			continue;
		}
		if (strncmp(arg, "--", 2) != 0 || (q = setup_question_find(arg + 2)) < 0 || a + 1 >= argc)
		{
			fprintf(stderr, "pepsi-setup init: unknown option or missing value: %s\n", arg);
			rc = setup_usage(stderr);
			goto done;
		}
		if (!setup_answer(&answers, q, argv[++a], why, sizeof(why)))
		{
			fprintf(stderr, "pepsi-setup init: --%s: %s; nothing changed\n", setup_questions[q].name, why);
			rc = CLI_EX_USAGE;
			goto done;
		}
	}
	if (interactive && !setup_interview(&answers))
	{
		fprintf(stderr, "pepsi-setup init: no answer; nothing changed\n");
		rc = CLI_EX_USAGE;
		goto done;
	}
	if (!setup_answers_complete(&answers, why, sizeof(why)))
	{
		fprintf(stderr, "pepsi-setup init: %s; nothing changed\n", why);
		rc = CLI_EX_USAGE;
		goto done;
	}
	/* Every check that can stop init comes before the first change. */
	if (root[0] && access(root, W_OK) != 0)
	{
		fprintf(stderr, "pepsi-setup init: --root %s: %s; nothing changed\n", root, strerror(errno));
		rc = CLI_EX_USAGE;
		goto done;
	}
	if (!setup_port_ours(&layout, setup_answer_value(&answers, SETUP_Q_SMTP_PORT))
		&& !setup_port_free(setup_answer_value(&answers, SETUP_Q_LISTEN),
							setup_answer_value(&answers, SETUP_Q_SMTP_PORT), why, sizeof(why)))
	{
		fprintf(stderr, "pepsi-setup init: %s (another MTA? stop it, or choose --smtp-port); nothing changed\n", why);
		rc = SETUP_EX_UNAVAILABLE;
		goto done;
	}
	if ((ctx.db = setup_connect_owner(setup_answer_value(&answers, SETUP_Q_CONNINFO), true, &rc)) == NULL)
	{
		fprintf(stderr, "pepsi-setup init: nothing changed\n");
		goto done;
	}
	plan = setup_plan(&answers, &layout);
	json_array_foreach (plan, i, task)
	{
		enum setup_kind kind;

		if (!setup_kind_parse(json_string_value(json_object_get(task, "kind")), &kind)
			|| !setup_task_check(kind, json_object_get(task, "params"), why, sizeof(why)))
		{
			fprintf(stderr, "pepsi-setup init: the plan's task %zu is refused: %s; nothing changed\n", i + 1, why);
			rc = CLI_EX_DATAERR;
			goto done;
		}
	}

	{
		const char *user = setup_answer_value(&answers, SETUP_Q_USER);

		ident_lines = xasprintf("pepsi  %s  pepsi_dispatch\npepsi  %s  pepsi_smtpd\npepsi  %s  pepsi_web\n"
								"pepsi  %s  pepsi_viewer\npepsi  root  pepsi_operator\n",
								user, user, user, user);
	}
	json_array_foreach (plan, i, task)
		if (strcmp(json_string_value(json_object_get(task, "kind")), "pg_hba_line") == 0)
		{
			char *line = setup_pg_hba_text(json_object_get(task, "params"));

			buf_printf(&hba_lines, "%s\n", line);
			free(line);
			database = setup_param(json_object_get(task, "params"), "database");
		}
	if (database != NULL)
	{
		char *with_autopay = setup_autopay_lines(database, &hba_lines, ident_lines);

		free(ident_lines);
		ident_lines = with_autopay;
	}
	buf_append_char(&hba_lines, '\0');
	if (apply_hba && !setup_hba_prepare(&ctx, &hba, hba_lines.data, ident_lines, why, sizeof(why)))
	{
		fprintf(stderr, "pepsi-setup init: --apply-pg-hba: %s; nothing changed\n", why);
		rc = SETUP_EX_UNAVAILABLE;
		goto done;
	}

	printf("database:\n");
	switch (setup_create_extension(ctx.db))
	{
		case SETUP_DONE:
			changes++;
			break;
		case SETUP_FAILED:
			failures++;
			break;
		default:
			break;
	}
	json_array_foreach (plan, i, task)
	{
		enum setup_kind kind;

		setup_kind_parse(json_string_value(json_object_get(task, "kind")), &kind);
		printf("%s:\n", setup_kind_name(kind));
		switch (setup_apply_task(&ctx, kind, json_object_get(task, "params")))
		{
			case SETUP_DONE:
				changes++;
				break;
			case SETUP_FAILED:
				failures++;
				break;
			default:
				break;
		}
		if (failures)
			break;
	}
	if (failures == 0 && database != NULL)
	{
		printf("auto-pay:\n");
		switch (setup_autopay_role(&ctx, database))
		{
			case SETUP_DONE:
				changes++;
				break;
			case SETUP_FAILED:
				failures++;
				break;
			default:
				break;
		}
	}
	if (failures == 0)
	{
		printf("pg_ident.conf (map pepsi: the system accounts that may log in as each role):\n");
		for (const char *line = ident_lines; *line; line += strcspn(line, "\n") + 1)
			printf("  %.*s\n", (int) strcspn(line, "\n"), line);
	}
	if (failures == 0 && apply_hba)
	{
		printf("pg_hba.conf and pg_ident.conf (--apply-pg-hba):\n");
		switch (setup_hba_apply(&ctx, &hba))
		{
			case SETUP_DONE:
				changes++;
				break;
			case SETUP_FAILED:
				failures++;
				break;
			default:
				printf("  their pepsi-setup block: as the answers say already\n");
				break;
		}
	}
	if (failures)
	{
		fprintf(stderr, "pepsi-setup init: stopped at the failure above (%d change%s made before it)\n", changes,
				changes == 1 ? "" : "s");
		rc = CLI_EX_CONFIG;
		goto done;
	}
	if (changes == 0)
		printf("pepsi-setup init: nothing changed: the host already is as the answers say\n");
	else
		printf("pepsi-setup init: %d change%s; next: %spublish the records of pepsi-setup dns, and start "
			   "pepsi-dispatch and pepsi-ingress\n",
			   changes, changes == 1 ? "" : "s",
			   apply_hba ? "" : "add the lines above to pg_hba.conf and pg_ident.conf (or run init with --apply-pg-hba), ");
	rc = CLI_EX_OK;
done:
	/* One way out: each of these is safe on what was never made. */
	setup_hba_free(&hba);
	buf_free(&hba_lines);
	free(ident_lines);
	json_decref(plan);
	PQfinish(ctx.db);
	setup_answers_free(&answers);
	return rc;
}

/* The configuration and the owner's connection of apply and upgrade. */
static PGconn *
setup_admin_connect(const struct pepsi_config *cfg, int *rc)
{
	const char *conninfo = config_text(cfg, "database", "ADMIN_CONNINFO");

	if (conninfo == NULL)
	{
		fprintf(stderr, "pepsi-setup: %s has no [database] ADMIN_CONNINFO (pepsi-setup init writes it)\n",
				cfg->path);
		*rc = CLI_EX_CONFIG;
		return NULL;
	}
	return setup_connect_owner(conninfo, false, rc);
}

static int
setup_upgrade(struct setup_ctx *ctx)
{
	PGresult *res = PQexec(ctx->db, "SELECT extversion FROM pg_extension WHERE extname = 'pepsi'");
	char	  before[64];
	char	  after[64];

	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
	{
		fprintf(stderr, "pepsi-setup upgrade: the extension pepsi is not installed in this database (pepsi-setup "
						"init creates it)\n");
		PQclear(res);
		return CLI_EX_CONFIG;
	}
	snprintf(before, sizeof(before), "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
	res = PQexec(ctx->db, "ALTER EXTENSION pepsi UPDATE");
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		fprintf(stderr, "pepsi-setup upgrade: ALTER EXTENSION pepsi UPDATE: %s", PQresultErrorMessage(res));
		PQclear(res);
		return CLI_EX_CONFIG;
	}
	PQclear(res);
	res = PQexec(ctx->db, "SELECT extversion FROM pg_extension WHERE extname = 'pepsi'");
	snprintf(after, sizeof(after), "%s", PQntuples(res) == 1 ? PQgetvalue(res, 0, 0) : "?");
	PQclear(res);
	if (strcmp(before, after) == 0)
		printf("extension pepsi: at %s already\n", after);
	else
		printf("extension pepsi: %s -> %s\n", before, after);
	printf("grant policy:\n");
	return setup_grants(ctx) == SETUP_FAILED ? CLI_EX_CONFIG : CLI_EX_OK;
}

int
pepsi_setup_main(int argc, char **argv)
{
	const char			*command;
	const char			*root = "";
	const char			*config_path = NULL;
	char				*default_path = NULL;
	char				 err[1024];
	struct pepsi_config *cfg;
	struct setup_ctx	 ctx = {"", geteuid() == 0, NULL, 0};
	int					 rc = CLI_EX_OK;
	int					 first = 2;

	if (argc < 2 || cli_is_help(argv[1]))
		return setup_usage(argc < 2 ? stderr : stdout);
	command = argv[1];
	/* --root and -c, wherever they are; the rest is the command's. */
	for (int a = 2; a < argc; a++)
		if (a + 1 < argc && strcmp(argv[a], "--root") == 0)
			root = argv[++a];
		else if (a + 1 < argc && strcmp(argv[a], "-c") == 0)
			config_path = argv[++a];
		else
			argv[first++] = argv[a];
	if (strcmp(root, "/") == 0)
		root = "";
	ctx.root = root;
	for (int a = 2; strcmp(command, "init") == 0 && a < first; a++)
		if (strcmp(argv[a], "--web") == 0)
			return setup_init_web(first - 2, argv + 2, root, config_path);
	if (strcmp(command, "init") == 0)
		return setup_init(first - 2, argv + 2, root);
	if (first > 2 && strcmp(command, "certificate") != 0)
	{
		fprintf(stderr, "pepsi-setup %s: unexpected %s\n", command, argv[2]);
		return setup_usage(stderr);
	}
	if (strcmp(command, "apply") != 0 && strcmp(command, "upgrade") != 0 && strcmp(command, "dns") != 0
		&& strcmp(command, "check") != 0 && strcmp(command, "certificate") != 0)
		return setup_usage(stderr);
	if (config_path == NULL)
	{
		struct setup_layout layout = {root, geteuid() == 0};

		config_path = default_path = setup_config_path(&layout);
	}
	cfg = config_load(config_path, err, sizeof(err));
	free(default_path);
	if (cfg == NULL)
	{
		fprintf(stderr, "pepsi-setup: %s\n", err);
		return CLI_EX_CONFIG;
	}
	if (strcmp(command, "certificate") == 0)
		rc = setup_certificate_command(&ctx, cfg, first - 2, argv + 2);
	else if (strcmp(command, "dns") == 0)
		rc = setup_dns_print(cfg);
	else if (strcmp(command, "check") == 0)
		rc = setup_dns_check(cfg, NULL, NULL);
	else if ((ctx.db = setup_admin_connect(cfg, &rc)) != NULL)
	{
		rc = strcmp(command, "apply") == 0 ? setup_drain(&ctx) : setup_upgrade(&ctx);
		PQfinish(ctx.db);
	}
	config_free(cfg);
	return rc;
}
