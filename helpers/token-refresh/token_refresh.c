/*
 * pepsi-helper-token-refresh: renew the OAuth 2.0 access tokens the
 * smarthost stages authenticate with (XOAUTH2, OAUTHBEARER), before they
 * expire.
 *
 *   pepsi-helper-token-refresh [-c CONFIG] [--force] [STAGE...]
 *
 * For every [stage-*] of pepsi-stage-relay-to-smarthost whose
 * AUTH_MECHANISM is a token (or only the STAGEs named), it reads the
 * access token file (AUTH_TOKEN_FILE: the token, then a line "expires
 * <unix time>" this program wrote), and when the token expires within
 * OAUTH_REFRESH_BEFORE (or is missing, or --force) asks the token
 * endpoint for a new one with the refresh token (RFC 6749 section 6:
 * grant_type=refresh_token, the client authenticated with its secret in
 * the body, section 2.3.1).  The answer's access_token replaces the file
 * (a new file renamed over the old: the stage never reads half a token,
 * and sees a new inode, so its next session uses it); a rotated
 * refresh_token replaces OAUTH_REFRESH_TOKEN_FILE first, so that a crash
 * between the two writes loses nothing the endpoint still honours.
 *
 * Who runs it: root, from pepsi-token-refresh.timer (or a member of the
 * pepsi-token group).  As root it gives the access token file to group
 * pepsi-token, mode 0640, which the set-group-id relay-to-smarthost reads
 * (spec: the pepsi-token group); the refresh token and the client secret
 * stay 0600, readable by this program only.  It is not a set-id program
 * and has no database connection: it is a plain program of the multi-call
 * binary (libcurl, jansson), named pepsi-helper-* because a timer, not an
 * operator, runs it.
 *
 * The endpoint is not trusted: only https, its certificate verified
 * (OAUTH_CA_FILE or the system's), a 64 KiB answer at most, and an
 * access_token that is not printable ASCII without spaces, or longer than
 * the stage reads, is refused.  An error answer ("error":
 * "invalid_grant"...) is logged with its description and writes nothing.
 *
 * Exit status: 0 when every token is fresh or was renewed, 75 when one
 * could not be renewed now (the endpoint failed or is unreachable), 78 for
 * a configuration that cannot work, 64 for a usage error.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>
#include <openssl/crypto.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "config/config.h"
#include "config/log_config.h"
#include "process/cli.h"
#include "process/secret.h"
#include "smtp/smtp_client.h"

int pepsi_helper_token_refresh_main(int argc, char **argv);

#define TOKEN_PROGRAM "pepsi-helper-token-refresh"
#define TOKEN_STAGE_PROGRAM "pepsi-stage-relay-to-smarthost"
/* The group whose members (the set-group-id relay stage) read access tokens. */
#define TOKEN_GROUP "pepsi-token"
/* relay-to-smarthost reads up to 8 KiB of the first line: a longer token could not be sent whole. */
#define TOKEN_MAX 8000
#define TOKEN_ANSWER_MAX (64 * 1024)
/* A token endpoint that says nothing of expiry: assume an hour (RFC 6749 5.1 leaves it open). */
#define TOKEN_DEFAULT_LIFETIME 3600
#define TOKEN_TIMEOUT_MS 30000L

/* What one stage's refresh needs, from its section. */
struct token_stage
{
	const char *section;
	const char *token_file;
	const char *endpoint;
	const char *client_id;
	const char *client_secret_file;
	const char *refresh_token_file;
	const char *scope;
	const char *ca_file;
	long long	refresh_before_ms;
};

static int
token_usage(FILE *out)
{
	fprintf(out, "usage: " TOKEN_PROGRAM " [-c CONFIG] [--force] [STAGE...]\n"
				 "  renew the OAuth access token of every [stage-*] of " TOKEN_STAGE_PROGRAM "\n"
				 "  whose AUTH_MECHANISM is xoauth2 or oauthbearer (or of the STAGEs named)\n"
				 "  when it expires within OAUTH_REFRESH_BEFORE (--force: now)\n");
	return out == stdout ? CLI_EX_OK : CLI_EX_USAGE;
}

