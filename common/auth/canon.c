/* canon.c: see canon.h. */
#include "auth/canon.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/evp.h>

#include "base/log.h"
#include "base/xalloc.h"

/* SHA-256 through EVP: OpenSSL 3 deprecates the SHA256_* calls. */
static EVP_MD_CTX *
canon_sha256_begin(void)
{
	/* Fetched once: OpenSSL 3 would look the algorithm up at every init. */
	static EVP_MD *sha256;
	EVP_MD_CTX	  *md = EVP_MD_CTX_new();

	if (sha256 == NULL)
		sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
	if (md == NULL || sha256 == NULL || EVP_DigestInit_ex(md, sha256, NULL) != 1)
		fatalx("cannot start a SHA-256 digest");
	return md;
}

static void
canon_sha256_end(EVP_MD_CTX *md, unsigned char hash[CANON_HASH_LEN])
{
	unsigned len = CANON_HASH_LEN;

	EVP_DigestFinal_ex(md, hash, &len);
	EVP_MD_CTX_free(md);
}

static bool
canon_is_wsp(char c)
{
	return c == ' ' || c == '\t';
}

bool
header_fields_parse(const char *headers, size_t len, size_t max_line,
					struct header_fields *out, char *err, size_t errlen)
{
	size_t	 cap = 32;
	size_t	 pos = 0;
	unsigned line = 0;

	out->count = 0;
	out->field = xcalloc(cap, sizeof(*out->field));
	while (pos < len)
	{
		const char *nl = memchr(headers + pos, '\n', len - pos);
		size_t		end = nl ? (size_t) (nl - headers) + 1 : len;
		size_t		content = end - pos - (nl ? 1 : 0);

		line++;
		if (content > 0 && headers[pos + content - 1] == '\r')
			content--;
		if (max_line > 0 && content > max_line)
		{
			snprintf(err, errlen, "header line %u is %zu octets long, over the limit of %zu",
					 line, content, max_line);
			goto fail;
		}
		if (canon_is_wsp(headers[pos]))
		{
			if (out->count == 0)
			{
				snprintf(err, errlen, "header line %u continues a field that does not exist", line);
				goto fail;
			}
			out->field[out->count - 1].len = end - (size_t) (out->field[out->count - 1].start - headers);
		}
		else
		{
			const char *colon = memchr(headers + pos, ':', content);
			size_t		name_len;

			if (colon == NULL || colon == headers + pos)
			{
				snprintf(err, errlen, "header line %u is not a field (no name and colon)", line);
				goto fail;
			}
			name_len = (size_t) (colon - (headers + pos));
			while (name_len > 0 && canon_is_wsp(headers[pos + name_len - 1]))
				name_len--;
			if (out->count == cap)
			{
				cap *= 2;
				out->field = xrealloc(out->field, cap * sizeof(*out->field));
			}
			out->field[out->count++] = (struct header_field){
				.start = headers + pos, .len = end - pos, .name_len = name_len};
		}
		pos = end;
	}
	return true;

fail:
	header_fields_free(out);
	return false;
}

void
header_fields_free(struct header_fields *fields)
{
	free(fields->field);
	fields->field = NULL;
	fields->count = 0;
}

bool
header_field_named(const struct header_field *f, const char *name, size_t name_len)
{
	return f->name_len == name_len && strncasecmp(f->start, name, name_len) == 0;
}

size_t
header_fields_count(const struct header_fields *fields, const char *name)
{
	size_t n = 0;

	for (size_t i = 0; i < fields->count; i++)
		if (header_field_named(&fields->field[i], name, strlen(name)))
			n++;
	return n;
}

const char *
header_field_value(const struct header_field *f, size_t *len)
{
	const char *colon = memchr(f->start, ':', f->len);

	*len = f->len - (size_t) (colon + 1 - f->start);
	return colon + 1;
}

void
header_fields_reset(struct header_fields *fields)
{
	for (size_t i = 0; i < fields->count; i++)
		fields->field[i].used = false;
}

bool
canon_parse(const char *text, size_t len, enum canon *out)
{
	if (len == 6 && strncasecmp(text, "simple", 6) == 0)
		*out = CANON_SIMPLE;
	else if (len == 7 && strncasecmp(text, "relaxed", 7) == 0)
		*out = CANON_RELAXED;
	else
		return false;
	return true;
}

