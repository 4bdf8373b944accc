/*
 * smtp_client_internal.h: what the SMTP client's files share (not for
 * its callers): the client structure and the I/O layer of
 * smtp_client_io.c (sockets, deadlines, TLS) that the protocol layer is
 * written on: the session in smtp_client.c (EHLO, STARTTLS, reuse), its
 * authentication in smtp_auth.c and the transaction in smtp_transaction.c.
 */
#ifndef PEPSI_SMTP_CLIENT_INTERNAL_H
#define PEPSI_SMTP_CLIENT_INTERNAL_H

#include <openssl/ssl.h>

#include "smtp/smtp_client.h"

#define SMTP_LINE_MAX 4096		   /* longer reply lines are cut */
#define SMTP_REPLY_MAX (64 * 1024) /* a longer reply is an error */

enum smtp_session_state
{
	SMTP_DISCONNECTED,
	SMTP_READY
};

struct smtp_client
{
	struct smtp_client_options opt;
	enum smtp_session_state	   state;
	int						   fd;
	SSL_CTX					  *ssl_ctx;
	SSL						  *ssl;
	struct buf				   in;
	char					   peer[300];		  /* host[address]:port, for messages */
	char					   local_address[64]; /* our end of the connection (getsockname), "" for a Unix socket */
	char					   tls[160];		  /* "TLSv1.3 TLS_AES_256_GCM_SHA384 verified", or "" in clear */
	bool					   tls_verified;	  /* the peer was authenticated (PKIX or DANE) */
	const struct tls_policy	  *policy;			  /* NULL: opt.tls decides; else policy_copy */
	struct tls_policy		  *policy_copy;
	char					   tls_outcome[256];
	char					   tls_result[48];
	char					   remote_mta[256];
	/* what EHLO said */
	bool		  esmtp;
	bool		  has_starttls;
	bool		  has_pipelining;
	bool		  has_8bitmime;
	bool		  has_smtputf8;
	bool		  has_chunking;
	bool		  has_binarymime;
	bool		  has_requiretls;
	bool		  has_dsn;
	bool		  has_enhanced;
	bool		  auth_plain;
	bool		  auth_login;
	bool		  auth_xoauth2;
	bool		  auth_oauthbearer;
	bool		  has_size;
	unsigned long size_limit; /* 0: none announced */
	/* reuse */
	int		  messages;
	long long last_used_ms;
	bool	  need_rset;
	char	  error[512]; /* the last I/O error */
	char	 *owned[12];  /* the copies of the option strings */
	int		  nowned;
};

/* smtp_client_io.c */
/* Empty r for reuse (its text buffer is kept). */
void	  smtp_reply_reset(struct smtp_reply *r);
long long smtp_io_now_ms(void);
void	  smtp_io_set_error(struct smtp_client *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
const char *smtp_io_ssl_error(void);
/* Read more input before the deadline; false (error set) on EOF, error or timeout. */
bool smtp_io_fill(struct smtp_client *c, long long deadline);
/* Write all of data within the command timeout; false (error set) otherwise. */
bool smtp_io_write(struct smtp_client *c, const char *data, size_t len);
/* One whole (multi-line) reply within the command timeout. */
bool smtp_io_read_reply(struct smtp_client *c, struct smtp_reply *r);
/* Send one command line and read its reply. */
bool smtp_io_command(struct smtp_client *c, struct smtp_reply *r, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Close the socket and TLS at once (no QUIT): the session is DISCONNECTED. */
void smtp_io_drop(struct smtp_client *c);
/* Resolve and connect to the first address that answers, within the connect timeout. */
bool smtp_io_connect(struct smtp_client *c);
/* The TLS handshake after STARTTLS, verifying the peer if the options say so. */
bool smtp_io_tls_handshake(struct smtp_client *c, struct smtp_result *res);

/* smtp_auth.c */
/* Note a mechanism the EHLO reply's AUTH line names (name: m bytes, not terminated). */
void smtp_auth_offered(struct smtp_client *c, const char *name, size_t m);
/* AUTH with the options' credentials and mechanism, after STARTTLS; false (res says why) otherwise. */
bool smtp_auth(struct smtp_client *c, struct smtp_result *res);

/* smtp_transaction.c */
/* One transaction on a READY session; false on an I/O failure (the session dropped, res says where). */
bool smtp_transaction(struct smtp_client *c, const struct smtp_envelope *env, const char *raw,
					  size_t len, struct smtp_result *res);

#endif
