/*
 * fuzz_forward.c: libFuzzer target for the ~/.forward parser
 * (helpers/dot-forward/forward_file.c).  A .forward is written by a local
 * user and read by the setuid helper: its text is as untrusted as a
 * message.  "make fuzz" runs it.
 *
 * Input: the text of a .forward, NULs included.  Every entry must come
 * out with a kind, a line within the text and a value; more than
 * FORWARD_MAX_ENTRIES is a bug, and abort() makes libFuzzer keep it.
 * (:include: files are read by the helper's main.c, not by the parser:
 * not reached here.)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "forward_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct forward_list list = {0};
	size_t				lines = 1;

	for (size_t i = 0; i < size; i++)
		lines += data[i] == '\n';
	forward_parse((const char *) data, size, &list);
	if (list.count > FORWARD_MAX_ENTRIES)
		abort();
	for (size_t i = 0; i < list.count; i++)
	{
		const struct forward_entry *e = &list.entries[i];

		if (e->value == NULL || e->line < 1 || (size_t) e->line > lines
			|| forward_kind_name(e->kind) == NULL)
			abort();
		(void) strlen(e->value);
	}
	forward_list_free(&list);
	return 0;
}
