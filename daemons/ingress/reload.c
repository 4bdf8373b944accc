/*
 * reload.c: SIGHUP.  pepsi-ingress reads its file (and the overlay) again
 * and applies it as a whole, for new sessions:
 *
 *   - each listener's section: everything listener_configure reads
 *     (certificate and key, limits, TRUSTED_NETWORKS, message
 *     authentication, greylisting, pre-greeting test, and whatever is
 *     added there) replaces the running listener's settings at once; a
 *     session keeps the TLS it has (its SSL holds a reference to the old
 *     context);
 *   - [ingress]: CREDENTIALS, MAX_HOPS, MAX_MESSAGE_MEMORY, AUTH_FAILURE_*,
 *     SRS_FAILURE_*, DNSBL_* (the verdicts this process kept are
 *     forgotten), SENDER_LOGIN_MAPS and SEND_LIMIT_*;
 *   - [pepsi] LOCAL_DOMAINS, LOG, LOG_FORMAT and MAIL_LOG.
 *
 * What a running process cannot take up is listed in reload_restart_only:
 * the socket (ADDRESS, PORT, MODE), the user, the database connections and
 * what is built from them at start.  A reload whose file or overlay changes
 * one of those is refused, naming it and saying a restart applies it,
 * rather than answering "reloaded" while ignoring it.  So is a new listener.
 *
 * A pepsi_config_changed notification (config_set or config_unset on
 * pepsi.config_override) reloads the same way.
 *
 * Everything is read and checked before anything changes: a file that
 * does not parse, a key that cannot be read (after the privilege drop the
 * files must be readable by [ingress] USER, and no one else's), a bad
 * value, a listener that disappeared or appeared, or a changed
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
#include "db_query.h"
#include "ingress.h"
#include "options.h"
#include "process/service.h"
#include "runtime/db.h"
#include "screen.h"
#include "sender_login.h"

/* What a reload will set in one running listener: its settings, read as at start. */
struct listener_reload
{
	struct listener *listener;
	struct listener	 settings;
};

/*
 * The options of ingress's own sections ([ingress], [listener-<name>],
 * [srs]) that only a restart applies: the socket and the user, and what
 * start builds once from them (the database connections, the admission
 * batches, the resolver, the SRS keys).  Every other option of those
 * sections is read again by a reload (listener_configure and the
 * [ingress] settings below).
 */
static const struct
{
	const char *where; /* as in schema/options.def */
	const char *name;
} reload_restart_only_options[] = {
	{"listener-*", "ADDRESS"},
	{"listener-*", "PORT"},
	{"listener-*", "MODE"},
	{"ingress", "USER"},
	{"ingress", "GROUP"},
	{"ingress", "CONNINFO"},
	{"ingress", "AUTHSERV_ID"},
	{"ingress", "DATABASE_CONNECTIONS"},
	{"ingress", "BULK_NICE"},
	{"ingress", "BATCH_SIZE"},
	{"ingress", "INIT_STAGE"},
	{"ingress", "DISPATCH_WAKE_INTERVAL"},
	{"ingress", "ARC_TRUSTED_SEALERS"},
	{"ingress", "DNS_MESSAGE_BUDGET"},
	{"ingress", "DNS_PROBE_INTERVAL"},
	{"ingress", "LOCAL_RECIPIENTS_REFRESH"},
	{"ingress", "MILTER_THREADS"},
	{"srs", "*"},
};

/*
 * [pepsi] is every program's: of its options, ingress reads these (the
 * others are none of its business, and changing them does not stop its
 * reload); all but LOCAL_DOMAINS, LOG, LOG_FORMAT and MAIL_LOG need a
 * restart.  Of [database], it reads CONNINFO when [ingress] CONNINFO is
 * unset (compared below).
 */
static const struct
{
	const char *where;
	const char *name;
} reload_shared_restart_only[] = {
	{"pepsi", "HOSTNAME"},
	{"pepsi", "LOCAL_RECIPIENTS"},
	{"pepsi", "ALIASES_FILE"},
	{"pepsi", "MAILDIR_ROOT"},
	{"pepsi", "DNS_FORWARDER"},
	{"pepsi", "DNS_TRUST_ANCHOR"},
	{"pepsi", "DNS_TIMEOUT"},
};

#define RELOAD_COUNT(array) (sizeof(array) / sizeof((array)[0]))

