/* secret.c: see secret.h. */
#include "secret.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

FILE *
secret_file_open(const char *path, char *err, size_t errlen)
{
	struct stat st;
	FILE	   *f;
	int			fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

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
	if (st.st_mode & (S_IRWXG | S_IRWXO))
	{
		snprintf(err, errlen, "%s: holds credentials but its group or others may access it "
							  "(mode %04o); refused: chmod 600 %s",
				 path, (unsigned) (st.st_mode & 07777), path);
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
