/*
 * certificate.c: pepsi-setup certificate, ingress's TLS certificate for
 * the host name.  Given one (--certificate and --key), it is checked and
 * installed by the certificate task; otherwise certbot obtains one
 * (certbot certonly, by --webroot or --standalone on port 80), with a
 * deploy hook that runs this command again (--deploy) on every renewal:
 * the hook installs the renewed lineage the same way and reloads ingress.
 * The files are copied out of certbot's live/ directory because ingress
 * reads them again on a reload, after it dropped root, and certbot's keys
 * are root's alone.
 */
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/xalloc.h"
#include "process/cli.h"
#include "setup.h"

extern char **environ;

struct setup_cert_options
{
	const char *hostname;
	const char *certificate;
	const char *key;
	const char *certbot;
	const char *webroot;
	const char *email;
	const char *port;
	bool		standalone;
	bool		deploy; /* certbot's deploy hook: RENEWED_LINEAGE */
};

/* Append word to b, quoted for sh. */
static void
setup_shell_quote(struct buf *b, const char *word)
{
	buf_append_char(b, '\'');
	for (const char *p = word; *p; p++)
		if (*p == '\'')
			buf_printf(b, "'\\''");
		else
			buf_append_char(b, *p);
	buf_append_char(b, '\'');
}

/* A program found on PATH (or name itself when it has a slash), allocated; NULL when there is none. */
static char *
setup_find_program(const char *name)
{
	const char *path = getenv("PATH");

	if (strchr(name, '/'))
		return access(name, X_OK) == 0 ? xstrdup(name) : NULL;
	for (const char *p = path ? path : "/usr/bin:/bin"; *p;)
	{
		size_t len = strcspn(p, ":");
		char  *candidate = xasprintf("%.*s/%s", (int) len, len ? p : ".", name);

		if (access(candidate, X_OK) == 0)
			return candidate;
		free(candidate);
		p += len + (p[len] == ':');
	}
	return NULL;
}

/* The ingress's group: the key must be readable by it (as root only). */
static const char *
setup_ingress_group(const struct pepsi_config *cfg)
{
	const char *group = config_get(cfg, "ingress", "GROUP");

	return group ? group : config_get(cfg, "ingress", "USER");
}

/* Install certificate and key for the host (the certificate task), then reload ingress when it changed. */
static int
setup_cert_install(struct setup_ctx *ctx, const struct pepsi_config *cfg, const char *host, const char *certificate,
				   const char *key)
{
	json_t			  *params = json_pack("{s:s, s:s, s:s}", "host", host, "certificate", certificate, "key", key);
	const char		  *group = setup_ingress_group(cfg);
	char			   why[1024];
	enum setup_outcome outcome;

	if (ctx->as_root && group)
		json_object_set_new(params, "group", json_string(group));
	if (!setup_task_check(SETUP_CERTIFICATE, params, why, sizeof(why)))
	{
		fprintf(stderr, "pepsi-setup certificate: %s; nothing changed\n", why);
		json_decref(params);
		return CLI_EX_USAGE;
	}
	printf("certificate:\n");
	outcome = setup_apply_task(ctx, SETUP_CERTIFICATE, params);
	json_decref(params);
	if (outcome == SETUP_FAILED)
		return 65;
	if (outcome == SETUP_DONE)
	{
		json_t *reload = json_pack("{s:s}", "service", "ingress");

		printf("reload:\n");
		outcome = setup_apply_task(ctx, SETUP_RELOAD, reload);
		json_decref(reload);
		if (outcome == SETUP_FAILED)
			return 65;
	}
	else
		printf("pepsi-setup certificate: nothing changed: the certificate is installed already\n");
	return CLI_EX_OK;
}

/* The deploy hook certbot runs: this program, its --root and -c, --deploy. */
static char *
setup_deploy_hook(const struct setup_ctx *ctx, const char *config_path, const char *host)
{
	struct buf b = BUF_INIT;
	char	   self[4096];
	ssize_t	   n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	self[n > 0 ? n : 0] = '\0';
	setup_shell_quote(&b, n > 0 ? self : "pepsi-setup");
	buf_printf(&b, " certificate --deploy --hostname ");
	setup_shell_quote(&b, host);
	buf_printf(&b, " -c ");
	setup_shell_quote(&b, config_path);
	if (ctx->root[0])
	{
		buf_printf(&b, " --root ");
		setup_shell_quote(&b, ctx->root);
	}
	buf_append_char(&b, '\0');
	return b.data;
}

