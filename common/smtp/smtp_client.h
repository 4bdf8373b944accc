/*
 * smtp_client.h: the outbound SMTP client of the relay stages.
 *
 * Blocking I/O with poll() deadlines, which is what a stage worker wants:
 * one message at a time, one process per concurrent connection.  A client
 * connects on first use and keeps the session for the next message
 * (RSET after a failed transaction, a fresh connection when the server
 * went away or the session is old), so a worker relaying a stream of
 * messages pays the greeting, EHLO, STARTTLS and AUTH once.
 *
 * Extensions: STARTTLS (RFC 3207; certificate verified against the system
 * store or a CA file by default), AUTH PLAIN and LOGIN (RFC 4954) or an
 * OAuth 2.0 token (XOAUTH2, OAUTHBEARER: RFC 7628; smtp_auth.c),
 * PIPELINING (RFC 2920), SIZE (RFC 1870), 8BITMIME (RFC 6152), SMTPUTF8
 * (RFC 6531), DSN (RFC 3461: the parameters are passed on when the server
 * has it), CHUNKING and BINARYMIME (RFC 3030: BDAT whenever the server
 * offers CHUNKING), REQUIRETLS (RFC 8689) and enhanced status codes (RFC
 * 2034/3463).
 *
 * Content the server cannot take is converted, never sent raw: 8-bit
 * content to a server without 8BITMIME and binary content (a NUL, a bare
 * CR) to one without BINARYMIME go through common/message/mime_downgrade.h; what
 * cannot be converted is refused with 5.6.3, and a message that needs
 * SMTPUTF8 with 5.6.7.
 *
 * A TLS policy (common/smtp/tls_policy.h: DANE, MTA-STS) set on the client
 * decides STARTTLS and the peer's authentication instead of the tls
 * option; the result says what TLS the delivery had (result.tls_outcome).
 *
 * LMTP (RFC 2033) is the same client with options.lmtp: LHLO instead of
 * EHLO, and after the message one reply per accepted recipient
 * (result.data_replies).  A host that starts with "/" is a Unix socket.
 */
#ifndef PEPSI_SMTP_CLIENT_H
#define PEPSI_SMTP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"

struct tls_policy;

/* In the order of the TLS option's choices (schema/options.def): verify|no-verify|may|none. */
enum smtp_tls_mode
{
	SMTP_TLS_VERIFY,	/* STARTTLS required, certificate and name verified */
	SMTP_TLS_NO_VERIFY, /* STARTTLS required, certificate not checked */
	SMTP_TLS_MAY,		/* STARTTLS when offered, not checked */
	SMTP_TLS_NONE		/* never */
};

/*
 * How AUTH proves who we are (schema/options.def AUTH_MECHANISM, in this
 * order): a password (PLAIN, else LOGIN, whichever the server offers), or
 * an OAuth 2.0 access token in auth_password, as XOAUTH2 (Google's and
 * Microsoft's SASL mechanism) or OAUTHBEARER (RFC 7628).
 */
enum smtp_auth_mechanism
{
	SMTP_AUTH_PASSWORD,
	SMTP_AUTH_XOAUTH2,
	SMTP_AUTH_OAUTHBEARER
};

struct smtp_client_options
{
	const char				*host;	  /* name or address of the server, or the path of a Unix socket */
	const char				*address; /* connect here instead of resolving host (an MX's address) */
	const char				*port;	  /* default "25" */
	enum smtp_tls_mode		 tls;
	const char				*tls_ca_file;	/* trust anchors for VERIFY (default: the system's) */
	const char				*tls_name;		/* name the certificate must carry (default: host) */
	const char				*helo_name;		/* our name in EHLO/HELO */
	const char				*auth_user;		/* NULL: no AUTH */
	const char				*auth_password; /* the password, or the access token for OAuth */
	enum smtp_auth_mechanism auth_mechanism;
	int						 connect_timeout_ms;
	int						 command_timeout_ms;		  /* each reply, and each write of the message */
	int						 max_messages_per_connection; /* then QUIT and reconnect */
	int						 max_idle_ms;				  /* a session idle longer is not reused */
	bool					 lmtp;						  /* speak LMTP (RFC 2033) */
};

/* Where in the session a reply came from (RFC 3464 "in reply to"). */
enum smtp_phase
{
	SMTP_PHASE_CONNECT,
	SMTP_PHASE_GREETING,
	SMTP_PHASE_EHLO,
	SMTP_PHASE_STARTTLS,
	SMTP_PHASE_AUTH,
	SMTP_PHASE_MAIL,
	SMTP_PHASE_RCPT,
	SMTP_PHASE_DATA,   /* the DATA command */
	SMTP_PHASE_MESSAGE /* the end of the message */
};

struct smtp_reply
{
	int		   code;		 /* 0 when there was no reply (I/O error, timeout) */
	char	   enhanced[16]; /* "5.1.1", or "" */
	struct buf text;		 /* the lines' text after the code, joined by spaces */
};

/* The outcome of one transaction. */
enum smtp_outcome
{
	SMTP_DELIVERED, /* 2xx at the end of the message */
	SMTP_TEMPORARY, /* 4xx, or the connection failed: try later */
	SMTP_PERMANENT	/* 5xx, or refused before sending (SIZE, SMTPUTF8) */
};

