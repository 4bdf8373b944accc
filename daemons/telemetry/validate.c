/*
 * validate.c: the collector's allow-list of a report (telemetry.h).  A
 * report holds exactly what docs/pepsi-telemetry-client.8.md lists: an
 * unknown key, a value of another type or out of its range, or more
 * entries than the limits allow is refused with the reason, and nothing
 * of it is stored.  Strings are held to the characters their field needs,
 * so nothing stored can carry markup, an address or free text.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "telemetry.h"

/* What a field holds. */
enum field_kind
{
	FIELD_SCHEMA,  /* the integer 1 */
	FIELD_COUNT,   /* an integer from 0 */
	FIELD_UUID,	   /* 8-4-4-4-12 lower-case hex digits */
	FIELD_VERSION, /* 1 to 32 of [0-9A-Za-z.+~-] */
	FIELD_HOST,	   /* 1 to 253 of [0-9A-Za-z.-] */
	FIELD_NAME,	   /* 1 to 64 of [0-9A-Za-z._-] */
	FIELD_DAY,	   /* YYYY-MM-DD, a real date */
	FIELD_DAYS,	   /* an array of day objects */
	FIELD_STAGES,  /* an array of stage objects */
};

struct field
{
	const char	   *key;
	enum field_kind kind;
	bool			required;
};

static const struct field report_fields[] = {
	{"schema", FIELD_SCHEMA, true},
	{"install_id", FIELD_UUID, true},
	{"version", FIELD_VERSION, true},
	{"extension_version", FIELD_VERSION, true},
	{"hostname", FIELD_HOST, false},
	{"days", FIELD_DAYS, true},
	{"stages", FIELD_STAGES, true},
	{NULL, 0, false},
};
static const struct field day_fields[] = {
	{"day", FIELD_DAY, true},
	{"received", FIELD_COUNT, true},
	{"delivered", FIELD_COUNT, true},
	{"deferred", FIELD_COUNT, true},
	{"bounced", FIELD_COUNT, true},
	{NULL, 0, false},
};
static const struct field stage_fields[] = {
	{"name", FIELD_NAME, true},
	{"program", FIELD_NAME, true},
	{"next", FIELD_NAME, false},
	{"bounce", FIELD_NAME, false},
	{NULL, 0, false},
};

static const char *
validate_type_name(const json_t *value)
{
	switch (json_typeof(value))
	{
		case JSON_OBJECT:
			return "an object";
		case JSON_ARRAY:
			return "an array";
		case JSON_STRING:
			return "a string";
		case JSON_INTEGER:
			return "an integer";
		case JSON_REAL:
			return "a number with a fraction";
		case JSON_TRUE:
		case JSON_FALSE:
			return "a boolean";
		default:
			return "null";
	}
}

/* Is s of 1..max characters, each of allowed? */
static bool
validate_chars(const char *s, size_t max, const char *allowed)
{
	size_t n = strlen(s);

	return n >= 1 && n <= max && strspn(s, allowed) == n;
}

#define VALIDATE_ALNUM "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

static bool
validate_uuid(const char *s)
{
	for (int i = 0; i < 36; i++)
		if ((i == 8 || i == 13 || i == 18 || i == 23) ? s[i] != '-'
													  : s[i] == '\0' || !strchr("0123456789abcdef", s[i]))
			return false;
	return s[36] == '\0';
}

/* A date that exists, from 2000 on: YYYY-MM-DD read back the same. */
static bool
validate_day(const char *s)
{
	struct tm tm = {0};
	char	  again[16];
	time_t	  t;

	if (strlen(s) != 10 || strptime(s, "%Y-%m-%d", &tm) == NULL || tm.tm_year < 100)
		return false;
	t = timegm(&tm);
	gmtime_r(&t, &tm);
	strftime(again, sizeof(again), "%Y-%m-%d", &tm);
	return strcmp(again, s) == 0;
}

static bool validate_array(const char *key, const json_t *value, const struct field *fields, long long max,
						   const char *limit, char *why, size_t whylen);

