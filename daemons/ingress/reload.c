/*
 * reload.c: SIGHUP.  pepsi-ingress reads its file (and the overlay) again
 * and applies what can change under running sessions:
 *
 *   - each listener's CERTIFICATE and KEY: a STARTTLS or an smtps
 *     connection after the reload gets the new pair; a session keeps the
 *     TLS it has (its SSL holds a reference to the old context);
 *   - each listener's limits (sizes, rates, timeouts, session counts);
 *   - [ingress] CREDENTIALS, MAX_HOPS and MAX_MESSAGE_MEMORY;
 *   - [pepsi] LOG, LOG_FORMAT and MAIL_LOG.
 *
 * A pepsi_config_changed notification (config_set or config_unset on
 * pepsi.config_override) reloads the same way: the overlay's options that
 * ingress reads are global ones among those above.
 *
 * Everything is read and checked before anything changes: a file that
 * does not parse, a key that cannot be read (after the privilege drop the
 * files must be readable by [ingress] USER), a bad limit or a listener
 * that disappeared refuse the whole reload with the reason in the log, and
 * the old settings stay.  Addresses, ports, modes and new listeners need a
 * restart (a new listener is named in the log).  The rest of the running
 * configuration (ingress.cfg, which sessions point into) stays as it was
 * read at start, and the new file is freed once its values are copied.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/ssl.h>

#include "auth.h"
#include "auth_throttle.h"
#include "ingress.h"
#include "log.h"
#include "log_config.h"
#include "service.h"
#include "xalloc.h"

/* What a reload will set in one running listener. */
struct listener_reload
{
	struct listener *listener;
	SSL_CTX			*tls;
	struct listener	 limits; /* only the fields listener_limits_apply sets */
};

static bool
reload_has_section(const char *const *sections, size_t nsections, const char *section)
{
	for (size_t i = 0; i < nsections; i++)
		if (strcmp(sections[i], section) == 0)
			return true;
	return false;
}

static bool
reload_listeners(struct pepsi_config *cfg, struct listener_reload *staged, char *err, size_t errlen)
{
	const char *sections[256];
	size_t		nsections = config_sections(cfg, "listener-", sections, 256);
	size_t		n = 0;

	for (struct listener *l = ingress.listeners; l; l = l->next, n++)
	{
		char	   *section = xasprintf("listener-%s", l->name);
		const char *mode = config_get(cfg, section, "MODE");
		bool		ok = false;

		staged[n].listener = l;
		if (!reload_has_section(sections, nsections, section))
			snprintf(err, errlen, "[%s] is gone: removing a listener needs a restart", section);
		else if ((mode == NULL							? LISTENER_SMTP
				  : strcasecmp(mode, "submission") == 0 ? LISTENER_SUBMISSION
				  : strcasecmp(mode, "smtps") == 0		? LISTENER_SMTPS
														: LISTENER_SMTP)
				 != l->mode)
			snprintf(err, errlen, "[%s] MODE changed: that needs a restart", section);
		else if (listener_tls_load(cfg, section, l->mode, &staged[n].tls, err, errlen))
		{
			staged[n].limits = *l;
			ok = listener_limits_apply(cfg, section, &staged[n].limits, err, errlen);
		}
		free(section);
		if (!ok)
			return false;
	}
	for (size_t i = 0; i < nsections; i++)
	{
		bool running = false;

		for (struct listener *l = ingress.listeners; l; l = l->next)
			running |= strcmp(sections[i] + strlen("listener-"), l->name) == 0;
		if (!running)
			log_warnx("reload: [%s] is new: it listens after a restart", sections[i]);
	}
	return true;
}