/* certbot certonly for host; then its live/HOST/ files are installed. */
static int
setup_certbot(struct setup_ctx *ctx, const struct pepsi_config *cfg, const char *config_path,
			  const struct setup_cert_options *o)
{
	char *certbot = setup_find_program(o->certbot ? o->certbot : "certbot");
	char *config_dir = xasprintf("%s/etc/letsencrypt", ctx->root);
	char *work_dir = xasprintf("%s/var/lib/letsencrypt", ctx->root);
	char *logs_dir = xasprintf("%s/var/log/letsencrypt", ctx->root);
	char *hook;
	char *live_chain;
	char *live_key;
	char *argv[32];
	int	  argc = 0;
	char  why[512];
	pid_t pid;
	int	  status = 0;
	int	  rc;

	if (certbot == NULL)
	{
		fprintf(stderr, "pepsi-setup certificate: certbot is not installed (apt install certbot, or --certbot "
						"PATH), and no --certificate FILE --key FILE was given; nothing changed\n");
		rc = SETUP_EX_UNAVAILABLE;
		goto out;
	}
	if ((o->webroot == NULL) == !o->standalone)
	{
		fprintf(stderr, "pepsi-setup certificate: certbot needs one of --webroot DIR (a web server already "
						"serves port 80 from DIR) or --standalone (certbot listens on port 80 itself); "
						"nothing changed\n");
		rc = CLI_EX_USAGE;
		goto out;
	}
	if (o->webroot && access(o->webroot, W_OK) != 0)
	{
		fprintf(stderr, "pepsi-setup certificate: --webroot %s: %s; nothing changed\n", o->webroot, strerror(errno));
		rc = CLI_EX_USAGE;
		goto out;
	}
	if (o->standalone && !setup_port_free("0.0.0.0", o->port, why, sizeof(why)))
	{
		fprintf(stderr, "pepsi-setup certificate: --standalone: %s (a web server? use --webroot DIR, or "
						"--http-01-port); nothing changed\n",
				why);
		rc = SETUP_EX_UNAVAILABLE;
		goto out;
	}
	hook = setup_deploy_hook(ctx, config_path, o->hostname);
	argv[argc++] = xstrdup(certbot);
	argv[argc++] = xstrdup("certonly");
	argv[argc++] = xstrdup("--non-interactive");
	argv[argc++] = xstrdup("--agree-tos");
	if (o->email)
	{
		argv[argc++] = xstrdup("-m");
		argv[argc++] = xstrdup(o->email);
	}
	else
		argv[argc++] = xstrdup("--register-unsafely-without-email");
	if (o->webroot)
	{
		argv[argc++] = xstrdup("--webroot");
		argv[argc++] = xstrdup("-w");
		argv[argc++] = xstrdup(o->webroot);
	}
	else
	{
		argv[argc++] = xstrdup("--standalone");
		argv[argc++] = xstrdup("--http-01-port");
		argv[argc++] = xstrdup(o->port);
	}
	argv[argc++] = xstrdup("-d");
	argv[argc++] = xstrdup(o->hostname);
	argv[argc++] = xstrdup("--cert-name");
	argv[argc++] = xstrdup(o->hostname);
	argv[argc++] = xstrdup("--deploy-hook");
	argv[argc++] = xstrdup(hook);
	argv[argc++] = xstrdup("--config-dir");
	argv[argc++] = xstrdup(config_dir);
	argv[argc++] = xstrdup("--work-dir");
	argv[argc++] = xstrdup(work_dir);
	argv[argc++] = xstrdup("--logs-dir");
	argv[argc++] = xstrdup(logs_dir);
	argv[argc] = NULL;
	printf("certbot:\n  %s certonly ... -d %s\n", certbot, o->hostname);
	fflush(stdout);
	if (posix_spawn(&pid, certbot, NULL, NULL, argv, environ) != 0 || waitpid(pid, &status, 0) < 0
		|| !WIFEXITED(status) || WEXITSTATUS(status) != 0)
	{
		fprintf(stderr, "pepsi-setup certificate: %s certonly failed (%s %d; its log is in %s)\n", certbot,
				WIFSIGNALED(status) ? "signal" : "exit status",
				WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), logs_dir);
		for (int i = 0; i < argc; i++)
			free(argv[i]);
		free(hook);
		rc = SETUP_EX_UNAVAILABLE;
		goto out;
	}
	for (int i = 0; i < argc; i++)
		free(argv[i]);
	free(hook);
	live_chain = xasprintf("%s/live/%s/fullchain.pem", config_dir, o->hostname);
	live_key = xasprintf("%s/live/%s/privkey.pem", config_dir, o->hostname);
	rc = setup_cert_install(ctx, cfg, o->hostname, live_chain, live_key);
	free(live_chain);
	free(live_key);