struct smtp_envelope
{
	const char		  *mail_from; /* "" for the null sender */
	const char *const *rcpt;
	size_t			   nrcpt;
	bool			   body_8bit;  /* BODY=8BITMIME wanted (the client also checks) */
	bool			   smtputf8;   /* SMTPUTF8 wanted (the client also checks) */
	bool			   requiretls; /* RFC 8689: only over verified TLS to a server with REQUIRETLS */
	/* RFC 3461, passed on when the server has DSN; any may be NULL. */
	const char		  *ret;	   /* "FULL" or "HDRS" */
	const char		  *envid;  /* decoded; xtext-encoded on the wire */
	const char *const *notify; /* per recipient: "SUCCESS,DELAY", "NEVER" */
	const char *const *orcpt;  /* per recipient: "rfc822;addr" (decoded) */
};

struct smtp_result
{
	enum smtp_outcome outcome;
	enum smtp_phase	  phase;			 /* where the deciding reply came from */
	struct smtp_reply reply;			 /* the deciding reply (code 0: none; see error) */
	char			  error[1024];		 /* local reason when there is no reply */
	char			  remote_mta[256];	 /* the server's name (greeting), else the host */
	char			  relay[300];		 /* host[address]:port of the session used, "" if none */
	char			  local_address[64]; /* the address the session was sent from, "" if none or a Unix socket */
	char			  tls[160];			 /* its TLS ("TLSv1.3 <cipher> verified"), "" in clear */
	double			  connect_seconds;	 /* connecting, greeting, EHLO, STARTTLS, AUTH (0 when reused) */
	double			  transfer_seconds;	 /* MAIL FROM to the end of DATA */
	bool			  dsn_passed;		 /* the server has DSN and took our parameters */
	bool			  bdat;				 /* the message went with BDAT (CHUNKING) */
	const char		 *body_type;		 /* BODY= sent: "7BIT", "8BITMIME", "BINARYMIME" */
	bool			  downgraded;		 /* converted for the server (mime_downgrade.h) */
	/*
	 * The TLS policy's outcome (common/smtp/tls_policy.h), for the log and
	 * TLSRPT: "" without a policy, else e.g. "dane verified",
	 * "sts enforce verified", "opportunistic unverified", or the failure
	 * ("dane certificate-expired: ...").  tls_result is the RFC 8460
	 * result type of a failure, "" when there was none.
	 */
	char tls_outcome[256];
	char tls_result[48];
	/* Sessions this send opened (0: it used one already open), for TLSRPT's session counts. */
	int sessions_opened;
	/* per recipient: the reply to its RCPT (code 0 if never sent) */
	struct smtp_reply *rcpt_replies;
	/*
	 * LMTP only, per recipient: its reply after the message (code 0 when its
	 * RCPT was refused, or the server gave fewer replies than it accepted
	 * recipients, which is an I/O error: the outcome is then TEMPORARY).
	 */
	struct smtp_reply *data_replies;
	size_t			   nrcpt;
};

struct smtp_client;

struct smtp_client *smtp_client_new(const struct smtp_client_options *options);
/*
 * A worker's session across messages: current when it was made with the
 * same options (compared field by field), else a new client, current
 * being freed (its session QUIT).  current may be NULL.
 */
struct smtp_client *smtp_client_reuse(struct smtp_client			   *current,
									  const struct smtp_client_options *options);
void				smtp_client_free(struct smtp_client *c); /* QUITs an open session */
/* Close the session now (QUIT when it is usable). */
void smtp_client_close(struct smtp_client *c);
bool smtp_client_connected(const struct smtp_client *c);
/*
 * Decide TLS by policy (NULL: by the tls option again).  The client keeps
 * a copy; a policy that asks something else closes the open session.
 */
void smtp_client_set_tls_policy(struct smtp_client *c, const struct tls_policy *policy);

/*
 * Send one message (raw: headers, CRLF, body; CRLF or bare LF line ends)
 * to the envelope's recipients over the current session or a new one.
 * The outcome is DELIVERED only when the server accepted the message for
 * at least one recipient; per-recipient replies are in result (for LMTP
 * the deciding one of each recipient is its data reply when it has one).
 */
void smtp_client_send(struct smtp_client *c, const struct smtp_envelope *env,
					  const char *raw, size_t len, struct smtp_result *result);
void smtp_result_free(struct smtp_result *result);

const char *smtp_phase_name(enum smtp_phase phase); /* "RCPT TO", "end of DATA", ... */
/*
 * "host", "host:port", "[address]:port", "[address]" (default_port when
 * none is given), or a path starting with "/" (a Unix socket: *port is
 * NULL).  false when it is none of them.  The strings are the caller's.
 */
bool smtp_parse_destination(const char *value, const char *default_port, char **host, char **port);

/* Helpers shared with tests and the DSN code. */
bool smtp_reply_parse_line(const char *line, size_t len, int *code, bool *last,
						   const char **text);
void smtp_dot_stuff(const char *raw, size_t len, struct buf *out); /* with the final "." */
void smtp_xtext_encode(const char *in, struct buf *out);

#endif