const char *
canon_name(enum canon c)
{
	return c == CANON_SIMPLE ? "simple" : "relaxed";
}

/*
 * RFC 6376 3.4.2: lower-case name, unfolded value, runs of whitespace one
 * space, none at either end of the value, none around the colon.
 */
static void
canon_header_relaxed(const char *field, size_t len, struct buf *out)
{
	const char *colon = memchr(field, ':', len);
	size_t		name_len = colon ? (size_t) (colon - field) : len;
	bool		pending_space = false;
	bool		started = false;

	while (name_len > 0 && canon_is_wsp(field[name_len - 1]))
		name_len--;
	buf_reserve(out, len + 2);
	for (size_t i = 0; i < name_len; i++)
		out->data[out->len++] = (char) tolower((unsigned char) field[i]);
	out->data[out->len++] = ':';
	for (size_t i = colon ? (size_t) (colon - field) + 1 : len; i < len; i++)
	{
		char c = field[i];

		if (c == '\r' || c == '\n')
			continue;
		if (canon_is_wsp(c))
		{
			pending_space = started;
			continue;
		}
		if (pending_space)
			out->data[out->len++] = ' ';
		pending_space = false;
		started = true;
		out->data[out->len++] = c;
	}
	out->data[out->len++] = '\r';
	out->data[out->len++] = '\n';
	out->data[out->len] = '\0';
}

void
canon_header(enum canon c, const char *field, size_t len, struct buf *out)
{
	if (c == CANON_RELAXED)
	{
		canon_header_relaxed(field, len, out);
		return;
	}
	buf_append(out, field, len);
	/* The last field of a block may lack its line end; the hash wants one. */
	if (len < 2 || field[len - 2] != '\r' || field[len - 1] != '\n')
	{
		if (len > 0 && field[len - 1] == '\n')
			out->len--;
		buf_append(out, "\r\n", 2);
	}
}

/*
 * The canonical body goes to the hash through a staging buffer: one
 * digest update per buffer-full rather than two per line, which on a
 * body of short lines cost more than hashing it.
 */
#define CANON_STAGE_SIZE 16384

struct canon_stage
{
	EVP_MD_CTX *sha;
	size_t		len;
	char		data[CANON_STAGE_SIZE];
};

static void
canon_stage_flush(struct canon_stage *st)
{
	if (st->len)
		EVP_DigestUpdate(st->sha, st->data, st->len);
	st->len = 0;
}

static void
canon_stage_crlf(struct canon_stage *st)
{
	if (st->len + 2 > CANON_STAGE_SIZE)
		canon_stage_flush(st);
	st->data[st->len++] = '\r';
	st->data[st->len++] = '\n';
}

static void
canon_stage_put(struct canon_stage *st, const char *text, size_t len)
{
	if (st->len + len > CANON_STAGE_SIZE)
	{
		canon_stage_flush(st);
		if (len > CANON_STAGE_SIZE)
		{
			EVP_DigestUpdate(st->sha, text, len);
			return;
		}
	}
	memcpy(st->data + st->len, text, len);
	st->len += len;
}

/* One line's content, relaxed (3.4.4): WSP runs as one SP, none at the end. */
static void
canon_stage_relaxed_line(struct canon_stage *st, const char *text, size_t len)
{
	bool space = false;

	for (size_t i = 0; i < len; i++)
	{
		char c = text[i];

		if (canon_is_wsp(c))
		{
			space = true;
			continue;
		}
		if (st->len + 2 > CANON_STAGE_SIZE)
			canon_stage_flush(st);
		if (space)
			st->data[st->len++] = ' ';
		space = false;
		st->data[st->len++] = c;
	}
}

/*
 * Is a line (its content, before the CRLF that ends it) its own relaxed
 * form: no tab, no run of two spaces, no space at the end?  Then the
 * canonical body holds its bytes as they are.  Eight octets at a time:
 * this runs over every line of every body signed.
 */
static uint64_t
canon_zero_octets(uint64_t x)
{
	const uint64_t low7 = 0x7f7f7f7f7f7f7f7fULL;

	/* 0x80 in each octet of x that is zero, nothing elsewhere (no borrow across octets). */
	return ~(((x & low7) + low7) | x | low7);
}

