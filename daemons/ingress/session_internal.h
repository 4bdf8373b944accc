/*
 * session_internal.h: a connection, as session.c (the socket, TLS, the
 * protocol machine's events) and session_screen.c (the connection-level
 * checks: DNSBL verdict at RCPT, the pre-greeting test) share it.  Not
 * for the rest of ingress, which sees ingress.h.
 */
#ifndef PEPSI_INGRESS_SESSION_INTERNAL_H
#define PEPSI_INGRESS_SESSION_INTERNAL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>

#include <ev.h>
#include <openssl/ssl.h>

#include "base/buf.h"
#include "ingress.h"
#include "message/queue_id.h"
#include "screen.h"
#include "smtp.h"

enum session_io
{
	SESSION_IO_PLAIN,
	SESSION_IO_HANDSHAKE, /* TLS being negotiated */
	SESSION_IO_TLS
};

/*
 * Sessions per client, for MAX_SESSIONS_PER_CLIENT.  An IPv4 client is its
 * address; an IPv6 client its /64, which one host or customer commonly
 * holds whole: counting single addresses would give it 2^64 allowances.
 */
struct client
{
	char		   ip[INET6_ADDRSTRLEN + 4]; /* the address, or the /64 */
	size_t		   sessions;
	struct client *next;
};

struct session
{
	struct smtp_session smtp;
	struct listener	   *listener;
	struct client	   *client;
	char				ip[INET6_ADDRSTRLEN]; /* the client's address */
	int					fd;
	SSL				   *ssl;
	enum session_io		io_state;
	int					tls_events;		  /* what the TLS library waits for */
	bool				starttls_pending; /* handshake once the 220 is out */
	bool				closing;		  /* close once the output is written */
	ev_io				io;
	ev_timer			timer;
	ev_timer			guard; /* SESSION_DEADLINE and MIN_DATA_RATE, checked every second */
	ev_tstamp			started;
	ev_tstamp			content_started; /* when DATA or the first BDAT began; 0 outside */
	size_t				content_octets;	 /* octets read since */
	ev_tstamp			last_command;
	struct buf			in; /* input not yet used: a partial line, or after an event */
	struct admission   *admission;
	struct auth_job	   *auth_job;		   /* a password being checked */
	ev_timer			auth_delay;		   /* a failed AUTH's answer, held back */
	bool				auth_close;		   /* ... and it closes the session (421) */
	struct verify	   *verify;			   /* message authentication; NULL when the listener has it off */
	bool				trusted;		   /* the client is in TRUSTED_NETWORKS */
	struct screen	   *screen;			   /* DNSBL and pre-greeting verdict; NULL: not screened */
	ev_timer			pregreet;		   /* the banner held back (PREGREET_WAIT) */
	bool				greet_pending;	   /* ... and not sent yet */
	struct db_query	   *greylist_query;	   /* pepsi.greylist_check in flight */
	char			   *greylist_address;  /* the recipient it was asked about */
	bool				greylist_answered; /* ... and its answer is in: */
	bool				greylist_pass;
	struct db_query	   *login_query; /* the account's addresses (sender_login.h) being read */
	bool				logins_loaded;
	char			  **logins; /* ... and what they are */
	size_t				nlogins;
	struct db_query	   *quota_query; /* pepsi.send_count_take in flight */
	char			   *quota_address;
	bool				quota_answered;
	bool				quota_pass;
	char				queue_id[QUEUE_ID_LEN + 1]; /* of the message being admitted */
	bool				queue_id_made;				/* ... made already, for the milters */
	struct milter_gate *milters;					/* the conversation with the listener's MILTERS */
	bool				milter_message;				/* ... which has the message */
	char			   *quarantine;					/* a milter's: the row is stored held, for this reason */
	char			   *quarantine_filter;
	char				client_name[256]; /* its client's verified name, or "" */
	struct session	   *prev;
	struct session	   *next;
};

/* session.c: write what is queued (false: closed); read and process (false: closed); watch. */
bool session_flush(struct session *s);
bool session_read(struct session *s);
bool session_update(struct session *s);

/* session_screen.c */
void session_screen_start(struct session *s, const struct sockaddr *addr);
/* Input before the banner: true when it was a talker's, and the session is closing. */
bool session_screen_early_talk(struct session *s);
void session_screen_stop(struct session *s);
/* session_account.c */
const char *session_from_refusal(struct session *s);
void		session_account_stop(struct session *s);
/* AUTH: a worker thread checked the password; the auth_delay timer answers a failure. */
void session_auth_checked(void *arg, bool ok);
void session_auth_answer_failure(struct ev_loop *loop, ev_timer *w, int revents);
/* SMTP_EVENT_SCREEN: the held RCPT is answered once the verdict is in. */
void session_screen_wait(struct session *s);
/* session.c: the content passed the milters (or there are none): authenticate and store it. */
void session_admit_content(struct session *s);
/* session_milter.c: the listener's MILTERS, told of the session's steps (milter_gate.h). */
void session_milter_open(struct session *s);
/* Show the transaction to the filters, which answer it. */
void session_milter_start(struct session *s);

#endif
