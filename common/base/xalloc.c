/*
 * xalloc.c: allocation that cannot fail.
 *
 * The programs are small and short of nothing but memory: running out is
 * fatal (logged through log.c), so callers never check for NULL.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/xalloc.h"

void *
xmalloc(size_t size)
{
	void *p = malloc(size ? size : 1);

	if (p == NULL)
		fatal("malloc(%zu)", size);
	return p;
}

void *
xcalloc(size_t count, size_t size)
{
	void *p = calloc(count ? count : 1, size ? size : 1);

	if (p == NULL)
		fatal("calloc(%zu, %zu)", count, size);
	return p;
}

void *
xrealloc(void *ptr, size_t size)
{
	void *p = realloc(ptr, size ? size : 1);

	if (p == NULL)
		fatal("realloc(%zu)", size);
	return p;
}

char *
xstrdup(const char *s)
{
	char *p = strdup(s);

	if (p == NULL)
		fatal("strdup");
	return p;
}

char *
xstrndup(const char *s, size_t n)
{
	char *p = strndup(s, n);

	if (p == NULL)
		fatal("strndup");
	return p;
}

char *
xasprintf(const char *fmt, ...)
{
	va_list ap;
	char   *p;

	va_start(ap, fmt);
	if (vasprintf(&p, fmt, ap) < 0)
		fatal("vasprintf");
	va_end(ap);
	return p;
}