/* The first line of a 0600 secret file (refresh token, client secret); NULL with err. */
static char *
token_read_secret(const char *option, const char *path, char *err, size_t errlen)
{
	char  why[256];
	FILE *f = secret_file_open(path, why, sizeof(why));
	char *value;

	if (f == NULL || (value = secret_file_first_line(f, path, why, sizeof(why))) == NULL)
	{
		snprintf(err, errlen, "%s %s", option, why);
		return NULL;
	}
	if (*value == '\0')
	{
		snprintf(err, errlen, "%s %s is empty", option, path);
		free(value);
		return NULL;
	}
	return value;
}

/* When the token in path expires (its "expires" line), or 0 if it is missing or says nothing. */
static long long
token_expiry(const char *path)
{
	FILE	 *f = fopen(path, "r");
	char	  line[TOKEN_MAX + 2];
	long long expires = 0;

	if (f == NULL)
		return 0;
	if (fgets(line, sizeof(line), f) && line[0] != '\n' && fgets(line, sizeof(line), f))
		if (sscanf(line, "expires %lld", &expires) != 1)
			expires = 0;
	OPENSSL_cleanse(line, sizeof(line));
	fclose(f);
	return expires;
}

/*
 * Replace path with content, atomically: a new file beside it (mode, and
 * group gid unless -1), synced, renamed over it, the directory synced.
 */
static bool
token_write_file(const char *path, const char *content, mode_t mode, gid_t gid, char *err, size_t errlen)
{
	char *tmp = xasprintf("%s.new.%ld", path, (long) getpid());
	char *dir = xstrdup(path);
	char *slash = strrchr(dir, '/');
	int	  fd;
	bool  ok = false;

	unlink(tmp);
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
	if (fd < 0)
	{
		snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
		goto out;
	}
	if (gid != (gid_t) -1 && fchown(fd, (uid_t) -1, gid) != 0)
		snprintf(err, errlen, "%s: cannot give it to group %s: %s", tmp, TOKEN_GROUP, strerror(errno));
	else if (fchmod(fd, mode) != 0)
		snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
	else if (!fd_write_all(fd, content, strlen(content)) || fsync(fd) != 0)
		snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
	else
	{
		int closed = close(fd);

		fd = -1;
		if (closed != 0)
			snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
		else if (rename(tmp, path) != 0)
			snprintf(err, errlen, "renaming %s to %s: %s", tmp, path, strerror(errno));
		else
			ok = true;
	}
	if (fd >= 0)
		close(fd);
	if (!ok)
		unlink(tmp);
	else if (slash)
	{
		int dfd;

		*slash = '\0';
		if ((dfd = open(*dir ? dir : "/", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0)
		{
			(void) fsync(dfd);
			close(dfd);
		}
	}
out:
	free(tmp);
	free(dir);
	return ok;
}

static size_t
token_collect(char *data, size_t size, size_t n, void *userdata)
{
	struct buf *answer = userdata;

	if (answer->len + size * n > TOKEN_ANSWER_MAX)
		return 0; /* curl: write error, the transfer stops */
	buf_append(answer, data, size * n);
	return size * n;
}

/* Append name=value (form-urlencoded) to body. */
static void
token_form_field(CURL *curl, struct buf *body, const char *name, const char *value)
{
	char *escaped = curl_easy_escape(curl, value, 0);

	buf_printf(body, "%s%s=%s", body->len ? "&" : "", name, escaped ? escaped : "");
	curl_free(escaped);
}

/* A token fit to put in a file line and an AUTH command: printable ASCII, no spaces. */
static bool
token_printable(const char *token)
{
	size_t n = strlen(token);

	if (n == 0 || n > TOKEN_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (token[i] <= 0x20 || token[i] > 0x7e)
			return false;
	return true;
}

/* POST the refresh to the endpoint; the answer's JSON, or NULL with err (*temporary: worth retrying). */
static json_t *
token_request(const struct token_stage *s, const char *refresh_token, const char *client_secret,
			  char *err, size_t errlen, bool *temporary)
{
	CURL		*curl = curl_easy_init();
	struct buf	 body = BUF_INIT;
	struct buf	 answer = BUF_INIT;
	char		 curl_error[CURL_ERROR_SIZE] = "";
	long		 status = 0;
	json_t		*json = NULL;
	json_error_t jerr;
	CURLcode	 rc;

	*temporary = true;
	if (curl == NULL)
	{
		snprintf(err, errlen, "cannot start libcurl");
		return NULL;
	}
	token_form_field(curl, &body, "grant_type", "refresh_token");
	token_form_field(curl, &body, "refresh_token", refresh_token);
	token_form_field(curl, &body, "client_id", s->client_id);
	if (client_secret)
		token_form_field(curl, &body, "client_secret", client_secret);
	if (s->scope)
		token_form_field(curl, &body, "scope", s->scope);
	curl_easy_setopt(curl, CURLOPT_URL, s->endpoint);
	curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "https");
	curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 1L);
	curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 2L);
	if (s->ca_file)
		curl_easy_setopt(curl, CURLOPT_CAINFO, s->ca_file);
	curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, TOKEN_TIMEOUT_MS);
	curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data);
	curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, (long) body.len);
	curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, token_collect);
	curl_easy_setopt(curl, CURLOPT_WRITEDATA, &answer);
	curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, curl_error);
	curl_easy_setopt(curl, CURLOPT_USERAGENT, "Pepsi token refresh");
	rc = curl_easy_perform(curl);
	if (rc != CURLE_OK)
	{
		snprintf(err, errlen, "%s: %s", s->endpoint, curl_error[0] ? curl_error : curl_easy_strerror(rc));
		goto out;
	}
	curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
	json = answer.len ? json_loadb(answer.data, answer.len, 0, &jerr) : NULL;
	if (status != 200)
	{
		const char *code = json ? json_string_value(json_object_get(json, "error")) : NULL;
		const char *why = json ? json_string_value(json_object_get(json, "error_description")) : NULL;

		/* RFC 6749 5.2: a 400 is the grant or the client refused, which waiting does not mend. */
		*temporary = status >= 500 || status == 429;
		snprintf(err, errlen, "%s answered HTTP %ld%s%.64s%s%.200s", s->endpoint, status,
				 code ? ": " : "", code ? code : "", why ? " (" : "", why ? why : "");
		if (why)
			strncat(err, ")", errlen - strlen(err) - 1);
		json_decref(json);
		json = NULL;
	}
	else if (json == NULL || !json_is_object(json))
	{
		snprintf(err, errlen, "%s answered 200 without a JSON object", s->endpoint);
		json_decref(json);
		json = NULL;
	}
