/*
 * apply.c: the applier of setup tasks, as root.  Each kind makes one thing
 * true and says whether it changed anything, so that running a plan twice
 * changes nothing the second time.  Files are written whole or not at all
 * (a temporary file beside them, renamed over), with their owner and mode
 * set before the rename.  pepsi-setup apply takes its tasks from
 * pepsi.setup_task, refusing a row not written by a member of pepsi_config
 * or of a kind or parameters this applier does not accept, and logs every
 * outcome in pepsi.setup_task_log.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>

#include "auth/keys.h"
#include "auth/password.h"
#include "base/base64.h"
#include "base/buf.h"
#include "base/xalloc.h"
#include "process/secret.h"
#include "setup.h"
#include "setup/setup_model.h"

extern char **environ;

/* The most rows one apply takes, so that a writer that never stops cannot keep it running. */
#define SETUP_DRAIN_MAX 1000

void
setup_say(struct setup_ctx *ctx, const char *fmt, ...)
{
	char	line[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	printf("  %s\n", line);
	fflush(stdout);
	if (ctx->task_id > 0 && ctx->db)
	{
		char		id[32];
		const char *values[2] = {id, line};
		PGresult   *res;

		snprintf(id, sizeof(id), "%lld", ctx->task_id);
		res = PQexecParams(ctx->db, "INSERT INTO pepsi.setup_task_log (task_id, line) VALUES ($1, $2)", 2, NULL,
						   values, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_COMMAND_OK)
			fprintf(stderr, "pepsi-setup: cannot log: %s", PQerrorMessage(ctx->db));
		PQclear(res);
	}
}

const char *
setup_param(const json_t *params, const char *name)
{
	return json_string_value(json_object_get(params, name));
}

/* The owner of what a task writes: root and group (as root), else the invoking account. */
static bool
setup_owner(struct setup_ctx *ctx, const char *user, const char *group, uid_t *uid, gid_t *gid)
{
	*uid = geteuid();
	*gid = getegid();
	if (!ctx->as_root)
		return true;
	if (user)
	{
		struct passwd *pw = getpwnam(user);

		if (pw == NULL)
		{
			setup_say(ctx, "failed: there is no user %s (adduser --system --group %s)", user, user);
			return false;
		}
		*uid = pw->pw_uid;
		*gid = pw->pw_gid;
	}
	if (group)
	{
		struct group *gr = getgrnam(group);

		if (gr == NULL)
		{
			setup_say(ctx, "failed: there is no group %s (addgroup --system %s)", group, group);
			return false;
		}
		*gid = gr->gr_gid;
	}
	return true;
}

/* mkdir -p of path's parent directories, mode 0755. */
static bool
setup_make_parents(struct setup_ctx *ctx, const char *path)
{
	char *copy = xstrdup(path);

	for (char *p = copy + 1; *p; p++)
		if (*p == '/')
		{
			*p = '\0';
			if (mkdir(copy, 0755) != 0 && errno != EEXIST)
			{
				setup_say(ctx, "failed: cannot make %s: %s", copy, strerror(errno));
				free(copy);
				return false;
			}
			*p = '/';
		}
	free(copy);
	return true;
}

/* Does path already hold content, with this mode and owner? */
static bool
setup_file_is(const char *path, const char *content, mode_t mode, uid_t uid, gid_t gid)
{
	struct stat st;
	struct buf	b = BUF_INIT;
	char		err[256];
	bool		same;

	if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 07777) != mode || st.st_uid != uid
		|| st.st_gid != gid)
		return false;
	same = buf_append_file(&b, path, 1 << 20, err, sizeof(err)) && b.len == strlen(content)
		   && memcmp(b.data, content, b.len) == 0;
	if (b.data)
		explicit_bzero(b.data, b.len);
	buf_free(&b);
	return same;
}