static bool
canon_relaxed_unchanged(const char *text, size_t len)
{
	const uint64_t spaces = 0x2020202020202020ULL;
	const uint64_t tabs = 0x0909090909090909ULL;
	size_t		   i = 0;

	if (len > 0 && text[len - 1] == ' ')
		return false;
	for (; i + 8 <= len; i += 8)
	{
		uint64_t word;
		uint64_t space;

		memcpy(&word, text + i, 8);
		if (canon_zero_octets(word ^ tabs))
			return false;
		space = canon_zero_octets(word ^ spaces);
		/* Two neighbouring octets, whichever the byte order; and across words. */
		if ((space & (space >> 8)) || (i > 0 && text[i] == ' ' && text[i - 1] == ' '))
			return false;
	}
	for (; i < len; i++)
		if (text[i] == '\t' || (text[i] == ' ' && i > 0 && text[i - 1] == ' '))
			return false;
	return true;
}

/*
 * The body, line by line, in one pass and no copy of it.  Empty lines
 * (relaxed: lines of WSP only) are held back and written only when a
 * non-empty line follows, which drops the trailing ones (3.4.3, 3.4.4).
 *
 * Most lines of most bodies end in CRLF and (relaxed) have no whitespace
 * to fold: their canonical form is their own bytes.  A run of such lines
 * (and of bare CRLF empty lines between them) goes to the hash straight
 * from the body, in one update; only the other lines are rewritten,
 * through the staging buffer.  Before the body is hashed directly, what
 * is staged goes first, so the order is kept.
 */
void
canon_body_hash(enum canon c, const char *body, size_t len, unsigned char hash[CANON_HASH_LEN])
{
	struct canon_stage *st = xmalloc(sizeof(*st));
	size_t				same_from = 0;	  /* the body from here on is its own canonical form */
	size_t				held_empty = 0;	  /* empty lines held back */
	size_t				held_from = 0;	  /* where the first of them starts */
	bool				held_same = true; /* and they are all bare CRLFs */
	bool				any = false;

	st->sha = canon_sha256_begin();
	st->len = 0;
	for (size_t pos = 0; pos < len;)
	{
		const char *nl = memchr(body + pos, '\n', len - pos);
		size_t		end = nl ? (size_t) (nl - body) + 1 : len;
		size_t		content = end - pos - (nl ? 1 : 0);
		const char *text = body + pos;
		size_t		first = 0;
		bool		crlf = false;
		bool		same;

		if (content > 0 && text[content - 1] == '\r' && nl)
		{
			content--;
			crlf = true;
		}
		if (c == CANON_RELAXED)
			while (first < content && canon_is_wsp(text[first]))
				first++;
		if (first == content)
		{
			if (held_empty++ == 0)
			{
				held_from = pos;
				held_same = true;
			}
			held_same = held_same && crlf && content == 0;
			pos = end;
			continue;
		}
		same = crlf && (c == CANON_SIMPLE || canon_relaxed_unchanged(text, content));
		if (!same || (held_empty > 0 && !held_same))
		{
			/* The body as it is up to here (without the held lines), then the rewritten part. */
			size_t same_to = held_empty > 0 ? held_from : pos;

			if (same_to > same_from)
			{
				canon_stage_flush(st);
				EVP_DigestUpdate(st->sha, body + same_from, same_to - same_from);
			}
			for (; held_empty > 0; held_empty--)
				canon_stage_crlf(st);
			if (same)
				same_from = pos;
			else
			{
				if (c == CANON_RELAXED)
					canon_stage_relaxed_line(st, text, content);
				else
					canon_stage_put(st, text, content);
				canon_stage_crlf(st);
				same_from = end;
			}
		}
		held_empty = 0;
		any = true;
		pos = end;
	}
	/* What is left of the body as it is, without the trailing empty lines. */
	{
		size_t same_to = held_empty > 0 ? held_from : len;

		if (same_to > same_from)
		{
			canon_stage_flush(st);
			EVP_DigestUpdate(st->sha, body + same_from, same_to - same_from);
		}
	}
	/* An empty body is one CRLF to simple, nothing to relaxed. */
	if (!any && c == CANON_SIMPLE)
		canon_stage_crlf(st);
	canon_stage_flush(st);
	canon_sha256_end(st->sha, hash);
	free(st);
}

