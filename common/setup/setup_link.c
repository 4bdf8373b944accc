/*
 * setup_link.c: see setup_link.h.  The file, one "name value" a line:
 *
 *   digest <SHA-256 of the token, hex>
 *   expires <Unix time>
 *   as_root yes|no
 *   root <the rest of the line; empty for />
 */
#include "setup/setup_link.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include "base/buf.h"
#include "base/xalloc.h"

#define SETUP_LINK_FILE_MAX 8192

void
setup_link_hex(const unsigned char *in, size_t len, char *out)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < len; i++)
	{
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 15];
	}
	out[2 * len] = '\0';
}

static void
setup_link_digest(const char *token, char out[2 * SHA256_DIGEST_LENGTH + 1])
{
	unsigned char digest[SHA256_DIGEST_LENGTH];

	SHA256((const unsigned char *) token, strlen(token), digest);
	setup_link_hex(digest, sizeof(digest), out);
}

bool
setup_link_create(const char *path, const char *root, bool as_root, long lifetime_s, uid_t uid, gid_t gid,
				  char token[SETUP_LINK_TOKEN_LEN + 1], char *err, size_t errlen)
{
	unsigned char random[SETUP_LINK_TOKEN_LEN / 2];
	char		  digest[2 * SHA256_DIGEST_LENGTH + 1];
	char		 *dir = xstrdup(path);
	char		 *slash = strrchr(dir, '/');
	char		 *tmp = xasprintf("%s.new", path);
	char		 *content;
	int			  fd;
	bool		  ok = false;

	if (strchr(root, '\n'))
	{
		snprintf(err, errlen, "--root holds a newline");
		goto out;
	}
	if (RAND_bytes(random, sizeof(random)) != 1)
	{
		snprintf(err, errlen, "no randomness for the token");
		goto out;
	}
	setup_link_hex(random, sizeof(random), token);
	explicit_bzero(random, sizeof(random));
	setup_link_digest(token, digest);
	if (slash && slash != dir)
	{
		*slash = '\0';
		if (mkdir(dir, 0700) == 0)
		{
			if (uid != (uid_t) -1 && chown(dir, uid, gid) != 0)
			{
				snprintf(err, errlen, "chown %s: %s", dir, strerror(errno));
				goto out;
			}
		}
		else if (errno != EEXIST)
		{
			snprintf(err, errlen, "mkdir %s: %s", dir, strerror(errno));
			goto out;
		}
	}
	content = xasprintf("digest %s\nexpires %lld\nas_root %s\nroot %s\n", digest,
						(long long) time(NULL) + lifetime_s, as_root ? "yes" : "no", root);
	unlink(tmp);
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 || !fd_write_all(fd, content, strlen(content))
		|| (uid != (uid_t) -1 && fchown(fd, uid, gid) != 0) || fsync(fd) != 0)
		snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
	else if (rename(tmp, path) != 0)
		snprintf(err, errlen, "rename %s to %s: %s", tmp, path, strerror(errno));
	else
		ok = true;
	if (fd >= 0)
		close(fd);
	if (!ok)
		unlink(tmp);
	free(content);
out:
	free(tmp);
	free(dir);
	return ok;
}

enum setup_link_result
setup_link_take(const char *path, const char *token, char **root, bool *as_root, char *err, size_t errlen)
{
	struct buf			   content = BUF_INIT;
	char				   digest[2 * SHA256_DIGEST_LENGTH + 1];
	const char			  *want = NULL;
	long long			   expires = 0;
	char				  *line;
	char				  *next;
	int					   fd;
	enum setup_link_result result = SETUP_LINK_INVALID;

	*root = NULL;
	*as_root = false;
	if ((fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) < 0)
	{
		if (errno == ENOENT)
			return SETUP_LINK_INVALID;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return SETUP_LINK_ERROR;
	}
	{
		FILE *f = fdopen(fd, "r");
		bool  read_ok = f && buf_append_stream(&content, f, path, SETUP_LINK_FILE_MAX, err, errlen);

		if (f)
			fclose(f);
		else
			close(fd);
		if (!read_ok)
		{
			buf_free(&content);
			return SETUP_LINK_ERROR;
		}
	}
	buf_append(&content, "", 1);
	for (line = content.data; line && *line; line = next)
	{
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		if (strncmp(line, "digest ", 7) == 0)
			want = line + 7;
		else if (strncmp(line, "expires ", 8) == 0)
			expires = strtoll(line + 8, NULL, 10);
		else if (strncmp(line, "as_root ", 8) == 0)
			*as_root = strcmp(line + 8, "yes") == 0;
		else if (strncmp(line, "root ", 5) == 0)
		{
			free(*root);
			*root = xstrdup(line + 5);
		}
	}
	setup_link_digest(token, digest);
	if (want == NULL || strlen(want) != strlen(digest) || strlen(token) != SETUP_LINK_TOKEN_LEN
		|| CRYPTO_memcmp(want, digest, strlen(digest)) != 0)
		result = SETUP_LINK_INVALID;
	else if (expires <= (long long) time(NULL))
		result = SETUP_LINK_EXPIRED;
	else if (unlink(path) != 0)
	{
		int error = errno;

		/* Not deleted, it would work again: refused. */
		snprintf(err, errlen, "cannot delete %s (%s), so the link would work twice", path, strerror(error));
		result = error == ENOENT ? SETUP_LINK_INVALID : SETUP_LINK_ERROR;
	}
	else
		result = SETUP_LINK_TAKEN;
	buf_free(&content);
	if (result != SETUP_LINK_TAKEN)
	{
		free(*root);
		*root = NULL;
	}
	else if (*root == NULL)
		*root = xstrdup("");
	return result;
}