/* Write path whole (a temporary file renamed over it), unless it already is so. */
enum setup_outcome
setup_write_file(struct setup_ctx *ctx, const char *path, const char *content, mode_t mode, uid_t uid,
				 gid_t gid)
{
	char *tmp;
	int	  fd;

	if (setup_file_is(path, content, mode, uid, gid))
	{
		setup_say(ctx, "%s: unchanged", path);
		return SETUP_UNCHANGED;
	}
	if (!setup_make_parents(ctx, path))
		return SETUP_FAILED;
	tmp = xasprintf("%s.pepsi-setup.%ld", path, (long) getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 || !fd_write_all(fd, content, strlen(content)) || (ctx->as_root && fchown(fd, uid, gid) != 0)
		|| fchmod(fd, mode) != 0 || fsync(fd) != 0 || close(fd) != 0 || rename(tmp, path) != 0)
	{
		setup_say(ctx, "failed: cannot write %s: %s", path, strerror(errno));
		if (fd >= 0)
			unlink(tmp);
		free(tmp);
		return SETUP_FAILED;
	}
	free(tmp);
	setup_say(ctx, "%s: written (mode %04o)", path, (unsigned) mode);
	return SETUP_DONE;
}

static char *
setup_path(struct setup_ctx *ctx, const char *relative)
{
	return xasprintf("%s/etc/pepsi/%s", ctx->root, relative);
}

/*
 * A drop-in of pepsi.conf.d, root's, mode 0644.  pepsi.conf itself is the
 * package's conffile and is never rewritten: it is made (a comment) only
 * when there is none, since the drop-ins are read beside it.
 */
static enum setup_outcome
setup_dropin(struct setup_ctx *ctx, const char *name, const char *content)
{
	char			  *conf = setup_path(ctx, "pepsi.conf");
	char			  *relative = xasprintf("pepsi.conf.d/%s", name);
	char			  *path = setup_path(ctx, relative);
	uid_t			   uid = ctx->as_root ? 0 : geteuid();
	gid_t			   gid = ctx->as_root ? 0 : getegid();
	enum setup_outcome outcome = SETUP_UNCHANGED;

	if (access(conf, F_OK) != 0)
		outcome = setup_write_file(ctx, conf,
								   "# Pepsi's configuration: pepsi-setup writes its settings in pepsi.conf.d/,\n"
								   "# read after this file; pepsi.conf(5) says what may be set here.\n",
								   0644, uid, gid);
	if (outcome != SETUP_FAILED)
	{
		enum setup_outcome written = setup_write_file(ctx, path, content, 0644, uid, gid);

		outcome = written == SETUP_UNCHANGED ? outcome : written;
	}
	free(conf);
	free(relative);
	free(path);
	return outcome;
}

static enum setup_outcome
setup_config_file(struct setup_ctx *ctx, const json_t *params)
{
	const char *name = setup_param(params, "name");

	return setup_dropin(ctx, name + strlen("pepsi.conf.d/"), setup_param(params, "content"));
}

/* A secrets.d fragment: root's (or ours), readable by the one group, mode 0640. */
static enum setup_outcome
setup_fragment(struct setup_ctx *ctx, const char *name, const char *group, const char *content)
{
	char			  *relative = xasprintf("secrets.d/%s.conf", name);
	char			  *path = setup_path(ctx, relative);
	uid_t			   uid;
	gid_t			   gid;
	enum setup_outcome outcome = SETUP_FAILED;

	if (setup_owner(ctx, NULL, group, &uid, &gid))
		outcome = setup_write_file(ctx, path, content, 0640, ctx->as_root ? 0 : uid, gid);
	free(relative);
	free(path);
	return outcome;
}

static enum setup_outcome
setup_secret(struct setup_ctx *ctx, const json_t *params)
{
	char			  *content = xasprintf("[%s]\n%s = %s\n", setup_param(params, "section"),
										   setup_param(params, "option"), setup_param(params, "value"));
	enum setup_outcome outcome = setup_fragment(ctx, setup_param(params, "name"), setup_param(params, "group"),
												content);

	explicit_bzero(content, strlen(content));
	free(content);
	return outcome;
}

