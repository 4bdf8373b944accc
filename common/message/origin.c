/*
 * origin.c: see origin.h.
 */
#include "message/origin.h"

#include <string.h>

const char *
origin_trust(const json_t *state)
{
	return json_string_value(json_object_get(json_object_get(state, "origin"), "trust"));
}

bool
origin_trusted(const json_t *state)
{
	static const char *const trusted[] = {ORIGIN_TRUST_AUTHENTICATED, ORIGIN_TRUST_TRUSTED_NETWORK,
										  ORIGIN_TRUST_LOCAL, ORIGIN_TRUST_PEPSI, ORIGIN_TRUST_LIST};
	const char				*trust = origin_trust(state);

	for (size_t i = 0; trust && i < sizeof(trusted) / sizeof(trusted[0]); i++)
		if (strcmp(trust, trusted[i]) == 0)
			return true;
	return false;
}

const char *
origin_list_domain(const json_t *state)
{
	const char *trust = origin_trust(state);

	if (trust == NULL || strcmp(trust, ORIGIN_TRUST_LIST) != 0)
		return NULL;
	return json_string_value(json_object_get(json_object_get(state, "origin"), "domain"));
}

json_t *
origin_generated(const char *program)
{
	return json_pack("{s:s, s:s}", "trust", ORIGIN_TRUST_PEPSI, "program", program);
}
