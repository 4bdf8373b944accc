/* language.c: see language.h. */
#include "language.h"

#include <ctype.h>
#include <errno.h>
#include <libexttextcat/textcat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/xalloc.h"
#include "message/mime.h"
#include "options.h"

/* libexttextcat's: candidates within this factor of the best score are reported. */
#define LANGUAGE_THRESHOLD 1.03

struct language_detector
{
	void		*textcat;
	candidate_t *candidates;
};

/* The tag of a model's name: "de--utf8" is "de", "zh-CN-utf8" is "zh-CN". */
static void
language_tag(const char *name, char *tag, size_t taglen)
{
	size_t n = strlen(name);

	if (n >= 5 && strcmp(name + n - 5, "-utf8") == 0)
		n -= 5;
	while (n > 0 && name[n - 1] == '-')
		n--;
	snprintf(tag, taglen, "%.*s", (int) n, name);
}

/* conffile with only the lines of the models of languages, in a file of its own (unlinked by the caller). */
static char *
language_filtered_conf(const char *conffile, const char *languages, char *err, size_t errlen)
{
	char  *path = xasprintf("%s/pepsi-language.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	FILE  *in = fopen(conffile, "r");
	FILE  *out = NULL;
	char   line[1024];
	size_t kept = 0;
	int	   fd;

	if (in == NULL)
	{
		snprintf(err, errlen, "%s: %s", conffile, strerror(errno));
		goto fail;
	}
	fd = mkstemp(path);
	if (fd < 0 || (out = fdopen(fd, "w")) == NULL)
	{
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		goto fail;
	}
	while (fgets(line, sizeof(line), in))
	{
		char file[512];
		char name[128];
		char tag[32];

		if (line[0] == '#' || sscanf(line, "%511s %127s", file, name) != 2)
			continue;
		language_tag(name, tag, sizeof(tag));
		if (option_list_contains(languages, tag))
		{
			fputs(line, out);
			kept++;
		}
	}
	if (fclose(out) != 0)
	{
		out = NULL;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		goto fail;
	}
	out = NULL;
	if (kept == 0)
	{
		snprintf(err, errlen, "%s has no model of the languages %s (LANGUAGES)", conffile, languages);
		goto fail;
	}
	fclose(in);
	return path;
fail:
	if (out)
		fclose(out);
	if (in)
		fclose(in);
	if (access(path, F_OK) == 0)
		unlink(path);
	free(path);
	return NULL;
}

struct language_detector *
language_detector_open(const char *conffile, const char *languages, char *err, size_t errlen)
{
	struct language_detector *detector;
	char					 *directory = xstrndup(conffile, strlen(conffile) + 1);
	char					 *slash = strrchr(directory, '/');
	char					 *filtered = NULL;
	void					 *textcat;

	if (slash)
		slash[1] = '\0';
	else
		strcpy(directory, "./");
	/* Said here, with the reason and the option, rather than by the library on stderr. */
	if (access(conffile, R_OK) != 0)
	{
		snprintf(err, errlen, "cannot read the language models' list %s: %s (LANGUAGE_MODELS; Debian: libexttextcat-data)",
				 conffile, strerror(errno));
		free(directory);
		return NULL;
	}
	if (languages != NULL && *languages != '\0'
		&& (filtered = language_filtered_conf(conffile, languages, err, errlen)) == NULL)
	{
		free(directory);
		return NULL;
	}
	textcat = special_textcat_Init(filtered ? filtered : conffile, directory);
	if (filtered)
	{
		unlink(filtered);
		free(filtered);
	}
	free(directory);
	if (textcat == NULL)
	{
		snprintf(err, errlen, "cannot read the language models of %s (LANGUAGE_MODELS; Debian: libexttextcat-data)",
				 conffile);
		return NULL;
	}
	detector = xmalloc(sizeof(*detector));
	detector->textcat = textcat;
	detector->candidates = textcat_GetClassifyFullOutput(textcat);
	return detector;
}

void
language_detector_close(struct language_detector *detector)
{
	if (detector == NULL)
		return;
	textcat_ReleaseClassifyFullOutput(detector->textcat, detector->candidates);
	textcat_Done(detector->textcat);
	free(detector);
}

/*
 * What says which language a text is in: its words, not the quoted
 * lines of an earlier message, a signature, addresses or links.  Returns
 * the letters kept.
 */
static size_t
language_words(const char *text, size_t len, size_t max, struct buf *out)
{
	size_t letters = 0;

	for (size_t at = 0; at < len && out->len < max;)
	{
		size_t line_end = mime_line_end(text, len, at);
		size_t n = line_end - at;

		if (n >= 3 && memcmp(text + at, "-- ", 3) == 0 && (n == 3 || text[at + 3] == '\r' || text[at + 3] == '\n'))
			break; /* a signature follows */
		if (text[at] == '>')
		{
			at = line_end;
			continue;
		}
		for (size_t i = at; i < line_end;)
		{
			size_t word_end = i;
			bool   link;

			while (word_end < line_end && !isspace((unsigned char) text[word_end]))
				word_end++;
			link = memchr(text + i, '@', word_end - i) != NULL || memmem(text + i, word_end - i, "://", 3) != NULL
				   || (word_end - i > 4 && memcmp(text + i, "www.", 4) == 0);
			if (!link && word_end > i)
			{
				for (size_t k = i; k < word_end; k++)
					if (isalpha((unsigned char) text[k]) || (unsigned char) text[k] >= 0xC0)
						letters++;
				buf_append(out, text + i, word_end - i);
			}
			buf_append_char(out, ' ');
			i = word_end;
			while (i < line_end && isspace((unsigned char) text[i]))
				i++;
		}
		at = line_end;
	}
	return letters;
}

void
language_detect(struct language_detector *detector, const char *text, size_t len,
				const struct language_limits *limits, struct language_verdict *verdict)
{
	struct buf words = BUF_INIT;
	int		   count;
	double	   best;
	double	   total = 0;
	double	   weight[LANGUAGE_CANDIDATES_MAX];

	memset(verdict, 0, sizeof(*verdict));
	snprintf(verdict->primary, sizeof(verdict->primary), "%s", LANGUAGE_UNDETERMINED);
	verdict->letters = language_words(text, len, limits->max_bytes > 0 ? limits->max_bytes : (size_t) -1, &words);
	if (verdict->letters < limits->min_letters || words.len == 0)
	{
		verdict->why = "too short";
		buf_free(&words);
		return;
	}
	count = textcat_ClassifyFull(detector->textcat, words.data, words.len, detector->candidates);
	buf_free(&words);
	if (count <= 0 || count > LANGUAGE_CANDIDATES_MAX)
	{
		verdict->why = count == TEXTCAT_RESULT_SHORT ? "too short" : "undecidable";
		return;
	}
	/* Each candidate's closeness to the best score (lower is better), as a share. */
	best = detector->candidates[0].score;
	for (int i = 0; i < count; i++)
	{
		double margin = best * (LANGUAGE_THRESHOLD - 1);

		weight[i] = margin > 0 ? 1 - (detector->candidates[i].score - best) / margin : 1;
		if (weight[i] < 0.01)
			weight[i] = 0.01;
		total += weight[i];
	}
	for (int i = 0; i < count; i++)
	{
		struct language_candidate *c = &verdict->candidates[verdict->ncandidates++];

		language_tag(detector->candidates[i].name, c->tag, sizeof(c->tag));
		c->confidence = weight[i] / total;
	}
	if (verdict->candidates[0].confidence < limits->min_confidence)
	{
		verdict->why = "undecidable";
		return;
	}
	snprintf(verdict->primary, sizeof(verdict->primary), "%s", verdict->candidates[0].tag);
	verdict->confidence = verdict->candidates[0].confidence;
}

void
language_detect_message(struct language_detector *detector, const char *raw, size_t len,
						const struct language_limits *limits, struct language_verdict *verdict)
{
	struct buf text = BUF_INIT;

	/* Room for the words of max_bytes after the quoted lines and links are left out. */
	mime_text(raw, len, limits->max_bytes > 0 ? limits->max_bytes * 4 : 0, &text);
	language_detect(detector, text.data ? text.data : "", text.len, limits, verdict);
	buf_free(&text);
}

/* A confidence rounded to two places, as JSON and the header show it. */
static double
language_round(double confidence)
{
	return (double) (long) (confidence * 100 + 0.5) / 100;
}

json_t *
language_verdict_json(const struct language_verdict *verdict)
{
	json_t *candidates = json_array();

	for (size_t i = 0; i < verdict->ncandidates; i++)
		json_array_append_new(candidates, json_pack("{s:s,s:f}", "language", verdict->candidates[i].tag, "confidence",
													language_round(verdict->candidates[i].confidence)));
	json_t *j = json_pack("{s:s,s:f,s:o}", "primary", verdict->primary, "confidence",
						  language_round(verdict->confidence), "candidates", candidates);

	if (verdict->why)
		json_object_set_new(j, "reason", json_string(verdict->why));
	return j;
}

void
language_verdict_text(const struct language_verdict *verdict, struct buf *out)
{
	buf_printf(out, "%s; confidence=%.2f", verdict->primary, language_round(verdict->confidence));
	if (verdict->why)
		buf_printf(out, "; reason=\"%s\"", verdict->why);
	for (size_t i = 0; i < verdict->ncandidates; i++)
		buf_printf(out, "%s%s:%.2f", i == 0 ? "; candidates=" : ",", verdict->candidates[i].tag,
				   language_round(verdict->candidates[i].confidence));
}
