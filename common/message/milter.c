/*
 * milter.c: packets of the milter protocol, version 6 (see milter.h).
 *
 * A packet is a 32-bit big-endian length, then that many bytes: the
 * command character and its payload.  Strings in payloads are
 * NUL-terminated; nothing a filter sends is trusted to be.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "message/milter.h"

static void
milter_put_uint32(struct buf *out, uint32_t value)
{
	unsigned char bytes[4] = {value >> 24, value >> 16, value >> 8, value};

	buf_append(out, bytes, 4);
}

static uint32_t
milter_get_uint32(const char *p)
{
	const unsigned char *u = (const unsigned char *) p;

	return ((uint32_t) u[0] << 24) | ((uint32_t) u[1] << 16) | ((uint32_t) u[2] << 8) | u[3];
}

void
milter_encode(struct buf *out, char command, const void *data, size_t len)
{
	milter_put_uint32(out, (uint32_t) (len + 1));
	buf_append_char(out, command);
	if (len)
		buf_append(out, data, len);
}

void
milter_encode_optneg(struct buf *out, uint32_t actions, uint32_t protocol)
{
	milter_put_uint32(out, 13);
	buf_append_char(out, MILTER_CMD_OPTNEG);
	milter_put_uint32(out, MILTER_VERSION);
	milter_put_uint32(out, actions);
	milter_put_uint32(out, protocol);
}

/* The packet's length is known only once its payload is written. */
static size_t
milter_begin(struct buf *out, char command)
{
	size_t start = out->len;

	milter_put_uint32(out, 0);
	buf_append_char(out, command);
	return start;
}

static void
milter_end(struct buf *out, size_t start)
{
	uint32_t	   len = (uint32_t) (out->len - start - 4);
	unsigned char *p = (unsigned char *) out->data + start;

	p[0] = len >> 24;
	p[1] = len >> 16;
	p[2] = len >> 8;
	p[3] = len;
}

void
milter_encode_connect(struct buf *out, const char *hostname, const char *ip, unsigned port)
{
	size_t start = milter_begin(out, MILTER_CMD_CONNECT);

	buf_append(out, hostname, strlen(hostname) + 1);
	if (ip == NULL)
		buf_append_char(out, 'U');
	else
	{
		unsigned char port_bytes[2] = {(port >> 8) & 0xff, port & 0xff};

		buf_append_char(out, strchr(ip, ':') ? '6' : '4');
		buf_append(out, port_bytes, 2);
		buf_append(out, ip, strlen(ip) + 1);
	}
	milter_end(out, start);
}

void
milter_encode_strings(struct buf *out, char command, const char *const *strings, size_t count)
{
	size_t start = milter_begin(out, command);

	for (size_t i = 0; i < count; i++)
		buf_append(out, strings[i], strlen(strings[i]) + 1);
	milter_end(out, start);
}

void
milter_encode_macros(struct buf *out, char for_command, const char *const *names,
					 const char *const *values, size_t count)
{
	size_t start = milter_begin(out, MILTER_CMD_MACRO);

	buf_append_char(out, for_command);
	for (size_t i = 0; i < count; i++)
	{
		buf_append(out, names[i], strlen(names[i]) + 1);
		buf_append(out, values[i], strlen(values[i]) + 1);
	}
	milter_end(out, start);
}

enum milter_frame_result
milter_frame(const char *data, size_t len, size_t max_packet, char *command, const char **payload,
			 size_t *payload_len, size_t *consumed, char *err, size_t errlen)
{
	uint32_t packet_len;

	if (len < 4)
		return MILTER_FRAME_NEED_MORE;
	packet_len = milter_get_uint32(data);
	if (packet_len == 0)
	{
		snprintf(err, errlen, "the filter sent an empty packet");
		return MILTER_FRAME_ERROR;
	}
	if (packet_len > max_packet)
	{
		snprintf(err, errlen, "the filter sent a packet of %lu bytes (at most %zu are taken)",
				 (unsigned long) packet_len, max_packet);
		return MILTER_FRAME_ERROR;
	}
	if (len - 4 < packet_len)
		return MILTER_FRAME_NEED_MORE;
	*command = data[4];
	*payload = data + 5;
	*payload_len = packet_len - 1;
	*consumed = 4 + (size_t) packet_len;
	return MILTER_FRAME_OK;
}

