/*
 * reload.c: SIGHUP.  pepsi-ingress reads its file (and the overlay) again
 * and applies what can change under running sessions:
 *
 *   - each listener's CERTIFICATE and KEY: a STARTTLS or an smtps
 *     connection after the reload gets the new pair; a session keeps the
 *     TLS it has (its SSL holds a reference to the old context);
 *   - each listener's limits (sizes, rates, timeouts, session counts) and
 *     TRUSTED_NETWORKS (its own or [ingress]'s), for new sessions;
 *   - [ingress] CREDENTIALS, MAX_HOPS, MAX_MESSAGE_MEMORY, AUTH_FAILURE_*;
 *   - [pepsi] LOCAL_DOMAINS, LOG, LOG_FORMAT and MAIL_LOG.
 *
 * Every other option ingress reads is read once, at start (reload_applies
 * and reload_shared_read say which): a reload whose file or overlay changes
 * one is refused, naming it and saying a restart applies it, rather than
 * answering "reloaded" while ignoring it.  So is a new listener.
 *
 * A pepsi_config_changed notification (config_set or config_unset on
 * pepsi.config_override) reloads the same way.
 *
 * Everything is read and checked before anything changes: a file that
 * does not parse, a key that cannot be read (after the privilege drop the
 * files must be readable by [ingress] USER, and no one else's), a bad
 * limit or network, a listener that disappeared or appeared, or a changed
 * restart-only option refuse the whole reload with the reason in the log,
 * and the old settings stay.  The running configuration (ingress.cfg)
 * stays as it was read at start, which is what the restart-only options
 * are compared with; the new file is freed once its values are copied.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/ssl.h>

#include "auth.h"
#include "auth_throttle.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "config/log_config.h"
#include "ingress.h"
#include "options.h"
#include "process/service.h"
#include "runtime/db.h"

/* What a reload will set in one running listener. */
struct listener_reload
{
	struct listener		   *listener;
	SSL_CTX				   *tls;
	struct listener			limits; /* only the fields listener_limits_apply sets */
	struct trusted_networks trusted;
};

/*
 * The options of ingress's own sections ([ingress], [listener-<name>],
 * [srs]) that a reload applies; every other one of
 * those sections needs a restart.  Deny by default, so that an option
 * added later is never silently ignored by a reload.
 */
static const struct
{
	const char *where; /* as in schema/options.def */
	const char *name;
} reload_applies[] = {
	{"listener-*", "CERTIFICATE"},
	{"listener-*", "KEY"},
	{"listener-*", "MAX_SIZE"},
	{"listener-*", "MAX_HEADER_FIELDS"},
	{"listener-*", "MAX_HEADER_SIZE"},
	{"listener-*", "MAX_RECIPIENTS"},
	{"listener-*", "MAX_LINE_LENGTH"},
	{"listener-*", "MAX_ERRORS"},
	{"listener-*", "COMMAND_RATE"},
	{"listener-*", "IDLE_TIMEOUT"},
	{"listener-*", "SESSION_DEADLINE"},
	{"listener-*", "MIN_DATA_RATE"},
	{"listener-*", "MAX_SESSIONS"},
	{"listener-*", "MAX_SESSIONS_PER_CLIENT"},
	{"listener-*", "TRUSTED_NETWORKS"},
	{"listener-*", "MILTERS"},
	{"ingress", "CREDENTIALS"},
	{"ingress", "MAX_HOPS"},
	{"ingress", "MAX_MESSAGE_MEMORY"},
	{"ingress", "AUTH_FAILURE_LIMIT"},
	{"ingress", "AUTH_FAILURE_WINDOW"},
	{"ingress", "AUTH_FAILURE_DELAY"},
	{"ingress", "SRS_FAILURE_LIMIT"},
	{"ingress", "SRS_FAILURE_WINDOW"},
	{"ingress", "TRUSTED_NETWORKS"},
	{"pepsi", "LOCAL_DOMAINS"},
	{"pepsi", "LOG"},
	{"pepsi", "LOG_FORMAT"},
	{"pepsi", "MAIL_LOG"},
};

/*
 * [pepsi] is every program's: of its options, ingress reads these (the
 * others are none of its business, and changing them does not stop its
 * reload).  Those not in reload_applies need a restart.  Of [database],
 * it reads CONNINFO when [ingress] CONNINFO is unset (compared below).
 */
static const struct
{
	const char *where;
	const char *name;
} reload_shared_read[] = {
	{"pepsi", "HOSTNAME"},
	{"pepsi", "LOCAL_DOMAINS"},
	{"pepsi", "LOCAL_RECIPIENTS"},
	{"pepsi", "ALIASES_FILE"},
	{"pepsi", "MAILDIR_ROOT"},
	{"pepsi", "DNS_FORWARDER"},
	{"pepsi", "DNS_TRUST_ANCHOR"},
	{"pepsi", "DNS_TIMEOUT"},
	{"pepsi", "LOG"},
	{"pepsi", "LOG_FORMAT"},
	{"pepsi", "MAIL_LOG"},
};

static const char *const reload_own_sections[] = {"ingress", "listener-*", "srs"};

#define RELOAD_COUNT(array) (sizeof(array) / sizeof((array)[0]))