/*
 * The signature field with the value of its b= tag cut out (whitespace
 * around it included, as it is part of the value to RFC 6376 3.5).
 */
static void
canon_without_b_value(const char *field, size_t len, struct buf *out)
{
	const char *colon = memchr(field, ':', len);
	size_t		pos = colon ? (size_t) (colon - field) + 1 : len;

	buf_append(out, field, pos);
	while (pos < len)
	{
		const char *semi = memchr(field + pos, ';', len - pos);
		size_t		end = semi ? (size_t) (semi - field) : len;
		const char *eq = memchr(field + pos, '=', end - pos);
		size_t		name_start = pos;
		size_t		name_end = eq ? (size_t) (eq - field) : end;

		while (name_start < name_end && isspace((unsigned char) field[name_start]))
			name_start++;
		while (name_end > name_start && isspace((unsigned char) field[name_end - 1]))
			name_end--;
		if (eq && name_end - name_start == 1 && field[name_start] == 'b')
		{
			buf_append(out, field + pos, (size_t) (eq - field) + 1 - pos);
			/* Keep the line end that closes the field, if b= is last. */
			if (!semi && len >= 2 && field[len - 2] == '\r')
				buf_append(out, "\r\n", 2);
		}
		else
			buf_append(out, field + pos, end - pos);
		if (semi)
			buf_append_char(out, ';');
		pos = semi ? end + 1 : len;
	}
}

/* Hash the listed fields, then the signature field without its b= value and final CRLF. */
void
canon_hash_fields(enum canon c, const struct header_field *const *list, size_t n,
				  const char *signature, size_t signature_len, unsigned char hash[CANON_HASH_LEN])
{
	EVP_MD_CTX *sha = canon_sha256_begin();
	struct buf	canon = BUF_INIT;
	struct buf	stripped = BUF_INIT;

	for (size_t i = 0; i < n; i++)
	{
		buf_reset(&canon);
		canon_header(c, list[i]->start, list[i]->len, &canon);
		EVP_DigestUpdate(sha, canon.data, canon.len);
	}
	canon_without_b_value(signature, signature_len, &stripped);
	buf_reset(&canon);
	canon_header(c, stripped.data, stripped.len, &canon);
	EVP_DigestUpdate(sha, canon.data, canon.len - 2); /* without the final CRLF */
	canon_sha256_end(sha, hash);
	buf_free(&canon);
	buf_free(&stripped);
}

size_t
canon_names_count(const char *names, size_t len)
{
	size_t n = 1;
	bool   blank = true;

	for (size_t i = 0; i < len; i++)
		if (names[i] == ':')
			n++;
		else if (!isspace((unsigned char) names[i]))
			blank = false;
	return blank && n == 1 ? 0 : n;
}

/* A field's name and position, for the index canon_header_hash sorts. */
struct canon_name_entry
{
	const char *name;
	size_t		len;
	size_t		index;
};

static int
canon_name_compare(const char *a, size_t alen, const char *b, size_t blen)
{
	int c = strncasecmp(a, b, alen < blen ? alen : blen);

	if (c != 0)
		return c;
	return alen < blen ? -1 : alen > blen;
}

/* By name without case, then the last instance first. */
static int
canon_entry_order(const void *x, const void *y)
{
	const struct canon_name_entry *a = x;
	const struct canon_name_entry *b = y;
	int							   c = canon_name_compare(a->name, a->len, b->name, b->len);

	if (c != 0)
		return c;
	return a->index < b->index ? 1 : a->index > b->index ? -1
														 : 0;
}