/* The SRS secret is made once: an existing fragment is kept (rewritten mail must still reverse). */
static enum setup_outcome
setup_srs_secret(struct setup_ctx *ctx, const json_t *params)
{
	char			  *path = setup_path(ctx, "secrets.d/srs.conf");
	unsigned char	   random[32];
	struct buf		   secret = BUF_INIT;
	char			  *content;
	enum setup_outcome outcome;

	if (access(path, F_OK) == 0)
	{
		setup_say(ctx, "%s: kept (the SRS secret is made once)", path);
		free(path);
		return SETUP_UNCHANGED;
	}
	free(path);
	if (RAND_bytes(random, sizeof(random)) != 1)
	{
		setup_say(ctx, "failed: no random bytes for the SRS secret");
		return SETUP_FAILED;
	}
	base64_append(&secret, random, sizeof(random));
	explicit_bzero(random, sizeof(random));
	content = xasprintf("[srs]\nSECRET = %s\n", secret.data);
	explicit_bzero(secret.data, secret.len);
	buf_free(&secret);
	outcome = setup_fragment(ctx, "srs", setup_param(params, "group"), content);
	explicit_bzero(content, strlen(content));
	free(content);
	return outcome;
}

/* A DKIM key is made once, with pepsi-keys' code, and its record printed. */
static enum setup_outcome
setup_dkim_key(struct setup_ctx *ctx, const json_t *params)
{
	struct setup_layout layout = {ctx->root, ctx->as_root};
	enum sign_algorithm algorithm;
	const char		   *name = setup_param(params, "algorithm");
	char			   *path = setup_dkim_key_path(&layout, setup_param(params, "domain"), setup_param(params, "selector"));
	char				err[512];
	EVP_PKEY		   *pkey;
	uid_t				uid;
	gid_t				gid;
	enum setup_outcome	outcome = SETUP_DONE;

	sign_algorithm_parse(name, strlen(name), &algorithm);
	if (!setup_owner(ctx, setup_param(params, "owner"), NULL, &uid, &gid))
		goto failed;
	if (access(path, F_OK) == 0)
	{
		if ((pkey = keys_load_private(path, algorithm, err, sizeof(err))) == NULL)
		{
			setup_say(ctx, "failed: %s", err);
			goto failed;
		}
		setup_say(ctx, "%s: kept (a key is made once)", path);
		outcome = SETUP_UNCHANGED;
	}
	else
	{
		if (!setup_make_parents(ctx, path))
			goto failed;
		pkey = keys_generate(algorithm, KEYS_RSA_MIN_BITS);
		if (pkey == NULL || !keys_write_private(path, pkey, err, sizeof(err))
			|| (ctx->as_root && chown(path, uid, gid) != 0))
		{
			setup_say(ctx, "failed: %s", pkey ? err : "key generation failed");
			EVP_PKEY_free(pkey);
			goto failed;
		}
		setup_say(ctx, "%s: made (%s)", path, name);
	}
	{
		struct buf record = BUF_INIT;

		keys_public_record(pkey, algorithm, &record);
		setup_say(ctx, "publish: %s._domainkey.%s TXT \"%s\"", setup_param(params, "selector"),
				  setup_param(params, "domain"), record.data);
		buf_free(&record);
	}
	EVP_PKEY_free(pkey);
	free(path);
	return outcome;
failed:
	free(path);
	return SETUP_FAILED;
}

/* A query of the owner's connection; false (said) when it fails. */
PGresult *
setup_query(struct setup_ctx *ctx, const char *sql, int n, const char *const *values)
{
	PGresult *res = PQexecParams(ctx->db, sql, n, NULL, values, NULL, NULL, 0);

	if (PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK)
		return res;
	setup_say(ctx, "failed: %s", PQresultErrorMessage(res));
	PQclear(res);
	return NULL;
}

