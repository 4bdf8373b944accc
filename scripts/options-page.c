/*
 * options-page.c: the option reference of pepsi.conf(5), made from
 * schema/options.def, so that the page cannot drift from what the programs
 * and the extension check.
 *
 *   options-page < docs/pepsi.conf.5.md > page
 *
 * Copies the page from standard input, replacing what lies between the
 * lines "<!-- BEGIN options.def -->" and "<!-- END options.def -->" with one
 * section per place an option is set (in options.def's order) and one
 * definition per option: its description, type and bounds, default and
 * where it may be set.  The Makefile builds the man page from this output
 * and fails make check when the committed page differs from it
 * (options-page-check); make options-page writes it back.
 */
#include "options.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BEGIN_MARK "<!-- BEGIN options.def -->"
#define END_MARK "<!-- END options.def -->"

#define OPTION(where, name, type, scope, default_value, min, max, choices, description)
#define UNSKIPPABLE(program, why) {program, why},
#define SECRET(where, name)
#define OWNER(where, name, lines)

static const struct
{
	const char *program;
	const char *why;
} unskippable[] = {
#include "options.def"
};

#undef OPTION
#undef UNSKIPPABLE
#undef SECRET
#undef OWNER

/* Text of options.def as Markdown: every character pandoc could read as markup escaped. */
static void
put_text(const char *s)
{
	for (; *s; s++)
	{
		if (strchr("\\`*_[]<>|#$~^\"@", *s))
			putchar('\\');
		putchar(*s);
	}
}

/* A duration in milliseconds, in the largest unit that divides it. */
static void
put_duration(long long ms)
{
	static const struct
	{
		long long	per;
		const char *unit;
	} units[] = {{86400000, "d"}, {3600000, "h"}, {60000, "m"}, {1000, "s"}};

	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
		if (ms != 0 && ms % units[i].per == 0)
		{
			printf("%lld%s", ms / units[i].per, units[i].unit);
			return;
		}
	printf("%lldms", ms);
}

static void
put_size(long long bytes)
{
	static const char *const units[] = {"G", "M", "k"};
	static const long long	 per[] = {1LL << 30, 1LL << 20, 1LL << 10};

	for (size_t i = 0; i < 3; i++)
		if (bytes != 0 && bytes % per[i] == 0)
		{
			printf("%lld%s", bytes / per[i], units[i]);
			return;
		}
	printf("%lld", bytes);
}

static void
put_bound(const struct option_def *o, long long v)
{
	if (o->type == OPTION_DURATION)
		put_duration(v);
	else if (o->type == OPTION_SIZE)
		put_size(v);
	else
		printf("%lld", v);
}

static const char *
type_text(enum option_type type)
{
	switch (type)
	{
		case OPTION_TEXT:
			return "text";
		case OPTION_BOOL:
			return "boolean";
		case OPTION_INT:
			return "integer";
		case OPTION_DURATION:
			return "duration";
		case OPTION_SIZE:
			return "size";
		case OPTION_STAGE:
			return "stage name";
		case OPTION_PROGRAM:
			return "program";
		case OPTION_DOMAIN:
			return "domain";
		case OPTION_DOMAIN_LIST:
			return "domain list";
		case OPTION_ADDRESS_LIST:
			return "address list";
		case OPTION_PATH:
			return "absolute path";
		case OPTION_ENUM:
			return "one of";
		case OPTION_NAME:
			return "name";
	}
	return "?";
}

static const char *
scope_text(enum option_scope scope)
{
	switch (scope)
	{
		case OPTION_SCOPE_FILE:
			return "pepsi.conf only";
		case OPTION_SCOPE_GLOBAL:
			return "pepsi.conf, or a global override";
		case OPTION_SCOPE_DOMAIN:
			return "pepsi.conf, or an override: global or per recipient domain";
		case OPTION_SCOPE_ADDRESS:
			return "pepsi.conf, or an override: global, per recipient domain or per recipient address";
	}
	return "?";
}

/* The heading of the options set in WHERE. */
static void
put_heading(const char *where)
{
	size_t len = strlen(where);

	if (strncmp(where, "pepsi-", 6) == 0)
	{
		printf("### A [stage-NAME] section with PROGRAM = %s\n\n", where);
		printf("Beside the options of every stage section, read by %s(8)", where);
		for (size_t i = 0; i < sizeof(unskippable) / sizeof(unskippable[0]); i++)
			if (strcmp(unskippable[i].program, where) == 0)
			{
				printf(".  An override never routes a message around such a stage: ");
				put_text(unskippable[i].why);
			}
		printf(".\n\n");
	}
	else if (len > 2 && strcmp(where + len - 2, "-*") == 0)
		printf("### [%.*s-NAME]\n\n", (int) (len - 2), where);
	else
		printf("### [%s]\n\n", where);
}

static void
put_option(const struct option_def *o)
{
	printf("`%s`\n:   ", o->name);
	put_text(o->description);
	printf(".\n\n    Type: %s", type_text(o->type));
	if (o->type == OPTION_ENUM)
	{
		const char *c = o->choices;

		while (c && *c)
		{
			size_t n = strcspn(c, "|");

			printf(" `%.*s`", (int) n, c);
			c += n;
			if (*c == '|')
			{
				c++;
				printf(",");
			}
		}
	}
	if ((o->type == OPTION_INT || o->type == OPTION_DURATION || o->type == OPTION_SIZE) && (o->min || o->max))
	{
		if (o->max)
		{
			printf(", from ");
			put_bound(o, o->min);
			printf(" to ");
			put_bound(o, o->max);
		}
		else
		{
			printf(", at least ");
			put_bound(o, o->min);
		}
	}
	if (o->type == OPTION_NAME)
		printf(", %lld to %lld letters, digits, `.`, `_` or `-`", o->min > 0 ? o->min : 1, o->max);
	printf(".  Default: ");
	if (o->default_value)
		printf("`%s`", o->default_value);
	else
		printf("none");
	printf(".  Set in: %s.\n\n", scope_text(o->scope));
}

static void
put_options(void)
{
	for (size_t i = 0; i < option_count; i++)
	{
		bool seen = false;

		for (size_t j = 0; j < i && !seen; j++)
			seen = strcmp(option_table[j].where, option_table[i].where) == 0;
		if (seen)
			continue;
		put_heading(option_table[i].where);
		for (size_t j = i; j < option_count; j++)
			if (strcmp(option_table[j].where, option_table[i].where) == 0)
				put_option(&option_table[j]);
	}
}

int
main(void)
{
	char line[4096];
	int	 state = 0; /* 0: before the block, 1: in it, 2: after it */

	while (fgets(line, sizeof line, stdin))
	{
		if (state == 1)
		{
			if (strncmp(line, END_MARK, strlen(END_MARK)) != 0)
				continue;
			state = 2;
		}
		fputs(line, stdout);
		if (state == 0 && strncmp(line, BEGIN_MARK, strlen(BEGIN_MARK)) == 0)
		{
			printf("\n");
			put_options();
			state = 1;
		}
	}
	if (state != 2)
	{
		fprintf(stderr, "options-page: the page has no %s ... %s block\n", BEGIN_MARK, END_MARK);
		return 1;
	}
	return ferror(stdout) ? 1 : 0;
}