out:
	if (body.data)
		OPENSSL_cleanse(body.data, body.len);
	if (answer.data)
		OPENSSL_cleanse(answer.data, answer.len);
	buf_free(&body);
	buf_free(&answer);
	curl_easy_cleanup(curl);
	return json;
}

/* Write what a 200 answer holds; false with err if it is not a usable token. */
static bool
token_store(const struct token_stage *s, json_t *answer, gid_t gid, char *err, size_t errlen)
{
	const char *access = json_string_value(json_object_get(answer, "access_token"));
	const char *type = json_string_value(json_object_get(answer, "token_type"));
	const char *rotated = json_string_value(json_object_get(answer, "refresh_token"));
	json_t	   *lifetime = json_object_get(answer, "expires_in");
	long long	seconds = TOKEN_DEFAULT_LIFETIME;
	char	   *content;
	bool		ok;

	if (access == NULL || !token_printable(access))
	{
		snprintf(err, errlen, "%s: the answer has no usable access_token (printable, at most %d "
							  "characters)",
				 s->endpoint, TOKEN_MAX);
		return false;
	}
	if (type && strcasecmp(type, "Bearer") != 0)
	{
		snprintf(err, errlen, "%s: token_type \"%.32s\" is not Bearer", s->endpoint, type);
		return false;
	}
	if (json_is_integer(lifetime))
		seconds = json_integer_value(lifetime);
	else if (json_is_string(lifetime)) /* some endpoints quote it */
		seconds = strtoll(json_string_value(lifetime), NULL, 10);
	if (seconds <= 0 || seconds > 366LL * 86400)
		seconds = TOKEN_DEFAULT_LIFETIME;
	if (rotated && token_printable(rotated))
	{
		char *line = xasprintf("%s\n", rotated);

		ok = token_write_file(s->refresh_token_file, line, 0600, (gid_t) -1, err, errlen);
		OPENSSL_cleanse(line, strlen(line));
		free(line);
		if (!ok)
			return false;
	}
	content = xasprintf("%s\nexpires %lld\n", access, (long long) time(NULL) + seconds);
	ok = token_write_file(s->token_file, content, 0640, gid, err, errlen);
	OPENSSL_cleanse(content, strlen(content));
	free(content);
	if (ok)
		log_info("[%s] renewed the access token in %s: valid for %llds%s", s->section, s->token_file,
				 seconds, rotated ? "; the refresh token was rotated" : "");
	return ok;
}

