/*
 * archive_search.c: the word pairs of an archived message's tsvector.
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
 */
#include "pepsi.h"

#include "catalog/pg_type.h"
#include "tsearch/ts_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"

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