const char *
milter_reply_name(char command)
{
	switch (command)
	{
		case MILTER_REPLY_ADDRCPT:
			return "ADDRCPT";
		case MILTER_REPLY_DELRCPT:
			return "DELRCPT";
		case MILTER_REPLY_ADDRCPT_PAR:
			return "ADDRCPT_PAR";
		case MILTER_REPLY_SHUTDOWN:
			return "SHUTDOWN";
		case MILTER_REPLY_ACCEPT:
			return "ACCEPT";
		case MILTER_REPLY_REPLBODY:
			return "REPLBODY";
		case MILTER_REPLY_CONTINUE:
			return "CONTINUE";
		case MILTER_REPLY_DISCARD:
			return "DISCARD";
		case MILTER_REPLY_CHGFROM:
			return "CHGFROM";
		case MILTER_REPLY_CONN_FAIL:
			return "CONN_FAIL";
		case MILTER_REPLY_ADDHEADER:
			return "ADDHEADER";
		case MILTER_REPLY_INSHEADER:
			return "INSHEADER";
		case MILTER_REPLY_CHGHEADER:
			return "CHGHEADER";
		case MILTER_REPLY_OPTNEG:
			return "OPTNEG";
		case MILTER_REPLY_PROGRESS:
			return "PROGRESS";
		case MILTER_REPLY_QUARANTINE:
			return "QUARANTINE";
		case MILTER_REPLY_REJECT:
			return "REJECT";
		case MILTER_REPLY_SKIP:
			return "SKIP";
		case MILTER_REPLY_TEMPFAIL:
			return "TEMPFAIL";
		case MILTER_REPLY_REPLYCODE:
			return "REPLYCODE";
	}
	return NULL;
}

/*
 * Take the next NUL-terminated string at *p (before end).  false if none
 * ends before end.
 */
static bool
milter_take_string(const char **p, const char *end, const char **out)
{
	const char *nul = memchr(*p, '\0', (size_t) (end - *p));

	if (nul == NULL)
		return false;
	*out = *p;
	*p = nul + 1;
	return true;
}

/* A header field name: printable ASCII but the colon (RFC 5322 ftext). */
static bool
milter_header_name_valid(const char *name)
{
	if (*name == '\0')
		return false;
	for (const unsigned char *c = (const unsigned char *) name; *c; c++)
		if (*c < 33 || *c > 126 || *c == ':')
			return false;
	return true;
}

/*
 * A header value from a filter: line breaks only as folds (LF or CRLF
 * followed by white space), so an edit can never start a new header or
 * end the header block.
 */
static bool
milter_header_value_valid(const char *value)
{
	for (const char *c = value; *c; c++)
	{
		if (*c == '\r')
		{
			if (c[1] != '\n')
				return false;
			continue;
		}
		if (*c == '\n' && c[1] != ' ' && c[1] != '\t')
			return false;
	}
	return true;
}

/* An address from a filter: one line, no NUL inside (ensured by the caller). */
static bool
milter_address_valid(const char *address)
{
	return *address != '\0' && strpbrk(address, "\r\n") == NULL;
}

/* "4xx"/"5xx", then a space, '-' or the end; continuation lines repeat the code. */
static bool
milter_replycode_valid(const char *text, int *code)
{
	if (text[0] != '4' && text[0] != '5')
		return false;
	if (text[1] < '0' || text[1] > '9' || text[2] < '0' || text[2] > '9')
		return false;
	if (text[3] != '\0' && text[3] != ' ' && text[3] != '-')
		return false;
	for (const char *c = text; *c; c++)
		if ((*c == '\r' && c[1] != '\n') || (*c == '\n' && strncmp(c + 1, text, 3) != 0))
			return false;
	*code = (text[0] - '0') * 100 + (text[1] - '0') * 10 + (text[2] - '0');
	return true;
}

