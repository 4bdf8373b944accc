/*
 * archive_search.c: the word pairs of an archived message's tsvector, a
 * search result's excerpt, the key of the archive's GIN index and the
 * obfuscation of the addresses a page shows.
 *
 * The archive finds a two-word phrase by a lexeme of its own, 'a b', that
 * a message's tsvector holds for each two words at adjacent positions
 * (pepsi--0.11.sql, archive_word_pairs and archive_search_query).  The
 * pairs were made in SQL (the tsvector unnested to one row per position,
 * lead() over the positions, array_to_tsvector): about 1.3 ms of CPU for a
 * message of a few hundred words, half of what parsing a message costs at
 * import, 100,000 messages and more in one import.  Here they are one sort
 * of the positions and one pass over them; the result is the same tsvector
 * (array_to_tsvector makes it, sorted and without duplicates).
 *
 * The excerpt of a search result (archive_excerpt) was ts_headline over
 * 600 characters of the text that a regular expression had found: about
 * 0.15 ms of CPU a row, most of a page of 100 results, a rare word's
 * page more than the search itself.  Here it is one pass over the text's
 * start: its words found, the query's among them marked, the excerpt cut
 * at word boundaries.
 *
 * The key (archive_search_key) and the obfuscation (archive_obfuscated)
 * were SQL called once a row of a search page: a plan run, a search_path
 * set, a tsvector copied through tsvector_concat, three regular
 * expressions.  Here they are one copy and one pass, same results.
 */
#include "pepsi.h"

#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "tsearch/ts_type.h"
#include "tsearch/ts_utils.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/formatting.h"

PG_FUNCTION_INFO_V1(archive_word_pairs);

/* A pair longer than this (both words, without the space) is left out:
 * archive_search_query leaves such a phrase to the word positions. */
#define WORD_PAIR_MAX_WORDS_BYTES 100
/* Past this many bytes of pairs in all (counted once per position), only
 * the first WORD_PAIR_CAPPED_COUNT pairs are kept, so that the tsvector
 * stays well under its 1 MB. */
#define WORD_PAIR_MAX_TOTAL_BYTES 400000
#define WORD_PAIR_CAPPED_COUNT 3800

/* One position of the tsvector: the position, the lexeme there. */
struct word_at
{
	uint16 position;
	int	   entry;
};

static int
word_at_compare(const void *a, const void *b)
{
	const struct word_at *x = a;
	const struct word_at *y = b;

	if (x->position != y->position)
		return x->position < y->position ? -1 : 1;
	return x->entry < y->entry ? -1 : x->entry > y->entry;
}

/*
 * archive_word_pairs(words tsvector) RETURNS tsvector: the lexemes at
 * positions p and p + 1, as one lexeme 'a b' each, without positions.
 * Lexemes sharing a position (the last one a tsvector counts, 16,383,
 * takes every word past it) are ordered by lexeme; only the last of them
 * pairs with the next position's first, as lead() over the positions did.
 */
