/*
 * names.c: the multi-call binary under the names mail programs call it by
 * (a symlink /usr/sbin/sendmail, as cron, PHP and logwatch expect):
 *
 *   sendmail ...        pepsi-sendmail (sendmail.c)
 *   sendmail -bp, mailq the queue listing: pepsi-queue list
 *   sendmail -bi, newaliases
 *                       check the aliases files: [pepsi] ALIASES_FILE and
 *                       every [stage-*] ALIASES_FILE; each error as
 *                       file:line: reason, exit 65 when one is broken.
 *                       Nothing is built: the files are read as they are.
 *
 * -C CONFIG (else $PEPSI_CONFIG, else the default) is honoured by all
 * three; the other options of mailq and newaliases are ignored, as
 * Postfix's are.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/xalloc.h"
#include "config/config.h"
#include "local/aliases.h"

#define EX_DATAERR 65
#define EX_CONFIG 78
#define NAMES_SECTIONS_MAX 256

int pepsi_sendmail_names_main(int argc, char **argv);
int pepsi_sendmail_main(int argc, char **argv);
int pepsi_queue_main(int argc, char **argv);

/* The -C of the arguments (attached or the next word), else $PEPSI_CONFIG, else the default. */
static const char *
names_config_path(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
	{
		if (strcmp(argv[i], "--") == 0)
			break;
		if (strncmp(argv[i], "-C", 2) == 0)
			return argv[i][2] ? argv[i] + 2 : (i + 1 < argc ? argv[i + 1] : NULL);
	}
	return getenv("PEPSI_CONFIG") ? getenv("PEPSI_CONFIG") : PEPSI_CONFIG_DEFAULT_PATH;
}

/* Is mode (-bp, -bi) among the options? */
static bool
names_has_mode(int argc, char **argv, const char *mode)
{
	for (int i = 1; i < argc && argv[i][0] == '-' && strcmp(argv[i], "--") != 0; i++)
		if (strcmp(argv[i], mode) == 0)
			return true;
	return false;
}

static int
names_mailq(const char *config_path)
{
	char  program[] = "pepsi-queue";
	char  flag[] = "-C";
	char  list[] = "list";
	char *path = xstrdup(config_path);
	char *argv[] = {program, flag, path, list, NULL};
	int	  rc = pepsi_queue_main(4, argv);

	free(path);
	return rc;
}

/* Check one aliases file; false after printing why it is broken. */
static bool
names_check_aliases(const char *path)
{
	char				err[1024];
	struct alias_table *table = aliases_load(path, err, sizeof(err));

	if (table == NULL)
	{
		fprintf(stderr, "newaliases: %s\n", err);
		return false;
	}
	printf("newaliases: %s: %zu aliases\n", path, aliases_count(table));
	aliases_free(table);
	return true;
}

static int
names_newaliases(const char *config_path)
{
	char				 err[1024];
	struct pepsi_config *cfg = config_load(config_path, err, sizeof(err));
	const char			*sections[NAMES_SECTIONS_MAX];
	const char		   **files;
	size_t				 nsections;
	size_t				 nfiles = 0;
	bool				 ok = true;

	if (cfg == NULL)
	{
		fprintf(stderr, "newaliases: %s\n", err);
		return EX_CONFIG;
	}
	nsections = config_sections(cfg, "stage-", sections, NAMES_SECTIONS_MAX);
	files = xcalloc(nsections + 1, sizeof(*files));
	files[nfiles++] = config_text(cfg, "pepsi", "ALIASES_FILE");
	for (size_t i = 0; i < nsections; i++)
	{
		const char *path = config_get(cfg, sections[i], "ALIASES_FILE");
		bool		seen = path == NULL;

		for (size_t j = 0; j < nfiles && !seen; j++)
			seen = strcmp(files[j], path) == 0;
		if (!seen)
			files[nfiles++] = path;
	}
	for (size_t i = 0; i < nfiles; i++)
		ok = names_check_aliases(files[i]) && ok;
	free(files);
	config_free(cfg);
	return ok ? 0 : EX_DATAERR;
}

int
pepsi_sendmail_names_main(int argc, char **argv)
{
	const char *name = argc > 0 ? strrchr(argv[0], '/') : NULL;
	const char *config_path = names_config_path(argc, argv);

	name = name ? name + 1 : (argc > 0 ? argv[0] : "sendmail");
	if (config_path == NULL)
	{
		fprintf(stderr, "%s: -C needs a file\n", name);
		return 64;
	}
	if (strcmp(name, "mailq") == 0 || (strcmp(name, "sendmail") == 0 && names_has_mode(argc, argv, "-bp")))
		return names_mailq(config_path);
	if (strcmp(name, "newaliases") == 0 || (strcmp(name, "sendmail") == 0 && names_has_mode(argc, argv, "-bi")))
		return names_newaliases(config_path);
	return pepsi_sendmail_main(argc, argv);
}
