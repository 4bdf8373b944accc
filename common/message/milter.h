/*
 * milter.h: the Sendmail/Postfix milter protocol, version 6, from the
 * MTA's side (pepsi-stage-milter is its user).
 *
 * Pure code, no I/O: encoders that append whole packets to a buffer, the
 * framing that cuts packets out of what a filter sent, and the parser that
 * checks each reply's payload before anything acts on it.  A filter is an
 * outside program, so every length and every string in its packets is
 * verified here; the fuzz target (common/fuzz/fuzz_milter.c) drives these.
 */
#ifndef PEPSI_MILTER_H
#define PEPSI_MILTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

#define MILTER_VERSION 6
/* Body chunks: the size libmilter reads (MILTER_CHUNK_SIZE). */
#define MILTER_CHUNK_SIZE 65535
/* The largest packet taken from a filter; anything bigger is a protocol error. */
#define MILTER_MAX_PACKET (1024 * 1024)

/* Commands, MTA to filter (SMFIC_*). */
#define MILTER_CMD_ABORT 'A'
#define MILTER_CMD_BODY 'B'
#define MILTER_CMD_CONNECT 'C'
#define MILTER_CMD_MACRO 'D'
#define MILTER_CMD_EOM 'E'
#define MILTER_CMD_HELO 'H'
#define MILTER_CMD_QUIT_NEW_CONNECTION 'K'
#define MILTER_CMD_HEADER 'L'
#define MILTER_CMD_MAIL 'M'
#define MILTER_CMD_EOH 'N'
#define MILTER_CMD_OPTNEG 'O'
#define MILTER_CMD_QUIT 'Q'
#define MILTER_CMD_RCPT 'R'
#define MILTER_CMD_DATA 'T'

/* Replies, filter to MTA (SMFIR_*). */
#define MILTER_REPLY_ADDRCPT '+'
#define MILTER_REPLY_DELRCPT '-'
#define MILTER_REPLY_ADDRCPT_PAR '2'
#define MILTER_REPLY_SHUTDOWN '4'
#define MILTER_REPLY_ACCEPT 'a'
#define MILTER_REPLY_REPLBODY 'b'
#define MILTER_REPLY_CONTINUE 'c'
#define MILTER_REPLY_DISCARD 'd'
#define MILTER_REPLY_CHGFROM 'e'
#define MILTER_REPLY_CONN_FAIL 'f'
#define MILTER_REPLY_ADDHEADER 'h'
#define MILTER_REPLY_INSHEADER 'i'
#define MILTER_REPLY_CHGHEADER 'm'
#define MILTER_REPLY_OPTNEG 'O'
#define MILTER_REPLY_PROGRESS 'p'
#define MILTER_REPLY_QUARANTINE 'q'
#define MILTER_REPLY_REJECT 'r'
#define MILTER_REPLY_SKIP 's'
#define MILTER_REPLY_TEMPFAIL 't'
#define MILTER_REPLY_REPLYCODE 'y'

/* Actions a filter may take at end of message (SMFIF_*). */
#define MILTER_ACTION_ADDHDRS 0x01
#define MILTER_ACTION_CHGBODY 0x02
#define MILTER_ACTION_ADDRCPT 0x04
#define MILTER_ACTION_DELRCPT 0x08
#define MILTER_ACTION_CHGHDRS 0x10
#define MILTER_ACTION_QUARANTINE 0x20
#define MILTER_ACTION_CHGFROM 0x40
#define MILTER_ACTION_ADDRCPT_PAR 0x80
#define MILTER_ACTION_SETSYMLIST 0x100
#define MILTER_ACTIONS_ALL 0x1ff

