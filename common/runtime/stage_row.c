/*
 * stage_row.c: the stage API's view of the row (see stage.h): accessors
 * and the content setters, which change the row in memory only; the
 * terminal commits what they touched (stage_commit.c).
 */
#include "runtime/stage.h"

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "config/settings.h"
#include "message/queue_id.h"
#include "runtime/db.h"
#include "runtime/stage_internal.h"
#include "touched.h"

/* ---------------------------------------------------------------------------
 * Accessors
 * ------------------------------------------------------------------------- */

long long
pepsi_id(const struct pepsi_ctx *ctx)
{
	return ctx->id;
}

const char *
pepsi_queue_id(struct pepsi_ctx *ctx)
{
	return queue_id_of(stage_state(ctx), ctx->id, ctx->queue_id, sizeof(ctx->queue_id));
}

void
pepsi_new_queue_id(struct pepsi_ctx *ctx, char *out)
{
	queue_id_make(ctx->worker->queue_id_host, out);
}

const char *
pepsi_program(const struct pepsi_ctx *ctx)
{
	return ctx->stage->program;
}

const char *
pepsi_stage_name(const struct pepsi_ctx *ctx)
{
	return ctx->stage_name;
}

const char *
pepsi_section(const struct pepsi_ctx *ctx)
{
	return ctx->section;
}

double
pepsi_message_age(const struct pepsi_ctx *ctx)
{
	return ctx->age_seconds;
}

long long
pepsi_received_us(const struct pepsi_ctx *ctx)
{
	return ctx->received_us;
}

bool
pepsi_crash_retry(const struct pepsi_ctx *ctx)
{
	json_t	   *crash = json_object_get(pepsi_state(ctx), "crash");
	const char *stage = json_string_value(json_object_get(crash, "stage"));

	return stage != NULL && strcmp(stage, ctx->db_stage) == 0;
}

double
pepsi_pass_seconds(const struct pepsi_ctx *ctx)
{
	return (stage_now_us() - ctx->loaded_us) / 1e6;
}

enum pepsi_load
pepsi_loaded(const struct pepsi_ctx *ctx)
{
	return ctx->loaded;
}

void
pepsi_report_delivery(struct pepsi_ctx *ctx, const char *status, double delay_seconds)
{
	ctx->delivery = status;
	ctx->delivery_delay = delay_seconds;
	free(ctx->delivery_stage);
	ctx->delivery_stage = xstrdup(ctx->stage_name);
}

void
pepsi_mail_log(struct pepsi_ctx *ctx, const char *event, json_t *detail)
{
	if (!ctx->worker->mail_log)
		return;
	if (ctx->mail_log == NULL)
		ctx->mail_log = json_array();
	json_array_append_new(ctx->mail_log,
						  json_pack("{s:s, s:O, s:s?}", "event", event, "detail", detail, "queue_id",
									json_string_value(json_object_get(stage_state(ctx), "queue_id"))));
}

const char *
pepsi_mail_from(const struct pepsi_ctx *ctx)
{
	return ctx->mail_from;
}

size_t
pepsi_rcpt_count(const struct pepsi_ctx *ctx)
{
	return ctx->nrcpt;
}

const char *
pepsi_rcpt(const struct pepsi_ctx *ctx, size_t index)
{
	return index < ctx->nrcpt ? ctx->rcpt[index] : NULL;
}

/*
 * The row's state, parsed from the text the load read when first asked
 * for: a stage that never reads it (most routing and many delivery
 * stages) does not pay for the parse.  A state that is not a JSON object
 * reads as an empty one.
 */
json_t *
stage_state(struct pepsi_ctx *ctx)
{
	if (ctx->state == NULL)
	{
		json_error_t jerr;

		ctx->state = ctx->state_text ? json_loads(ctx->state_text, 0, &jerr) : NULL;
		if (!json_is_object(ctx->state))
		{
			json_decref(ctx->state);
			ctx->state = json_object();
		}
		free(ctx->state_text);
		ctx->state_text = NULL;
	}
	return ctx->state;
}

