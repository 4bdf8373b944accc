/*
 * results.c: see results.h.
 */
#include "auth/results.h"

#include <stdbool.h>
#include <string.h>

/* The methods in the order the header lists them, and their properties. */
static const char *const results_methods[] = {
	"auth", "iprev", "spf", "spf_helo", "dkim", "dmarc", "arc", NULL};
static const char *const results_properties[] = {
	"smtp.auth", "smtp.mailfrom", "smtp.helo", "policy.iprev", "header.d", "header.i",
	"header.s", "header.a", "header.b", "header.from", "policy.dmarc", "header.oldest-pass", NULL};

/*
 * RFC 2045 token characters, and '@' (RFC 8601 pvalue allows
 * local-part@domain): no quoting needed.
 */
static bool
results_is_token(const char *s)
{
	if (*s == '\0')
		return false;
	for (; *s; s++)
		if ((unsigned char) *s <= ' ' || (unsigned char) *s >= 0x7f
			|| strchr("()<>,;:\\\"/[]?=", *s))
			return false;
	return true;
}

/* A quoted string of at most max characters; what no header may hold becomes '?'. */
static void
results_quoted(struct buf *h, const char *s, size_t max)
{
	buf_append_char(h, '"');
	for (size_t i = 0; s[i] && i < max; i++)
	{
		unsigned char ch = (unsigned char) s[i];

		if (ch == '"' || ch == '\\')
			buf_append_char(h, '\\');
		buf_append_char(h, ch < ' ' || ch >= 0x7f ? '?' : (char) ch);
	}
	buf_append_char(h, '"');
}

/* A value as a token, or else a quoted string. */
static void
results_value(struct buf *h, const char *s)
{
	if (results_is_token(s))
		buf_append_str(h, s);
	else
		results_quoted(h, s, 256);
}

/* A comment's text: parentheses and backslashes escaped, controls dropped. */
static void
results_comment(struct buf *h, const char *s)
{
	buf_append_str(h, " (");
	for (size_t i = 0; s[i] && i < 256; i++)
	{
		unsigned char ch = (unsigned char) s[i];

		if (ch == '(' || ch == ')' || ch == '\\')
			buf_append_char(h, '\\');
		buf_append_char(h, ch < ' ' || ch >= 0x7f ? '?' : (char) ch);
	}
	buf_append_char(h, ')');
}

static void
results_one(struct buf *h, const char *method, const json_t *r, bool *first)
{
	const char *result = json_string_value(json_object_get(r, "result"));
	const char *reason = json_string_value(json_object_get(r, "reason"));
	const char *name = json_string_value(json_object_get(r, "name"));

	if (result == NULL)
		return;
	buf_append_str(h, *first ? "\t" : ";\r\n\t");
	*first = false;
	/* spf_helo is the spf method for the HELO identity. */
	buf_append_str(h, strcmp(method, "spf_helo") == 0 ? "spf" : method);
	buf_append_char(h, '=');
	results_value(h, result);
	if (name)
		results_comment(h, name);
	if (reason)
	{
		/* Always quoted: it is prose. */
		buf_append_str(h, " reason=");
		results_quoted(h, reason, 200);
	}
	for (size_t i = 0; results_properties[i]; i++)
	{
		const char *value = json_string_value(json_object_get(r, results_properties[i]));

		if (value)
		{
			buf_printf(h, " %s=", results_properties[i]);
			results_value(h, value);
		}
	}
}

void
auth_results_header(struct buf *h, const char *authserv_id, const json_t *auth)
{
	buf_printf(h, "Authentication-Results: %s;\r\n", authserv_id);
	auth_results_resinfo(h, auth);
}

void
auth_results_resinfo(struct buf *h, const json_t *auth)
{
	bool first = true;

	for (size_t i = 0; results_methods[i]; i++)
	{
		const char	 *method = results_methods[i];
		const json_t *r = json_object_get(auth, method);

		if (json_is_array(r))
		{
			size_t	j;
			json_t *one;

			if (json_array_size(r) == 0)
			{
				buf_append_str(h, first ? "\t" : ";\r\n\t");
				first = false;
				buf_printf(h, "%s=none", method);
			}
			json_array_foreach (r, j, one)
				results_one(h, method, one, &first);
		}
		else if (json_is_object(r))
			results_one(h, method, r, &first);
	}
	/* RFC 8601 2.2: no method at all is "none". */
	buf_append_str(h, first ? "\tnone\r\n" : "\r\n");
}

json_t *
auth_result(const char *result, const char *property, const char *value)
{
	json_t *r = json_object();

	json_object_set_new(r, "result", json_string(result));
	if (property && value)
		json_object_set_new(r, property, json_string(value));
	return r;
}
