/*
 * pepsi-stage-relay-to-smarthost: hand each recipient's copy to one
 * configured SMTP server (the smarthost) and record the outcome.
 *
 * One envelope recipient per attempt: a row with several is split first
 * (split_to_one_per_row), so every outcome, retry time and DSN concerns
 * one recipient.  The SMTP session is kept open across messages (see
 * common/smtp/smtp_client.h); the outcomes are common/delivery/delivery.h's.
 *
 * A worker takes the rows already waiting for it as one batch (up to
 * RELAY_BATCH_MAX): they are loaded together, go through its session one
 * after another, and their outcomes are committed together (the
 * deliveries in one statement) before the worker answers for any of them.
 * The smarthost's 250 may thus come before our commit: a crash in between
 * leaves the rows running, to be retried (at least once, as any MTA).  In
 * the multi-call binary it also runs fused after a body-free stage (route)
 * with its body loaded late in that pass (common/runtime/stage.h late_load).
 *
 * OAuth 2.0 (XOAUTH2, OAUTHBEARER).  The access token is a file of the
 * pepsi-token group (root:pepsi-token, 0640) that
 * pepsi-helper-token-refresh replaces before the token expires; make
 * install makes this program's own file set-group-id pepsi-token, so
 * only it (and not every stage of the multi-call binary) can read the
 * tokens.  With AUTH_MECHANISM set to a token the stage therefore never
 * runs fused in another stage's worker (which lacks the group): relay_can_fuse
 * says no, the row is committed to this stage, and pepsi-dispatch runs the
 * set-group-id file.  The token is read when a session opens, and the
 * session is kept only while the file is the same one (inode, size,
 * mtime): a refreshed token is used from the next connection on, and a
 * token the server refuses defers the message (4.7.0 with the server's
 * reason) until the file changes.
 *
 * Options of its [stage-*] section (besides delivery.h's):
 *   SMARTHOST          host, host:port, [address]:port (port 25 by default);
 *                      unset: remote mail is held paused, with a log line
 *   TLS                verify (default) | no-verify | may | none
 *   TLS_CA_FILE        trust anchors for verify (default: the system's)
 *   TLS_NAME           the name the certificate must carry (default: the host)
 *   AUTH_USER, AUTH_PASSWORD (secrets.d) or AUTH_PASSWORD_FILE   AUTH PLAIN/LOGIN (never in the clear
 *                      unless TLS = none)
 *   AUTH_MECHANISM     password (default) | xoauth2 | oauthbearer: with
 *                      OAuth, AUTH_TOKEN_FILE's access token instead of
 *                      a password (common/smtp/smtp_auth.c)
 *   HELO_NAME          (default [pepsi] HOSTNAME)
 *   CONNECT_TIMEOUT (30s), TIMEOUT (5m, each reply), REUSE_MESSAGES (1000),
 *   REUSE_IDLE (60s: an older idle session is closed rather than reused)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "delivery/delivery.h"
#include "process/privilege.h"
#include "process/secret.h"
#include "runtime/stage.h"
#include "smtp/smtp_client.h"

int pepsi_stage_relay_to_smarthost_main(int argc, char **argv);

/* The most rows a worker takes at once (of those waiting): one load, one commit of their outcomes. */
#define RELAY_BATCH_MAX 16

/* The session of this worker and the settings it was made with. */
static struct smtp_client *relay_client;
static char				  *relay_client_key;
static bool				   relay_close_at_exit; /* relay_close_client registered with atexit */

static char *
relay_read_password(const char *path, char *err, size_t errlen)
{
	char  why[256];
	FILE *f = secret_file_open(path, why, sizeof(why));
	char *password;

	if (f == NULL)
	{
		snprintf(err, errlen, "cannot read AUTH_PASSWORD_FILE %s", why);
		return NULL;
	}
	if ((password = secret_file_first_line(f, path, why, sizeof(why))) == NULL)
		snprintf(err, errlen, "AUTH_PASSWORD_FILE %s", why);
	return password;
}