out:
	free(certbot);
	free(config_dir);
	free(work_dir);
	free(logs_dir);
	return rc;
}

int
setup_certificate_command(struct setup_ctx *ctx, const struct pepsi_config *cfg, int argc, char **argv)
{
	struct setup_cert_options o = {0};

	o.port = "80";
	for (int a = 0; a < argc; a++)
	{
		const char	*arg = argv[a];
		const char	*value = a + 1 < argc ? argv[a + 1] : NULL;
		const char **slot = NULL;

		if (strcmp(arg, "--standalone") == 0)
			o.standalone = true;
		else if (strcmp(arg, "--deploy") == 0)
			o.deploy = true;
		else if (strcmp(arg, "--hostname") == 0)
			slot = &o.hostname;
		else if (strcmp(arg, "--certificate") == 0)
			slot = &o.certificate;
		else if (strcmp(arg, "--key") == 0)
			slot = &o.key;
		else if (strcmp(arg, "--certbot") == 0)
			slot = &o.certbot;
		else if (strcmp(arg, "--webroot") == 0)
			slot = &o.webroot;
		else if (strcmp(arg, "--email") == 0)
			slot = &o.email;
		else if (strcmp(arg, "--http-01-port") == 0)
			slot = &o.port;
		else
		{
			fprintf(stderr, "pepsi-setup certificate: unknown option %s\n", arg);
			return CLI_EX_USAGE;
		}
		if (slot && value == NULL)
		{
			fprintf(stderr, "pepsi-setup certificate: %s needs a value\n", arg);
			return CLI_EX_USAGE;
		}
		if (slot)
			*slot = argv[++a];
	}
	if (o.hostname == NULL)
		o.hostname = config_get(cfg, "pepsi", "HOSTNAME");
	if (o.hostname == NULL)
	{
		fprintf(stderr, "pepsi-setup certificate: no --hostname, and %s has no [pepsi] HOSTNAME\n", cfg->path);
		return CLI_EX_USAGE;
	}
	{
		char why[512];

		if (!setup_domain_valid(o.hostname, why, sizeof(why)))
		{
			fprintf(stderr, "pepsi-setup certificate: --hostname: %s; nothing changed\n", why);
			return CLI_EX_USAGE;
		}
		if (strspn(o.port, "0123456789") != strlen(o.port) || atoi(o.port) < 1 || atoi(o.port) > 65535)
		{
			fprintf(stderr, "pepsi-setup certificate: --http-01-port %s is not a port; nothing changed\n", o.port);
			return CLI_EX_USAGE;
		}
	}
	if (o.deploy)
	{
		const char *lineage = getenv("RENEWED_LINEAGE");
		char	   *chain;
		char	   *key;
		int			rc;

		if (lineage == NULL || lineage[0] != '/')
		{
			fprintf(stderr, "pepsi-setup certificate --deploy: certbot's deploy hook, run without "
							"RENEWED_LINEAGE\n");
			return CLI_EX_USAGE;
		}
		chain = xasprintf("%s/fullchain.pem", lineage);
		key = xasprintf("%s/privkey.pem", lineage);
		rc = setup_cert_install(ctx, cfg, o.hostname, chain, key);
		free(chain);
		free(key);
		return rc;
	}
	if ((o.certificate == NULL) != (o.key == NULL))
	{
		fprintf(stderr, "pepsi-setup certificate: --certificate and --key go together\n");
		return CLI_EX_USAGE;
	}
	if (o.certificate)
		return setup_cert_install(ctx, cfg, o.hostname, o.certificate, o.key);
	return setup_certbot(ctx, cfg, cfg->path, &o);
}
