/*
 * fuzz_config.c: libFuzzer target for the configuration reader
 * (common/config/config.c from a buffer, config_parse_string: the same checks as
 * config_load without the file) and for the overrides the database holds,
 * which the httpd API and pepsi-config let an administrator write
 * (config_add_override).  "make fuzz" runs it.
 *
 * Input: the text of a pepsi.conf; after a NUL, optionally an override,
 * "scope\tsection\toption\tvalue".  What loads must then read back with
 * every typed getter of every option its sections may hold: a getter that
 * finds a value the load did not check ends the process (fatalx), which
 * libFuzzer reports as a crash.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/xalloc.h"
#include "config/config.h"
#include "options.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_SECTIONS 8

static void
fuzz_read_back(const struct pepsi_config *cfg)
{
	const char *sections[FUZZ_MAX_SECTIONS];
	size_t		n = config_sections(cfg, "", sections, FUZZ_MAX_SECTIONS);

	for (size_t s = 0; s < n; s++)
		for (size_t i = 0; i < option_count; i++)
		{
			const char				*section = sections[s];
			const char				*option = option_table[i].name;
			const struct option_def *def = config_option_def(cfg, section, option);

			if (def == NULL)
				continue;
			switch (def->type)
			{
				case OPTION_BOOL:
					config_bool_for(cfg, section, option, "example.org", "a@example.org");
					break;
				case OPTION_INT:
					config_int_for(cfg, section, option, "example.org", "a@example.org");
					break;
				case OPTION_DURATION:
					config_duration_ms_for(cfg, section, option, "example.org", "a@example.org");
					break;
				case OPTION_SIZE:
					config_size_for(cfg, section, option, "example.org", "a@example.org");
					break;
				case OPTION_ENUM:
					config_enum_for(cfg, section, option, "example.org", "a@example.org");
					break;
				default:
					config_text_for(cfg, section, option, "example.org", "a@example.org");
					break;
			}
		}
	config_hostname(cfg);
	config_authserv_id(cfg);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char				*text = xstrndup((const char *) data, size);
	size_t				 textlen = strlen(text);
	char				*override = textlen < size ? xstrndup((const char *) data + textlen + 1, size - textlen - 1) : NULL;
	struct pepsi_config *cfg;
	char				 err[1024];

	cfg = config_parse_string(text, "fuzz.conf", err, sizeof(err));
	if (cfg)
	{
		char *field[4] = {NULL};
		char *p = override;

		for (int i = 0; p && i < 4; i++)
		{
			field[i] = p;
			p = strchr(p, '\t');
			if (p && i < 3)
				*p++ = '\0';
			else
				p = NULL;
		}
		if (field[3] && config_add_override(cfg, field[0], field[1], field[2], field[3], err, sizeof(err)))
			fuzz_read_back(cfg);
		else
			fuzz_read_back(cfg);
		config_free(cfg);
	}
	free(override);
	free(text);
	return 0;
}
