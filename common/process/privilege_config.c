/*
 * privilege_config.c: privilege_drop (privilege.h), the daemons' drop to
 * their configured [section] USER and GROUP (pepsi-ingress, pepsi-httpd,
 * pepsi-dispatch and so its stage workers), and privilege_config_load, the
 * set-id programs' reading of root's configuration only.  Apart from
 * privilege.c so that the setuid helpers link without libpq.
 */
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

#include "base/log.h"
#include "config/config.h"
#include "process/privilege.h"

void
privilege_drop(const struct pepsi_config *cfg, const char *section)
{
	const char	  *user = config_text(cfg, section, "USER");
	const char	  *group = config_text(cfg, section, "GROUP");
	struct passwd *pw;
	gid_t		   gid;
	char		   err[256];

	if (user == NULL)
	{
		if (geteuid() == 0)
			fatalx("%s: refusing to run as root: set [%s] USER", cfg->path, section);
		return;
	}
	if ((pw = getpwnam(user)) == NULL)
		fatalx("%s: [%s] USER %s: no such user", cfg->path, section, user);
	if (pw->pw_uid == 0)
		fatalx("%s: [%s] USER %s: refusing to run as root: name an unprivileged user",
			   cfg->path, section, user);
	if (geteuid() != 0)
	{
		/* Started as that user already (make run, the tests): nothing to drop. */
		if (pw->pw_uid != geteuid())
			fatalx("%s: [%s] USER %s: only root can become another user",
				   cfg->path, section, user);
		return;
	}
	gid = pw->pw_gid;
	if (group)
	{
		struct group *gr = getgrnam(group);

		if (gr == NULL)
			fatalx("%s: [%s] GROUP %s: no such group", cfg->path, section, group);
		gid = gr->gr_gid;
	}
	/* The daemon's own group only: it needs none of the user's others. */
	if (!privilege_become(NULL, pw->pw_uid, gid, "/", err, sizeof(err)))
		fatalx("[%s] USER %s: %s", section, user, err);
	log_info("running as %s", user);
}

struct pepsi_config *
privilege_config_load(const char *path, char *err, size_t errlen)
{
	char why[1024];

	if (privilege_running_setid() && !privilege_path_trusted(path, 0, why, sizeof(why)))
	{
		snprintf(err, errlen,
				 "refusing the configuration %s: %s (running set-id, only a file of root's is read)",
				 path, why);
		return NULL;
	}
	return config_load(path, err, errlen);
}
