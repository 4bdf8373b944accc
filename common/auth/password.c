/*
 * password.c: see password.h.
 */
#include "auth/password.h"

#include <stdlib.h>
#include <string.h>

#include <argon2.h>
#include <openssl/rand.h>

#include "base/xalloc.h"

char *
password_hash(const char *password)
{
	unsigned char salt[PASSWORD_SALT_BYTES];
	size_t		  len = argon2_encodedlen(PASSWORD_T_COST, PASSWORD_M_COST, PASSWORD_PARALLELISM,
										  PASSWORD_SALT_BYTES, PASSWORD_HASH_BYTES, Argon2_id);
	char		 *encoded = xmalloc(len);

	if (RAND_bytes(salt, sizeof(salt)) != 1
		|| argon2id_hash_encoded(PASSWORD_T_COST, PASSWORD_M_COST, PASSWORD_PARALLELISM, password,
								 strlen(password), salt, sizeof(salt), PASSWORD_HASH_BYTES, encoded,
								 len)
			   != ARGON2_OK)
	{
		free(encoded);
		return NULL;
	}
	return encoded;
}

bool
password_verify(const char *encoded, const char *password)
{
	return argon2id_verify(encoded, password, strlen(password)) == ARGON2_OK;
}
