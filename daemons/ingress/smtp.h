/*
 * smtp.h: the server side of SMTP as a pure state machine.
 *
 * No sockets, no clock, no database: bytes go in through smtp_input,
 * replies come out in session->out, and whatever the protocol cannot
 * decide alone (start TLS, check a password, store a message, close) is
 * raised as an event that suspends input until the host answers it.  The
 * daemon (session.c) and the fuzz target (fuzz/fuzz_smtp.c) both drive it,
 * so what the fuzzer explores is exactly what faces the network.
 */
#ifndef PEPSI_INGRESS_SMTP_H
#define PEPSI_INGRESS_SMTP_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"
#include "smtp/smtp_address.h"

/* RFC 5321 4.5.3.1.4 says 512; extensions (AUTH, DSN, SMTPUTF8) need more. */
#define SMTP_COMMAND_MAX 4096
#define SMTP_HELO_MAX 255
#define SMTP_ENVID_MAX 100

struct smtp_session;

/* The host's verdict on a recipient (relay control, recipient validation). */
enum smtp_rcpt_verdict
{
	SMTP_RCPT_ACCEPT,
	SMTP_RCPT_RELAY_DENIED, /* 554 5.7.1: not ours, and the client may not relay */
	SMTP_RCPT_UNKNOWN_USER, /* 550 5.1.1: ours, but no such recipient */
	SMTP_RCPT_UNVERIFIED,	/* 451 4.3.0: ours, but it cannot be checked now */
	SMTP_RCPT_OVER_QUOTA	/* 452 4.2.2: ours, and its mailbox is full (quota_gate.c) */
};

/* What a client did that a well-behaved one does not (postscreen's after-220 tests). */
enum smtp_violation
{
	SMTP_VIOLATION_PIPELINING,	/* commands sent before PIPELINING was offered, without waiting */
	SMTP_VIOLATION_BARE_NEWLINE /* a command line ending in a bare LF */
};

/* The host's connection-level verdict (screen.h), asked at RCPT. */
enum smtp_screen_verdict
{
	SMTP_SCREEN_PASS,	/* go on; not asked again this session */
	SMTP_SCREEN_REFUSE, /* the recipient refused with the host's reply */
	SMTP_SCREEN_WAIT	/* not in yet: SMTP_EVENT_SCREEN */
};

/* The host's verdict on a recipient in the SRS domain (srs_rcpt.c). */
enum smtp_srs_verdict
{
	SMTP_SRS_NONE,		 /* not an SRS address of ours: rcpt_check decides */
	SMTP_SRS_REVERSED,	 /* rewritten in place to the original sender, taken without rcpt_check */
	SMTP_SRS_NOT_BOUNCE, /* 550 5.7.1: only the null sender may write to it */
	SMTP_SRS_INVALID,	 /* 550 5.1.1: a bad hash, expired or malformed */
	SMTP_SRS_TOO_MANY,	 /* 421 4.7.0 and close: this invalid one reached the client's limit */
	SMTP_SRS_THROTTLED	 /* 450 4.7.1: the client is over its limit, nothing checked */
};

/*
 * A message of this many octets or more is heavy: its checks (verify.c,
 * on auth_worker.h's heavy lane) and its admission (admit.c, on one
 * connection's lane) are kept apart from the others', so that a client
 * sending the biggest messages the limits allow slows its own sessions
 * first, not everyone's.
 */
#define SMTP_HEAVY_MESSAGE (64 * 1024)

