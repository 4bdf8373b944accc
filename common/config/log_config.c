/* log_config.c: see log_config.h. */
#include "config/log_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"

bool
log_configure(const struct pepsi_config *cfg, char *err, size_t errlen)
{
	/* LOG's choices, in the order of schema/options.def; LOG_FORMAT's are text|json. */
	static const char *const destinations[] = {"auto", "stderr", "syslog"};
	const char				*from_env = getenv("PEPSI_LOG");
	int						 where = -1;
	bool					 use_syslog;
	const char				*syslog_name;

	if (from_env && *from_env)
	{
		for (int i = 0; i < 3 && where < 0; i++)
			if (strcmp(from_env, destinations[i]) == 0)
				where = i;
		if (where < 0)
		{
			snprintf(err, errlen, "environment PEPSI_LOG: LOG is \"%s\": expected auto, stderr or syslog",
					 from_env);
			return false;
		}
	}
	else
		where = config_enum(cfg, "pepsi", "LOG");
	if (where == 0)
		use_syslog = !isatty(STDERR_FILENO) && getenv("JOURNAL_STREAM") == NULL;
	else
		use_syslog = where == 2;
	syslog_name = config_text(cfg, "pepsi", "SYSLOG_NAME");
	/* The option schema (a NAME of 1 to 64 characters) checked it as pepsi.conf was loaded. */
	if (syslog_name && !log_set_syslog_name(syslog_name))
		fatalx("[pepsi] SYSLOG_NAME = %s: passed the option schema, not the log's check", syslog_name);
	log_set_destination(use_syslog);
	log_set_json(config_enum(cfg, "pepsi", "LOG_FORMAT") == 1);
	return true;
}