/* Does ingress read def at start only? */
static bool
reload_restart_only(const struct option_def *def)
{
	for (size_t i = 0; i < RELOAD_COUNT(reload_applies); i++)
		if (strcmp(reload_applies[i].where, def->where) == 0
			&& strcmp(reload_applies[i].name, def->name) == 0)
			return false;
	for (size_t i = 0; i < RELOAD_COUNT(reload_shared_read); i++)
		if (strcmp(reload_shared_read[i].where, def->where) == 0
			&& strcmp(reload_shared_read[i].name, def->name) == 0)
			return true;
	for (size_t i = 0; i < RELOAD_COUNT(reload_own_sections); i++)
		if (strcmp(reload_own_sections[i], def->where) == 0)
			return true;
	return false;
}

static bool
reload_same(const struct pepsi_config *cfg, const char *section, const struct option_def *def,
			char *err, size_t errlen)
{
	char origin[512];

	if (!config_option_changed(ingress.cfg, cfg, section, def->name))
		return true;
	/* The values stay out of the log: a CONNINFO may hold a password. */
	snprintf(err, errlen, "[%s] %s changed (%s): only a restart of pepsi-ingress applies it",
			 section, def->name, config_origin(cfg, section, def->name, origin, sizeof(origin)));
	return false;
}

/* False with err naming the first option the new cfg changes that only a restart applies. */
static bool
reload_restart_options_unchanged(const struct pepsi_config *cfg, char *err, size_t errlen)
{
	for (size_t i = 0; i < option_count; i++)
	{
		const struct option_def *def = &option_table[i];

		if (!reload_restart_only(def))
			continue;
		if (strcmp(def->where, "listener-*") != 0)
		{
			if (!reload_same(cfg, def->where, def, err, errlen))
				return false;
			continue;
		}
		for (struct listener *l = ingress.listeners; l; l = l->next)
		{
			char *section = xasprintf("listener-%s", l->name);
			bool  same = reload_same(cfg, section, def, err, errlen);

			free(section);
			if (!same)
				return false;
		}
	}
	if (strcmp(db_conninfo(ingress.cfg, "ingress", "CONNINFO"), db_conninfo(cfg, "ingress", "CONNINFO"))
		!= 0)
	{
		snprintf(err, errlen, "[database] CONNINFO changed: only a restart of pepsi-ingress applies it");
		return false;
	}
	return true;
}

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
			ok = listener_limits_apply(cfg, section, &staged[n].limits, err, errlen)
				 && listener_trusted_networks_load(cfg, section, &staged[n].trusted, err, errlen);
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
		{
			snprintf(err, errlen, "[%s] is new: adding a listener needs a restart", sections[i]);
			return false;
		}
	}
	return true;
}

static void
reload_staged_free(struct listener_reload *staged, size_t count)
{
	for (size_t i = 0; i < count; i++)
	{
		SSL_CTX_free(staged[i].tls);
		trusted_networks_free(&staged[i].trusted);
		/* MILTERS read for a reload that did not take it (a transaction copies what it uses) */
		if (staged[i].listener && staged[i].limits.milters.entries != staged[i].listener->milters.entries)
			milter_gate_list_free(&staged[i].limits.milters);
	}
	free(staged);
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
		 && reload_listeners(cfg, staged, err, sizeof(err))
		 && reload_restart_options_unchanged(cfg, err, sizeof(err));
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
		reload_staged_free(staged, nlisteners);
		credentials_free(credentials);
		config_free(cfg);
		service_reloaded();
		return;
	}

	for (size_t i = 0; i < nlisteners; i++)
	{
		struct listener		  *l = staged[i].listener;
		const struct listener *n = &staged[i].limits;

		SSL_CTX_free(l->tls);
		l->tls = staged[i].tls;
		staged[i].tls = NULL;
		/* A session reads l->trusted only when it starts (session_accept). */
		trusted_networks_free(&l->trusted);
		l->trusted = staged[i].trusted;
		staged[i].trusted = (struct trusted_networks){0};
		l->policy.starttls = l->tls != NULL && l->mode != LISTENER_SMTPS;
		l->policy.max_size = n->policy.max_size;
		l->policy.max_recipients = n->policy.max_recipients;
		l->policy.max_line_length = n->policy.max_line_length;
		l->policy.max_header_fields = n->policy.max_header_fields;
		l->policy.max_header_size = n->policy.max_header_size;
		l->policy.max_errors = n->policy.max_errors;
		l->policy.command_rate = n->policy.command_rate;
		l->idle_timeout = n->idle_timeout;
		l->session_deadline = n->session_deadline;
		l->min_data_rate = n->min_data_rate;
		l->max_sessions = n->max_sessions;
		l->max_sessions_per_client = n->max_sessions_per_client;
		milter_gate_list_free(&l->milters);
		l->milters = n->milters;
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
	/* Sessions read it at each RCPT, through ingress.local_domains: none keeps the old one. */
	free(ingress.local_domains);
	ingress.local_domains = xstrdup(local_domains(cfg, NULL));
	config_free(cfg);
	reload_staged_free(staged, nlisteners);
	log_info("reloaded %s: certificates, credentials, limits, trusted networks and local domains "
			 "in force for new sessions",
			 config_path);
	service_reloaded();
}