/* The stage's settings; false (err: which option) if it cannot be refreshed. */
static bool
token_stage_load(const struct pepsi_config *cfg, const char *section, struct token_stage *s, char *err,
				 size_t errlen)
{
	memset(s, 0, sizeof(*s));
	s->section = section;
	s->token_file = config_get(cfg, section, "AUTH_TOKEN_FILE");
	s->endpoint = config_get(cfg, section, "OAUTH_TOKEN_ENDPOINT");
	s->client_id = config_get(cfg, section, "OAUTH_CLIENT_ID");
	s->client_secret_file = config_get(cfg, section, "OAUTH_CLIENT_SECRET_FILE");
	s->refresh_token_file = config_get(cfg, section, "OAUTH_REFRESH_TOKEN_FILE");
	s->scope = config_get(cfg, section, "OAUTH_SCOPE");
	s->ca_file = config_get(cfg, section, "OAUTH_CA_FILE");
	s->refresh_before_ms = config_duration_ms(cfg, section, "OAUTH_REFRESH_BEFORE");
	if (s->token_file == NULL || s->endpoint == NULL || s->client_id == NULL || s->refresh_token_file == NULL)
	{
		snprintf(err, errlen, "%s: [%s] needs AUTH_TOKEN_FILE, OAUTH_TOKEN_ENDPOINT, OAUTH_CLIENT_ID and "
							  "OAUTH_REFRESH_TOKEN_FILE to renew its token",
				 cfg->path, section);
		return false;
	}
	if (strncasecmp(s->endpoint, "https://", 8) != 0)
	{
		snprintf(err, errlen, "%s: [%s] OAUTH_TOKEN_ENDPOINT \"%s\" is not an https:// URL (tokens "
							  "never travel in the clear)",
				 cfg->path, section, s->endpoint);
		return false;
	}
	return true;
}

/* Renew one stage's token if it is due; a CLI_EX_* status. */
static int
token_refresh_stage(const struct pepsi_config *cfg, const char *section, bool force, gid_t gid)
{
	struct token_stage s;
	char			   err[1024];
	char			  *refresh = NULL;
	char			  *secret = NULL;
	json_t			  *answer;
	long long		   expires;
	bool			   temporary;
	int				   rc = CLI_EX_OK;

	if (!token_stage_load(cfg, section, &s, err, sizeof(err)))
	{
		log_warnx("%s", err);
		return CLI_EX_CONFIG;
	}
	expires = token_expiry(s.token_file);
	if (!force && expires > 0 && (long long) time(NULL) + s.refresh_before_ms / 1000 < expires)
	{
		log_info("[%s] the access token in %s is good for %llds more: not renewed", section, s.token_file,
				 expires - (long long) time(NULL));
		return CLI_EX_OK;
	}
	if ((refresh = token_read_secret("OAUTH_REFRESH_TOKEN_FILE", s.refresh_token_file, err, sizeof(err))) == NULL
		|| (s.client_secret_file
			&& (secret = token_read_secret("OAUTH_CLIENT_SECRET_FILE", s.client_secret_file, err, sizeof(err)))
				   == NULL))
	{
		log_warnx("[%s] %s: the access token is not renewed", section, err);
		rc = CLI_EX_CONFIG;
		goto out;
	}
	answer = token_request(&s, refresh, secret, err, sizeof(err), &temporary);
	if (answer == NULL)
	{
		log_warnx("[%s] %s: the access token is not renewed%s", section, err,
				  temporary ? " (tried again at the next run)" : "; a new refresh token is needed");
		rc = temporary ? CLI_EX_TEMPFAIL : CLI_EX_DATAERR;
		goto out;
	}
	if (!token_store(&s, answer, gid, err, sizeof(err)))
	{
		log_warnx("[%s] %s: the access token is not renewed", section, err);
		rc = CLI_EX_DATAERR;
	}
	json_decref(answer);
out:
	if (refresh)
		OPENSSL_cleanse(refresh, strlen(refresh));
	if (secret)
		OPENSSL_cleanse(secret, strlen(secret));
	free(refresh);
	free(secret);
	return rc;
}

