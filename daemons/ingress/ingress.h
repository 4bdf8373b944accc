/*
 * ingress.h: what the parts of pepsi-ingress share: the listeners (from
 * [listener-<name>] sections only, never from the database) and the
 * process-wide settings.  main.c sets up, session.c serves connections,
 * admit.c stores messages.
 */
#ifndef PEPSI_INGRESS_H
#define PEPSI_INGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include <ev.h>
#include <openssl/ssl.h>

#include "auth.h"
#include "config/config.h"
#include "local/local.h"
#include "milter_gate.h"
#include "relay_control.h"
#include "smtp.h"
#include "verify.h"

enum listener_mode
{
	LISTENER_SMTP,		 /* 25: relay in, STARTTLS offered */
	LISTENER_SUBMISSION, /* 587: AUTH required, only after STARTTLS */
	LISTENER_SMTPS		 /* 465: submission over implicit TLS */
};

struct listener
{
	char				   *name; /* "smtp" for [listener-smtp] */
	enum listener_mode		mode;
	int						fd;
	ev_io					io;
	ev_timer				backoff; /* accept() paused: out of descriptors */
	SSL_CTX				   *tls;	 /* NULL without CERTIFICATE */
	struct smtp_policy		policy;
	struct trusted_networks trusted;		  /* TRUSTED_NETWORKS: may relay without AUTH */
	struct verify_policy	verify;			  /* message authentication (verify.h) */
	double					idle_timeout;	  /* seconds */
	double					session_deadline; /* seconds a session may last at most; 0: no limit */
	double					min_data_rate;	  /* octets per second of message content; 0: no limit */
	double					pregreet_wait;	  /* PREGREET_WAIT, seconds; 0: no pre-greeting test */
	bool					greylist;		  /* GREYLIST */
	double					greylist_delay;	  /* GREYLIST_DELAY, GREYLIST_EXPIRE, GREYLIST_AUTO_WHITELIST: seconds */
	double					greylist_expire;
	double					greylist_auto_whitelist;
	size_t					max_sessions;
	size_t					max_sessions_per_client;
	struct milter_gate_list milters; /* MILTERS: before-queue filters, none when empty */
	size_t					sessions;
	struct listener		   *next;
};

struct ingress
{
	struct ev_loop		  *loop;
	struct pepsi_config	  *cfg;
	const char			  *hostname;
	unsigned			   queue_id_host; /* [pepsi] HOST_ID (common/message/queue_id.h) */
	const char			  *authserv_id;
	struct credentials	  *credentials;
	char				  *local_domains;	 /* [pepsi] LOCAL_DOMAINS, replaced on reload */
	struct local_resolver *local_recipients; /* NULL: no recipient validation */
	unsigned			   max_hops;		 /* [ingress] MAX_HOPS */
	struct auth_throttle  *auth_throttle;	 /* [ingress] AUTH_FAILURE_* */
	size_t				   memory_in_flight; /* octets of content the sessions hold */
	size_t				   memory_limit;	 /* [ingress] MAX_MESSAGE_MEMORY */
	struct listener		  *listeners;
	size_t				   sessions;
	unsigned long long	   sessions_total; /* accepted since start */
	unsigned long long	   messages_total; /* stored since start */
	bool				   mail_log;	   /* [pepsi] MAIL_LOG: admissions become pepsi.mail_log rows */
	bool				   stopping;
};

extern struct ingress ingress;

/* local_refresh.c: the virtual mailboxes re-read from SQL off the event loop. */
void local_refresh_start(double interval);
void local_refresh_stop(void);

/* quota_gate.c: the local recipients over quota (pepsi.quota_full), 452 4.2.2 at RCPT. */
void quota_gate_start(double interval);
void quota_gate_stop(void);
bool quota_gate_full(const char *address);

/* list_rcpt.c: the mailing lists' addresses, read with the virtual mailboxes. */
extern const char	   list_rcpt_query[];
void				   list_rcpt_set(const PGresult *res);
enum smtp_rcpt_verdict list_rcpt_check(const char *address, enum smtp_rcpt_verdict verdict);

/* srs_rcpt.c: the SRS reverse path ([srs]), smtp_policy.srs_reverse when enabled. */
bool srs_rcpt_init(const struct pepsi_config *cfg, char *err, size_t errlen);
/* [ingress] SRS_FAILURE_LIMIT and SRS_FAILURE_WINDOW, at start and on reload. */
void				  srs_rcpt_configure(const struct pepsi_config *cfg);
bool				  srs_rcpt_enabled(void);
enum smtp_srs_verdict srs_rcpt_reverse(const struct smtp_session *s, char *address, size_t size);

/* main.c: what a listener reads from its section, at start and on reload. */
bool listener_tls_load(const struct pepsi_config *cfg, const char *section,
					   enum listener_mode mode, SSL_CTX **ctx, char *err, size_t errlen);
bool listener_limits_apply(const struct pepsi_config *cfg, const char *section,
						   struct listener *l, char *err, size_t errlen);
bool listener_trusted_networks_load(const struct pepsi_config *cfg, const char *section,
									struct trusted_networks *out, char *err, size_t errlen);
bool listener_configure(const struct pepsi_config *cfg, const char *section, bool auth,
						struct listener *l, char *err, size_t errlen);
void listener_gates_set(struct listener *l);
void listener_settings_free(struct listener *l);
bool ingress_load_overrides_into(struct pepsi_config *cfg, char *err, size_t errlen);
/* Whether sessions need the database connection of db_query.h (at start, and after a reload). */
bool ingress_session_checks_use_db(void);

/* reload.c: SIGHUP. */
void ingress_reload(const char *config_path);

/* session.c */
void session_accept(struct listener *l, int fd, const struct sockaddr *addr);
/* policy.rcpt_check of every listener: relay control and recipient validation. */
enum smtp_rcpt_verdict session_rcpt_check(const struct smtp_session *smtp, const char *address);
/* What a session's client is counted as: its IPv4 address, or its IPv6 /64. */
const char *session_client_of(const struct smtp_session *smtp);
/* policy.mail_accepted of every listener: SPF starts. */
void session_mail_accepted(const struct smtp_session *smtp);
/* session_screen.c: policy.screen of the listeners of MODE smtp (screen.h). */
enum smtp_screen_verdict session_screen_verdict(const struct smtp_session *smtp, char *reply,
												size_t size);
/* policy.violation of the listeners of MODE smtp: the client's verdict (screen.h). */
void session_screen_violation(const struct smtp_session *smtp, enum smtp_violation v);
/* Greylisting (session_screen.c): the triplet asked of pepsi.greylist_check. */
enum smtp_screen_verdict session_greylist(const struct smtp_session *smtp, const char *address,
										  char *reply, size_t size);
/* session_account.c: policy.rcpt_gate (greylisting, send limits) and policy.mail_gate. */
/* session_milter.c: the policy's hooks for a listener with MILTERS. */
void					 session_milter_helo(const struct smtp_session *smtp);
bool					 session_milter_envelope(const struct smtp_session *smtp, bool mail, const char *address);
enum smtp_screen_verdict session_rcpt_gate(const struct smtp_session *smtp, const char *address,
										   char *reply, size_t size);
enum smtp_screen_verdict session_mail_gate(const struct smtp_session *smtp, const char *address,
										   char *reply, size_t size);
/* Stop: 421 to every session not waiting for the database. */
void session_shutdown_all(void);

#endif