/* What a listener allows; shared by its sessions, never changed by them. */
struct smtp_policy
{
	const char *hostname; /* banner, EHLO, Received */
	size_t		max_size; /* octets of message content */
	size_t		max_recipients;
	size_t		max_line_length;   /* octets of a text line, CRLF excluded */
	size_t		max_header_fields; /* fields of the header section; 0: no limit */
	size_t		max_header_size;   /* octets of the header section; 0: no limit */
	unsigned	max_errors;		   /* error replies before 421 */
	unsigned	command_rate;	   /* commands per second on average; 0: no limit */
	bool		starttls;		   /* a certificate is configured */
	bool		auth;			   /* credentials are configured */
	bool		auth_required;	   /* submission and smtps: MAIL needs AUTH */
	/* Told of each MAIL accepted (message authentication starts there); may be NULL. */
	void (*mail_accepted)(const struct smtp_session *s);
	/*
	 * Octets of message content held by every session together (the host's
	 * counter, shared by its listeners) and the most it may reach: past it
	 * new content gets 451 4.3.1.  NULL: not counted.
	 */
	size_t *memory_in_flight;
	size_t	memory_limit;
	/* Asked for each syntactically valid recipient; NULL accepts all. */
	enum smtp_rcpt_verdict (*rcpt_check)(const struct smtp_session *s, const char *address);
	/*
	 * Optional, asked at RCPT until it passes (screen.h): the client's
	 * connection-level verdict.  SMTP_SCREEN_REFUSE with the reply in
	 * reply; SMTP_SCREEN_WAIT raises SMTP_EVENT_SCREEN, and the RCPT is
	 * answered once the host calls smtp_screen_done.
	 */
	enum smtp_screen_verdict (*screen)(const struct smtp_session *s, char *reply, size_t size);
	/*
	 * Optional, asked for each recipient that passed every other check
	 * (greylisting): as screen, but for this recipient; after a WAIT the
	 * RCPT is given again and the host answers from what it learnt.
	 */
	enum smtp_screen_verdict (*rcpt_gate)(const struct smtp_session *s, const char *address,
										  char *reply, size_t size);
	/* Optional: told of each protocol violation (screen.h keeps it as the client's verdict). */
	void (*violation)(const struct smtp_session *s, enum smtp_violation v);
	/* Optional, asked for an authenticated session's sender at MAIL (not <>), as rcpt_gate. */
	enum smtp_screen_verdict (*mail_gate)(const struct smtp_session *s, const char *address,
										  char *reply, size_t size);
	/*
	 * Optional (a listener's MILTERS, milter_gate.h): told of each HELO or
	 * EHLO answered, and asked of each MAIL and RCPT that passed every
	 * other check.  True when the command waits for the filters:
	 * SMTP_EVENT_MILTER is raised and smtp_milter_done answers it.
	 */
	void (*helo_accepted)(const struct smtp_session *s);
	bool (*milter_envelope)(const struct smtp_session *s, bool mail, const char *address);
	/* Optional, asked first: the SRS reverse path, a bounce relayed back to its sender. */
	enum smtp_srs_verdict (*srs_reverse)(const struct smtp_session *s, char *address, size_t size);
};

enum smtp_state
{
	SMTP_STATE_HELO,  /* waiting for EHLO/HELO (again after STARTTLS) */
	SMTP_STATE_IDLE,  /* greeted, no transaction */
	SMTP_STATE_MAIL,  /* MAIL accepted, no recipient yet */
	SMTP_STATE_RCPT,  /* at least one recipient */
	SMTP_STATE_DATA,  /* reading DATA content up to CRLF.CRLF */
	SMTP_STATE_BDAT,  /* reading the octets of a BDAT chunk */
	SMTP_STATE_AUTH,  /* waiting for an AUTH continuation line */
	SMTP_STATE_WAIT,  /* an event is out with the host */
	SMTP_STATE_CLOSED /* nothing more is read */
};

enum smtp_event
{
	SMTP_EVENT_NONE,
	SMTP_EVENT_STARTTLS, /* flush the 220, discard unread input, handshake */
	SMTP_EVENT_AUTH,	 /* check auth_user/auth_password: smtp_auth_done */
	SMTP_EVENT_MESSAGE,	 /* admit the transaction: smtp_admit_done */
	SMTP_EVENT_CLOSE,	 /* flush the output and close */
	SMTP_EVENT_SCREEN,	 /* the client's verdict is not in yet: smtp_screen_done */
	SMTP_EVENT_MILTER	 /* the filters have the MAIL or RCPT: smtp_milter_done */
};

enum smtp_body
{
	SMTP_BODY_7BIT,
	SMTP_BODY_8BITMIME,
	SMTP_BODY_BINARYMIME
};

/* Why content was refused; the first reason found wins. */
enum smtp_taint
{
	SMTP_TAINT_NONE,
	SMTP_TAINT_SIZE,
	SMTP_TAINT_LINE_LENGTH,
	SMTP_TAINT_BARE_LF,
	SMTP_TAINT_BARE_CR,
	SMTP_TAINT_NUL,
	SMTP_TAINT_MEMORY, /* every session's content together is over the limit */
	SMTP_TAINT_HEADER_FIELDS,
	SMTP_TAINT_HEADER_SIZE
};

/* Where the DATA scanner is within a line. */
enum smtp_scan
{
	SMTP_SCAN_LINE_START,
	SMTP_SCAN_IN_LINE,
	SMTP_SCAN_CR,	 /* a CR inside a line */
	SMTP_SCAN_DOT,	 /* a dot at the start of a line */
	SMTP_SCAN_DOT_CR /* "." CR at the start of a line */
};

struct smtp_recipient
{
	char *address;
	char *notify; /* "SUCCESS,DELAY", "NEVER" or NULL */
	char *orcpt;  /* "rfc822;x@y" (xtext decoded) or NULL */
};

struct smtp_tls_info
{
	char version[32];
	char cipher[96];
	int	 bits;
};

struct smtp_session
{
	const struct smtp_policy *policy;
	void					 *host; /* the host's own, for policy->rcpt_check */
	enum smtp_state			  state;
	enum smtp_event			  event;
	struct buf				  out; /* replies not yet written */