void
canon_header_hash(enum canon c, struct header_fields *fields, const char *names,
				  const char *signature, size_t signature_len, unsigned char hash[CANON_HASH_LEN])
{
	size_t						count = fields->count;
	const struct header_field **list = xcalloc(count + 1, sizeof(*list));
	struct canon_name_entry	   *index = xcalloc(count + 1, sizeof(*index));
	size_t					   *cursor = xcalloc(count + 1, sizeof(*cursor));
	size_t						n = 0;

	/*
	 * Each name's instances sit together, the last first; a group's first
	 * entry keeps where the next instance not yet taken may be.
	 */
	for (size_t i = 0; i < count; i++)
		index[i] = (struct canon_name_entry){fields->field[i].start, fields->field[i].name_len, i};
	qsort(index, count, sizeof(*index), canon_entry_order);
	for (size_t i = 0; i < count; i++)
		cursor[i] = i;
	for (const char *p = names; *p;)
	{
		size_t		len = strcspn(p, ":");
		const char *name = p;
		size_t		name_len = len;
		size_t		lo = 0,
			   hi = count;

		while (name_len > 0 && isspace((unsigned char) *name))
			name++, name_len--;
		while (name_len > 0 && isspace((unsigned char) name[name_len - 1]))
			name_len--;
		/* The group's first entry: the first not before the name. */
		while (lo < hi)
		{
			size_t mid = lo + (hi - lo) / 2;

			if (canon_name_compare(index[mid].name, index[mid].len, name, name_len) < 0)
				lo = mid + 1;
			else
				hi = mid;
		}
		if (name_len > 0 && lo < count
			&& canon_name_compare(index[lo].name, index[lo].len, name, name_len) == 0)
		{
			size_t k = cursor[lo];

			/* Instances taken before (the signature itself, for one) are passed over. */
			while (k < count && fields->field[index[k].index].used
				   && canon_name_compare(index[k].name, index[k].len, name, name_len) == 0)
				k++;
			if (k < count && canon_name_compare(index[k].name, index[k].len, name, name_len) == 0)
			{
				struct header_field *f = &fields->field[index[k].index];

				f->used = true;
				list[n++] = f;
				k++;
			}
			cursor[lo] = k;
		}
		p += len;
		if (*p == ':')
			p++;
	}
	canon_hash_fields(c, list, n, signature, signature_len, hash);
	free(cursor);
	free(index);
	free(list);
}

bool
tag_list_parse(const char *text, size_t len, struct tag *tags, size_t max, size_t *count)
{
	size_t pos = 0;

	*count = 0;
	while (pos < len)
	{
		const char *semi = memchr(text + pos, ';', len - pos);
		size_t		end = semi ? (size_t) (semi - text) : len;
		const char *eq = memchr(text + pos, '=', end - pos);
		struct tag	t;

		if (eq == NULL)
		{
			/* Only whitespace may follow the last ';'. */
			for (size_t i = pos; i < end; i++)
				if (!isspace((unsigned char) text[i]))
					return false;
			break;
		}
		t.name = text + pos;
		t.name_len = (size_t) (eq - t.name);
		while (t.name_len > 0 && isspace((unsigned char) *t.name))
			t.name++, t.name_len--;
		while (t.name_len > 0 && isspace((unsigned char) t.name[t.name_len - 1]))
			t.name_len--;
		if (t.name_len == 0 || !isalpha((unsigned char) t.name[0]))
			return false;
		for (size_t i = 0; i < t.name_len; i++)
			if (!isalnum((unsigned char) t.name[i]) && t.name[i] != '_')
				return false;
		t.value = eq + 1;
		t.value_len = (size_t) (text + end - t.value);
		while (t.value_len > 0 && isspace((unsigned char) *t.value))
			t.value++, t.value_len--;
		while (t.value_len > 0 && isspace((unsigned char) t.value[t.value_len - 1]))
			t.value_len--;
		for (size_t i = 0; i < *count; i++)
			if (tags[i].name_len == t.name_len && memcmp(tags[i].name, t.name, t.name_len) == 0)
				return false;
		if (*count == max)
			return false;
		tags[(*count)++] = t;
		pos = semi ? end + 1 : len;
	}
	return true;
}

const struct tag *
tag_find(const struct tag *tags, size_t count, const char *name)
{
	size_t n = strlen(name);

	for (size_t i = 0; i < count; i++)
		if (tags[i].name_len == n && memcmp(tags[i].name, name, n) == 0)
			return &tags[i];
	return NULL;
}

char *
tag_strdup(const struct tag *tags, size_t count, const char *name)
{
	const struct tag *t = tag_find(tags, count, name);

	return t ? xstrndup(t->value, t->value_len) : NULL;
}