Datum
archive_word_pairs(PG_FUNCTION_ARGS)
{
	TSVector		words;
	WordEntry	   *entries;
	char		   *lexemes;
	struct word_at *at;
	int				positions = 0;
	int				pairs = 0;
	int64			total_bytes = 0;
	Datum		   *texts;
	ArrayType	   *array;

	if (PG_ARGISNULL(0)) /* no words, no pairs (as the SQL function it replaces answered) */
		PG_RETURN_DATUM(DirectFunctionCall1(array_to_tsvector, PointerGetDatum(construct_empty_array(TEXTOID))));
	words = PG_GETARG_TSVECTOR(0);
	entries = ARRPTR(words);
	lexemes = STRPTR(words);
	for (int i = 0; i < words->size; i++)
		positions += POSDATALEN(words, &entries[i]);
	at = palloc(sizeof(struct word_at) * Max(positions, 1));
	positions = 0;
	for (int i = 0; i < words->size; i++)
	{
		WordEntryPos *pos = POSDATAPTR(words, &entries[i]);

		for (int j = 0; j < POSDATALEN(words, &entries[i]); j++)
		{
			at[positions].position = WEP_GETPOS(pos[j]);
			at[positions].entry = i;
			positions++;
		}
	}
	qsort(at, positions, sizeof(struct word_at), word_at_compare);

	texts = palloc(sizeof(Datum) * Max(positions, 1));
	for (int k = 0; k + 1 < positions; k++)
	{
		WordEntry *a = &entries[at[k].entry];
		WordEntry *b = &entries[at[k + 1].entry];
		text	  *pair;
		char	  *p;

		if (at[k + 1].position != at[k].position + 1 || a->len + b->len >= WORD_PAIR_MAX_WORDS_BYTES)
			continue;
		pair = palloc(VARHDRSZ + a->len + 1 + b->len);
		SET_VARSIZE(pair, VARHDRSZ + a->len + 1 + b->len);
		p = VARDATA(pair);
		memcpy(p, lexemes + a->pos, a->len);
		p[a->len] = ' ';
		memcpy(p + a->len + 1, lexemes + b->pos, b->len);
		texts[pairs++] = PointerGetDatum(pair);
		total_bytes += a->len + 1 + b->len;
	}
	if (total_bytes >= WORD_PAIR_MAX_TOTAL_BYTES && pairs > WORD_PAIR_CAPPED_COUNT)
		pairs = WORD_PAIR_CAPPED_COUNT;

	array = construct_array(texts, pairs, TEXTOID, -1, false, TYPALIGN_INT);
	PG_RETURN_DATUM(DirectFunctionCall1(array_to_tsvector, PointerGetDatum(array)));
}

PG_FUNCTION_INFO_V1(archive_excerpt);

/* The start of the text searched for the query's words (as the window's
 * regular expression searched its first 20,000 characters): only that
 * much of a long message is read back from TOAST and decompressed. */
#define EXCERPT_SCAN_BYTES 20000
/* A fragment: up to this many words before the first word of the query
 * it shows, this many words in all, this many bytes at most (a "word" of
 * a few kilobytes, a hex dump, is cut). */
#define EXCERPT_WORDS_BEFORE 8
#define EXCERPT_WORDS 35
#define EXCERPT_FRAGMENT_BYTES 320
/* Two fragments at most, as ts_headline's MaxFragments=2 gave. */
#define EXCERPT_FRAGMENTS 2
#define EXCERPT_MARK_START "\u00ab"
#define EXCERPT_MARK_STOP "\u00bb"
#define EXCERPT_FRAGMENT_DELIMITER " ... "

/* A word of the text: its bytes [start, end), whether it is one of the
 * query's. */
struct excerpt_word
{
	int	 start;
	int	 end;
	bool marked;
};

/* A lexeme of the query (the 'simple' configuration's: the word in lower
 * case), and whether it stands for any word it begins (lexeme:*). */
struct excerpt_term
{
	const char *lexeme;
	int			len;
	bool		prefix;
};

/* A word is a run of letters and digits, any character past ASCII being
 * a letter: the parser's words as the 'simple' configuration makes them
 * in the C locale ('_', '-', '.', '@' separate, so a hyphenated word or an
 * address is found by its parts). */