	/* The session */
	char				*helo;
	bool				 esmtp;
	bool				 tls;
	struct smtp_tls_info tls_info;
	char				*auth_account; /* after a successful AUTH */
	unsigned			 errors;
	bool				 discarding_line;  /* skipping the rest of an over-long command */
	double				 rate_tokens;	   /* command rate bucket */
	double				 rate_elapsed;	   /* seconds since the last input; added by the host */
	bool				 screen_passed;	   /* policy->screen said pass */
	char				*screen_held;	   /* the MAIL or RCPT argument waiting for its verdict */
	bool				 screen_held_mail; /* ... MAIL's */
	enum smtp_state		 screen_resume;	   /* the state it was given in */
	/* A MAIL or RCPT the filters have (SMTP_EVENT_MILTER), parsed and checked */
	bool			milter_held_mail;
	char		   *milter_held_address;
	char		   *milter_held_notify;
	char		   *milter_held_orcpt;
	enum smtp_state milter_resume;

	/* AUTH in progress */
	enum
	{
		SMTP_AUTH_NONE,
		SMTP_AUTH_PLAIN,
		SMTP_AUTH_LOGIN_USER,
		SMTP_AUTH_LOGIN_PASSWORD
	} auth_step;
	char *auth_user;
	char *auth_password;

	/* The transaction */
	char				  *mail_from;
	bool				   smtputf8;
	bool				   requiretls; /* RFC 8689: MAIL FROM ... REQUIRETLS, over TLS only */
	enum smtp_body		   body;
	char				  *ret; /* "FULL", "HDRS" or NULL */
	char				  *envid;
	struct smtp_recipient *rcpt;
	size_t				   nrcpt;
	bool				   chunking;	   /* BDAT was used: DATA is out of sequence */
	bool				   chunk_failed;   /* a chunk was refused; the rest are skipped */
	struct buf			   message;		   /* content as received, dot-unstuffing done */
	size_t				   message_size;   /* octets received, stored or not */
	size_t				   memory_counted; /* octets of message in *policy->memory_in_flight */
	enum smtp_taint		   taint;
	enum smtp_scan		   scan;
	size_t				   line_length;
	/* The header section, counted as it arrives (up to its empty line) */
	bool		header_done;
	bool		header_in_line; /* inside a line of it, not at its start */
	size_t		header_fields;
	size_t		header_size;
	size_t		bdat_remaining;
	bool		bdat_last;
	const char *bdat_reply; /* the refusal owed when the chunk is read */
};

void smtp_init(struct smtp_session *s, const struct smtp_policy *policy);
void smtp_free(struct smtp_session *s);
/* The banner (after the TLS handshake on an smtps listener). */
void smtp_greet(struct smtp_session *s);
/*
 * Feed received bytes; returns how many were used.  The rest (a partial
 * command line, or everything after an event) must be offered again, with
 * what follows, once the event is answered; after SMTP_EVENT_STARTTLS the
 * rest must be thrown away instead.
 */
size_t smtp_input(struct smtp_session *s, const char *data, size_t len);
/*
 * The host has made its own copy of the content (the envelope, before
 * SMTP_EVENT_MESSAGE is answered): the receive buffer is freed, and its
 * share of the memory in flight stays counted for that copy until the
 * transaction ends.
 */
void smtp_message_handed_over(struct smtp_session *s);
/* The host's answers to events. */
void smtp_tls_started(struct smtp_session *s, const struct smtp_tls_info *info);
/* SMTP_EVENT_SCREEN answered: the held RCPT is answered now. */
void smtp_screen_done(struct smtp_session *s);
/* SMTP_EVENT_MILTER answered: the held MAIL or RCPT is taken (refusal NULL) or refused with it. */
void smtp_milter_done(struct smtp_session *s, const char *refusal);
void smtp_auth_done(struct smtp_session *s, bool ok);
/* AUTH answered without a check (reply, e.g. 454), or with no reply before smtp_close. */
void smtp_auth_refused(struct smtp_session *s, const char *reply);
void smtp_admit_done(struct smtp_session *s, bool ok, const char *queue_id);
/* The host refuses the content after all (reply: "554 5.6.0 ..."). */
void smtp_admit_refused(struct smtp_session *s, const char *reply);
/* The idle timeout or shutdown: a 421 and close. */
void smtp_close(struct smtp_session *s, const char *reply);
/*
 * Refusals: every 4xx and 5xx reply's last line is counted by its code
 * (smtp_reply, and the session limits' replies before a session exists),
 * since the process started; pepsi.ingress_report takes them as JSON.
 */
void		smtp_count_refusal(const char *reply);
char	   *smtp_refusals_json(void); /* {"550": 3, ...}, malloc'd */
const char *smtp_body_name(enum smtp_body body);
/* The RFC 3848 "with" keyword for Received: ESMTPSA, UTF8SMTPS... */
const char *smtp_protocol_name(const struct smtp_session *s);

/* The validators and decoders of the syntax are in smtp_syntax.h. */

#endif
