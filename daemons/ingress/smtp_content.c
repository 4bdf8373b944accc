/*
 * smtp_content.c: what arrives after the commands that open it: the
 * content of DATA (dot-stuffed, up to CRLF "." CRLF) and of BDAT chunks,
 * and the input loop that tells commands from content.  Apart from
 * smtp.c's commands because it is the part a hostile sender can make
 * large: its limits (MAX_SIZE, MAX_LINE_LENGTH, MAX_HEADER_FIELDS,
 * MAX_HEADER_SIZE, MAX_MESSAGE_MEMORY) are counted here, as the octets
 * arrive.  Bare CR, bare LF and NUL taint a message rather than end a
 * line (smtp.c's header comment says why).
 */
#include "smtp.h"
#include "smtp_internal.h"
#include "smtp_syntax.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/base64.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "message/message.h"

/*
 * Content
 */

static void
smtp_taint(struct smtp_session *s, enum smtp_taint taint)
{
	if (s->taint == SMTP_TAINT_NONE)
		s->taint = taint;
}

/*
 * Count the header section's fields and octets as its content arrives (the
 * octets kept, DATA's dot-stuffing undone), up to the empty line that ends
 * it: a message over MAX_HEADER_FIELDS or MAX_HEADER_SIZE is refused once
 * its end arrives, and nothing past the limit is kept meanwhile.  Every
 * later step that reads the header (verification, the envelope, the
 * stages) so has a bounded number of fields to look at.
 */
static void
smtp_count_header(struct smtp_session *s, const char *data, size_t len)
{
	const struct smtp_policy *p = s->policy;
	size_t					  pos = 0;

	while (pos < len && !s->header_done)
	{
		const char *nl;
		size_t		end;

		if (!s->header_in_line)
		{
			/* A line starts: the empty one ends the section, one without WSP starts a field. */
			if (data[pos] == '\r' || data[pos] == '\n')
			{
				s->header_done = true;
				break;
			}
			if (data[pos] != ' ' && data[pos] != '\t')
				s->header_fields++;
			s->header_in_line = true;
		}
		nl = memchr(data + pos, '\n', len - pos);
		end = nl ? (size_t) (nl - data) + 1 : len;
		s->header_size += end - pos;
		if (nl)
			s->header_in_line = false;
		pos = end;
	}
	if (p->max_header_fields > 0 && s->header_fields > p->max_header_fields)
		smtp_taint(s, SMTP_TAINT_HEADER_FIELDS);
	if (p->max_header_size > 0 && s->header_size > p->max_header_size)
		smtp_taint(s, SMTP_TAINT_HEADER_SIZE);
}

/* Keep content octets, unless the message is already refused. */
static void
smtp_keep_content(struct smtp_session *s, const char *data, size_t len)
{
	s->message_size += len;
	if (!s->header_done && s->taint == SMTP_TAINT_NONE)
		smtp_count_header(s, data, len);
	if (s->message_size > s->policy->max_size)
		smtp_taint(s, SMTP_TAINT_SIZE);
	if (s->policy->memory_in_flight
		&& *s->policy->memory_in_flight + len > s->policy->memory_limit)
		smtp_taint(s, SMTP_TAINT_MEMORY);
	if (s->taint != SMTP_TAINT_NONE)
	{
		smtp_message_release(s);
		return;
	}
	buf_append(&s->message, data, len);
	if (s->policy->memory_in_flight)
	{
		*s->policy->memory_in_flight += len;
		s->memory_counted += len;
	}
}

static void
smtp_content_refused(struct smtp_session *s)
{
	switch (s->taint)
	{
		case SMTP_TAINT_SIZE:
			smtp_error(s, "552 5.3.4 Message size exceeds fixed maximum message size");
			break;
		case SMTP_TAINT_LINE_LENGTH:
			smtp_error(s, "554 5.6.0 Message refused: a line is longer than %zu octets",
					   s->policy->max_line_length);
			break;
		case SMTP_TAINT_BARE_LF:
			smtp_error(s, "554 5.6.0 Message refused: bare LF (lines must end with CRLF)");
			break;
		case SMTP_TAINT_BARE_CR:
			smtp_error(s, "554 5.6.0 Message refused: bare CR (lines must end with CRLF)");
			break;
		case SMTP_TAINT_NUL:
			smtp_error(s, "554 5.6.0 Message refused: NUL octet");
			break;
		case SMTP_TAINT_MEMORY:
			smtp_reply(s, SMTP_MEMORY_REPLY); /* ours, not the client's error */
			break;
		case SMTP_TAINT_HEADER_FIELDS:
			smtp_error(s, "552 5.3.4 Message refused: the header section has more than %zu fields "
						  "(MAX_HEADER_FIELDS)",
					   s->policy->max_header_fields);
			break;
		case SMTP_TAINT_HEADER_SIZE:
			smtp_error(s, "552 5.3.4 Message refused: the header section is longer than %zu octets "
						  "(MAX_HEADER_SIZE)",
					   s->policy->max_header_size);
			break;
		case SMTP_TAINT_NONE:
			break;
	}
}

