/*
 * milter_list.c: the MILTERS option (pepsi-stage-milter's and a listener's), the filters in
 * order and, Postfix style, the settings of each filter that differ from
 * the stage's:
 *
 *   MILTERS = inet:127.0.0.1:11332
 *             { unix:/run/spamass.sock, command_timeout=10s, default_action=accept }
 *
 * A setting is the stage option of the same name in lower case (Postfix's
 * content_timeout is FINAL_TIMEOUT), and its value is checked and read by
 * the option schema (schema/options.def) like the option's own, so that a
 * value is valid in braces exactly when it is valid for the stage.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/xalloc.h"
#include "message/milter_filter.h"
#include "options.h"

/* The settings a filter's braces may hold, and the stage options they stand for. */
static const struct
{
	const char *setting;
	const char *option;
} milters_settings[] = {
	{"connect_timeout", "CONNECT_TIMEOUT"},
	{"command_timeout", "COMMAND_TIMEOUT"},
	{"final_timeout", "FINAL_TIMEOUT"},
	{"content_timeout", "FINAL_TIMEOUT"}, /* Postfix's milter_content_timeout */
	{"default_action", "DEFAULT_ACTION"},
};

#define MILTERS_SETTING_NAMES \
	"connect_timeout, command_timeout, final_timeout (or content_timeout), default_action"

static void
milters_entry_init(struct milter_entry *e, const char *address, size_t len)
{
	memset(e, 0, sizeof(*e));
	e->address = xstrndup(address, len);
	e->connect_ms = e->command_ms = e->final_ms = -1;
	e->default_action = -1;
}

void
milters_free(struct milter_entry *entries, size_t count)
{
	for (size_t i = 0; i < count; i++)
		free(entries[i].address);
	free(entries);
}

/* One name=value of a filter's braces, checked against the option it stands for. */
static bool
milters_apply_setting(struct milter_entry *e, const char *text, char *err, size_t errlen)
{
	const char				*eq = strchr(text, '=');
	const struct option_def *def = NULL;
	char					 problem[256];
	long long				 ms;
	long long				*slot = NULL;
	size_t					 name_len;

	if (eq == NULL || eq == text || eq[1] == '\0')
	{
		snprintf(err, errlen, "MILTERS: \"%s\" in the braces of %s is not a setting (name=value: " MILTERS_SETTING_NAMES ")",
				 text, e->address);
		return false;
	}
	name_len = (size_t) (eq - text);
	for (size_t i = 0; i < sizeof(milters_settings) / sizeof(milters_settings[0]); i++)
		if (strlen(milters_settings[i].setting) == name_len
			&& strncasecmp(milters_settings[i].setting, text, name_len) == 0)
			def = option_find("stage-milter", "pepsi-stage-milter", milters_settings[i].option);
	if (def == NULL)
	{
		snprintf(err, errlen, "MILTERS: unknown setting \"%.*s\" for %s (known: " MILTERS_SETTING_NAMES ")",
				 (int) name_len, text, e->address);
		return false;
	}
	if (!option_value_check(def, eq + 1, false, problem, sizeof(problem)))
	{
		snprintf(err, errlen, "MILTERS: %.*s=%s for %s: %s", (int) name_len, text, eq + 1, e->address,
				 problem);
		return false;
	}
	if (def->type == OPTION_ENUM)
	{
		if (e->default_action >= 0)
			goto twice;
		e->default_action = option_enum_index(def, eq + 1);
		return true;
	}
	slot = strcmp(def->name, "CONNECT_TIMEOUT") == 0   ? &e->connect_ms
		   : strcmp(def->name, "COMMAND_TIMEOUT") == 0 ? &e->command_ms
													   : &e->final_ms;
	if (*slot >= 0)
		goto twice;
	if (!option_parse_duration_ms(eq + 1, &ms))
	{
		snprintf(err, errlen, "MILTERS: %.*s=%s for %s is not a duration", (int) name_len, text,
				 eq + 1, e->address);
		return false;
	}
	*slot = ms;
	return true;
twice:
	snprintf(err, errlen, "MILTERS: %s is given twice for %s", def->name, e->address);
	return false;
}

/*
 * The words of one pair of braces: "name = value" is taken as
 * "name=value", then commas and white space separate.  The first word is
 * the filter's address.
 */
static bool
milters_parse_braces(const char *inside, size_t len, struct milter_entry *e, char *err,
					 size_t errlen)
{
	char  *copy = xmalloc(len + 1);
	size_t n = 0;
	char  *save = NULL;
	bool   ok = true;
	bool   first = true;

	for (size_t i = 0; i < len; i++)
	{
		if (isspace((unsigned char) inside[i]))
		{
			size_t next = i;

			while (next < len && isspace((unsigned char) inside[next]))
				next++;
			/* white space next to '=' is not a separator */
			if ((n > 0 && copy[n - 1] == '=') || (next < len && inside[next] == '='))
			{
				i = next - 1;
				continue;
			}
		}
		copy[n++] = inside[i];
	}
	copy[n] = '\0';
	for (char *word = strtok_r(copy, ", \t\r\n", &save); word && ok;
		 word = strtok_r(NULL, ", \t\r\n", &save))
	{
		if (first)
		{
			if (strchr(word, '='))
			{
				snprintf(err, errlen, "MILTERS: braces must begin with the filter's address, not \"%s\"", word);
				ok = false;
				break;
			}
			milters_entry_init(e, word, strlen(word));
			first = false;
			continue;
		}
		ok = milters_apply_setting(e, word, err, errlen);
	}
	if (ok && first)
	{
		snprintf(err, errlen, "MILTERS: a pair of braces names no filter");
		ok = false;
	}
	if (!ok && !first)
	{
		free(e->address);
		e->address = NULL;
	}
	free(copy);
	return ok;
}

bool
milters_parse(const char *value, struct milter_entry **out, size_t *count, char *err, size_t errlen)
{
	const char *p = value ? value : "";
	bool		ok = true;

	*out = NULL;
	*count = 0;
	while (ok)
	{
		struct milter_entry e;

		p += strspn(p, ", \t\r\n");
		if (*p == '\0')
			break;
		if (*p == '}')
		{
			snprintf(err, errlen, "MILTERS: a \"}\" without its \"{\"");
			ok = false;
			break;
		}
		if (*p == '{')
		{
			const char *close = strchr(p + 1, '}');
			const char *nested = strchr(p + 1, '{');

			if (close == NULL || (nested && nested < close))
			{
				snprintf(err, errlen, "MILTERS: a \"{\" without its \"}\"");
				ok = false;
				break;
			}
			ok = milters_parse_braces(p + 1, (size_t) (close - p - 1), &e, err, errlen);
			if (!ok)
				break;
			p = close + 1;
		}
		else
		{
			size_t len = strcspn(p, ", \t\r\n{}");

			milters_entry_init(&e, p, len);
			p += len;
		}
		*out = xrealloc(*out, (*count + 1) * sizeof(**out));
		(*out)[(*count)++] = e;
	}
	if (ok && *count == 0)
	{
		snprintf(err, errlen, "MILTERS names no filter (inet:host:port or unix:/path, in order)");
		ok = false;
	}
	if (!ok)
	{
		milters_free(*out, *count);
		*out = NULL;
		*count = 0;
	}
	return ok;
}