/* Whether [section] is a relay-to-smarthost stage with a token: the stage's own reading of AUTH_MECHANISM. */
static bool
token_stage_uses_oauth(const struct pepsi_config *cfg, const char *section)
{
	const char *program = config_get(cfg, section, "PROGRAM");

	if (program == NULL || strcmp(program, TOKEN_STAGE_PROGRAM) != 0)
		return false;
	return config_enum(cfg, section, "AUTH_MECHANISM") != SMTP_AUTH_PASSWORD;
}

int
pepsi_helper_token_refresh_main(int argc, char **argv)
{
	const char			*config_path = NULL;
	bool				 force = false;
	struct pepsi_config *cfg;
	const char			*sections[256];
	size_t				 nsections;
	struct group		*token_group;
	gid_t				 gid = (gid_t) -1;
	char				 err[1024];
	int					 rc = CLI_EX_OK;
	int					 renewed = 0;
	int					 i;

	log_init(TOKEN_PROGRAM, false);
	for (i = 1; i < argc && argv[i][0] == '-'; i++)
	{
		if (cli_is_help(argv[i]))
			return token_usage(stdout);
		if (strcmp(argv[i], "--force") == 0)
			force = true;
		else if (strcmp(argv[i], "-c") == 0 && i + 1 < argc)
			config_path = argv[++i];
		else
			return token_usage(stderr);
	}
	if ((cfg = config_load(cli_config_path(config_path), err, sizeof(err))) == NULL)
	{
		fprintf(stderr, TOKEN_PROGRAM ": %s\n", err);
		return CLI_EX_CONFIG;
	}
	if (!log_configure(cfg, err, sizeof(err)))
		log_warnx("%s", err);
	/* As root, the token files go to the stage's group; otherwise they stay the caller's. */
	if (geteuid() == 0 && (token_group = getgrnam(TOKEN_GROUP)) != NULL)
		gid = token_group->gr_gid;
	curl_global_init(CURL_GLOBAL_DEFAULT);
	nsections = config_sections(cfg, "stage-", sections, sizeof(sections) / sizeof(sections[0]));
	for (size_t k = 0; k < nsections; k++)
	{
		bool named = i == argc;
		int	 one;

		for (int j = i; j < argc && !named; j++)
			named = strcmp(argv[j], sections[k] + strlen("stage-")) == 0;
		if (!named || !token_stage_uses_oauth(cfg, sections[k]))
			continue;
		renewed++;
		one = token_refresh_stage(cfg, sections[k], force, gid);
		if (one != CLI_EX_OK && (rc == CLI_EX_OK || one == CLI_EX_TEMPFAIL))
			rc = one;
	}
	if (renewed == 0)
	{
		log_warnx("%s: no [stage-*] of %s with AUTH_MECHANISM xoauth2 or oauthbearer%s", cfg->path,
				  TOKEN_STAGE_PROGRAM, i < argc ? " among those named" : "");
		if (i < argc)
			rc = CLI_EX_USAGE;
	}
	curl_global_cleanup();
	config_free(cfg);
	return rc;
}
