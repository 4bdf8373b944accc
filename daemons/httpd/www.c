/*
 * www.c: the web page's files (www/), built into the program so that
 * pepsi-httpd needs no document root: nothing on disk can be served by
 * mistake, and a path that is not one of these names is 404, whatever
 * "..", "%2e" or "//" it holds.
 */
#include <string.h>

#include "httpd.h"

/*
 * Each file is included by the assembler (.incbin, with the path from the
 * top of the tree, where make runs), between a start and an end symbol.
 */
#define WWW_FILE(symbol, path)                                                    \
	__asm__(".section .rodata\n"                                                  \
			".globl " #symbol "\n.hidden " #symbol "\n" #symbol ":\n"             \
			".incbin \"" path "\"\n"                                              \
			".globl " #symbol "_end\n.hidden " #symbol "_end\n" #symbol "_end:\n" \
			".previous\n");                                                       \
	extern const char symbol[], symbol##_end[]

WWW_FILE(httpd_www_index_html, "daemons/httpd/www/index.html");
WWW_FILE(httpd_www_app_js, "daemons/httpd/www/app.js");
WWW_FILE(httpd_www_style_css, "daemons/httpd/www/style.css");
WWW_FILE(httpd_www_setup_html, "daemons/httpd/www/setup.html");
WWW_FILE(httpd_www_setup_js, "daemons/httpd/www/setup.js");
/* The chart library, from npm (www/vendor/README.md says which and its license). */
WWW_FILE(httpd_www_uplot_js, "daemons/httpd/www/vendor/uPlot.iife.min.js");
WWW_FILE(httpd_www_uplot_css, "daemons/httpd/www/vendor/uPlot.min.css");
WWW_FILE(httpd_www_uplot_license, "daemons/httpd/www/vendor/uPlot.LICENSE");

static const struct www_file
{
	const char *path;
	const char *content_type;
	const char *start;
	const char *end;
} www_files[] = {
	{"/", "text/html; charset=utf-8", httpd_www_index_html, httpd_www_index_html_end},
	{"/index.html", "text/html; charset=utf-8", httpd_www_index_html, httpd_www_index_html_end},
	{"/app.js", "text/javascript; charset=utf-8", httpd_www_app_js, httpd_www_app_js_end},
	{"/style.css", "text/css; charset=utf-8", httpd_www_style_css, httpd_www_style_css_end},
	/* (The setup page itself is served at /setup, to its session only: setup_web.c.) */
	{"/setup.js", "text/javascript; charset=utf-8", httpd_www_setup_js, httpd_www_setup_js_end},
	{"/vendor/uPlot.js", "text/javascript; charset=utf-8", httpd_www_uplot_js, httpd_www_uplot_js_end},
	{"/vendor/uPlot.css", "text/css; charset=utf-8", httpd_www_uplot_css, httpd_www_uplot_css_end},
	{"/vendor/uPlot.LICENSE", "text/plain; charset=utf-8", httpd_www_uplot_license,
	 httpd_www_uplot_license_end},
};

enum MHD_Result
www_respond(struct request *req)
{
	for (size_t i = 0; i < sizeof(www_files) / sizeof(www_files[0]); i++)
	{
		const struct www_file *f = &www_files[i];

		if (strcmp(req->path, f->path) != 0)
			continue;
		if (strcmp(req->method, "GET") != 0 && strcmp(req->method, "HEAD") != 0)
			return reply_error(req, MHD_HTTP_METHOD_NOT_ALLOWED, "%s takes GET", f->path);
		return reply_bytes(req, MHD_HTTP_OK, f->content_type, f->start, (size_t) (f->end - f->start),
						   false);
	}
	return reply_error(req, MHD_HTTP_NOT_FOUND, "no such page");
}

void
www_setup_page(const char **html, size_t *len)
{
	*html = httpd_www_setup_html;
	*len = (size_t) (httpd_www_setup_html_end - httpd_www_setup_html);
}
