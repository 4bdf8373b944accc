/*
 * pepsi-stage-detect-language: which language a message is written in
 * (docs/pepsi-stage-detect-language.8.md).
 *
 * The text of the message (its text/plain parts, else its text/html
 * ones: transfer encoding undone, charset made UTF-8 by
 * common/message/mime.c) goes to libexttextcat's models; the verdict,
 * the primary language and the candidates with their confidences, is
 * merged into state.language and written in an X-Pepsi-Language header
 * (one the message arrived with is removed: only ours is believed).  A
 * text too short or undecidable is "und", which no stage blocks
 * (pepsi-stage-block-language).  The message always goes on to
 * NEXT_STAGE.
 *
 * The models are loaded once per worker, from LANGUAGE_MODELS (only the
 * LANGUAGES, when set).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "language.h"
#include "message/header.h"
#include "runtime/stage.h"

int pepsi_stage_detect_language_main(int argc, char **argv);

/*
 * The models a worker loaded (at start, by check_config), and the
 * LANGUAGE_MODELS and LANGUAGES they were loaded for: a section that
 * names others (several sections run this program) loads its own.
 */
static struct language_detector *detect_language_models;
static char						*detect_language_loaded_for;

static struct language_detector *
detect_language_detector(const char *models, const char *languages, char *err, size_t errlen)
{
	char *key = xasprintf("%s\n%s", models, languages ? languages : "");

	if (detect_language_models != NULL && strcmp(key, detect_language_loaded_for) == 0)
	{
		free(key);
		return detect_language_models;
	}
	language_detector_close(detect_language_models);
	free(detect_language_loaded_for);
	detect_language_loaded_for = key;
	detect_language_models = language_detector_open(models, languages, err, errlen);
	return detect_language_models;
}

static int
detect_language_run(struct pepsi_ctx *ctx)
{
	const struct buf	  *headers = pepsi_headers(ctx);
	struct language_limits limits = {
		.min_letters = (size_t) pepsi_option_int(ctx, "MIN_LETTERS"),
		.min_confidence = pepsi_option_int(ctx, "MIN_CONFIDENCE") / 100.0,
		.max_bytes = (size_t) pepsi_option_size(ctx, "MAX_TEXT"),
	};
	struct language_detector *detector;
	struct language_verdict	  verdict;
	struct buf				  raw = BUF_INIT;
	struct buf				  rewritten = BUF_INIT;
	char					  err[512];
	json_t					 *merge;

	if (headers == NULL || !pepsi_raw_message(ctx, &raw))
		return -1;
	detector = detect_language_detector(pepsi_option_text(ctx, "LANGUAGE_MODELS"), pepsi_option_text(ctx, "LANGUAGES"),
										err, sizeof(err));
	if (detector == NULL)
	{
		buf_free(&raw);
		return pepsi_error(ctx, "%s", err);
	}
	language_detect_message(detector, raw.data, raw.len, &limits, &verdict);
	buf_free(&raw);

	buf_append_str(&rewritten, "X-Pepsi-Language: ");
	language_verdict_text(&verdict, &rewritten);
	buf_append_str(&rewritten, "\r\n");
	header_remove(headers->data, headers->len, "X-Pepsi-Language", &rewritten);
	pepsi_set_headers(ctx, rewritten.data, rewritten.len);
	buf_free(&rewritten);

	merge = json_pack("{s:o}", "language", language_verdict_json(&verdict));
	pepsi_merge_state(ctx, merge);
	json_decref(merge);
	log_info("%s: row %lld: language %s (confidence %.2f%s%s)", pepsi_queue_id(ctx), pepsi_id(ctx), verdict.primary,
			 verdict.confidence, verdict.why ? ", " : "", verdict.why ? verdict.why : "");
	return pepsi_advance(ctx);
}

/* The models must load at start: a worker that cannot read them would fail every message. */
static bool
detect_language_check_config(const struct pepsi_config *cfg, const char *section, char *err, size_t errlen)
{
	return detect_language_detector(config_text(cfg, section, "LANGUAGE_MODELS"), config_text(cfg, section, "LANGUAGES"),
									err, errlen)
		   != NULL;
}

const struct pepsi_stage pepsi_stage_detect_language_stage = {
	.program = "pepsi-stage-detect-language",
	.load = PEPSI_LOAD_FULL,
	.run = detect_language_run,
	.check_config = detect_language_check_config,
};

int
pepsi_stage_detect_language_main(int argc, char **argv)
{
	int rc = pepsi_worker_main(&pepsi_stage_detect_language_stage, argc, argv);

	language_detector_close(detect_language_models);
	free(detect_language_loaded_for);
	return rc;
}
