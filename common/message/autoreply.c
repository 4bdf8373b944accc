/*
 * autoreply.c: see autoreply.h.
 */
#include "message/autoreply.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "base/base64.h"
#include "base/xalloc.h"
#include "message/dsn.h"
#include "message/header.h"

/* The longest subject a reply gets (octets, before encoding). */
#define AUTOREPLY_MAX_SUBJECT 200

/* The first word of a field value, lower-cased (what Auto-Submitted and Precedence compare). */
static char *
autoreply_keyword(const char *value)
{
	size_t len;
	char  *word;

	while (*value == ' ' || *value == '\t')
		value++;
	len = strcspn(value, " \t;(");
	word = xstrndup(value, len);
	for (char *p = word; *p; p++)
		*p = (char) tolower((unsigned char) *p);
	return word;
}

static bool
autoreply_system_sender(const char *sender)
{
	static const char *const names[] = {"mailer-daemon", "listserv", "majordomo", "postmaster"};
	const char				*at = strrchr(sender, '@');
	size_t					 len = at ? (size_t) (at - sender) : strlen(sender);

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (len == strlen(names[i]) && strncasecmp(sender, names[i], len) == 0)
			return true;
	return (len >= 6 && strncasecmp(sender, "owner-", 6) == 0)
		   || (len >= 8 && strncasecmp(sender + len - 8, "-request", 8) == 0)
		   || (len >= 6 && strncasecmp(sender + len - 6, "-owner", 6) == 0);
}

/*
 * Is address named in a recipient field (RFC 3834 2: a personal
 * responder answers only mail explicitly written to the recipient, not a
 * list's copy, an alias's expansion or a forward)?  Any case.
 */
static bool
autoreply_addressed_to(const char *headers, size_t hlen, const char *address)
{
	static const char *const fields[] = {"To", "Cc", "Bcc", "Resent-To", "Resent-Cc", "Resent-Bcc"};
	struct buf				 values = BUF_INIT;
	char				   **list = NULL;
	size_t					 n = 0;
	bool					 found = false;

	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
	{
		buf_reset(&values);
		header_get_all(headers, hlen, fields[i], &values);
		if (values.len > 0)
			header_addresses(values.data, &list, &n);
	}
	for (size_t i = 0; i < n; i++)
	{
		found = found || strcasecmp(list[i], address) == 0;
		free(list[i]);
	}
	free(list);
	buf_free(&values);
	return found;
}

bool
autoreply_refused(const char *headers, size_t hlen, const char *sender, const char *responder,
				  char *why, size_t whylen)
{
	static const char *const list_fields[] = {"List-Id", "List-Post", "List-Unsubscribe",
											  "List-Subscribe", "List-Help", "List-Owner",
											  "List-Archive"};
	char					*value;

	if (sender == NULL || sender[0] == '\0')
	{
		snprintf(why, whylen, "the null sender");
		return true;
	}
	if (strcasecmp(sender, responder) == 0)
	{
		snprintf(why, whylen, "the responder's own address");
		return true;
	}
	if (autoreply_system_sender(sender))
	{
		snprintf(why, whylen, "a list or system sender (%s)", sender);
		return true;
	}
	if ((value = header_get(headers, hlen, "Auto-Submitted")) != NULL)
	{
		char *word = autoreply_keyword(value);
		bool  automatic = strcmp(word, "no") != 0;

		if (automatic)
			snprintf(why, whylen, "Auto-Submitted: %s", word);
		free(word);
		free(value);
		if (automatic)
			return true;
	}
	if ((value = header_get(headers, hlen, "Precedence")) != NULL)
	{
		char *word = autoreply_keyword(value);
		bool  bulk = strcmp(word, "bulk") == 0 || strcmp(word, "list") == 0 || strcmp(word, "junk") == 0;

		if (bulk)
			snprintf(why, whylen, "Precedence: %s", word);
		free(word);
		free(value);
		if (bulk)
			return true;
	}
	for (size_t i = 0; i < sizeof(list_fields) / sizeof(list_fields[0]); i++)
		if (header_count(headers, hlen, list_fields[i]) > 0)
		{
			snprintf(why, whylen, "a mailing list's message (%s)", list_fields[i]);
			return true;
		}
	if ((value = header_get(headers, hlen, "X-Auto-Response-Suppress")) != NULL)
	{
		bool suppress = strcasestr(value, "OOF") || strcasestr(value, "All");

		free(value);
		if (suppress)
		{
			snprintf(why, whylen, "X-Auto-Response-Suppress");
			return true;
		}
	}
	if (!autoreply_addressed_to(headers, hlen, responder))
	{
		snprintf(why, whylen, "<%s> is not in To or Cc (RFC 3834 2)", responder);
		return true;
	}
	return false;
}

