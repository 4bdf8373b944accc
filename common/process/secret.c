/* secret.c: see secret.h. */
#include "process/secret.h"

#include "base/xalloc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The file open for reading, if no permission in forbidden is set; else NULL with err. */
static FILE *
secret_open(const char *path, int flags, mode_t forbidden, const char *what, const char *fix,
			char *err, size_t errlen)
{
	struct stat st;
	FILE	   *f;
	int			fd = open(path, O_RDONLY | O_CLOEXEC | flags);

	if (fd < 0)
	{
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return NULL;
	}
	if (fstat(fd, &st) != 0)
	{
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		goto err;
	}
	if (!S_ISREG(st.st_mode))
	{
		snprintf(err, errlen, "%s: not a regular file", path);
		goto err;
	}
	if (st.st_mode & forbidden)
	{
		snprintf(err, errlen, "%s: %s (mode %04o); refused: %s %s", path, what,
				 (unsigned) (st.st_mode & 07777), fix, path);
		goto err;
	}
	if ((f = fdopen(fd, "r")) == NULL)
	{
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		goto err;
	}
	return f;

err:
	close(fd);
	return NULL;
}

FILE *
secret_file_open(const char *path, char *err, size_t errlen)
{
	return secret_open(path, O_NOFOLLOW, S_IRWXG | S_IRWXO,
					   "holds credentials but its group or others may access it", "chmod 600",
					   err, errlen);
}

FILE *
secret_key_open(const char *path, char *err, size_t errlen)
{
	return secret_open(path, 0, S_IWGRP | S_IXGRP | S_IRWXO,
					   "a private key others may access, or its group change", "chmod 640", err,
					   errlen);
}

FILE *
secret_group_file_open(const char *path, char *err, size_t errlen)
{
	return secret_open(path, O_NOFOLLOW, S_IWGRP | S_IXGRP | S_IRWXO,
					   "holds credentials but others may access it, or its group change", "chmod 640",
					   err, errlen);
}

char *
secret_file_first_line(FILE *f, const char *path, char *err, size_t errlen)
{
	char   line[SECRET_LINE_MAX + 2]; /* the line, its end, the NUL */
	size_t n;
	bool   whole;
	char  *value = NULL;

	if (fgets(line, sizeof(line), f) == NULL)
		line[0] = '\0';
	n = strcspn(line, "\r\n");
	whole = line[n] != '\0' || n <= SECRET_LINE_MAX;
	fclose(f);
	line[n] = '\0';
	if (!whole)
		snprintf(err, errlen, "%s: first line longer than %d bytes", path, SECRET_LINE_MAX);
	else
		value = xstrdup(line);
	explicit_bzero(line, sizeof(line));
	return value;
}
