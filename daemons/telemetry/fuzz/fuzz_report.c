/*
 * fuzz_report.c: libFuzzer target for the collector's allow-list
 * (daemons/telemetry/validate.c), the parser of what the network posts to
 * /report: the body as jansson reads it, then telemetry_validate.  A
 * report it accepts must hold only the allow-list's keys at the top (the
 * collector stores it as it is): anything else is a bug, and abort()
 * makes libFuzzer keep the input.  "make fuzz" runs it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "telemetry.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const top[] = {"schema", "install_id", "version", "extension_version",
									  "hostname", "days", "stages"};
	struct telemetry_limits	 limits = {31, 64};
	json_t					*report = json_loadb((const char *) data, size, JSON_REJECT_DUPLICATES, NULL);
	const char				*key;
	json_t					*value;
	char					 why[512];

	if (report == NULL)
		return 0;
	if (telemetry_validate(report, &limits, why, sizeof(why)))
		json_object_foreach (report, key, value)
		{
			bool known = false;

			for (size_t i = 0; i < sizeof(top) / sizeof(top[0]); i++)
				known |= strcmp(key, top[i]) == 0;
			if (!known)
				abort();
		}
	json_decref(report);
	return 0;
}