/* The end of the content: refuse it, or hand it to the host. */
static void
smtp_content_complete(struct smtp_session *s)
{
	if (s->taint != SMTP_TAINT_NONE)
	{
		s->state = SMTP_STATE_RCPT;
		smtp_content_refused(s);
		if (s->state != SMTP_STATE_CLOSED)
		{
			s->state = SMTP_STATE_IDLE;
			smtp_reset_transaction(s);
		}
		return;
	}
	s->state = SMTP_STATE_WAIT;
	s->event = SMTP_EVENT_MESSAGE;
}

/*
 * Check content octets for line ends and line length; with dots, undo
 * dot-stuffing and stop at CRLF.CRLF.  Returns the octets used (all of
 * them unless the end was found).
 */
static size_t
smtp_scan_content(struct smtp_session *s, const char *data, size_t len, bool dots)
{
	size_t keep_from = 0;
	size_t max_line = s->policy->max_line_length;
	size_t octet_by_octet_until = 0; /* a run the fast path found something in */

	for (size_t i = 0; i < len; i++)
	{
		unsigned char c;

		/*
		 * Inside a line, the octets up to the next CR need no state: when
		 * none of them is an LF or a NUL and the line stays within its
		 * limit, they are counted and passed over in one step.  Otherwise
		 * they go octet by octet below, so a tainted message is refused
		 * for the first fault in it, as ever, and a long faulty run is
		 * not searched again from each of its octets.
		 */
		if (s->scan == SMTP_SCAN_IN_LINE && i >= octet_by_octet_until)
		{
			const char *cr = memchr(data + i, '\r', len - i);
			size_t		run = (cr ? (size_t) (cr - data) : len) - i;
			size_t		room = s->line_length < max_line ? max_line - s->line_length : 0;

			if (run <= room && memchr(data + i, '\n', run) == NULL && memchr(data + i, '\0', run) == NULL)
			{
				s->line_length += run;
				i += run;
				if (i == len)
					break;
			}
			else
				octet_by_octet_until = i + run;
		}
		c = (unsigned char) data[i];
		switch (s->scan)
		{
			case SMTP_SCAN_LINE_START:
				if (dots && c == '.')
				{
					/* Held back: stuffing, or the end. */
					smtp_keep_content(s, data + keep_from, i - keep_from);
					keep_from = i + 1;
					s->scan = SMTP_SCAN_DOT;
					s->line_length = 1;
					continue;
				}
				s->line_length = 0;
				/* FALLTHROUGH */
			case SMTP_SCAN_IN_LINE:
in_line:
				if (c == '\r')
					s->scan = SMTP_SCAN_CR;
				else
				{
					if (c == '\n')
						smtp_taint(s, SMTP_TAINT_BARE_LF);
					else if (c == '\0')
						smtp_taint(s, SMTP_TAINT_NUL);
					s->scan = SMTP_SCAN_IN_LINE;
					if (++s->line_length > max_line)
						smtp_taint(s, SMTP_TAINT_LINE_LENGTH);
				}
				break;
			case SMTP_SCAN_CR:
				if (c == '\n')
				{
					s->scan = SMTP_SCAN_LINE_START;
					s->line_length = 0;
					break;
				}
				smtp_taint(s, SMTP_TAINT_BARE_CR);
				s->line_length++;
				goto in_line;
			case SMTP_SCAN_DOT:
				if (c == '\r')
				{
					/* Held back too: it may be the end. */
					keep_from = i + 1;
					s->scan = SMTP_SCAN_DOT_CR;
					continue;
				}
				/* RFC 5321 4.5.2: the first dot of the line is dropped. */
				goto in_line;
			case SMTP_SCAN_DOT_CR:
				if (c == '\n')
				{
					smtp_content_complete(s);
					return i + 1;
				}
				smtp_taint(s, SMTP_TAINT_BARE_CR);
				s->line_length++;
				goto in_line;
		}
	}
	smtp_keep_content(s, data + keep_from, len - keep_from);
	return len;
}