static enum setup_outcome
setup_database_role(struct setup_ctx *ctx, const json_t *params)
{
	const char *values[2] = {setup_param(params, "name"), setup_param(params, "member_of")};
	PGresult   *res = setup_query(ctx,
								  "SELECT r.rolcanlogin, pg_has_role(r.rolname, $2, 'MEMBER') "
									"FROM pg_roles r WHERE r.rolname = $1",
								  2, values);
	bool		exists;
	bool		member;
	char	   *role;
	char	   *group;
	char	   *sql;

	if (res == NULL)
		return SETUP_FAILED;
	exists = PQntuples(res) == 1;
	member = exists && strcmp(PQgetvalue(res, 0, 1), "t") == 0 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	if (member)
	{
		setup_say(ctx, "role %s: a member of %s already", values[0], values[1]);
		return SETUP_UNCHANGED;
	}
	role = PQescapeIdentifier(ctx->db, values[0], strlen(values[0]));
	group = PQescapeIdentifier(ctx->db, values[1], strlen(values[1]));
	sql = xasprintf("%s ROLE %s LOGIN; GRANT %s TO %s", exists ? "ALTER" : "CREATE", role, group, role);
	res = PQexec(ctx->db, sql);
	free(sql);
	PQfreemem(role);
	PQfreemem(group);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		setup_say(ctx, "failed: %s", PQresultErrorMessage(res));
		PQclear(res);
		return SETUP_FAILED;
	}
	PQclear(res);
	setup_say(ctx, "role %s: %s, a member of %s", values[0], exists ? "may log in" : "created", values[1]);
	return SETUP_DONE;
}

/* The differences grant_verify() reports; -1 when it cannot be asked. */
static int
setup_grant_drift(struct setup_ctx *ctx, bool say)
{
	PGresult *res = setup_query(ctx,
								"SELECT coalesce(grantee, 'the owner'), object, privilege, expected, actual "
								"FROM pepsi.grant_verify()",
								0, NULL);
	int		  n;

	if (res == NULL)
		return -1;
	n = PQntuples(res);
	for (int i = 0; say && i < n; i++)
		setup_say(ctx, "drift: %s %s %s on %s", PQgetvalue(res, i, 0),
				  strcmp(PQgetvalue(res, i, 4), "t") == 0 ? "has" : "lacks", PQgetvalue(res, i, 2),
				  PQgetvalue(res, i, 1));
	PQclear(res);
	return n;
}

enum setup_outcome
setup_grants(struct setup_ctx *ctx)
{
	int		  before = setup_grant_drift(ctx, true);
	int		  after;
	PGresult *res;

	if (before < 0)
		return SETUP_FAILED;
	if ((res = setup_query(ctx, "SELECT pepsi.grant_apply()", 0, NULL)) == NULL)
		return SETUP_FAILED;
	PQclear(res);
	after = setup_grant_drift(ctx, true);
	if (after != 0)
	{
		setup_say(ctx, "failed: the grants still differ from the policy in %d place%s", after, after == 1 ? "" : "s");
		return SETUP_FAILED;
	}
	if (before == 0)
	{
		setup_say(ctx, "grants: as the policy says");
		return SETUP_UNCHANGED;
	}
	setup_say(ctx, "grants: %d difference%s from the policy undone, verified", before, before == 1 ? "" : "s");
	return SETUP_DONE;
}

/* systemctl reload of a daemon; under --root nothing runs. */
static enum setup_outcome
setup_reload(struct setup_ctx *ctx, const json_t *params)
{
	char *unit = xasprintf("pepsi-%s.service", setup_param(params, "service"));
	char *argv[] = {"systemctl", "try-reload-or-restart", unit, NULL};
	pid_t pid;
	int	  status = 0;

	if (ctx->root[0])
	{
		setup_say(ctx, "%s: not reloaded (--root)", unit);
		free(unit);
		return SETUP_UNCHANGED;
	}
	if (posix_spawnp(&pid, "systemctl", NULL, NULL, argv, environ) != 0 || waitpid(pid, &status, 0) < 0
		|| !WIFEXITED(status) || WEXITSTATUS(status) != 0)
	{
		setup_say(ctx, "failed: systemctl try-reload-or-restart %s did not succeed", unit);
		free(unit);
		return SETUP_FAILED;
	}
	setup_say(ctx, "%s: reloaded", unit);
	free(unit);
	return SETUP_DONE;
}