/* The access token of AUTH_TOKEN_FILE; NULL with err if unreadable or empty. */
static char *
relay_read_token(const char *path, char *err, size_t errlen)
{
	char  why[256];
	FILE *f;
	char *token;

	/*
	 * Installed set-group-id pepsi-token, the group is set aside at start
	 * (privilege_setid_start) and taken up for this open only: nothing
	 * else the worker opens is opened with it.
	 */
	if (!privilege_exec_group(true, err, errlen))
		return NULL;
	f = secret_group_file_open(path, why, sizeof(why));
	if (!privilege_exec_group(false, why, sizeof(why)))
		fatalx("[relay-to-smarthost] %s", why);
	if (f == NULL)
	{
		snprintf(err, errlen, "cannot read AUTH_TOKEN_FILE %s (is pepsi-helper-token-refresh run, "
							  "and this program set-group-id pepsi-token?)",
				 why);
		return NULL;
	}
	if ((token = secret_file_first_line(f, path, why, sizeof(why))) == NULL)
	{
		snprintf(err, errlen, "AUTH_TOKEN_FILE %s", why);
		return NULL;
	}
	if (*token == '\0')
	{
		snprintf(err, errlen, "AUTH_TOKEN_FILE %s holds no token", path);
		free(token);
		return NULL;
	}
	return token;
}

/* Which file the token is now: a refresh replaces it (rename), so the session key changes. */
static void
relay_token_identity(const char *path, char *out, size_t outlen)
{
	struct stat st;

	if (path == NULL || stat(path, &st) != 0)
		snprintf(out, outlen, "-");
	else
		snprintf(out, outlen, "%llu:%llu:%lld:%lld.%09ld", (unsigned long long) st.st_dev,
				 (unsigned long long) st.st_ino, (long long) st.st_size, (long long) st.st_mtim.tv_sec,
				 st.st_mtim.tv_nsec);
}

static void
relay_close_client(void)
{
	smtp_client_free(relay_client);
	relay_client = NULL;
	free(relay_client_key);
	relay_client_key = NULL;
}

/* The client for the current settings: the open one if they have not changed. */
static struct smtp_client *
relay_client_for(struct pepsi_ctx *ctx, const char *smarthost, char *err, size_t errlen)
{
	struct smtp_client_options o = {0};
	const char				  *password_file = pepsi_option(ctx, "AUTH_PASSWORD_FILE");
	const char				  *token_file = pepsi_option(ctx, "AUTH_TOKEN_FILE");
	enum smtp_auth_mechanism   mechanism = (enum smtp_auth_mechanism) pepsi_option_enum(ctx, "AUTH_MECHANISM");
	const char				  *helo_name = pepsi_option(ctx, "HELO_NAME");
	char					   token_identity[128];
	char					  *host = NULL;
	char					  *port = NULL;
	char					  *password = NULL;
	char					  *key;

	if (helo_name == NULL)
		helo_name = config_hostname(pepsi_config(ctx));
	relay_token_identity(mechanism == SMTP_AUTH_PASSWORD ? NULL : token_file, token_identity,
						 sizeof(token_identity));
	key = xasprintf("%s|%d|%s|%s|%s|%s|%s|%lld|%.3f|%.3f|%s|%.3f|%d|%s", smarthost,
					pepsi_option_enum(ctx, "TLS"),
					pepsi_option(ctx, "TLS_CA_FILE") ? pepsi_option(ctx, "TLS_CA_FILE") : "",
					pepsi_option(ctx, "TLS_NAME") ? pepsi_option(ctx, "TLS_NAME") : "",
					pepsi_option(ctx, "AUTH_USER") ? pepsi_option(ctx, "AUTH_USER") : "",
					password_file ? password_file : "", helo_name,
					pepsi_option_int(ctx, "REUSE_MESSAGES"), pepsi_option_seconds(ctx, "CONNECT_TIMEOUT"),
					pepsi_option_seconds(ctx, "TIMEOUT"), pepsi_stage_name(ctx),
					pepsi_option_seconds(ctx, "REUSE_IDLE"), (int) mechanism, token_identity);
	if (relay_client && strcmp(key, relay_client_key) == 0)
	{
		free(key);
		return relay_client;
	}
	relay_close_client();
	if (smarthost[0] == '/' || !smtp_parse_destination(smarthost, "25", &host, &port))
	{
		snprintf(err, errlen, "SMARTHOST \"%s\" is not host, host:port or [address]:port", smarthost);
		free(key);
		return NULL;
	}
	o.tls = (enum smtp_tls_mode) pepsi_option_enum(ctx, "TLS");
	if (pepsi_option(ctx, "AUTH_USER") && mechanism != SMTP_AUTH_PASSWORD)
	{
		if (token_file == NULL)
		{
			snprintf(err, errlen, "AUTH_MECHANISM is a token but AUTH_TOKEN_FILE is not set");
			goto err;
		}
		if ((password = relay_read_token(token_file, err, errlen)) == NULL)
			goto err;
	}
	else if (pepsi_option(ctx, "AUTH_USER"))
	{
		if (pepsi_option(ctx, "AUTH_PASSWORD"))
			password = xstrdup(pepsi_option(ctx, "AUTH_PASSWORD"));
		else if (password_file == NULL)
		{
			snprintf(err, errlen, "AUTH_USER is set but neither AUTH_PASSWORD (secrets.d) nor "
								  "AUTH_PASSWORD_FILE is");
			goto err;
		}
		else if ((password = relay_read_password(password_file, err, errlen)) == NULL)
			goto err;
	}
	o.host = host;
	o.port = port;
	o.tls_ca_file = pepsi_option(ctx, "TLS_CA_FILE");
	o.tls_name = pepsi_option(ctx, "TLS_NAME");
	o.helo_name = helo_name;
	o.auth_user = pepsi_option(ctx, "AUTH_USER");
	o.auth_password = password;
	o.auth_mechanism = mechanism;
	o.connect_timeout_ms = (int) (pepsi_option_seconds(ctx, "CONNECT_TIMEOUT") * 1000);
	o.command_timeout_ms = (int) (pepsi_option_seconds(ctx, "TIMEOUT") * 1000);
	o.max_messages_per_connection = (int) pepsi_option_int(ctx, "REUSE_MESSAGES");
	o.max_idle_ms = (int) (pepsi_option_seconds(ctx, "REUSE_IDLE") * 1000);
	relay_client = smtp_client_new(&o);
	relay_client_key = key;
	/* Fused into another stage's worker, which does not end in our main: QUIT at exit there too. */
	if (!relay_close_at_exit)
		relay_close_at_exit = atexit(relay_close_client) == 0;
	key = NULL;
err:
	if (password)
	{
		explicit_bzero(password, strlen(password));
		free(password);
	}
	free(host);
	free(port);
	free(key);
	return relay_client;
}