json_t *
pepsi_state(const struct pepsi_ctx *ctx)
{
	/*
	 * Parsing on first use changes no value the caller can see, so the
	 * accessor stays const for the stages (through uintptr_t: the cast
	 * drops the qualifier on purpose).
	 */
	return stage_state((struct pepsi_ctx *) (uintptr_t) ctx);
}

const struct buf *
pepsi_headers(struct pepsi_ctx *ctx)
{
	if (ctx->loaded < PEPSI_LOAD_HEADERS)
	{
		pepsi_error(ctx, "%s read the headers but declared a metadata load", ctx->stage->program);
		return NULL;
	}
	return &ctx->headers;
}

const struct buf *
pepsi_body(struct pepsi_ctx *ctx)
{
	if (ctx->loaded < PEPSI_LOAD_FULL)
	{
		pepsi_error(ctx, "%s read the body but did not declare a full load", ctx->stage->program);
		return NULL;
	}
	return &ctx->body;
}

bool
pepsi_raw_message(struct pepsi_ctx *ctx, struct buf *out)
{
	if (ctx->loaded < PEPSI_LOAD_FULL)
	{
		pepsi_error(ctx, "%s read the raw message but did not declare a full load",
					ctx->stage->program);
		return false;
	}
	buf_append(out, ctx->headers.data, ctx->headers.len);
	buf_append(out, "\r\n", 2);
	buf_append(out, ctx->body.data, ctx->body.len);
	return true;
}

const struct pepsi_config *
pepsi_config(const struct pepsi_ctx *ctx)
{
	return ctx->worker->cfg;
}

PGconn *
pepsi_db(const struct pepsi_ctx *ctx)
{
	/* What the stage writes through it is unknown to the status line (stage_queued_at). */
	ctx->worker->db_handed_out = true;
	return ctx->worker->conn;
}

/*
 * The scope an override must have to apply to this row: its recipient's
 * address when it has one, the domain they all share when they share one,
 * else none (only global values apply): an override for a domain or an
 * address applies to a message only when it applies to every recipient.
 */
struct stage_row_scope
{
	const char *domain;
	const char *address; /* config_get_for takes its domain too */
};

static struct stage_row_scope
stage_row_scope(const struct pepsi_ctx *ctx)
{
	struct stage_row_scope scope = {NULL, NULL};
	const char			  *shared;

	if (ctx->nrcpt == 1)
		scope.address = ctx->rcpt[0];
	if (ctx->nrcpt < 2 || (shared = strrchr(ctx->rcpt[0], '@')) == NULL)
		return scope;
	for (size_t i = 1; i < ctx->nrcpt; i++)
	{
		const char *at = strrchr(ctx->rcpt[i], '@');

		if (at == NULL || strcasecmp(at, shared) != 0)
			return scope;
	}
	scope.domain = shared + 1;
	return scope;
}

const char *
pepsi_option(const struct pepsi_ctx *ctx, const char *option)
{
	struct stage_row_scope s = stage_row_scope(ctx);

	return config_get_for(ctx->worker->cfg, ctx->section, option, s.domain, s.address);
}

const char *
pepsi_option_for(const struct pepsi_ctx *ctx, const char *option, const char *address)
{
	return config_get_for(ctx->worker->cfg, ctx->section, option, NULL, address);
}

/* The typed getters: the config_*_for of their type, with this row's scope. */
#define STAGE_OPTION_GETTER(type, name, config_getter)                                     \
	type                                                                                   \
	name(const struct pepsi_ctx *ctx, const char *option)                                  \
	{                                                                                      \
		struct stage_row_scope s = stage_row_scope(ctx);                                   \
		return config_getter(ctx->worker->cfg, ctx->section, option, s.domain, s.address); \
	}

STAGE_OPTION_GETTER(const char *, pepsi_option_text, config_text_for)
STAGE_OPTION_GETTER(bool, pepsi_option_bool, config_bool_for)
STAGE_OPTION_GETTER(long long, pepsi_option_int, config_int_for)
STAGE_OPTION_GETTER(long long, pepsi_option_size, config_size_for)
STAGE_OPTION_GETTER(int, pepsi_option_enum, config_enum_for)

