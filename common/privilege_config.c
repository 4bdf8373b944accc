/*
 * privilege_config.c: privilege_drop (privilege.h), the daemons' drop to
 * their configured [section] USER and GROUP (pepsi-ingress, pepsi-httpd,
 * pepsi-dispatch and so its stage workers).  Apart from privilege.c so
 * that the setuid helpers, which read no configuration, link without it.
 */
#include <grp.h>
#include <pwd.h>
#include <sys/types.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "privilege.h"

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