void
ingress_reload(const char *config_path)
{
	struct pepsi_config	   *cfg;
	struct listener_reload *staged;
	struct credentials	   *credentials = NULL;
	const char			   *credentials_path;
	size_t					nlisteners = 0;
	bool					mail_log = false;
	long					max_hops = 0,
		 memory_limit = 0, auth_limit = 0;
	double auth_window = 0,
		   auth_delay = 0;
	char err[1024];
	bool ok;

	if (ingress.stopping)
		return;
	service_reloading();
	log_info("reloading %s", config_path);
	for (struct listener *l = ingress.listeners; l; l = l->next)
		nlisteners++;
	staged = xcalloc(nlisteners + 1, sizeof(*staged));
	cfg = config_load(config_path, err, sizeof(err));
	ok = cfg != NULL && ingress_load_overrides_into(cfg, err, sizeof(err))
		 && reload_listeners(cfg, staged, err, sizeof(err));
	if (ok)
	{
		max_hops = (long) config_int(cfg, "ingress", "MAX_HOPS");
		auth_limit = (long) config_int(cfg, "ingress", "AUTH_FAILURE_LIMIT");
		auth_window = config_duration_ms(cfg, "ingress", "AUTH_FAILURE_WINDOW") / 1000.0;
		auth_delay = config_duration_ms(cfg, "ingress", "AUTH_FAILURE_DELAY") / 1000.0;
		mail_log = config_bool(cfg, "pepsi", "MAIL_LOG");
		memory_limit = (long) config_size(cfg, "ingress", "MAX_MESSAGE_MEMORY");
	}
	if (ok && (credentials_path = config_get(cfg, "ingress", "CREDENTIALS")) != NULL)
	{
		ok = (credentials = credentials_load(credentials_path, err, sizeof(err))) != NULL;
		if (!ok)
			log_warnx("reload: [ingress] CREDENTIALS %s cannot be read", credentials_path);
	}
	for (size_t i = 0; ok && i < nlisteners; i++)
		if (staged[i].listener->policy.auth_required && credentials == NULL)
		{
			snprintf(err, sizeof(err), "[listener-%s] needs [ingress] CREDENTIALS", staged[i].listener->name);
			ok = false;
		}
	if (ok)
		ok = log_configure(cfg, err, sizeof(err));
	if (!ok)
	{
		log_warnx("reload refused: %s; the old configuration stays", err);
		for (size_t i = 0; i < nlisteners; i++)
			SSL_CTX_free(staged[i].tls);
		credentials_free(credentials);
		config_free(cfg);
		free(staged);
		service_reloaded();
		return;
	}

	for (size_t i = 0; i < nlisteners; i++)
	{
		struct listener		  *l = staged[i].listener;
		const struct listener *n = &staged[i].limits;

		SSL_CTX_free(l->tls);
		l->tls = staged[i].tls;
		l->policy.starttls = l->tls != NULL && l->mode != LISTENER_SMTPS;
		l->policy.max_size = n->policy.max_size;
		l->policy.max_recipients = n->policy.max_recipients;
		l->policy.max_line_length = n->policy.max_line_length;
		l->policy.max_errors = n->policy.max_errors;
		l->policy.command_rate = n->policy.command_rate;
		l->idle_timeout = n->idle_timeout;
		l->session_deadline = n->session_deadline;
		l->min_data_rate = n->min_data_rate;
		l->max_sessions = n->max_sessions;
		l->max_sessions_per_client = n->max_sessions_per_client;
		l->policy.auth = credentials != NULL;
	}
	credentials_free(ingress.credentials);
	ingress.credentials = credentials;
	ingress.max_hops = (unsigned) max_hops;
	auth_throttle_configure(ingress.auth_throttle, (unsigned) auth_limit, auth_window, auth_delay);
	srs_rcpt_configure(cfg);
	ingress.mail_log = mail_log;
	ingress.memory_limit = (size_t) memory_limit;
	for (struct listener *l = ingress.listeners; l; l = l->next)
		l->policy.memory_limit = ingress.memory_limit;
	config_free(cfg);
	free(staged);
	log_info("reloaded %s: certificates, credentials and limits in force for new sessions", config_path);
	service_reloaded();
}