double
pepsi_option_seconds(const struct pepsi_ctx *ctx, const char *option)
{
	struct stage_row_scope s = stage_row_scope(ctx);

	return config_duration_ms_for(ctx->worker->cfg, ctx->section, option, s.domain, s.address) / 1000.0;
}

json_t *
pepsi_address_settings(struct pepsi_ctx *ctx, const char *address)
{
	struct stage_worker *w = ctx->worker;
	char				 err[512];
	json_t				*settings;

	if (w->settings != NULL && ctx->settings_generation == w->settings_generation
		&& (settings = json_object_get(w->settings, address)) != NULL)
		return json_incref(settings);
	settings = settings_for_address(w->conn, address, err, sizeof(err));

	if (settings == NULL)
		pepsi_error(ctx, "%s", err);
	return settings;
}

void
pepsi_prefetch_address_settings(struct pepsi_ctx *const *ctxs, size_t count)
{
	struct stage_worker *w;
	const char		   **addresses;
	size_t				 n = 0;
	size_t				 total = 0;
	char				 err[512];

	if (count == 0)
		return;
	w = ctxs[0]->worker;
	json_decref(w->settings);
	w->settings = NULL;
	/* A new generation: rows of an earlier batch no longer match it. */
	w->settings_generation++;
	for (size_t i = 0; i < count; i++)
		total += ctxs[i]->nrcpt;
	if (total == 0)
		return;
	addresses = xcalloc(total, sizeof(*addresses));
	for (size_t i = 0; i < count; i++)
		for (size_t j = 0; j < ctxs[i]->nrcpt; j++)
			addresses[n++] = ctxs[i]->rcpt[j];
	w->settings = settings_for_addresses(w->conn, addresses, n, err, sizeof(err));
	free(addresses);
	if (w->settings == NULL)
	{
		log_warnx("%s (each row reads its own)", err);
		return;
	}
	for (size_t i = 0; i < count; i++)
		ctxs[i]->settings_generation = w->settings_generation;
}

/* ---------------------------------------------------------------------------
 * Content setters
 * ------------------------------------------------------------------------- */

void
pepsi_set_headers(struct pepsi_ctx *ctx, const char *headers, size_t len)
{
	buf_reset(&ctx->headers);
	buf_append(&ctx->headers, headers, len);
	ctx->touched |= TOUCHED_HEADERS;
}

void
pepsi_set_body(struct pepsi_ctx *ctx, const char *body, size_t len)
{
	buf_reset(&ctx->body);
	buf_append(&ctx->body, body, len);
	ctx->touched |= TOUCHED_BODY;
}

void
pepsi_set_mail_from(struct pepsi_ctx *ctx, const char *mail_from)
{
	free(ctx->mail_from);
	ctx->mail_from = xstrdup(mail_from);
	ctx->touched |= TOUCHED_MAIL_FROM;
}

static void
stage_replace_rcpt(struct pepsi_ctx *ctx, const char *const *rcpt, size_t count)
{
	for (size_t i = 0; i < ctx->nrcpt; i++)
		free(ctx->rcpt[i]);
	free(ctx->rcpt);
	ctx->rcpt = xcalloc(count + 1, sizeof(char *));
	for (size_t i = 0; i < count; i++)
		ctx->rcpt[i] = xstrdup(rcpt[i]);
	ctx->nrcpt = count;
}

void
pepsi_set_rcpt_to(struct pepsi_ctx *ctx, const char *const *rcpt, size_t count)
{
	stage_replace_rcpt(ctx, rcpt, count);
	ctx->touched |= TOUCHED_RCPT_TO;
}

void
pepsi_merge_state(struct pepsi_ctx *ctx, json_t *merge)
{
	if (merge == NULL || !json_is_object(merge))
		return;
	json_object_update(stage_state(ctx), merge);
	json_object_update(ctx->merge, merge);
}

void
pepsi_set_state(struct pepsi_ctx *ctx, json_t *state)
{
	json_decref(ctx->state);
	free(ctx->state_text);
	ctx->state_text = NULL;
	ctx->state = json_is_object(state) ? json_deep_copy(state) : json_object();
	json_object_clear(ctx->merge);
	ctx->touched |= TOUCHED_SET_STATE;
}
