/*
 * condition.c: parsing a CONDITION of pepsi-stage-if ("SUBJECT OP [VALUE]")
 * and comparing a subject's value with it.  if.c finds the value of the
 * subject in the row and caches parsed conditions.
 */
#include "condition.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/xalloc.h"

void
if_condition_free(struct if_condition *c)
{
	free(c->text);
	free(c->subject);
	free(c->value);
	if (c->has_regex)
		regfree(&c->regex);
	memset(c, 0, sizeof(*c));
}

/* Parse text into c; false with a reason in err. */
bool
if_condition_parse(const char *text, struct if_condition *c, char *err, size_t errlen)
{
	static const struct
	{
		const char *token;
		enum if_op	op;
	} ops[] = {
		{"!=", IF_NE}, {"!~", IF_NOMATCH}, {"=", IF_EQ}, {"~", IF_MATCH}, {"<", IF_LT}, {">", IF_GT}, {"exists", IF_EXISTS}, {"missing", IF_MISSING}};
	const char *p = text;
	size_t		n;
	bool		found = false;

	memset(c, 0, sizeof(*c));
	while (isspace((unsigned char) *p))
		p++;
	n = strcspn(p, " \t!=~<>");
	if (n == 0)
	{
		snprintf(err, errlen, "CONDITION \"%s\" has no subject", text);
		return false;
	}
	c->subject = xstrndup(p, n);
	if (strcmp(c->subject, "mail_from") != 0 && strcmp(c->subject, "rcpt") != 0
		&& strcmp(c->subject, "rcpt_count") != 0 && strncmp(c->subject, "state.", 6) != 0)
	{
		snprintf(err, errlen, "CONDITION subject \"%s\" is not mail_from, rcpt, rcpt_count or state.<key>",
				 c->subject);
		if_condition_free(c);
		return false;
	}
	p += n;
	while (isspace((unsigned char) *p))
		p++;
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]) && !found; i++)
		if (strncmp(p, ops[i].token, strlen(ops[i].token)) == 0)
		{
			c->op = ops[i].op;
			p += strlen(ops[i].token);
			found = true;
		}
	if (!found)
	{
		snprintf(err, errlen, "CONDITION \"%s\" has no operator (= != ~ !~ < > exists missing)", text);
		if_condition_free(c);
		return false;
	}
	while (isspace((unsigned char) *p))
		p++;
	n = strlen(p);
	while (n > 0 && isspace((unsigned char) p[n - 1]))
		n--;
	if (n >= 2 && p[0] == '"' && p[n - 1] == '"')
	{
		p++;
		n -= 2;
	}
	c->value = xstrndup(p, n);
	if ((c->op == IF_EXISTS || c->op == IF_MISSING) && n > 0)
	{
		snprintf(err, errlen, "CONDITION \"%s\": exists and missing take no value", text);
		if_condition_free(c);
		return false;
	}
	if (c->op == IF_MATCH || c->op == IF_NOMATCH)
	{
		int rc = regcomp(&c->regex, c->value, REG_EXTENDED | REG_ICASE | REG_NOSUB);

		if (rc != 0)
		{
			char message[256];

			regerror(rc, &c->regex, message, sizeof(message));
			snprintf(err, errlen, "CONDITION regex \"%s\": %s", c->value, message);
			if_condition_free(c);
			return false;
		}
		c->has_regex = true;
	}
	c->text = xstrdup(text);
	return true;
}

bool
if_compare(const struct if_condition *c, const char *value)
{
	switch (c->op)
	{
		case IF_EXISTS:
			return value != NULL;
		case IF_MISSING:
			return value == NULL;
		case IF_EQ:
			return value && strcmp(value, c->value) == 0;
		case IF_NE:
			return !value || strcmp(value, c->value) != 0;
		case IF_MATCH:
			return value && regexec(&c->regex, value, 0, NULL, 0) == 0;
		case IF_NOMATCH:
			return !value || regexec(&c->regex, value, 0, NULL, 0) != 0;
		case IF_LT:
			return value && strtod(value, NULL) < strtod(c->value, NULL);
		case IF_GT:
			return value && strtod(value, NULL) > strtod(c->value, NULL);
	}
	return false;
}