static int
relay_run(struct pepsi_ctx *ctx)
{
	const char			  *smarthost = pepsi_option(ctx, "SMARTHOST");
	struct smtp_client	  *client;
	struct smtp_envelope   env;
	struct smtp_result	   result;
	struct delivery_report report;
	struct buf			   raw = BUF_INIT;
	struct buf			   diagnostic = BUF_INIT;
	const char			  *rcpt[1];
	const char			  *notify[1];
	const char			  *orcpt[1];
	char				   status[16];
	char				   err[512];
	int					   rc;

	if (pepsi_rcpt_count(ctx) > 1 && pepsi_split_to_one_per_row(ctx) < 0)
		return -1;
	if (smarthost == NULL || *smarthost == '\0')
	{
		struct delivery_report held = {
			.status = "4.3.5",
			.diagnostic = "X-Pepsi; no SMARTHOST is configured for remote mail",
		};

		log_warnx("[stage-%s] has no SMARTHOST: row %lld to <%s> is held paused; set SMARTHOST "
				  "in [stage-%s] of %s (read from the file only) to deliver remote mail",
				  pepsi_stage_name(ctx), pepsi_id(ctx), pepsi_rcpt(ctx, 0), pepsi_stage_name(ctx),
				  pepsi_config(ctx)->path);
		return delivery_deferred(ctx, &held);
	}
	if ((client = relay_client_for(ctx, smarthost, err, sizeof(err))) == NULL)
	{
		struct delivery_report misconfigured = {.status = "4.3.5"};
		char				  *text = xasprintf("X-Pepsi; %s", err);

		log_warnx("[stage-%s]: %s", pepsi_stage_name(ctx), err);
		misconfigured.diagnostic = text;
		rc = delivery_deferred(ctx, &misconfigured);
		free(text);
		return rc;
	}
	if (!pepsi_raw_message(ctx, &raw))
		return -1;

	delivery_envelope(ctx, 1, rcpt, notify, orcpt, &env);
	smtp_client_send(client, &env, raw.data, raw.len, &result);

	delivery_report_from_smtp(&result, NULL, &report, status, sizeof(status), &diagnostic);
	switch (result.outcome)
	{
		case SMTP_DELIVERED:
			/* A next hop that speaks DSN reports on its own; else "relayed" (RFC 3464 2.3.3). */
			rc = delivery_succeeded(ctx, result.dsn_passed ? "delivered" : "relayed", &report,
									result.dsn_passed);
			break;
		case SMTP_PERMANENT:
			rc = delivery_bounced(ctx, &report);
			break;
		default:
			rc = delivery_deferred(ctx, &report);
			break;
	}
	smtp_result_free(&result);
	buf_free(&raw);
	buf_free(&diagnostic);
	return rc;
}

