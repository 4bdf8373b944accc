/* buf.c: see buf.h. */
#include "base/buf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/xalloc.h"

void
buf_reserve(struct buf *b, size_t extra)
{
	size_t need = b->len + extra + 1;

	if (need <= b->cap)
		return;
	if (b->cap == 0)
		b->cap = 256;
	while (b->cap < need)
		b->cap *= 2;
	b->data = xrealloc(b->data, b->cap);
}

void
buf_append(struct buf *b, const void *data, size_t len)
{
	buf_reserve(b, len);
	if (len > 0)
		memcpy(b->data + b->len, data, len);
	b->len += len;
	b->data[b->len] = '\0';
}

void
buf_append_str(struct buf *b, const char *s)
{
	buf_append(b, s, strlen(s));
}

void
buf_append_char(struct buf *b, char c)
{
	buf_append(b, &c, 1);
}

void
buf_printf(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	int		n;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0)
		fatalx("buf_printf: bad format");
	buf_reserve(b, (size_t) n);
	va_start(ap, fmt);
	vsnprintf(b->data + b->len, (size_t) n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t) n;
}

/* Drop the first len bytes. */
void
buf_consume(struct buf *b, size_t len)
{
	if (len >= b->len)
	{
		buf_reset(b);
		return;
	}
	memmove(b->data, b->data + len, b->len - len);
	b->len -= len;
	b->data[b->len] = '\0';
}

void
buf_reset(struct buf *b)
{
	b->len = 0;
	if (b->data)
		b->data[0] = '\0';
}

void
buf_free(struct buf *b)
{
	free(b->data);
	b->data = NULL;
	b->len = b->cap = 0;
}

bool
buf_append_stream(struct buf *b, FILE *f, const char *name, size_t max, char *err, size_t errlen)
{
	char   chunk[4096];
	size_t n, read_so_far = 0;

	while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
	{
		if ((read_so_far += n) > max)
		{
			snprintf(err, errlen, "%s: larger than %zu bytes", name, max);
			buf_append(b, "", 0);
			return false;
		}
		buf_append(b, chunk, n);
	}
	buf_append(b, "", 0); /* NUL-terminated even when empty */
	if (ferror(f))
	{
		snprintf(err, errlen, "%s: %s", name, strerror(errno));
		return false;
	}
	return true;
}

bool
buf_append_file(struct buf *b, const char *path, size_t max, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	bool  ok;

	if (f == NULL)
	{
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return false;
	}
	ok = buf_append_stream(b, f, path, max, err, errlen);
	fclose(f);
	return ok;
}

bool
fd_write_all(int fd, const void *data, size_t len)
{
	const char *p = data;

	while (len > 0)
	{
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		p += n;
		len -= (size_t) n;
	}
	return true;
}