size_t
smtp_input_bdat(struct smtp_session *s, const char *data, size_t len)
{
	size_t n = len < s->bdat_remaining ? len : s->bdat_remaining;

	if (s->bdat_reply == NULL)
	{
		if (s->body == SMTP_BODY_BINARYMIME)
			smtp_keep_content(s, data, n);
		else
			smtp_scan_content(s, data, n, false);
	}
	s->bdat_remaining -= n;
	if (s->bdat_remaining > 0)
		return n;

	if (s->bdat_reply)
	{
		const char *reply = s->bdat_reply;

		s->bdat_reply = NULL;
		s->state = s->chunking ? SMTP_STATE_RCPT : (s->mail_from ? SMTP_STATE_MAIL : (s->helo ? SMTP_STATE_IDLE : SMTP_STATE_HELO));
		if (s->bdat_last && s->chunking)
			smtp_reset_transaction(s);
		smtp_error(s, "%s", reply);
	}
	else if (s->bdat_last)
		smtp_content_complete(s);
	else
	{
		s->state = SMTP_STATE_RCPT;
		smtp_reply(s, "250 2.0.0 %zu octets received", s->message_size);
	}
	return n;
}

/* One command line (CRLF removed), or an AUTH continuation. */
static void
smtp_input_line(struct smtp_session *s, char *line, size_t len)
{
	if (s->state == SMTP_STATE_AUTH)
	{
		line[len] = '\0';
		if (memchr(line, '\0', len) || memchr(line, '\r', len))
		{
			s->auth_step = SMTP_AUTH_NONE;
			s->state = SMTP_STATE_IDLE;
			smtp_error(s, "501 5.5.2 Cannot decode the response");
			return;
		}
		smtp_auth_response(s, line);
		explicit_bzero(line, len);
		return;
	}
	smtp_dispatch_command(s, line, len);
}

size_t
smtp_input(struct smtp_session *s, const char *data, size_t len)
{
	size_t used = 0;
	char   line[SMTP_COMMAND_MAX + 1];

	while (used < len && s->event == SMTP_EVENT_NONE)
	{
		const char *start = data + used;
		const char *nl;
		size_t		n;

		switch (s->state)
		{
			case SMTP_STATE_DATA:
				used += smtp_scan_content(s, start, len - used, true);
				continue;
			case SMTP_STATE_BDAT:
				used += smtp_input_bdat(s, start, len - used);
				continue;
			case SMTP_STATE_WAIT:
			case SMTP_STATE_CLOSED:
				return used;
			default:
				break;
		}
		nl = memchr(start, '\n', len - used);
		if (s->discarding_line)
		{
			if (nl == NULL)
				return len;
			used += (size_t) (nl - start) + 1;
			s->discarding_line = false;
			continue;
		}
		if (nl == NULL)
		{
			if (len - used > SMTP_COMMAND_MAX)
			{
				s->discarding_line = true;
				smtp_error(s, "500 5.5.2 Line too long");
				return len;
			}
			return used; /* wait for the rest of the line */
		}
		n = (size_t) (nl - start);
		used += n + 1;
		if (n > SMTP_COMMAND_MAX)
		{
			smtp_error(s, "500 5.5.2 Line too long");
			continue;
		}
		if (n == 0 || start[n - 1] != '\r')
		{
			if (s->policy->violation)
				s->policy->violation(s, SMTP_VIOLATION_BARE_NEWLINE);
			smtp_error(s, "500 5.5.2 Bare LF in command (lines must end with CRLF)");
			continue;
		}
		memcpy(line, start, n - 1);
		line[n - 1] = '\0';
		/* More commands behind this one before PIPELINING was offered: they did not wait for its reply. */
		if (!s->esmtp && used < len && s->policy->violation && s->state != SMTP_STATE_AUTH)
			s->policy->violation(s, SMTP_VIOLATION_PIPELINING);
		smtp_input_line(s, line, n - 1);
		explicit_bzero(line, n);
	}
	return used;
}