/* A header value: one line, control characters out, at most max octets. */
static void
autoreply_clean(const char *value, size_t max, struct buf *out)
{
	size_t n = 0;

	for (const char *p = value; *p && n < max; p++, n++)
		buf_append_char(out, (unsigned char) *p < 0x20 || *p == 0x7f ? ' ' : *p);
}

/* Subject as an RFC 2047 encoded word when it is not ASCII. */
static void
autoreply_subject(const char *subject, struct buf *headers)
{
	struct buf clean = BUF_INIT;
	bool	   ascii = true;

	autoreply_clean(subject, AUTOREPLY_MAX_SUBJECT, &clean);
	for (size_t i = 0; i < clean.len; i++)
		ascii = ascii && (unsigned char) clean.data[i] < 0x80;
	buf_append_str(headers, "Subject: ");
	if (ascii)
		buf_append(headers, clean.data ? clean.data : "", clean.len);
	else
	{
		buf_append_str(headers, "=?UTF-8?B?");
		base64_append(headers, clean.data, clean.len);
		buf_append_str(headers, "?=");
	}
	buf_append_str(headers, "\r\n");
	buf_free(&clean);
}

/* A msg-id of the original, or NULL: "<...>" with nothing that would break a header. */
static char *
autoreply_msg_id(const char *headers, size_t hlen)
{
	char *value = header_get(headers, hlen, "Message-ID");
	char *start;
	char *end;
	char *id = NULL;

	if (value && (start = strchr(value, '<')) && (end = strchr(start, '>')) && end - start < 990)
	{
		id = xstrndup(start, (size_t) (end - start + 1));
		for (char *p = id; *p; p++)
			if ((unsigned char) *p <= 0x20 || *p == 0x7f)
				*p = '_';
	}
	free(value);
	return id;
}

void
autoreply_build(const struct autoreply *r, const char *headers, size_t hlen,
				struct buf *out_headers, struct buf *out_body)
{
	char  date[64];
	char *original_id = autoreply_msg_id(headers, hlen);
	char *references = header_get(headers, hlen, "References");

	dsn_format_date(time(NULL), date, sizeof(date));
	buf_printf(out_headers, "From: <%s>\r\nTo: <%s>\r\n", r->responder, r->recipient);
	if (r->subject)
		autoreply_subject(r->subject, out_headers);
	else
	{
		char	  *original = header_get(headers, hlen, "Subject");
		struct buf auto_subject = BUF_INIT;

		buf_printf(&auto_subject, "Auto: %s", original && *original ? original : "(no subject)");
		autoreply_subject(auto_subject.data, out_headers);
		buf_free(&auto_subject);
		free(original);
	}
	buf_printf(out_headers, "Date: %s\r\n", date);
	buf_printf(out_headers, "Message-ID: <autoreply.%s.%lld@%s>\r\n", r->unique,
			   (long long) time(NULL), r->hostname);
	if (original_id)
	{
		buf_printf(out_headers, "In-Reply-To: %s\r\n", original_id);
		buf_append_str(out_headers, "References: ");
		/* The original's own references first (RFC 5322 3.6.4), kept to one sane line. */
		if (references && strlen(references) < 900)
		{
			autoreply_clean(references, 900, out_headers);
			buf_append_str(out_headers, "\r\n ");
		}
		buf_printf(out_headers, "%s\r\n", original_id);
	}
	buf_append_str(out_headers, "Auto-Submitted: auto-replied\r\n"
								"MIME-Version: 1.0\r\n"
								"Content-Type: text/plain; charset=utf-8\r\n"
								"Content-Transfer-Encoding: 8bit\r\n");
	for (const char *p = r->text; *p; p++)
	{
		if (*p == '\r')
			continue;
		if (*p == '\n')
			buf_append_str(out_body, "\r\n");
		else
			buf_append_char(out_body, *p);
	}
	if (out_body->len < 2 || memcmp(out_body->data + out_body->len - 2, "\r\n", 2) != 0)
		buf_append_str(out_body, "\r\n");
	free(original_id);
	free(references);
}