/* Why a certificate and key may not be installed for host, or NULL (*cert and *key read). */
static const char *
setup_certificate_refusal(const json_t *params, X509 **cert, EVP_PKEY **key, char *why, size_t whylen)
{
	const char *host = setup_param(params, "host");
	FILE	   *f;

	if ((f = fopen(setup_param(params, "certificate"), "r")) != NULL)
	{
		*cert = PEM_read_X509(f, NULL, NULL, NULL);
		fclose(f);
	}
	if ((f = fopen(setup_param(params, "key"), "r")) != NULL)
	{
		*key = PEM_read_PrivateKey(f, NULL, NULL, NULL);
		fclose(f);
	}
	if (*cert == NULL)
		snprintf(why, whylen, "%s is not a readable PEM certificate", setup_param(params, "certificate"));
	else if (*key == NULL)
		snprintf(why, whylen, "%s is not a readable PEM private key", setup_param(params, "key"));
	else if (X509_check_private_key(*cert, *key) != 1)
		snprintf(why, whylen, "the key %s is not the certificate's", setup_param(params, "key"));
	else if (X509_check_host(*cert, host, strlen(host), 0, NULL) != 1)
		snprintf(why, whylen, "the certificate %s is not for %s", setup_param(params, "certificate"), host);
	else if (X509_cmp_current_time(X509_get0_notAfter(*cert)) <= 0)
		snprintf(why, whylen, "the certificate %s has expired", setup_param(params, "certificate"));
	else
		return NULL;
	return why;
}

/*
 * A given certificate and key for the host, checked (the key is the
 * certificate's, the certificate names the host and has not expired) and
 * installed as tls/fullchain.pem and tls/privkey.pem, the key readable by
 * the group that runs ingress (which reads them again on a reload, after
 * it dropped root), and [listener-smtp] pointed at them by the drop-in
 * pepsi.conf.d/certificate.conf.
 * pepsi-setup certificate obtains one with certbot first (certificate.c).
 */
static enum setup_outcome
setup_certificate(struct setup_ctx *ctx, const json_t *params)
{
	X509			  *cert = NULL;
	EVP_PKEY		  *key = NULL;
	char			   why[1024];
	struct buf		   chain = BUF_INIT;
	struct buf		   secret = BUF_INIT;
	char			  *chain_path = setup_path(ctx, "tls/fullchain.pem");
	char			  *key_path = setup_path(ctx, "tls/privkey.pem");
	uid_t			   uid;
	gid_t			   gid;
	enum setup_outcome outcome = SETUP_FAILED;

	if (setup_certificate_refusal(params, &cert, &key, why, sizeof(why)))
		setup_say(ctx, "failed: %s", why);
	else if (!buf_append_file(&chain, setup_param(params, "certificate"), 1 << 20, why, sizeof(why))
			 || !buf_append_file(&secret, setup_param(params, "key"), 1 << 20, why, sizeof(why)))
		setup_say(ctx, "failed: %s", why);
	else if (setup_owner(ctx, NULL, setup_param(params, "group"), &uid, &gid))
	{
		char			  *dropin = xasprintf("# Written by pepsi-setup certificate.\n[listener-smtp]\n"
														   "CERTIFICATE = %s\nKEY = %s\n",
											  chain_path, key_path);
		enum setup_outcome first;
		enum setup_outcome second;
		enum setup_outcome third;

		buf_append_char(&chain, '\0');
		buf_append_char(&secret, '\0');
		first = setup_write_file(ctx, chain_path, chain.data, 0644, ctx->as_root ? 0 : uid, ctx->as_root ? 0 : gid);
		second = first == SETUP_FAILED ? SETUP_FAILED
									   : setup_write_file(ctx, key_path, secret.data, 0640, ctx->as_root ? 0 : uid, gid);
		third = second == SETUP_FAILED ? SETUP_FAILED : setup_dropin(ctx, "certificate.conf", dropin);
		free(dropin);

		if (first == SETUP_FAILED || second == SETUP_FAILED || third == SETUP_FAILED)
			outcome = SETUP_FAILED;
		else
			outcome = first == SETUP_DONE || second == SETUP_DONE || third == SETUP_DONE ? SETUP_DONE
																						 : SETUP_UNCHANGED;
	}
	if (secret.data)
		explicit_bzero(secret.data, secret.len);
	buf_free(&secret);
	buf_free(&chain);
	X509_free(cert);
	EVP_PKEY_free(key);
	free(chain_path);
	free(key_path);
	return outcome;
}

