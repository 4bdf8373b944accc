/* log_config.c: see log_config.h. */
#include "log_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

bool
log_configure(const struct pepsi_config *cfg, char *err, size_t errlen)
{
	const char *from_env = getenv("PEPSI_LOG");
	const char *where = from_env && *from_env ? from_env : config_get(cfg, "pepsi", "LOG");
	const char *format = config_get(cfg, "pepsi", "LOG_FORMAT");
	char		origin[128];
	bool		use_syslog;

	if (where == NULL || strcmp(where, "auto") == 0)
		use_syslog = !isatty(STDERR_FILENO) && getenv("JOURNAL_STREAM") == NULL;
	else if (strcmp(where, "stderr") == 0 || strcmp(where, "syslog") == 0)
		use_syslog = strcmp(where, "syslog") == 0;
	else
	{
		snprintf(err, errlen, "%s: LOG is \"%s\": expected auto, stderr or syslog",
				 where == from_env ? "environment PEPSI_LOG"
				 : config_origin(cfg, "pepsi", "LOG", origin, sizeof(origin)), where);
		return false;
	}
	if (format != NULL && strcmp(format, "text") != 0 && strcmp(format, "json") != 0)
	{
		snprintf(err, errlen, "%s: LOG_FORMAT is \"%s\": expected text or json",
				 config_origin(cfg, "pepsi", "LOG_FORMAT", origin, sizeof(origin)), format);
		return false;
	}
	log_set_destination(use_syslog);
	log_set_json(format != NULL && strcmp(format, "json") == 0);
	return true;
}
