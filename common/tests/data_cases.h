/*
 * data_cases.h: data-driven cmocka tests, one case per line of a data file
 * (as jansson's test suites keep one case per directory): the data is the
 * point, and adding a case is adding a line.
 *
 * A data file lives in the data/ directory beside the test's source.  A
 * line is TAB-separated fields; blank lines and lines starting with '#'
 * are skipped.  Fields may use the escapes \t \n \r \\ \0 and \xHH, so a
 * case can hold any octet; each field keeps its decoded length.  Every
 * line runs as its own cmocka test named file:line.
 */
#ifndef PEPSI_DATA_CASES_H
#define PEPSI_DATA_CASES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DATA_CASE_FIELDS 8

struct data_case
{
	char   name[256]; /* "file:line", the cmocka test name */
	int	   nfields;
	char  *field[DATA_CASE_FIELDS];
	size_t len[DATA_CASE_FIELDS];
};

/* Decode the escapes of one field in place; returns its length. */
static inline size_t
data_case_unescape(char *s)
{
	char *w = s;

	for (const char *r = s; *r; r++)
	{
		if (*r != '\\' || r[1] == '\0')
		{
			*w++ = *r;
			continue;
		}
		r++;
		switch (*r)
		{
			case 't':
				*w++ = '\t';
				break;
			case 'n':
				*w++ = '\n';
				break;
			case 'r':
				*w++ = '\r';
				break;
			case '0':
				*w++ = '\0';
				break;
			case 'x':
				{
					unsigned v = 0;

					if (sscanf(r + 1, "%2x", &v) != 1)
						fail_msg("bad \\x escape in \"%s\"", s);
					*w++ = (char) v;
					r += 2;
					break;
				}
			default:
				*w++ = *r;
		}
	}
	*w = '\0';
	return (size_t) (w - s);
}

/*
 * Load the cases of data/<name> beside test_source (pass __FILE__; the
 * Makefile defines PEPSI_SOURCE_TOP so the path does not depend on the
 * directory the test runs from).  Exits if the file cannot be read: a
 * suite whose data is missing must fail, not pass empty.
 */
static inline struct data_case *
data_cases_load(const char *test_source, const char *name, size_t *count)
{
	char			  path[1024];
	const char		 *slash = strrchr(test_source, '/');
	int				  dirlen = slash ? (int) (slash - test_source) : 1;
	FILE			 *f;
	char			 *line = NULL;
	size_t			  cap = 0;
	ssize_t			  n;
	int				  lineno = 0;
	struct data_case *cases = NULL;

	snprintf(path, sizeof(path), "%s%s%.*s/data/%s",
			 test_source[0] == '/' ? "" : PEPSI_SOURCE_TOP, test_source[0] == '/' ? "" : "/",
			 dirlen, slash ? test_source : ".", name);
	f = fopen(path, "r");
	if (f == NULL)
	{
		perror(path);
		exit(1);
	}
	*count = 0;
	while ((n = getline(&line, &cap, f)) >= 0)
	{
		struct data_case *c;
		char			 *p;

		lineno++;
		while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
			line[--n] = '\0';
		if (n == 0 || line[0] == '#')
			continue;
		cases = realloc(cases, (*count + 1) * sizeof(*cases));
		c = &cases[(*count)++];
		memset(c, 0, sizeof(*c));
		snprintf(c->name, sizeof(c->name), "%s:%d", name, lineno);
		p = strdup(line);
		while (p != NULL && c->nfields < DATA_CASE_FIELDS)
		{
			char *tab = strchr(p, '\t');

			if (tab)
				*tab++ = '\0';
			c->field[c->nfields] = p;
			c->len[c->nfields] = data_case_unescape(p);
			c->nfields++;
			p = tab;
		}
	}
	free(line);
	fclose(f);
	if (*count == 0)
	{
		fprintf(stderr, "%s: no cases\n", path);
		exit(1);
	}
	return cases;
}

static inline void
data_cases_free(struct data_case *cases, size_t count)
{
	for (size_t i = 0; i < count; i++)
		free(cases[i].field[0]); /* the line's one copy; the fields point into it */
	free(cases);
}

/* Run fn once per case (its *state is the struct data_case), as one group; frees cases. */
static inline int
data_cases_run(const char *group, struct data_case *cases, size_t count, CMUnitTestFunction fn)
{
	struct CMUnitTest *tests = calloc(count, sizeof(*tests));
	int				   rc;

	for (size_t i = 0; i < count; i++)
	{
		tests[i].name = cases[i].name;
		tests[i].test_func = fn;
		tests[i].initial_state = &cases[i];
	}
	rc = _cmocka_run_group_tests(group, tests, count, NULL, NULL);
	free(tests);
	data_cases_free(cases, count);
	return rc;
}

/* The case's field i, failing the test if the line has fewer fields. */
static inline const char *
data_case_field(const struct data_case *c, int i)
{
	if (i >= c->nfields)
		fail_msg("%s: needs at least %d fields", c->name, i + 1);
	return c->field[i];
}

#endif
