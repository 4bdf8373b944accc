/*
 * fuzz_aliases.c: libFuzzer target for the aliases(5) reader and its
 * recursive expansion (common/local/aliases.c).  "make fuzz" runs it.
 *
 * Input: a first line, the address to expand (its domain one of
 * example.org and localhost, or none; postmaster when the line is empty),
 * then the text of an aliases file.
 * An expansion that succeeds must give addresses, each once: a
 * duplicate or an empty one is a bug, and abort() makes libFuzzer keep
 * the input.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/xalloc.h"
#include "local/aliases.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
fuzz_expand(const struct alias_table *table, const char *address)
{
	char **out = NULL;
	size_t count = 0;
	char   err[256];

	if (aliases_expand(table, address, "example.org, localhost", &out, &count, err, sizeof(err)))
		for (size_t i = 0; i < count; i++)
		{
			if (out[i] == NULL || out[i][0] == '\0')
				abort();
			for (size_t j = 0; j < i && count < 200; j++)
				if (strcmp(out[i], out[j]) == 0)
					abort();
		}
	for (size_t i = 0; i < count; i++)
		free(out[i]);
	free(out);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char			   *text = xstrndup((const char *) data, size);
	char			   *nl = strchr(text, '\n');
	const char		   *address = "postmaster";
	struct alias_table *table;
	char				err[256];

	if (nl)
	{
		*nl = '\0';
		if (text[0] != '\0') /* a recipient is never empty */
			address = text;
	}
	table = aliases_parse(nl ? nl + 1 : text, "fuzz", err, sizeof(err));
	if (table)
	{
		aliases_count(table);
		aliases_has(table, address);
		fuzz_expand(table, address);
		fuzz_expand(table, "root@localhost");
		aliases_free(table);
	}
	free(text);
	return 0;
}
