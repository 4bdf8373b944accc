/* auth.c: see auth.h. */
#include "auth.h"

#include <crypt.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "process/secret.h"

/* The longest password checked (octets); longer ones fail unhashed. */
#define AUTH_PASSWORD_MAX 256

/* Checked against when the user is unknown, so the answer takes as long. */
#define AUTH_DUMMY_HASH "$6$pepsi.dummy$GnzSbzW.rWT/ECvclBSrv.sFBsnys1bpf/31uwlJ9JXIZObncn/jOa79J6JM8Me2Z4GnaPdUoYauOA.2tZ0KD/"

struct credential
{
	char *user;
	char *hash;
};

struct credentials
{
	struct credential *entries;
	size_t			   count;
};

/* Names go into Authentication-Results as smtp.auth=: keep them tokens. */
static bool
credentials_user_valid(const char *user)
{
	if (*user == '\0' || strlen(user) > 255)
		return false;
	for (const char *p = user; *p; p++)
		if (!isalnum((unsigned char) *p) && !strchr("._@+-", *p))
			return false;
	return true;
}

struct credentials *
credentials_load(const char *path, char *err, size_t errlen)
{
	FILE			   *f = secret_file_open(path, err, errlen);
	struct credentials *c = NULL;
	char				line[4096];
	int					lineno = 0;

	if (f == NULL)
		return NULL;
	c = xcalloc(1, sizeof(*c));
	while (fgets(line, sizeof(line), f))
	{
		char  *colon;
		size_t len = strlen(line);

		lineno++;
		while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = '\0';
		if (len == 0 || line[0] == '#')
			continue;
		colon = strchr(line, ':');
		if (colon == NULL || colon[1] != '$')
		{
			snprintf(err, errlen, "%s:%d: expected user:$id$salt$hash", path, lineno);
			goto err;
		}
		*colon = '\0';
		if (!credentials_user_valid(line))
		{
			snprintf(err, errlen, "%s:%d: a user name is letters, digits and ._@+- only",
					 path, lineno);
			goto err;
		}
		c->entries = xrealloc(c->entries, (c->count + 1) * sizeof(*c->entries));
		c->entries[c->count].user = xstrdup(line);
		c->entries[c->count].hash = xstrdup(colon + 1);
		c->count++;
	}
	explicit_bzero(line, sizeof(line));
	fclose(f);
	return c;

err:
	explicit_bzero(line, sizeof(line));
	fclose(f);
	credentials_free(c);
	return NULL;
}

char *
credentials_hash_for(const struct credentials *c, const char *user, bool *known)
{
	*known = false;
	for (size_t i = 0; c && i < c->count; i++)
		if (strcmp(c->entries[i].user, user) == 0)
		{
			*known = true;
			return xstrdup(c->entries[i].hash);
		}
	return xstrdup(AUTH_DUMMY_HASH);
}

bool
credentials_verify(const char *hash, const char *password)
{
	struct crypt_data *data;
	const char		  *result;
	unsigned char	   diff = 0;
	size_t			   len = strlen(hash);
	bool			   ok = false;

	/* SHA-crypt's work grows with the password's length: a long one fails unhashed. */
	if (strlen(password) > AUTH_PASSWORD_MAX)
		return false;
	data = xcalloc(1, sizeof(*data)); /* some 32 KB: not for a thread's stack */
	result = crypt_r(password, hash, data);
	if (result != NULL && result[0] != '*' && strlen(result) == len)
	{
		for (size_t i = 0; i < len; i++)
			diff |= (unsigned char) (result[i] ^ hash[i]);
		ok = diff == 0;
	}
	explicit_bzero(data, sizeof(*data));
	free(data);
	return ok;
}

bool
credentials_check(const struct credentials *c, const char *user, const char *password)
{
	bool  known;
	char *hash = credentials_hash_for(c, user, &known);
	bool  ok = credentials_verify(hash, password) && known;

	explicit_bzero(hash, strlen(hash));
	free(hash);
	return ok;
}

void
credentials_free(struct credentials *c)
{
	if (c == NULL)
		return;
	for (size_t i = 0; i < c->count; i++)
	{
		free(c->entries[i].user);
		explicit_bzero(c->entries[i].hash, strlen(c->entries[i].hash));
		free(c->entries[i].hash);
	}
	free(c->entries);
	free(c);
}
