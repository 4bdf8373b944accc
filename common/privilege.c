/*
 * privilege.c: see privilege.h.  chroot is left out: libpq needs the
 * socket directory and /etc.
 */
#include "privilege.h"

#include <grp.h>
#include <pwd.h>
#include <sys/types.h>
#include <unistd.h>

#include "log.h"

void
privilege_drop(const struct pepsi_config *cfg, const char *section)
{
	const char	  *user = config_get(cfg, section, "USER");
	const char	  *group = config_get(cfg, section, "GROUP");
	struct passwd *pw;
	gid_t		   gid;

	if (user == NULL)
	{
		if (geteuid() == 0)
			fatalx("%s: refusing to run as root: set [%s] USER", cfg->path, section);
		return;
	}
	if ((pw = getpwnam(user)) == NULL)
		fatalx("%s: [%s] USER %s: no such user", cfg->path, section, user);
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
	if (chdir("/") != 0)
		fatal("chdir /");
	if (setgroups(1, &gid) != 0)
		fatal("setgroups");
	if (setresgid(gid, gid, gid) != 0)
		fatal("setresgid");
	if (setresuid(pw->pw_uid, pw->pw_uid, pw->pw_uid) != 0)
		fatal("setresuid");
	/* A process that could regain root would make the drop pointless. */
	if (setuid(0) == 0)
		fatalx("[%s] USER %s: could regain root after dropping privileges", section, user);
	log_info("running as %s", user);
}