/* The first line of a password file, root's alone (secret_file_open); NULL (said) when it is not one. */
static char *
setup_password_read(struct setup_ctx *ctx, const char *path)
{
	char	err[512];
	FILE   *f = secret_file_open(path, err, sizeof(err));
	char   *line = NULL;
	size_t	capacity = 0;
	ssize_t n;

	if (f == NULL)
	{
		setup_say(ctx, "failed: %s", err);
		return NULL;
	}
	n = getline(&line, &capacity, f);
	fclose(f);
	if (n > 0)
		line[strcspn(line, "\r\n")] = '\0';
	if (n <= 0 || strlen(line) < 8 || strlen(line) > 256)
	{
		setup_say(ctx, "failed: %s: the password on its first line must have 8 to 256 characters", path);
		if (line)
			explicit_bzero(line, capacity);
		free(line);
		return NULL;
	}
	return line;
}

/* A new password, written to path (root's alone, mode 0600): 24 characters of 144 random bits. */
static enum setup_outcome
setup_password_make(struct setup_ctx *ctx, const char *path)
{
	unsigned char	   random[18];
	struct buf		   password = BUF_INIT;
	enum setup_outcome outcome;

	if (RAND_bytes(random, sizeof(random)) != 1)
	{
		setup_say(ctx, "failed: no random bytes for the password");
		return SETUP_FAILED;
	}
	base64_append(&password, random, sizeof(random));
	explicit_bzero(random, sizeof(random));
	for (size_t i = 0; i < password.len; i++)
		if (password.data[i] == '/' || password.data[i] == '+')
			password.data[i] = password.data[i] == '/' ? '_' : '-';
	buf_append_char(&password, '\n');
	buf_append_char(&password, '\0');
	outcome = setup_write_file(ctx, path, password.data, 0600, ctx->as_root ? 0 : geteuid(),
							   ctx->as_root ? 0 : getegid());
	explicit_bzero(password.data, password.len);
	buf_free(&password);
	return outcome;
}

/*
 * A pepsi-httpd administrator (pepsi.admin_account_set, as pepsi-httpd
 * passwd), its password the first line of password_file, or of
 * /etc/pepsi/admin/NAME.password, made with a new random password when it
 * does not exist.  The password never is a parameter: a task row is
 * readable by the configuration role.  Unchanged when the account's hash
 * already verifies the password and its role is the one asked; to reset
 * a password, change the file (or remove the made one) and apply again.
 */
