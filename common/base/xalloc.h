/*
 * xalloc.h: allocation that cannot fail (running out of memory is fatal).
 */
#ifndef PEPSI_XALLOC_H
#define PEPSI_XALLOC_H

#include <stddef.h>

void *xmalloc(size_t size);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *ptr, size_t size);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
