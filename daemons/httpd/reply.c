/*
 * reply.c: every response pepsi-httpd sends goes through here, so that
 * each carries the same security headers and every error is JSON of one
 * shape: {"error": "what went wrong"}.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "httpd.h"

/* form_action: what a form of the page may post to ("'none'", or "'self'" for a page with one). */
static void
reply_add_headers(struct MHD_Response *response, const char *form_action)
{
	char policy[256];

	MHD_add_response_header(response, "X-Content-Type-Options", "nosniff");
	MHD_add_response_header(response, "X-Frame-Options", "DENY");
	MHD_add_response_header(response, "Referrer-Policy", "no-referrer");
	MHD_add_response_header(response, "Cache-Control", "no-store");
	/* The page loads only its own script and style, and nothing inline. */
	snprintf(policy, sizeof(policy),
			 "default-src 'none'; script-src 'self'; style-src 'self'; "
			 "connect-src 'self'; img-src 'self'; base-uri 'none'; "
			 "form-action %s; frame-ancestors 'none'",
			 form_action);
	MHD_add_response_header(response, "Content-Security-Policy", policy);
}

void
reply_add_security_headers(struct MHD_Response *response)
{
	reply_add_headers(response, "'none'");
}

void
reply_add_form_security_headers(struct MHD_Response *response)
{
	reply_add_headers(response, "'self'");
}

enum MHD_Result
reply_form_page(struct request *req, unsigned status, const char *html)
{
	struct MHD_Response *response;
	enum MHD_Result		 result;

	response = MHD_create_response_from_buffer(strlen(html), (void *) (uintptr_t) html, MHD_RESPMEM_MUST_COPY);
	if (response == NULL)
		return MHD_NO;
	MHD_add_response_header(response, "Content-Type", "text/html; charset=utf-8");
	reply_add_headers(response, "'self'");
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(response, "Allow", "GET, POST");
	result = MHD_queue_response(req->connection, status, response);
	MHD_destroy_response(response);
	return result;
}

enum MHD_Result
reply_bytes(struct request *req, unsigned status, const char *content_type, const void *data,
			size_t len, bool copy)
{
	struct MHD_Response *response;
	enum MHD_Result		 result;

	/* (MHD takes a non-const pointer; with PERSISTENT it only reads it.) */
	response = MHD_create_response_from_buffer(len, (void *) (uintptr_t) data,
											   copy ? MHD_RESPMEM_MUST_COPY : MHD_RESPMEM_PERSISTENT);
	if (response == NULL)
		return MHD_NO;
	MHD_add_response_header(response, "Content-Type", content_type);
	reply_add_security_headers(response);
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(response, "Allow",
								strncmp(req->path, "/api/", 5) == 0 ? "GET, POST, DELETE" : "GET, HEAD");
	result = MHD_queue_response(req->connection, status, response);
	MHD_destroy_response(response);
	return result;
}

enum MHD_Result
reply_json_text(struct request *req, unsigned status, const char *json)
{
	return reply_bytes(req, status, "application/json", json, strlen(json), true);
}

enum MHD_Result
reply_json(struct request *req, unsigned status, json_t *body)
{
	char		   *text = json_dumps(body, JSON_COMPACT | JSON_ENSURE_ASCII);
	enum MHD_Result result;

	json_decref(body);
	if (text == NULL)
		return reply_json_text(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "{\"error\":\"out of memory\"}");
	result = reply_json_text(req, status, text);
	free(text);
	return result;
}

enum MHD_Result
reply_error(struct request *req, unsigned status, const char *fmt, ...)
{
	char	message[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(message, sizeof(message), fmt, ap);
	va_end(ap);
	if (status >= 500)
		log_warnx("%s %s: %u %s", req->method ? req->method : "?", req->path ? req->path : "?",
				  status, message);
	else
		log_debug("%s %s from %s: %u %s", req->method ? req->method : "?",
				  req->path ? req->path : "?", req->client, status, message);
	return reply_json(req, status, json_pack("{ss}", "error", message));
}

void
reply_html_escape(struct buf *out, const char *text)
{
	for (const char *p = text; *p; p++)
		switch (*p)
		{
			case '<':
				buf_append_str(out, "&lt;");
				break;
			case '>':
				buf_append_str(out, "&gt;");
				break;
			case '&':
				buf_append_str(out, "&amp;");
				break;
			case '"':
				buf_append_str(out, "&quot;");
				break;
			default:
				buf_append_char(out, *p);
		}
}