/*
 * A row with several recipients is split, which a fused pass cannot do;
 * and with an OAuth token the pass must be this program's own
 * set-group-id file, the only one that can read the token.
 */
static bool
relay_can_fuse(struct pepsi_ctx *ctx)
{
	return pepsi_rcpt_count(ctx) <= 1 && pepsi_option_enum(ctx, "AUTH_MECHANISM") == SMTP_AUTH_PASSWORD;
}

/* What the schema cannot say alone: the form of SMARTHOST, and AUTH's file. */
static bool
relay_check_config(const struct pepsi_config *cfg, const char *section, char *err, size_t errlen)
{
	const char *smarthost = config_get(cfg, section, "SMARTHOST");
	const char *user = config_get(cfg, section, "AUTH_USER");
	const char *password_file = config_get(cfg, section, "AUTH_PASSWORD_FILE");
	char	   *host;
	char	   *port;

	if (smarthost && *smarthost)
	{
		if (smarthost[0] == '/' || !smtp_parse_destination(smarthost, "25", &host, &port))
		{
			snprintf(err, errlen, "%s: [%s] SMARTHOST \"%s\" is not host, host:port or "
								  "[address]:port",
					 cfg->path, section, smarthost);
			return false;
		}
		free(host);
		free(port);
	}
	else
		log_warnx("%s: [%s] has no SMARTHOST: remote mail will be held paused", cfg->path, section);
	if (config_enum(cfg, section, "AUTH_MECHANISM") != SMTP_AUTH_PASSWORD)
	{
		/*
		 * The token file is not opened here: a token not yet fetched at
		 * start is no configuration error (pepsi-helper-token-refresh may
		 * run later); a delivery without one defers with the reason.
		 */
		if (user == NULL || config_get(cfg, section, "AUTH_TOKEN_FILE") == NULL)
		{
			snprintf(err, errlen, "%s: [%s] AUTH_MECHANISM %s needs AUTH_USER and AUTH_TOKEN_FILE",
					 cfg->path, section, config_get(cfg, section, "AUTH_MECHANISM"));
			return false;
		}
		if (password_file || config_get(cfg, section, "AUTH_PASSWORD"))
		{
			snprintf(err, errlen, "%s: [%s] has both a password (AUTH_PASSWORD_FILE or AUTH_PASSWORD) "
								  "and AUTH_MECHANISM %s: choose one",
					 cfg->path, section, config_get(cfg, section, "AUTH_MECHANISM"));
			return false;
		}
		return true;
	}
	if (config_get(cfg, section, "AUTH_TOKEN_FILE"))
	{
		snprintf(err, errlen, "%s: [%s] has AUTH_TOKEN_FILE but AUTH_MECHANISM is password "
							  "(set xoauth2 or oauthbearer)",
				 cfg->path, section);
		return false;
	}
	if (user && config_get(cfg, section, "AUTH_PASSWORD"))
		return true;
	if (user && password_file == NULL)
	{
		snprintf(err, errlen, "%s: [%s] has AUTH_USER but neither AUTH_PASSWORD (secrets.d) nor "
							  "AUTH_PASSWORD_FILE",
				 cfg->path, section);
		return false;
	}
	if (user && access(password_file, R_OK) != 0)
	{
		snprintf(err, errlen, "%s: [%s] AUTH_PASSWORD_FILE %s: %s", cfg->path, section,
				 password_file, strerror(errno));
		return false;
	}
	return true;
}

const struct pepsi_stage pepsi_stage_relay_to_smarthost_stage = {
	.program = "pepsi-stage-relay-to-smarthost",
	.load = PEPSI_LOAD_FULL,
	.run = relay_run,
	.can_fuse = relay_can_fuse,
	.check_config = relay_check_config,
	/* The rows waiting go through the session one after another, loaded and committed together. */
	.batch_max = RELAY_BATCH_MAX,
	/* After route (body-free), in the same pass: its body loaded then, not a second claim. */
	.late_load = true,
};

int
pepsi_stage_relay_to_smarthost_main(int argc, char **argv)
{
	int rc = pepsi_worker_main(&pepsi_stage_relay_to_smarthost_stage, argc, argv);

	relay_close_client(); /* QUIT the session the worker kept */
	return rc;
}
