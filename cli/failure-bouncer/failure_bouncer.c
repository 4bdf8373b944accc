/*
 * pepsi-failure-bouncer: return the messages that failed for good to their
 * senders.
 *
 *   pepsi-failure-bouncer [-C config] [--older-than DURATION] [--policy bounce|delete]
 *                         [--bounce-stage S] [--max-rows N] [--dry-run]
 *
 * Failed and timed-out rows wait for an operator (pepsi-queue); this does
 * what the operator would, for the rows older than [failure-bouncer]
 * MAX_AGE: each is bounced through the bounce stage (a DSN to its
 * sender), or deleted when POLICY is delete; a row with the null sender
 * is never bounced, it is deleted.  The work is one SQL function,
 * pepsi.failure_bounce(), which a pepsi.schedule row may call as well
 * (pepsi--0.16.sql), so the two ways of running it cannot differ; each row
 * is one pepsi.queue_bounce or queue_delete, the queue tools' own audit
 * trail in pepsi.event_log.  This program logs a line per message
 * (mail.log, as the other programs) and prints the count.  Run from a
 * systemd timer (pepsi-failure-bouncer.timer) or by hand.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "config/config.h"
#include "config/log_config.h"
#include "options.h"
#include "process/cli.h"
#include "runtime/db.h"

int pepsi_failure_bouncer_main(int argc, char **argv);

#define FB_PROGRAM "pepsi-failure-bouncer"
#define FB_SECTION "failure-bouncer"

struct fb_options
{
	const char *config_path;
	const char *older_than; /* as given, or NULL: MAX_AGE */
	const char *policy;
	const char *bounce_stage;
	long		max_rows;
	bool		dry_run;
};

static void
fb_usage(FILE *out)
{
	fprintf(out, "usage: " FB_PROGRAM " [-C CONFIG] [--older-than DURATION] [--policy bounce|delete]\n"
				 "       [--bounce-stage STAGE] [--max-rows N] [--dry-run]\n"
				 "  bounce (or delete) failed and timed-out messages older than DURATION\n"
				 "  (default [failure-bouncer] MAX_AGE); --dry-run lists them only\n");
}

/* The rows as pepsi.failure_bounce() returns them: one log line each. */
static void
fb_log_rows(PGresult *res, bool dry_run)
{
	int bounced = 0;
	int deleted = 0;

	for (int i = 0; i < PQntuples(res); i++)
	{
		const char *queue_id = PQgetvalue(res, i, 1);
		const char *stage = PQgetvalue(res, i, 2);
		const char *status = PQgetvalue(res, i, 3);
		const char *sender = PQgetvalue(res, i, 4);
		const char *action = PQgetvalue(res, i, 6);
		const char *reason = PQgetvalue(res, i, 7);

		if (strcmp(action, "bounced") == 0)
			bounced++;
		else
			deleted++;
		if (dry_run)
			printf("%s\t%s\t%s\t<%s>\twould be %s\t%s\n", queue_id, stage, status, sender, action, reason);
		else if (strcmp(action, "bounced") == 0)
			log_info("%s: from=<%s>, stage=%s, status=%s: bounced to the sender: %s", queue_id, sender,
					 stage, status, reason);
		else
			log_info("%s: from=<%s>, stage=%s, status=%s: deleted (%s): %s", queue_id, sender, stage,
					 status, strcmp(action, "deleted") == 0 ? "POLICY = delete" : "null sender, never bounced",
					 reason);
	}
	printf("%s%d bounced, %d deleted\n", dry_run ? "dry run: " : "", bounced, deleted);
}

int
pepsi_failure_bouncer_main(int argc, char **argv)
{
	static const struct option long_options[] = {
		{"config", required_argument, NULL, 'C'},
		{"older-than", required_argument, NULL, 'o'},
		{"policy", required_argument, NULL, 'p'},
		{"bounce-stage", required_argument, NULL, 'B'},
		{"max-rows", required_argument, NULL, 'n'},
		{"dry-run", no_argument, NULL, 'd'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0}};
	struct fb_options	 o = {.max_rows = 1000};
	struct pepsi_config *cfg = NULL;
	PGconn				*conn;
	PGresult			*res;
	long long			 age_ms;
	char				 age[48];
	char				 max_rows[24];
	char				 err[512];
	const char			*values[5];
	int					 opt;
	int					 rc = CLI_EX_OK;

	log_init(FB_PROGRAM, false);
	while ((opt = getopt_long(argc, argv, "C:h", long_options, NULL)) != -1)
		switch (opt)
		{
			case 'C':
				o.config_path = optarg;
				break;
			case 'o':
				o.older_than = optarg;
				break;
			case 'p':
				if (strcmp(optarg, "bounce") != 0 && strcmp(optarg, "delete") != 0)
				{
					fprintf(stderr, FB_PROGRAM ": --policy is bounce or delete, not \"%s\"\n", optarg);
					return CLI_EX_USAGE;
				}
				o.policy = optarg;
				break;
			case 'B':
				o.bounce_stage = optarg;
				break;
			case 'n':
				if (!cli_parse_int_range(optarg, 1, 100000, &o.max_rows))
				{
					fprintf(stderr, FB_PROGRAM ": --max-rows takes a whole number from 1 to 100000, not \"%s\"\n",
							optarg);
					return CLI_EX_USAGE;
				}
				break;
			case 'd':
				o.dry_run = true;
				break;
			case 'h':
				fb_usage(stdout);
				return CLI_EX_OK;
			default:
				fb_usage(stderr);
				return CLI_EX_USAGE;
		}
	if (optind < argc)
	{
		fprintf(stderr, FB_PROGRAM ": takes no argument, not \"%s\"\n", argv[optind]);
		fb_usage(stderr);
		return CLI_EX_USAGE;
	}
	if (o.older_than && !option_parse_duration_ms(o.older_than, &age_ms))
	{
		fprintf(stderr, FB_PROGRAM ": --older-than takes a duration (30m, 12h, 5d), not \"%s\"\n",
				o.older_than);
		return CLI_EX_USAGE;
	}
	if ((conn = cli_connect(FB_PROGRAM, o.config_path, CLI_ROLE_CONFIG, &cfg, &rc)) == NULL)
		return rc;
	if (!log_configure(cfg, err, sizeof(err)))
	{
		fprintf(stderr, FB_PROGRAM ": %s\n", err);
		PQfinish(conn);
		config_free(cfg);
		return CLI_EX_CONFIG;
	}
	if (o.older_than == NULL)
		age_ms = config_duration_ms(cfg, FB_SECTION, "MAX_AGE");
	if (o.policy == NULL)
		o.policy = config_enum(cfg, FB_SECTION, "POLICY") == 1 ? "delete" : "bounce";
	if (o.bounce_stage == NULL)
		o.bounce_stage = config_text(cfg, FB_SECTION, "BOUNCE_STAGE");

	snprintf(age, sizeof(age), "%lld milliseconds", age_ms);
	snprintf(max_rows, sizeof(max_rows), "%ld", o.max_rows);
	values[0] = age;
	values[1] = o.policy;
	values[2] = o.bounce_stage;
	values[3] = max_rows;
	values[4] = o.dry_run ? "true" : "false";
	res = db_exec(conn, "SELECT * FROM pepsi.failure_bounce($1::interval, $2, $3, $4::integer, $5::boolean)", 5,
				  values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		rc = cli_db_exit_code(res, conn);
		cli_db_error(FB_PROGRAM, res, conn);
	}
	else
		fb_log_rows(res, o.dry_run);
	PQclear(res);
	PQfinish(conn);
	config_free(cfg);
	return rc;
}