/* Does ingress read def at start only? */
static bool
reload_restart_only(const struct option_def *def)
{
	for (size_t i = 0; i < RELOAD_COUNT(reload_restart_only_options); i++)
		if (strcmp(reload_restart_only_options[i].where, def->where) == 0
			&& (strcmp(reload_restart_only_options[i].name, "*") == 0
				|| strcmp(reload_restart_only_options[i].name, def->name) == 0))
			return true;
	for (size_t i = 0; i < RELOAD_COUNT(reload_shared_restart_only); i++)
		if (strcmp(reload_shared_restart_only[i].where, def->where) == 0
			&& strcmp(reload_shared_restart_only[i].name, def->name) == 0)
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

/* Each running listener's section read into staged (auth: CREDENTIALS are loaded). */
static bool
reload_listeners(struct pepsi_config *cfg, bool auth, struct listener_reload *staged, char *err,
				 size_t errlen)
{
	const char *sections[256];
	size_t		nsections = config_sections(cfg, "listener-", sections, 256);
	size_t		n = 0;

	for (struct listener *l = ingress.listeners; l; l = l->next, n++)
	{
		char *section = xasprintf("listener-%s", l->name);
		bool  ok = false;

		staged[n].listener = l;
		staged[n].settings.mode = l->mode;
		if (!reload_has_section(sections, nsections, section))
			snprintf(err, errlen, "[%s] is gone: removing a listener needs a restart", section);
		else
			ok = listener_configure(cfg, section, auth, &staged[n].settings, err, errlen);
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
		listener_settings_free(&staged[i].settings);
	free(staged);
}

/*
 * The staged settings replace l's as a whole; what belongs to the running
 * listener (its socket, watchers, name, mode, session count and place in
 * the list) stays.  The old TLS context and networks are freed: a session
 * holds its own SSL reference, and reads l->trusted only when it starts.
 */
static void
reload_listener_replace(struct listener *l, struct listener *settings)
{
	struct listener running = *l;

	listener_settings_free(l);
	*l = *settings;
	*settings = (struct listener){0};
	l->name = running.name;
	l->mode = running.mode;
	l->fd = running.fd;
	l->io = running.io;
	l->backoff = running.backoff;
	l->sessions = running.sessions;
	l->next = running.next;
}

void
ingress_reload(const char *config_path)
{
	struct pepsi_config	   *cfg;
	struct listener_reload *staged;
	struct credentials	   *credentials = NULL;
	struct sender_logins   *logins = NULL;
	const char			   *credentials_path;
	size_t					nlisteners = 0;
	char					err[1024];
	bool					ok;

	if (ingress.stopping)
		return;
	service_reloading();
	log_info("reloading %s", config_path);
	for (struct listener *l = ingress.listeners; l; l = l->next)
		nlisteners++;
	staged = xcalloc(nlisteners + 1, sizeof(*staged));
	cfg = config_load(config_path, err, sizeof(err));
	ok = cfg != NULL && ingress_load_overrides_into(cfg, err, sizeof(err));
	if (ok && (credentials_path = config_get(cfg, "ingress", "CREDENTIALS")) != NULL)
	{
		ok = (credentials = credentials_load(credentials_path, err, sizeof(err))) != NULL;
		if (!ok)
			log_warnx("reload: [ingress] CREDENTIALS %s cannot be read", credentials_path);
	}
	/*
	 * Everything is read and checked before anything changes; log_configure,
	 * the only step that puts its settings in force as it accepts them, is
	 * the last that can refuse, so a refused reload changes nothing.
	 */
	ok = ok && reload_listeners(cfg, credentials != NULL, staged, err, sizeof(err))
		 && reload_restart_options_unchanged(cfg, err, sizeof(err)) && screen_check(cfg, err, sizeof(err))
		 && (logins = sender_login_load(cfg, err, sizeof(err))) != NULL && log_configure(cfg, err, sizeof(err));
	if (!ok)
	{
		log_warnx("reload refused: %s; the old configuration stays", err);
		sender_login_discard(logins);
		reload_staged_free(staged, nlisteners);
		credentials_free(credentials);
		config_free(cfg);
		service_reloaded();
		return;
	}

	sender_login_install(logins);
	if (!screen_configure(cfg, verify_resolver(), err, sizeof(err)))
		fatalx("reload: %s", err); /* screen_check accepted it */
	credentials_free(ingress.credentials);
	ingress.credentials = credentials;
	ingress.max_hops = (unsigned) config_int(cfg, "ingress", "MAX_HOPS");
	auth_throttle_configure(ingress.auth_throttle, (unsigned) config_int(cfg, "ingress", "AUTH_FAILURE_LIMIT"),
							config_duration_ms(cfg, "ingress", "AUTH_FAILURE_WINDOW") / 1000.0,
							config_duration_ms(cfg, "ingress", "AUTH_FAILURE_DELAY") / 1000.0);
	srs_rcpt_configure(cfg);
	ingress.mail_log = config_bool(cfg, "pepsi", "MAIL_LOG");
	ingress.memory_limit = (size_t) config_size(cfg, "ingress", "MAX_MESSAGE_MEMORY");
	for (size_t i = 0; i < nlisteners; i++)
	{
		struct listener *l = staged[i].listener;

		reload_listener_replace(l, &staged[i].settings);
		l->policy.memory_limit = ingress.memory_limit;
		listener_gates_set(l);
	}
	/* Sessions read it at each RCPT, through ingress.local_domains: none keeps the old one. */
	free(ingress.local_domains);
	ingress.local_domains = xstrdup(local_domains(cfg, NULL));
	/* Greylisting, sender logins or DNSBL turned on where nothing asked the database before. */
	if (!db_query_available() && ingress_session_checks_use_db())
		db_query_init(ingress.loop, ingress.cfg);
	config_free(cfg);
	reload_staged_free(staged, nlisteners);
	log_info("reloaded %s: the listeners' and [ingress]'s settings in force for new sessions",
			 config_path);
	service_reloaded();
}
