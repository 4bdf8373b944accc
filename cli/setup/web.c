/*
 * web.c: pepsi-setup init --web [--lifetime DURATION]: the one-time link
 * to pepsi-httpd's setup page (common/setup/setup_link.h).  The interview
 * then happens in the browser, which enqueues the plan's tasks in
 * pepsi.setup_task; pepsi-setup apply, as root, carries them out.
 *
 * It reads the configuration pepsi-httpd reads (-c, else the layout's
 * pepsi.conf) for where the link's file goes ([httpd] SETUP_TOKEN) and
 * where pepsi-httpd listens; as root, the file and its directory are
 * given to [httpd] USER, which must delete the file when the link is used.
 */
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/xalloc.h"
#include "options.h"
#include "process/cli.h"
#include "setup.h"
#include "setup/setup_link.h"
#include "setup/setup_model.h"

#define SETUP_WEB_LIFETIME_DEFAULT_S 3600
#define SETUP_EX_CANTCREAT 73 /* sysexits */

/* The link's owner as root: [httpd] USER and GROUP (-1: leave root's). */
static bool
setup_web_owner(const struct pepsi_config *cfg, uid_t *uid, gid_t *gid)
{
	const char *user = config_text(cfg, "httpd", "USER");
	const char *group = config_text(cfg, "httpd", "GROUP");

	*uid = (uid_t) -1;
	*gid = (gid_t) -1;
	if (geteuid() != 0 || user == NULL)
		return true;
	{
		struct passwd *pw = getpwnam(user);

		if (pw == NULL)
		{
			fprintf(stderr, "pepsi-setup init --web: [httpd] USER %s: no such user; nothing changed\n", user);
			return false;
		}
		*uid = pw->pw_uid;
		*gid = pw->pw_gid;
	}
	if (group)
	{
		struct group *gr = getgrnam(group);

		if (gr == NULL)
		{
			fprintf(stderr, "pepsi-setup init --web: [httpd] GROUP %s: no such group; nothing changed\n", group);
			return false;
		}
		*gid = gr->gr_gid;
	}
	return true;
}

/* http(s)://ADDRESS:PORT, a wildcard address replaced by [pepsi] HOSTNAME (or localhost). */
static char *
setup_web_base(const struct pepsi_config *cfg)
{
	const char *address = config_text(cfg, "httpd", "ADDRESS");
	const char *scheme = config_get(cfg, "httpd", "CERTIFICATE") ? "https" : "http";
	long long	port = config_int(cfg, "httpd", "PORT");

	if (address == NULL || strcmp(address, "0.0.0.0") == 0 || strcmp(address, "::") == 0)
		address = config_text(cfg, "pepsi", "HOSTNAME") ? config_text(cfg, "pepsi", "HOSTNAME") : "localhost";
	if (strchr(address, ':'))
		return xasprintf("%s://[%s]:%lld", scheme, address, port);
	return xasprintf("%s://%s:%lld", scheme, address, port);
}

int
setup_init_web(int argc, char **argv, const char *root, const char *config_path)
{
	struct setup_layout	 layout = {root, geteuid() == 0};
	char				*default_path = NULL;
	struct pepsi_config *cfg;
	char				 err[1024];
	char				 token[SETUP_LINK_TOKEN_LEN + 1];
	long long			 lifetime_ms = SETUP_WEB_LIFETIME_DEFAULT_S * 1000LL;
	const char			*path;
	char				*base;
	uid_t				 uid;
	gid_t				 gid;

	for (int a = 0; a < argc; a++)
	{
		if (strcmp(argv[a], "--web") == 0)
			continue;
		if (strcmp(argv[a], "--lifetime") == 0 && a + 1 < argc)
		{
			if (!option_parse_duration_ms(argv[++a], &lifetime_ms) || lifetime_ms < 1000)
			{
				fprintf(stderr, "pepsi-setup init --web: --lifetime \"%s\" is not a duration of at least 1s "
								"(30s, 15m, 2h); nothing changed\n",
						argv[a]);
				return CLI_EX_USAGE;
			}
			continue;
		}
		fprintf(stderr, "pepsi-setup init --web: unexpected %s (the interview's answers are given on the page; "
						"only --lifetime, --root and -c go with --web)\n",
				argv[a]);
		return CLI_EX_USAGE;
	}
	if (config_path == NULL)
		config_path = default_path = setup_config_path(&layout);
	cfg = config_load(config_path, err, sizeof(err));
	free(default_path);
	if (cfg == NULL)
	{
		fprintf(stderr, "pepsi-setup init --web: %s (pepsi-httpd's configuration: where it listens, and its "
						"[database] CONFIG_CONNINFO, through which the page enqueues); nothing changed\n",
				err);
		return CLI_EX_CONFIG;
	}
	path = config_text(cfg, "httpd", "SETUP_TOKEN");
	if (!setup_web_owner(cfg, &uid, &gid))
	{
		config_free(cfg);
		return CLI_EX_CONFIG;
	}
	if (!setup_link_create(path, root, layout.as_root, (long) (lifetime_ms / 1000), uid, gid, token, err,
						   sizeof(err)))
	{
		fprintf(stderr, "pepsi-setup init --web: [httpd] SETUP_TOKEN: %s; no link made\n", err);
		config_free(cfg);
		return SETUP_EX_CANTCREAT;
	}
	base = setup_web_base(cfg);
	printf("Open this link in a browser within %lld s; it works once (its digest is in %s):\n\n"
		   "  %s/setup?token=%s\n\n"
		   "The page asks the interview's questions and enqueues the tasks; then run pepsi-setup apply as "
		   "root to carry them out (the page shows their log).\n",
		   lifetime_ms / 1000, path, base, token);
	explicit_bzero(token, sizeof(token));
	free(base);
	config_free(cfg);
	return CLI_EX_OK;
}
