/*
 * buf.h: a growable byte buffer, always NUL-terminated after len so its
 * contents can be used as a C string when they hold text.
 */
#ifndef PEPSI_BUF_H
#define PEPSI_BUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

struct buf
{
	char  *data;
	size_t len;
	size_t cap;
};

#define BUF_INIT   \
	{              \
		NULL, 0, 0 \
	}

void buf_reserve(struct buf *b, size_t extra);
void buf_append(struct buf *b, const void *data, size_t len);
void buf_append_str(struct buf *b, const char *s);
void buf_append_char(struct buf *b, char c);
void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_consume(struct buf *b, size_t len);
void buf_reset(struct buf *b);
void buf_free(struct buf *b);
/*
 * Append the whole file at path (at most max bytes: a bigger file is
 * refused); false with err naming the file and the reason.
 */
bool buf_append_file(struct buf *b, const char *path, size_t max, char *err, size_t errlen);
/* The same from an open stream (a secret_key_open file, say); name is for err. */
bool buf_append_stream(struct buf *b, FILE *f, const char *name, size_t max, char *err,
					   size_t errlen);

/* Write all of data to fd, retrying short writes and EINTR; false with errno set. */
bool fd_write_all(int fd, const void *data, size_t len);

#endif