/* One field's value; where names it in the message ("days[2].day"). */
static bool
validate_value(const char *where, const struct field *f, const json_t *value,
			   const struct telemetry_limits *limits, char *why, size_t whylen)
{
	const char *s = json_is_string(value) ? json_string_value(value) : NULL;
	const char *want = NULL;

	switch (f->kind)
	{
		case FIELD_SCHEMA:
			if (!json_is_integer(value) || json_integer_value(value) != 1)
				want = "the integer 1 (the only report format this collector knows)";
			break;
		case FIELD_COUNT:
			if (!json_is_integer(value) || json_integer_value(value) < 0)
				want = "an integer from 0";
			break;
		case FIELD_UUID:
			if (s == NULL || !validate_uuid(s))
				want = "a UUID in lower-case hex (8-4-4-4-12)";
			break;
		case FIELD_VERSION:
			if (s == NULL || !validate_chars(s, 32, VALIDATE_ALNUM ".+~-"))
				want = "a version: 1 to 32 letters, digits, '.', '+', '~' or '-'";
			break;
		case FIELD_HOST:
			if (s == NULL || !validate_chars(s, 253, VALIDATE_ALNUM ".-"))
				want = "a host name: 1 to 253 letters, digits, '.' or '-'";
			break;
		case FIELD_NAME:
			if (s == NULL || !validate_chars(s, 64, VALIDATE_ALNUM "._-"))
				want = "a name: 1 to 64 letters, digits, '.', '_' or '-'";
			break;
		case FIELD_DAY:
			if (s == NULL || !validate_day(s))
				want = "a date, YYYY-MM-DD";
			break;
		case FIELD_DAYS:
			return validate_array(where, value, day_fields, limits->max_days, "MAX_DAYS", why, whylen);
		case FIELD_STAGES:
			return validate_array(where, value, stage_fields, limits->max_stages, "MAX_STAGES", why, whylen);
	}
	if (want == NULL)
		return true;
	snprintf(why, whylen, "\"%s\" must be %s, not %s", where, want,
			 s ? "that string" : validate_type_name(value));
	return false;
}

/* An object with only fields' keys, the required ones present. */
static bool
validate_object(const char *where, json_t *object, const struct field *fields,
				const struct telemetry_limits *limits, char *why, size_t whylen)
{
	const char *key;
	json_t	   *value;
	char		path[128];

	if (!json_is_object(object))
	{
		snprintf(why, whylen, "%s%smust be an object, not %s", where, *where ? " " : "",
				 validate_type_name(object));
		return false;
	}
	json_object_foreach (object, key, value)
	{
		const struct field *f = fields;

		while (f->key && strcmp(f->key, key) != 0)
			f++;
		if (f->key == NULL)
		{
			snprintf(why, whylen, "%s%sunknown key \"%.64s\": a report holds only the documented fields",
					 where, *where ? ": " : "", key);
			return false;
		}
		snprintf(path, sizeof(path), "%s%s%s", where, *where ? "." : "", key);
		if (!validate_value(path, f, value, limits, why, whylen))
			return false;
	}
	for (const struct field *f = fields; f->key; f++)
		if (f->required && json_object_get(object, f->key) == NULL)
		{
			snprintf(why, whylen, "%s%s\"%s\" is missing", where, *where ? ": " : "", f->key);
			return false;
		}
	return true;
}

/* An array of at most max objects of fields (limit: the option that sets max). */
static bool
validate_array(const char *key, const json_t *value, const struct field *fields, long long max,
			   const char *limit, char *why, size_t whylen)
{
	static const struct telemetry_limits none = {0, 0};
	char								 where[128];
	size_t								 i;
	json_t								*item;

	if (!json_is_array(value))
	{
		snprintf(why, whylen, "\"%s\" must be an array, not %s", key, validate_type_name(value));
		return false;
	}
	if ((long long) json_array_size(value) > max)
	{
		snprintf(why, whylen, "\"%s\" has %zu entries, more than %lld ([telemetry-collector] %s)", key,
				 json_array_size(value), max, limit);
		return false;
	}
	json_array_foreach (value, i, item)
	{
		snprintf(where, sizeof(where), "%s[%zu]", key, i);
		if (!validate_object(where, item, fields, &none, why, whylen))
			return false;
	}
	/* A day twice would be two figures for one day. */
	for (size_t a = 0; fields == day_fields && a < json_array_size(value); a++)
		for (size_t b = a + 1; b < json_array_size(value); b++)
			if (json_equal(json_object_get(json_array_get(value, a), "day"),
						   json_object_get(json_array_get(value, b), "day")))
			{
				snprintf(why, whylen, "\"%s\": the day %s is there twice", key,
						 json_string_value(json_object_get(json_array_get(value, a), "day")));
				return false;
			}
	return true;
}

bool
telemetry_validate(json_t *report, const struct telemetry_limits *limits, char *why, size_t whylen)
{
	if (!json_is_object(report))
	{
		snprintf(why, whylen, "the report must be a JSON object, not %s", validate_type_name(report));
		return false;
	}
	return validate_object("", report, report_fields, limits, why, whylen);
}