static enum setup_outcome
setup_admin_account(struct setup_ctx *ctx, const json_t *params)
{
	const char		  *name = setup_param(params, "name");
	const char		  *role = setup_param(params, "role");
	char			  *relative = xasprintf("admin/%s.password", name);
	char			  *path = setup_param(params, "password_file") ? xstrdup(setup_param(params, "password_file"))
																   : setup_path(ctx, relative);
	char			  *password = NULL;
	char			  *hash = NULL;
	const char		  *values[3] = {name, NULL, role};
	PGresult		  *res;
	bool			   exists = false;
	enum setup_outcome outcome = SETUP_FAILED;

	free(relative);
	if (setup_param(params, "password_file") == NULL && access(path, F_OK) != 0)
	{
		if (setup_password_make(ctx, path) == SETUP_FAILED)
			goto out;
		setup_say(ctx, "the password of %s is in %s (root's alone)", name, path);
	}
	if ((password = setup_password_read(ctx, path)) == NULL)
		goto out;
	if ((res = setup_query(ctx, "SELECT password_hash, role, disabled FROM pepsi.admin_account WHERE name = $1", 1,
						   values))
		== NULL)
		goto out;
	exists = PQntuples(res) == 1;
	if (exists && strcmp(PQgetvalue(res, 0, 2), "f") == 0 && password_verify(PQgetvalue(res, 0, 0), password)
		&& (role == NULL || strcmp(PQgetvalue(res, 0, 1), role) == 0))
	{
		PQclear(res);
		setup_say(ctx, "administrator %s: as %s says already", name, path);
		outcome = SETUP_UNCHANGED;
		goto out;
	}
	PQclear(res);
	if ((hash = password_hash(password)) == NULL)
	{
		setup_say(ctx, "failed: Argon2id hashing failed");
		goto out;
	}
	values[1] = hash;
	res = setup_query(ctx,
					  role ? "SELECT pepsi.admin_account_set($1, $2, $3)" : "SELECT pepsi.admin_account_set($1, $2)",
					  role ? 3 : 2, values);
	if (res == NULL)
		goto out;
	PQclear(res);
	setup_say(ctx, "administrator %s: %s%s%s, its password from %s", name, exists ? "password set" : "created",
			  role ? ", role " : "", role ? role : "", path);
	outcome = SETUP_DONE;
out:
	if (password)
		explicit_bzero(password, strlen(password));
	free(password);
	free(hash);
	free(path);
	return outcome;
}

enum setup_outcome
setup_apply_task(struct setup_ctx *ctx, enum setup_kind kind, const json_t *params)
{
	switch (kind)
	{
		case SETUP_CONFIG_FILE:
			return setup_config_file(ctx, params);
		case SETUP_SECRET:
			return setup_secret(ctx, params);
		case SETUP_DATABASE_ROLE:
			return setup_database_role(ctx, params);
		case SETUP_GRANT_POLICY:
			return setup_grants(ctx);
		case SETUP_PG_HBA_LINE:
			return setup_pg_hba_line(ctx, params);
		case SETUP_DKIM_KEY:
			return setup_dkim_key(ctx, params);
		case SETUP_SRS_SECRET:
			return setup_srs_secret(ctx, params);
		case SETUP_RELOAD:
			return setup_reload(ctx, params);
		case SETUP_DNS_CHECK:
			{
				char				*path = setup_path(ctx, "pepsi.conf");
				char				 err[1024];
				struct pepsi_config *cfg = config_load(path, err, sizeof(err));
				int					 rc;

				free(path);
				if (cfg == NULL)
				{
					setup_say(ctx, "failed: %s", err);
					return SETUP_FAILED;
				}
				rc = setup_dns_check(cfg, setup_param(params, "domain"), ctx);
				config_free(cfg);
				return rc == 0 ? SETUP_PRINTED : SETUP_FAILED;
			}
		case SETUP_CERTIFICATE:
			return setup_certificate(ctx, params);
		case SETUP_ADMIN_ACCOUNT:
			return setup_admin_account(ctx, params);
		case SETUP_KIND_COUNT:
			break;
	}
	return SETUP_FAILED;
}

static const char *
setup_outcome_status(enum setup_outcome outcome)
{
	switch (outcome)
	{
		case SETUP_DONE:
		case SETUP_PRINTED:
			return "done";
		case SETUP_UNCHANGED:
			return "unchanged";
		case SETUP_FAILED:
			break;
	}
	return "failed";
}

