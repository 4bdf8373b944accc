/*
 * language.h: which language a text is in, by libexttextcat's n-gram
 * models (Debian's libexttextcat-data), for pepsi-stage-detect-language
 * and pepsi-detect-language(1), the two programs of this directory's own
 * multi-call binary (docs/architecture.md: it is kept out of the shared one).
 *
 * A verdict names the primary language (a BCP 47 tag such as "de", or
 * "und" when the text is too short or the models cannot tell) and the
 * candidates the models found about as likely, each with a confidence:
 * its share of the candidates' closeness to the best score, 1.0 for a
 * text only one model fits.
 */
#ifndef PEPSI_LANGUAGE_H
#define PEPSI_LANGUAGE_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "base/buf.h"

#define LANGUAGE_UNDETERMINED "und"
/* libexttextcat reports at most this many candidates (its MAXCANDIDATES). */
#define LANGUAGE_CANDIDATES_MAX 5

struct language_detector;

struct language_candidate
{
	char   tag[32];
	double confidence;
};

struct language_verdict
{
	char					  primary[32]; /* a tag, or "und" */
	double					  confidence;  /* the primary's (0 for und) */
	size_t					  letters;	   /* the letters the text had */
	const char				 *why;		   /* for und: "too short", "undecidable" */
	size_t					  ncandidates;
	struct language_candidate candidates[LANGUAGE_CANDIDATES_MAX];
};

struct language_limits
{
	size_t min_letters;	   /* fewer letters than this: und */
	double min_confidence; /* a primary less sure than this: und */
	size_t max_bytes;	   /* only so much of the text is read */
};

/*
 * Load the models listed in conffile (libexttextcat's fpdb.conf: a model
 * file, relative to the conffile's directory, and its name per line),
 * only those of languages when it is not NULL (a comma or space separated
 * list of tags).  NULL with err when they cannot be read.
 */
struct language_detector *language_detector_open(const char *conffile, const char *languages, char *err,
												 size_t errlen);
void					  language_detector_close(struct language_detector *detector);

/* The verdict on text (UTF-8, len bytes). */
void language_detect(struct language_detector *detector, const char *text, size_t len,
					 const struct language_limits *limits, struct language_verdict *verdict);
/* The message raw's text (common/message/mime.h) and its verdict. */
void language_detect_message(struct language_detector *detector, const char *raw, size_t len,
							 const struct language_limits *limits, struct language_verdict *verdict);

/*
 * {"primary": "de", "confidence": 0.93, "candidates": [{"language": "de", "confidence": 0.93}, ...]},
 * and for und its "reason".
 */
json_t *language_verdict_json(const struct language_verdict *verdict);
/* "de; confidence=0.93; candidates=de:0.93,nl:0.07" (the X-Pepsi-Language value), appended to out. */
void language_verdict_text(const struct language_verdict *verdict, struct buf *out);

#endif
