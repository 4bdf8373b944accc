/*
 * pepsi-detect-language(1): the verdict pepsi-stage-detect-language would
 * give a message (or, with --text, a plain text), for a person or a
 * script (docs/pepsi-detect-language.1.md).  The same file as the stage,
 * run by another name; its defaults are the stage's, from
 * schema/options.def.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "language.h"
#include "options.h"

int pepsi_detect_language_main(int argc, char **argv);

#define DETECT_LANGUAGE_PROGRAM "pepsi-detect-language"
/* The largest input read: a message past this is cut (the verdict reads MAX_TEXT of it anyway). */
#define DETECT_LANGUAGE_INPUT_MAX (64 * 1024 * 1024)

/* The stage's default of option (schema/options.def). */
static const char *
detect_language_default(const char *option)
{
	const struct option_def *def = option_find("stage-detect-language", "pepsi-stage-detect-language", option);

	return def ? def->default_value : NULL;
}

static int
detect_language_usage(FILE *out)
{
	fprintf(out,
			"usage: " DETECT_LANGUAGE_PROGRAM " [-t] [-j] [-m MODELS] [-l LANGUAGES] [-n LETTERS] [-p PERCENT] [FILE...]\n"
			"  The language of each message FILE (standard input when none or \"-\").\n"
			"  -t, --text         the input is plain UTF-8 text, not a message\n"
			"  -j, --json         one JSON object per input\n"
			"  -m, --models CONF  the model list (default %s)\n"
			"  -l, --languages L  only these languages (comma separated tags)\n"
			"  -n, --min-letters N  fewer letters: und (default %s)\n"
			"  -p, --min-confidence P  a less sure verdict is und (percent, default %s)\n",
			detect_language_default("LANGUAGE_MODELS"), detect_language_default("MIN_LETTERS"),
			detect_language_default("MIN_CONFIDENCE"));
	return out == stdout ? 0 : 64;
}

/* A whole number of option in min..max, or -1 (said on stderr). */
static long long
detect_language_number(const char *option, const char *value, long long min, long long max)
{
	long long n;

	if (!option_parse_int(value, &n) || n < min || n > max)
	{
		fprintf(stderr, DETECT_LANGUAGE_PROGRAM ": %s \"%s\" is not a whole number from %lld to %lld\n", option, value,
				min, max);
		return -1;
	}
	return n;
}

int
pepsi_detect_language_main(int argc, char **argv)
{
	static const struct option long_options[] = {
		{"text", no_argument, NULL, 't'}, {"json", no_argument, NULL, 'j'}, {"models", required_argument, NULL, 'm'}, {"languages", required_argument, NULL, 'l'}, {"min-letters", required_argument, NULL, 'n'}, {"min-confidence", required_argument, NULL, 'p'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
	const char				 *models = detect_language_default("LANGUAGE_MODELS");
	const char				 *languages = NULL;
	long long				  min_letters = 0;
	long long				  min_percent = 0;
	long long				  max_text = 0;
	bool					  plain = false;
	bool					  as_json = false;
	struct language_limits	  limits;
	struct language_detector *detector;
	char					  err[512];
	int						  status = 0;
	int						  opt;

	option_parse_int(detect_language_default("MIN_LETTERS"), &min_letters);
	option_parse_int(detect_language_default("MIN_CONFIDENCE"), &min_percent);
	option_parse_size(detect_language_default("MAX_TEXT"), &max_text);
	while ((opt = getopt_long(argc, argv, "tjm:l:n:p:h", long_options, NULL)) != -1)
		switch (opt)
		{
			case 't':
				plain = true;
				break;
			case 'j':
				as_json = true;
				break;
			case 'm':
				models = optarg;
				break;
			case 'l':
				languages = optarg;
				break;
			case 'n':
				if ((min_letters = detect_language_number("--min-letters", optarg, 0, 100000)) < 0)
					return 64;
				break;
			case 'p':
				if ((min_percent = detect_language_number("--min-confidence", optarg, 0, 100)) < 0)
					return 64;
				break;
			case 'h':
				return detect_language_usage(stdout);
			default:
				return detect_language_usage(stderr);
		}
	limits = (struct language_limits){
		.min_letters = (size_t) min_letters, .min_confidence = min_percent / 100.0, .max_bytes = (size_t) max_text};
	if ((detector = language_detector_open(models, languages, err, sizeof(err))) == NULL)
	{
		fprintf(stderr, DETECT_LANGUAGE_PROGRAM ": %s\n", err);
		return 1;
	}
	for (int i = optind; i < argc || i == optind; i++)
	{
		const char			   *name = i < argc ? argv[i] : "-";
		struct buf				input = BUF_INIT;
		struct language_verdict verdict;
		bool					read_ok;

		if (strcmp(name, "-") == 0)
			read_ok = buf_append_stream(&input, stdin, "standard input", DETECT_LANGUAGE_INPUT_MAX, err, sizeof(err));
		else
			read_ok = buf_append_file(&input, name, DETECT_LANGUAGE_INPUT_MAX, err, sizeof(err));
		if (!read_ok)
		{
			fprintf(stderr, DETECT_LANGUAGE_PROGRAM ": %s\n", err);
			buf_free(&input);
			status = 1;
			continue;
		}
		if (plain)
			language_detect(detector, input.data ? input.data : "", input.len, &limits, &verdict);
		else
			language_detect_message(detector, input.data ? input.data : "", input.len, &limits, &verdict);
		buf_free(&input);
		if (as_json)
		{
			json_t *j = language_verdict_json(&verdict);
			char   *text;

			if (argc - optind > 1)
				json_object_set_new(j, "file", json_string(name));
			text = json_dumps(j, JSON_COMPACT);
			printf("%s\n", text);
			free(text);
			json_decref(j);
		}
		else
		{
			struct buf line = BUF_INIT;

			language_verdict_text(&verdict, &line);
			if (argc - optind > 1)
				printf("%s: %s\n", name, line.data);
			else
				printf("%s\n", line.data);
			buf_free(&line);
		}
	}
	language_detector_close(detector);
	return status;
}