/* End a task's row: its status, and when. */
static bool
setup_finish_row(struct setup_ctx *ctx, const char *id, const char *status)
{
	const char *values[2] = {id, status};
	PGresult   *res = setup_query(ctx, "UPDATE pepsi.setup_task SET status = $2, finished_at = now() WHERE id = $1", 2,
								  values);

	if (res == NULL)
		return false;
	PQclear(res);
	res = PQexec(ctx->db, "COMMIT");
	PQclear(res);
	return true;
}

/* Take and apply the oldest pending row; 0 none left, 1 one done, -1 the database failed. */
static int
setup_drain_one(struct setup_ctx *ctx, int *failures)
{
	PGresult		  *res;
	char			   id[32];
	char			   kind_name[64];
	enum setup_kind	   kind;
	json_t			  *params;
	json_error_t	   error;
	char			   why[1024];
	bool			   trusted;
	enum setup_outcome outcome;

	PQclear(PQexec(ctx->db, "BEGIN"));
	res = setup_query(ctx,
					  "SELECT t.id, t.kind, t.params::text, t.written_by, "
					  "       coalesce((SELECT NOT r.rolsuper AND pg_has_role(r.oid, 'pepsi_config', 'MEMBER') "
					  "                 FROM pg_roles r WHERE r.rolname = t.written_by), false) "
					  "FROM pepsi.setup_task t WHERE t.status = 'pending' ORDER BY t.id LIMIT 1 "
					  "FOR UPDATE SKIP LOCKED",
					  0, NULL);
	if (res == NULL)
		return -1;
	if (PQntuples(res) == 0)
	{
		PQclear(res);
		PQclear(PQexec(ctx->db, "COMMIT"));
		return 0;
	}
	snprintf(id, sizeof(id), "%s", PQgetvalue(res, 0, 0));
	snprintf(kind_name, sizeof(kind_name), "%s", PQgetvalue(res, 0, 1));
	trusted = strcmp(PQgetvalue(res, 0, 4), "t") == 0;
	ctx->task_id = strtoll(id, NULL, 10);
	printf("task %s (%s, written by %s):\n", id, kind_name, PQgetvalue(res, 0, 3));
	params = json_loads(PQgetvalue(res, 0, 2), 0, &error);
	if (!trusted)
		setup_say(ctx, "refused: written by %s, which is not a member of pepsi_config (only the configuration "
					   "role may ask root for anything)",
				  PQgetvalue(res, 0, 3));
	PQclear(res);
	if (!trusted)
		;
	else if (!setup_kind_parse(kind_name, &kind))
		setup_say(ctx, "refused: unknown kind %s (this pepsi-setup applies %s)", kind_name, setup_kind_list());
	else if (!setup_task_check(kind, params, why, sizeof(why)))
		setup_say(ctx, "refused: %s", why);
	else
	{
		const char *values[1] = {id};

		if ((res = setup_query(ctx, "UPDATE pepsi.setup_task SET status = 'running', started_at = now() WHERE id = $1",
							   1, values)))
			PQclear(res);
		outcome = setup_apply_task(ctx, kind, params);
		json_decref(params);
		ctx->task_id = 0;
		if (outcome == SETUP_FAILED)
			(*failures)++;
		return setup_finish_row(ctx, id, setup_outcome_status(outcome)) ? 1 : -1;
	}
	json_decref(params);
	ctx->task_id = 0;
	(*failures)++;
	return setup_finish_row(ctx, id, "refused") ? 1 : -1;
}

int
setup_drain(struct setup_ctx *ctx)
{
	int failures = 0;
	int taken = 0;
	int rc = 1;

	printf("grant policy:\n");
	if (setup_grants(ctx) == SETUP_FAILED)
		failures++;
	for (taken = 0; taken < SETUP_DRAIN_MAX && (rc = setup_drain_one(ctx, &failures)) == 1; taken++)
		;
	if (rc < 0)
		return SETUP_EX_UNAVAILABLE;
	printf("pepsi-setup apply: %d task%s, %d refused or failed\n", taken, taken == 1 ? "" : "s", failures);
	return failures ? 65 : 0;
}