/* Protocol steps a filter may skip or not answer (SMFIP_*). */
#define MILTER_PROTO_NOCONNECT 0x01
#define MILTER_PROTO_NOHELO 0x02
#define MILTER_PROTO_NOMAIL 0x04
#define MILTER_PROTO_NORCPT 0x08
#define MILTER_PROTO_NOBODY 0x10
#define MILTER_PROTO_NOHDRS 0x20
#define MILTER_PROTO_NOEOH 0x40
#define MILTER_PROTO_NR_HDR 0x80
#define MILTER_PROTO_NOUNKNOWN 0x100
#define MILTER_PROTO_NODATA 0x200
#define MILTER_PROTO_SKIP 0x400
#define MILTER_PROTO_RCPT_REJ 0x800
#define MILTER_PROTO_NR_CONN 0x1000
#define MILTER_PROTO_NR_HELO 0x2000
#define MILTER_PROTO_NR_MAIL 0x4000
#define MILTER_PROTO_NR_RCPT 0x8000
#define MILTER_PROTO_NR_DATA 0x10000
#define MILTER_PROTO_NR_UNKN 0x20000
#define MILTER_PROTO_NR_EOH 0x40000
#define MILTER_PROTO_NR_BODY 0x80000
#define MILTER_PROTO_HDR_LEADSPC 0x100000
/* What this client offers: every step and no-reply flag but RCPT_REJ (it sends no rejected recipients). */
#define MILTER_PROTO_OFFERED 0x1ff7ff

/* The macro stages a filter may ask for in its negotiation (SMFIM_*). */
enum milter_macro_stage
{
	MILTER_MACROS_CONNECT = 0,
	MILTER_MACROS_HELO,
	MILTER_MACROS_MAIL,
	MILTER_MACROS_RCPT,
	MILTER_MACROS_DATA,
	MILTER_MACROS_EOM,
	MILTER_MACROS_EOH,
	MILTER_MACRO_STAGES
};

/* Encoders: each appends one whole packet. */
void milter_encode(struct buf *out, char command, const void *data, size_t len);
void milter_encode_optneg(struct buf *out, uint32_t actions, uint32_t protocol);
/* ip NULL: family unknown (a message submitted locally). */
void milter_encode_connect(struct buf *out, const char *hostname, const char *ip, unsigned port);
/* The NUL-terminated strings one after another: HELO, MAIL, RCPT, HEADER. */
void milter_encode_strings(struct buf *out, char command, const char *const *strings, size_t count);
/* A MACRO packet for the command that follows it: name, value pairs. */
void milter_encode_macros(struct buf *out, char for_command, const char *const *names,
						  const char *const *values, size_t count);

enum milter_frame_result
{
	MILTER_FRAME_NEED_MORE, /* not a whole packet yet */
	MILTER_FRAME_OK,
	MILTER_FRAME_ERROR /* err says why; the connection cannot go on */
};

/*
 * Cut the first packet out of data: its command, payload (pointing into
 * data) and the bytes it took.  A packet above max_packet, or an empty
 * one, is an error.
 */
enum milter_frame_result milter_frame(const char *data, size_t len, size_t max_packet, char *command,
									  const char **payload, size_t *payload_len, size_t *consumed,
									  char *err, size_t errlen);

/* One reply, checked.  Strings point into the payload and are NUL-terminated there. */
struct milter_reply
{
	char command;
	/* OPTNEG */
	uint32_t	version;
	uint32_t	actions;
	uint32_t	protocol;
	const char *macros[MILTER_MACRO_STAGES]; /* NULL: the default list */
	/* REPLYCODE: the SMTP code and the whole reply text ("550 5.7.1 spam") */
	int code;
	/* ADDHEADER, INSHEADER, CHGHEADER (index: the header's occurrence or position) */
	uint32_t	index;
	const char *name;
	const char *value;
	/* REPLYCODE text, QUARANTINE reason, ADDRCPT/DELRCPT/CHGFROM address */
	const char *text;
	const char *args; /* ESMTP arguments of CHGFROM, ADDRCPT_PAR, or NULL */
	/* REPLBODY */
	const char *data;
	size_t		data_len;
};

/* Check a reply's payload; false with err naming what is wrong. */
bool milter_parse_reply(char command, const char *payload, size_t len, struct milter_reply *r,
						char *err, size_t errlen);

/* A milter's name for messages: "reply 'y' (REPLYCODE)". */
const char *milter_reply_name(char command);

/* Where a filter listens: inet:host:port, inet6:host:port, unix:/path (Postfix's spellings). */
struct milter_address
{
	enum
	{
		MILTER_ADDRESS_INET,
		MILTER_ADDRESS_UNIX
	} family;
	char *host; /* INET */
	char *port; /* INET */
	char *path; /* UNIX */
};

/* Parse one address; false with err.  Free with milter_address_free. */
bool milter_parse_address(const char *text, struct milter_address *a, char *err, size_t errlen);
void milter_address_free(struct milter_address *a);

#endif