bool
milter_parse_reply(char command, const char *payload, size_t len, struct milter_reply *r,
				   char *err, size_t errlen)
{
	const char *p = payload;
	const char *end = payload + len;
	const char *name = milter_reply_name(command);

	memset(r, 0, sizeof(*r));
	r->command = command;
	if (name == NULL)
	{
		snprintf(err, errlen, "the filter sent an unknown reply 0x%02x", (unsigned char) command);
		return false;
	}
	switch (command)
	{
		case MILTER_REPLY_OPTNEG:
			if (len < 12)
				goto malformed;
			r->version = milter_get_uint32(p);
			r->actions = milter_get_uint32(p + 4);
			r->protocol = milter_get_uint32(p + 8);
			p += 12;
			while (p < end)
			{
				uint32_t	stage;
				const char *list;

				if (end - p < 4)
					goto malformed;
				stage = milter_get_uint32(p);
				p += 4;
				if (stage >= MILTER_MACRO_STAGES || !milter_take_string(&p, end, &list))
					goto malformed;
				r->macros[stage] = list;
			}
			return true;

		case MILTER_REPLY_REPLYCODE:
			if (!milter_take_string(&p, end, &r->text) || p != end
				|| !milter_replycode_valid(r->text, &r->code))
				goto malformed;
			return true;

		case MILTER_REPLY_INSHEADER:
		case MILTER_REPLY_CHGHEADER:
			if (len < 4)
				goto malformed;
			r->index = milter_get_uint32(p);
			p += 4;
			/* FALLTHROUGH */
		case MILTER_REPLY_ADDHEADER:
			if (!milter_take_string(&p, end, &r->name) || !milter_take_string(&p, end, &r->value)
				|| p != end || !milter_header_name_valid(r->name)
				|| !milter_header_value_valid(r->value))
				goto malformed;
			return true;

		case MILTER_REPLY_ADDRCPT:
		case MILTER_REPLY_DELRCPT:
		case MILTER_REPLY_QUARANTINE:
			if (!milter_take_string(&p, end, &r->text) || p != end)
				goto malformed;
			if (command != MILTER_REPLY_QUARANTINE && !milter_address_valid(r->text))
				goto malformed;
			if (command == MILTER_REPLY_QUARANTINE && strpbrk(r->text, "\r\n"))
				goto malformed;
			return true;

		case MILTER_REPLY_CHGFROM:
		case MILTER_REPLY_ADDRCPT_PAR:
			if (!milter_take_string(&p, end, &r->text) || !milter_address_valid(r->text))
				goto malformed;
			if (p < end && (!milter_take_string(&p, end, &r->args) || strpbrk(r->args, "\r\n")))
				goto malformed;
			if (p != end)
				goto malformed;
			return true;

		case MILTER_REPLY_REPLBODY:
			r->data = payload;
			r->data_len = len;
			return true;

		default:
			/* accept, continue, discard, reject, tempfail, skip, progress, ... carry nothing */
			if (len != 0)
				goto malformed;
			return true;
	}

malformed:
	snprintf(err, errlen, "the filter sent a malformed %s reply (%zu bytes)", name, len);
	return false;
}

bool
milter_parse_address(const char *text, struct milter_address *a, char *err, size_t errlen)
{
	memset(a, 0, sizeof(*a));
	if (strncmp(text, "unix:", 5) == 0 || text[0] == '/')
	{
		const char *path = text[0] == '/' ? text : text + 5;

		if (path[0] != '/')
		{
			snprintf(err, errlen, "milter address \"%s\": a unix socket needs an absolute path", text);
			return false;
		}
		a->family = MILTER_ADDRESS_UNIX;
		a->path = xstrdup(path);
		return true;
	}
	if (strncmp(text, "inet:", 5) == 0 || strncmp(text, "inet6:", 6) == 0)
	{
		const char *rest = strchr(text, ':') + 1;
		const char *colon;

		if (rest[0] == '[')
		{
			const char *close = strchr(rest, ']');

			if (close == NULL || close == rest + 1 || close[1] != ':')
				goto bad;
			a->host = xstrndup(rest + 1, (size_t) (close - rest - 1));
			colon = close + 1;
		}
		else
		{
			colon = strrchr(rest, ':');
			if (colon == NULL || colon == rest)
				goto bad;
			a->host = xstrndup(rest, (size_t) (colon - rest));
		}
		if (colon[1] == '\0' || strspn(colon + 1, "0123456789") != strlen(colon + 1)
			|| atol(colon + 1) < 1 || atol(colon + 1) > 65535)
		{
			free(a->host);
			a->host = NULL;
			goto bad;
		}
		a->family = MILTER_ADDRESS_INET;
		a->port = xstrdup(colon + 1);
		return true;
	}
bad:
	snprintf(err, errlen, "milter address \"%s\" is not inet:host:port, inet:[address]:port "
						  "or unix:/path",
			 text);
	return false;
}

void
milter_address_free(struct milter_address *a)
{
	free(a->host);
	free(a->port);
	free(a->path);
	memset(a, 0, sizeof(*a));
}