static inline bool
excerpt_word_byte(unsigned char c)
{
	return c >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* Whether the word text[start, end) (ascii: all its bytes ASCII) is one
 * of the query's: compared in lower case, ASCII by itself (its length
 * first: most words are not the query's), any other by the database's
 * collation (as the parser lowered the query's words), only when some
 * term has a byte past ASCII (no lower case of a character past ASCII is
 * ASCII that a query's word could be, but for a few that no mail search
 * needs). */
static bool
excerpt_word_marked(const char *text, int start, int end, bool ascii, const struct excerpt_term *terms, int nterms,
					bool terms_ascii)
{
	int	  len = end - start;
	char *folded;
	bool  found = false;

	if (ascii)
	{
		for (int t = 0; t < nterms; t++)
			if ((terms[t].prefix ? len >= terms[t].len : len == terms[t].len)
				&& pg_strncasecmp(text + start, terms[t].lexeme, terms[t].len) == 0)
				return true;
		return false;
	}
	if (terms_ascii)
		return false;
	folded = str_tolower(text + start, len, DEFAULT_COLLATION_OID);
	len = strlen(folded);
	for (int t = 0; t < nterms && !found; t++)
		found = terms[t].prefix ? len >= terms[t].len && memcmp(folded, terms[t].lexeme, terms[t].len) == 0
								: len == terms[t].len && memcmp(folded, terms[t].lexeme, len) == 0;
	pfree(folded);
	return found;
}

/*
 * Where the first of the query's terms (all ASCII) is in text[from, len),
 * in any case and whether or not a word begins or ends there; len when
 * none is.  A word the query marks holds one of its terms, so past from
 * no word is marked when none is there: a rare word's excerpt need not
 * read every word of the text looking for a second one.  One pass over
 * the bytes, a term compared only where a byte could begin one.
 */
static int
excerpt_next_term(const char *text, int from, int len, const struct excerpt_term *terms, int nterms)
{
	bool begins[256] = {false};

	for (int t = 0; t < nterms; t++)
	{
		unsigned char c;

		if (terms[t].len == 0)
			return from;
		c = (unsigned char) terms[t].lexeme[0];
		begins[c] = true;
		if (c >= 'a' && c <= 'z')
			begins[c - 'a' + 'A'] = true;
		else if (c >= 'A' && c <= 'Z')
			begins[c - 'A' + 'a'] = true;
	}
	for (int i = from; i < len; i++)
	{
		if (!begins[(unsigned char) text[i]])
			continue;
		for (int t = 0; t < nterms; t++)
			if (i + terms[t].len <= len && pg_strncasecmp(text + i, terms[t].lexeme, terms[t].len) == 0)
				return i;
	}
	return len;
}

/*
 * The words of text[from, len) in *words (grown as needed), as many as
 * the fragments need: the second fragment starts at or before the first
 * word found past EXCERPT_WORDS after the first one found (past the first
 * fragment's end), and takes up to EXCERPT_WORDS from there.  No further
 * when no term of the query is left in the text (terms all ASCII: a word
 * past ASCII is then never marked) and every fragment that can be made
 * has its words, EXCERPT_WORDS from its marked word (or from the start)
 * and the one after them, whose start ends the punctuation shown: the
 * excerpt is then what reading every word would make.  How many.
 */
static int
excerpt_read_words(const char *text, int from, int len, const struct excerpt_term *terms, int nterms,
				   bool terms_ascii, struct excerpt_word **words, int *capacity)
{
	int nwords = 0;
	int first_found = -1;
	int second_found = -1;
	int last_marked = -1;
	int next_term = -1; /* where a term of the query is next, from the words read on */

	for (int i = from; i < len && (second_found < 0 || nwords <= second_found + EXCERPT_WORDS);)
	{
		int	 start;
		bool ascii = true;
		bool marked;

		if (terms_ascii && nwords > Max(last_marked, 0) + EXCERPT_WORDS)
		{
			if (next_term < i)
				next_term = excerpt_next_term(text, i, len, terms, nterms);
			if (next_term >= len)
				break;
		}
		while (i < len && !excerpt_word_byte(text[i]))
			i++;
		if (i >= len)
			break;
		start = i;
		while (i < len && excerpt_word_byte(text[i]))
			ascii = !IS_HIGHBIT_SET(text[i++]) && ascii;
		if (nwords == *capacity)
		{
			*capacity *= 2;
			*words = repalloc(*words, sizeof(struct excerpt_word) * *capacity);
		}
		marked = excerpt_word_marked(text, start, i, ascii, terms, nterms, terms_ascii);
		(*words)[nwords].start = start;
		(*words)[nwords].end = i;
		(*words)[nwords].marked = marked;
		if (marked)
			last_marked = nwords;
		if (marked && first_found < 0)
			first_found = nwords;
		else if (marked && second_found < 0 && nwords >= first_found + EXCERPT_WORDS)
			second_found = nwords;
		nwords++;
	}
	return nwords;
}

/*
 * Where the words are read from (terms all ASCII): the start of the
 * EXCERPT_WORDS_BEFORE + 1 words before the word that holds the first of
 * the query's terms in the text, or the text's start when fewer words
 * are there.  No word before that one is the query's (a marked word
 * begins with a term), and the fragments count their words from the word
 * found, so the words before them change nothing but a rare word's
 * reading of all the text before it; the fragment from the text's start,
 * when no word is the query's, is read again from the start.
 */
static int
excerpt_read_from(const char *text, int len, const struct excerpt_term *terms, int nterms)
{
	int at = excerpt_next_term(text, 0, len, terms, nterms);

	if (at >= len)
		return 0;
	while (at > 0 && excerpt_word_byte(text[at - 1]))
		at--;
	for (int before = 0; before <= EXCERPT_WORDS_BEFORE; before++)
	{
		while (at > 0 && !excerpt_word_byte(text[at - 1]))
			at--;
		if (at == 0)
			return 0;
		while (at > 0 && excerpt_word_byte(text[at - 1]))
			at--;
	}
	return at;
}

static bool
excerpt_any_marked(const struct excerpt_word *words, int nwords)
{
	for (int w = 0; w < nwords; w++)
		if (words[w].marked)
			return true;
	return false;
}

/* The length of text's first len bytes without a character the cut at len
 * left incomplete (a slice of the text ends anywhere). */
static int
excerpt_whole_characters(const char *text, int len)
{
	int last = len;

	if (pg_database_encoding_max_length() == 1)
		return len;
	if (GetDatabaseEncoding() != PG_UTF8)
		return pg_mbcliplen(text, len, len);
	/* UTF-8: back to the last character's first byte, keep it if whole */
	while (last > 0 && len - last < 4 && (text[last - 1] & 0xC0) == 0x80)
		last--;
	if (last == 0)
		return 0;
	last--;
	return last + pg_utf_mblen((const unsigned char *) text + last) <= len ? len : last;
}

/* Append text[from, to) as shown: each run of white space and control
 * characters one space. */
static void
excerpt_append_gap(StringInfo out, const char *text, int from, int to)
{
	bool space = false;

	for (int i = from; i < to; i++)
	{
		unsigned char c = text[i];

		if (c <= ' ' || c == 0x7f)
			space = true;
		else
		{
			if (space)
				appendStringInfoChar(out, ' ');
			space = false;
			appendStringInfoChar(out, c);
		}
	}
	if (space)
		appendStringInfoChar(out, ' ');
}

/* The punctuation a fragment keeps around its words ("<b>", "dog.", a
 * quote's marks), up to a space or another word, so many bytes at most
 * (all of it ASCII: a byte past ASCII is a word's). */
#define EXCERPT_PUNCTUATION_BYTES 8

static inline bool
excerpt_space_byte(unsigned char c)
{
	return c <= ' ' || c == 0x7f;
}

/* Append the fragment of words[first .. last] (of nwords, in text's len
 * bytes), its marked words between the marks, at most
 * EXCERPT_FRAGMENT_BYTES of the text (a word that would pass it ends the
 * fragment; a first word that alone passes it is cut at a character's
 * boundary), with the punctuation just before it (from floor on) and
 * after it; the last word shown, and in *shown_to the byte after what was
 * shown. */
static int
excerpt_append_fragment(StringInfo out, const char *text, int len, const struct excerpt_word *words, int nwords,
						int first, int last, int floor, int *shown_to)
{
	int limit = words[first].start + EXCERPT_FRAGMENT_BYTES;
	int from = words[first].start;
	int to;
	int shown = first;

	while (from > floor && words[first].start - from < EXCERPT_PUNCTUATION_BYTES && !excerpt_space_byte(text[from - 1])
		   && (first == 0 || from > words[first - 1].end))
		from--;
	appendBinaryStringInfo(out, text + from, words[first].start - from);
	for (int w = first; w <= last; w++)
	{
		int end = words[w].end;

		if (end > limit)
		{
			if (w > first)
				break;
			end = words[w].start + pg_mbcliplen(text + words[w].start, end - words[w].start, EXCERPT_FRAGMENT_BYTES);
		}
		if (w > first)
			excerpt_append_gap(out, text, words[w - 1].end, words[w].start);
		if (words[w].marked)
			appendStringInfoString(out, EXCERPT_MARK_START);
		appendBinaryStringInfo(out, text + words[w].start, end - words[w].start);
		if (words[w].marked)
			appendStringInfoString(out, EXCERPT_MARK_STOP);
		shown = w;
		if (end < words[w].end)
		{
			*shown_to = end;
			return shown;
		}
	}
	to = words[shown].end;
	while (to < len && to - words[shown].end < EXCERPT_PUNCTUATION_BYTES && !excerpt_space_byte(text[to])
		   && (shown + 1 >= nwords || to < words[shown + 1].start))
		to++;
	appendBinaryStringInfo(out, text + words[shown].end, to - words[shown].end);
	*shown_to = to;
	return shown;
}

/*
 * archive_excerpt(body text, query tsquery) RETURNS text: what a search
 * result shows of a message's text.  Up to two fragments, each up to
 * EXCERPT_WORDS words from a few words before a word of the query (the
 * first one, then the first past the first fragment), joined by " ... ",
 * the query's words between « and »; the text's first words when none of
 * the query's words is in its first EXCERPT_SCAN_BYTES (the message was
 * found by its subject, or further down).  White space is one space; the
 * text is otherwise as it is (the page escapes it for HTML).
 */
Datum
archive_excerpt(PG_FUNCTION_ARGS)
{
	text				*body = PG_GETARG_TEXT_P_SLICE(0, 0, EXCERPT_SCAN_BYTES);
	TSQuery				 query = PG_GETARG_TSQUERY(1);
	const char			*text = VARDATA_ANY(body);
	int					 len = VARSIZE_ANY_EXHDR(body);
	QueryItem			*items = GETQUERY(query);
	struct excerpt_term *terms = palloc(sizeof(struct excerpt_term) * Max(query->size, 1));
	int					 nterms = 0;
	bool				 terms_ascii = true;
	struct excerpt_word *words;
	int					 nwords = 0;
	int					 capacity = 256;
	int					 from;
	int					 shown_until = -1; /* the last word shown so far */
	int					 shown_to = 0;	   /* the byte after the text shown so far */
	StringInfoData		 out;

	/* a slice may end within a character: the text is its whole ones */
	if (len == EXCERPT_SCAN_BYTES)
		len = excerpt_whole_characters(text, len);
	for (int i = 0; i < query->size; i++)
	{
		if (items[i].type != QI_VAL)
			continue;
		terms[nterms].lexeme = GETOPERAND(query) + items[i].qoperand.distance;
		terms[nterms].len = items[i].qoperand.length;
		terms[nterms].prefix = items[i].qoperand.prefix;
		for (int k = 0; k < terms[nterms].len; k++)
			terms_ascii = terms_ascii && !IS_HIGHBIT_SET(terms[nterms].lexeme[k]);
		nterms++;
	}

	words = palloc(sizeof(struct excerpt_word) * capacity);
	from = terms_ascii ? excerpt_read_from(text, len, terms, nterms) : 0;
	nwords = excerpt_read_words(text, from, len, terms, nterms, terms_ascii, &words, &capacity);
	if (from > 0 && !excerpt_any_marked(words, nwords)) /* the term found was within other words */
		nwords = excerpt_read_words(text, 0, len, terms, nterms, terms_ascii, &words, &capacity);

	initStringInfo(&out);
	if (nwords == 0) /* nothing but spaces and punctuation: their start */
		excerpt_append_gap(&out, text, 0, pg_mbcliplen(text, len, EXCERPT_FRAGMENT_BYTES));
	for (int fragment = 0; fragment < EXCERPT_FRAGMENTS && nwords > 0; fragment++)
	{
		int found = shown_until + 1;
		int first;
		int last;
		int floor;

		while (found < nwords && !words[found].marked)
			found++;
		if (found >= nwords)
		{
			if (fragment > 0)
				break;
			found = 0; /* none of the query's words: the text's start */
		}
		first = Max(shown_until + 1, found - EXCERPT_WORDS_BEFORE);
		/* the word found stays within the fragment's bytes */
		while (first < found && words[found].end - words[first].start > EXCERPT_FRAGMENT_BYTES / 2)
			first++;
		last = Min(nwords - 1, first + EXCERPT_WORDS - 1);
		floor = shown_to;
		if (fragment > 0 && first == shown_until + 1) /* the first one goes on */
		{
			excerpt_append_gap(&out, text, shown_to, words[first].start);
			floor = words[first].start;
		}
		else if (fragment > 0)
			appendStringInfoString(&out, EXCERPT_FRAGMENT_DELIMITER);
		shown_until = excerpt_append_fragment(&out, text, len, words, nwords, first, last, floor, &shown_to);
	}
	PG_RETURN_TEXT_P(cstring_to_text_with_len(out.data, out.len));
}

PG_FUNCTION_INFO_V1(archive_search_key);

/*
 * archive_search_key(list bigint, search tsvector) RETURNS tsvector: the
 * message's tsvector and its list's lexeme, '#list' and the id, without
 * positions: the lexemes that `search || array_to_tsvector(ARRAY['#list'
 * || list])` had in SQL.  The GIN index archive_message_list_search is on
 * this expression, and a page walked in date order (a common word's, a
 * phrase's) checks it on each row it reads: in SQL each check set the
 * function's search_path, ran its plan, built a one-lexeme tsvector and
 * copied the message's 5 to 12 KB tsvector entry by entry through
 * tsvector_concat.  Here the entries are copied with the list's put in
 * its place (they are sorted), the lexemes and positions in one piece,
 * the list's lexeme after them: a tsvector's entries point at their
 * lexemes, which need not be in the entries' order, so no entry moves in
 * the data and no position is realigned.
 */
Datum
archive_search_key(PG_FUNCTION_ARGS)
{
	TSVector   search = PG_GETARG_TSVECTOR(1);
	char	   key[32];
	int		   key_len = snprintf(key, sizeof(key), "#list" INT64_FORMAT, PG_GETARG_INT64(0));
	WordEntry *entries = ARRPTR(search);
	int		   data_len = VARSIZE(search) - CALCDATASIZE(search->size, 0);
	int		   low = 0;
	int		   high = search->size;
	TSVector   out;
	WordEntry *out_entries;

	/* where the list's lexeme goes, in the tsvector's order */
	while (low < high)
	{
		int mid = (low + high) / 2;
		int cmp = tsCompareString(STRPTR(search) + entries[mid].pos, entries[mid].len, key, key_len, false);

		if (cmp == 0) /* already there (no parser makes it): the same words */
			PG_RETURN_TSVECTOR(search);
		if (cmp < 0)
			low = mid + 1;
		else
			high = mid;
	}
	if (data_len > MAXSTRPOS) /* as tsvector_concat would have said */
		ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
						errmsg("string is too long for tsvector (%d bytes, max %d bytes)", data_len, MAXSTRPOS)));
	out = palloc(CALCDATASIZE(search->size + 1, data_len + key_len));
	SET_VARSIZE(out, CALCDATASIZE(search->size + 1, data_len + key_len));
	out->size = search->size + 1;
	out_entries = ARRPTR(out);
	memcpy(out_entries, entries, low * sizeof(WordEntry));
	out_entries[low].haspos = 0;
	out_entries[low].len = key_len;
	out_entries[low].pos = data_len;
	memcpy(out_entries + low + 1, entries + low, (search->size - low) * sizeof(WordEntry));
	memcpy(STRPTR(out), STRPTR(search), data_len);
	memcpy(STRPTR(out) + data_len, key, key_len);
	PG_RETURN_TSVECTOR(out);
}

