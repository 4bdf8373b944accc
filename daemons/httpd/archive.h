/*
 * archive.h: the list archive's pages (archive_pages.c) and their login
 * and owners' pages (archive_login.c), shared between the two files.
 */
#ifndef PEPSI_HTTPD_ARCHIVE_H
#define PEPSI_HTTPD_ARCHIVE_H

#include "httpd.h"

/* The longest list address in a path (as pepsi.mailing_list allows). */
#define ARCHIVE_ADDRESS_MAX 254

/* What a page asks for: the list, the rest of the path, who reads. */
struct archive_request
{
	char		list_id[32];
	char		address[ARCHIVE_ADDRESS_MAX + 1];
	bool		private_list;
	const char *arg; /* the rest of the path after the view */
	/* A logged-in reader (archive_login.c): address empty when none. */
	char reader[256];
	char csrf[65];
	bool owner;
};

enum MHD_Result archive_page(struct request *req, unsigned status, const struct archive_request *ar,
							 const char *title, const struct buf *content);
PGresult	   *archive_query(struct request *req, const char *sql, int nparams, const char *const *values,
							  enum MHD_Result *result);
/* A link: <a href="/archive/LIST/PATH">TEXT</a>. */
void archive_link(struct buf *out, const struct archive_request *ar, const char *path, const char *text);
/* The reader of the request's session cookie, if any, into ar. */
void archive_reader_identify(struct request *req, struct archive_request *ar);
/* /archive/LIST/login: the form, the mailed link's button, the session. */
enum MHD_Result archive_login_route(struct request *req, const struct archive_request *ar);
/* /archive/LIST/members and /archive/LIST/moderation, for owners. */
enum MHD_Result archive_owner_route(struct request *req, const struct archive_request *ar, const char *view);

#endif