PG_FUNCTION_INFO_V1(archive_obfuscated);

/* The characters of an address's local part and of its domain, as the
 * regular expressions this replaces named them: [A-Za-z0-9._%+=-] and
 * [A-Za-z0-9.-] (ASCII only: a byte of a multibyte character is never
 * one of them, nor '@', in any server encoding). */
static inline bool
address_local_byte(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' || c == '_'
		   || c == '%' || c == '+' || c == '=' || c == '-';
}

static inline bool
address_domain_byte(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' || c == '-';
}

static inline bool
address_letter_byte(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* The length of the domain that text[from, len) starts with, as
 * [A-Za-z0-9.-]+\.[A-Za-z]+ matches it (the longest): the run of domain
 * bytes up to the end of its last run of letters that follows a '.' not
 * at the run's start; 0 when it has none. */
static int
address_domain_length(const char *text, int from, int len)
{
	int best = 0;
	int i = from;

	while (i < len && address_domain_byte(text[i]))
	{
		int letters = i;

		while (letters < len && address_letter_byte(text[letters]))
			letters++;
		if (letters > i && i - 1 > from && text[i - 1] == '.')
			best = letters - from;
		i = letters > i ? letters : i + 1;
	}
	return best;
}

/*
 * archive_obfuscated(obfuscation text, shown text) RETURNS text: shown
 * with its addresses obfuscated as a list's archive_policy says: 'none'
 * as it is, 'hide' user@..., any other (the default 'at', or NULL) user
 * at example.org.  An address is what the regular expression
 * ([A-Za-z0-9._%+=-]+)@([A-Za-z0-9.-]+\.[A-Za-z]+) matched, leftmost then
 * longest, each in turn: the same text as regexp_replace made, in one
 * pass, and none when the text has no '@'.  A search page obfuscates three
 * fields of each of its 100 rows, a thread's page two of each message.
 */
Datum
archive_obfuscated(PG_FUNCTION_ARGS)
{
	text		  *shown;
	const char	  *s;
	int			   len;
	bool		   hide;
	int			   copied = 0;
	int			   i = 0;
	StringInfoData out;

	if (PG_ARGISNULL(1))
		PG_RETURN_NULL();
	shown = PG_GETARG_TEXT_PP(1);
	s = VARDATA_ANY(shown);
	len = VARSIZE_ANY_EXHDR(shown);
	if (!PG_ARGISNULL(0))
	{
		text *how = PG_GETARG_TEXT_PP(0);

		if (VARSIZE_ANY_EXHDR(how) == 4 && memcmp(VARDATA_ANY(how), "none", 4) == 0)
			PG_RETURN_TEXT_P(shown);
		hide = VARSIZE_ANY_EXHDR(how) == 4 && memcmp(VARDATA_ANY(how), "hide", 4) == 0;
	}
	else
		hide = false;
	if (memchr(s, '@', len) == NULL)
		PG_RETURN_TEXT_P(shown);

	initStringInfo(&out);
	while (i < len)
	{
		int start = i;
		int domain;

		/* a run of the local part's bytes, then '@' and a domain */
		while (i < len && address_local_byte(s[i]))
			i++;
		if (i == start || i >= len || s[i] != '@')
		{
			i = i == start ? i + 1 : i;
			continue;
		}
		domain = address_domain_length(s, i + 1, len);
		if (domain == 0)
		{
			i++;
			continue;
		}
		appendBinaryStringInfo(&out, s + copied, i - copied);
		if (hide)
			appendStringInfoString(&out, "@...");
		else
		{
			appendStringInfoString(&out, " at ");
			appendBinaryStringInfo(&out, s + i + 1, domain);
		}
		i += 1 + domain;
		copied = i;
	}
	if (copied == 0)
		PG_RETURN_TEXT_P(shown);
	appendBinaryStringInfo(&out, s + copied, len - copied);
	PG_RETURN_TEXT_P(cstring_to_text_with_len(out.data, out.len));
}
