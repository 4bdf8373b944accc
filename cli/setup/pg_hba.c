/*
 * pg_hba.c: pepsi-setup's lines for the cluster's client authentication.
 * The pg_hba_line task says a line (for the DBA, printed by init), and
 * init --apply-pg-hba keeps them, with the pg_ident.conf map, in a marked
 * block of the cluster's own files when the cluster is local (setup.h).
 * Apart from apply.c because it edits files another program owns, which
 * no other task does: the server parses them before they count, and they
 * are put back as they were when it cannot.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/xalloc.h"
#include "setup.h"

char *
setup_pg_hba_text(const json_t *params)
{
	const char *address = setup_param(params, "address");
	const char *map = setup_param(params, "map");

	return xasprintf("%-7s %-8s %-16s %s%s%s%s%s", setup_param(params, "type"), setup_param(params, "database"),
					 setup_param(params, "user"), address ? address : "", address ? " " : "",
					 setup_param(params, "method"), map ? " map=" : "", map ? map : "");
}

enum setup_outcome
setup_pg_hba_line(struct setup_ctx *ctx, const json_t *params)
{
	char *line = setup_pg_hba_text(params);

	setup_say(ctx, "pg_hba.conf: %s", line);
	free(line);
	return SETUP_PRINTED;
}

#define SETUP_BLOCK_BEGIN "# BEGIN pepsi-setup"
#define SETUP_BLOCK_END "# END pepsi-setup\n"

/*
 * text with pepsi-setup's block (lines between the two markers) set to
 * lines: replaced where it is, else put first (pg_hba.conf: the first
 * matching line wins) or last.  NULL with why when the block is broken.
 */
static char *
setup_with_block(const char *text, const char *lines, bool first, char *why, size_t whylen)
{
	const char *begin = strstr(text, SETUP_BLOCK_BEGIN);
	const char *end = begin ? strstr(begin, SETUP_BLOCK_END) : NULL;
	char	   *block = xasprintf(SETUP_BLOCK_BEGIN ": kept by pepsi-setup init --apply-pg-hba, which "
														  "replaces what is edited here\n%s" SETUP_BLOCK_END,
								  lines);
	char	   *result;

	if (begin && (end == NULL || (begin != text && begin[-1] != '\n')))
	{
		snprintf(why, whylen, "its \"%s\" line has no \"%.*s\" line after it (mend the block by hand)",
				 SETUP_BLOCK_BEGIN, (int) strlen(SETUP_BLOCK_END) - 1, SETUP_BLOCK_END);
		free(block);
		return NULL;
	}
	if (begin)
		result = xasprintf("%.*s%s%s", (int) (begin - text), text, block, end + strlen(SETUP_BLOCK_END));
	else if (first)
		result = xasprintf("%s%s", block, text);
	else
		result = xasprintf("%s%s%s", text, text[0] && text[strlen(text) - 1] != '\n' ? "\n" : "", block);
	free(block);
	return result;
}

/* The rules of pg_hba_file_rules and pg_ident_file_mappings that the server cannot parse. */
static int
setup_hba_errors(struct setup_ctx *ctx)
{
	PGresult *res = setup_query(ctx,
								"SELECT 'pg_hba.conf line ' || line_number || ': ' || error FROM pg_hba_file_rules "
								"WHERE error IS NOT NULL UNION ALL "
								"SELECT 'pg_ident.conf line ' || line_number || ': ' || error "
								"FROM pg_ident_file_mappings WHERE error IS NOT NULL",
								0, NULL);
	int		  n;

	if (res == NULL)
		return -1;
	n = PQntuples(res);
	for (int i = 0; i < n; i++)
		setup_say(ctx, "the server cannot parse %s", PQgetvalue(res, i, 0));
	PQclear(res);
	return n;
}

bool
setup_hba_prepare(struct setup_ctx *ctx, struct setup_hba *hba, const char *hba_lines, const char *ident_lines,
				  char *why, size_t whylen)
{
	PGresult   *res = PQexec(ctx->db, "SELECT current_setting('hba_file'), current_setting('ident_file'), "
										"pg_read_file(current_setting('hba_file')), "
										"pg_read_file(current_setting('ident_file'))");
	const char *names[2] = {"pg_hba.conf", "pg_ident.conf"};
	const char *lines[2] = {hba_lines, ident_lines};

	memset(hba, 0, sizeof(*hba));
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
	{
		snprintf(why, whylen, "the server does not show its pg_hba.conf (the conninfo's role must be a superuser): %s",
				 PQresultErrorMessage(res));
		PQclear(res);
		return false;
	}
	for (int i = 0; i < 2; i++)
	{
		const char *server_text = PQgetvalue(res, 0, 2 + i);
		struct buf	text = BUF_INIT;
		char		err[512];

		hba->path[i] = xstrdup(PQgetvalue(res, 0, i));
		if (lstat(hba->path[i], &hba->st[i]) != 0 || !S_ISREG(hba->st[i].st_mode) || access(hba->path[i], W_OK) != 0
			|| !buf_append_file(&text, hba->path[i], 16 << 20, err, sizeof(err)))
		{
			snprintf(why, whylen, "the cluster's %s, %s, is not a file this host can write (%s): the cluster "
								  "is not local; give the lines printed to its DBA instead",
					 names[i], hba->path[i], strerror(errno));
			buf_free(&text);
			PQclear(res);
			return false;
		}
		buf_append_char(&text, '\0');
		if (strcmp(text.data, server_text) != 0)
		{
			snprintf(why, whylen, "%s on this host is not the file the cluster reads (another host's "
								  "cluster?): give the lines printed to its DBA instead",
					 hba->path[i]);
			buf_free(&text);
			PQclear(res);
			return false;
		}
		hba->before[i] = text.data;
		if ((hba->after[i] = setup_with_block(text.data, lines[i], i == 0, err, sizeof(err))) == NULL)
		{
			snprintf(why, whylen, "%s: %s", hba->path[i], err);
			PQclear(res);
			return false;
		}
	}
	PQclear(res);
	return true;
}

enum setup_outcome
setup_hba_apply(struct setup_ctx *ctx, struct setup_hba *hba)
{
	enum setup_outcome outcome = SETUP_UNCHANGED;
	int				   errors;
	PGresult		  *res;

	for (int i = 0; i < 2; i++)
		switch (setup_write_file(ctx, hba->path[i], hba->after[i], hba->st[i].st_mode & 07777, hba->st[i].st_uid,
								 hba->st[i].st_gid))
		{
			case SETUP_FAILED:
				outcome = SETUP_FAILED;
				break;
			case SETUP_DONE:
				if (outcome != SETUP_FAILED)
					outcome = SETUP_DONE;
				break;
			default:
				break;
		}
	if (outcome == SETUP_UNCHANGED)
		return outcome;
	errors = outcome == SETUP_FAILED ? 0 : setup_hba_errors(ctx);
	if (outcome == SETUP_FAILED || errors != 0)
	{
		for (int i = 0; i < 2; i++)
			setup_write_file(ctx, hba->path[i], hba->before[i], hba->st[i].st_mode & 07777, hba->st[i].st_uid,
							 hba->st[i].st_gid);
		setup_say(ctx, "failed: pg_hba.conf and pg_ident.conf put back as they were, the cluster not reloaded");
		return SETUP_FAILED;
	}
	if ((res = setup_query(ctx, "SELECT pg_reload_conf()", 0, NULL)) == NULL)
		return SETUP_FAILED;
	PQclear(res);
	setup_say(ctx, "the cluster reloaded (pg_reload_conf())");
	return SETUP_DONE;
}

void
setup_hba_free(struct setup_hba *hba)
{
	for (int i = 0; i < 2; i++)
	{
		free(hba->path[i]);
		free(hba->before[i]);
		free(hba->after[i]);
	}
}

/*
 * pepsi-helper-auto-pay's login (pepsi-helper-auto-pay(8)).  The set-user-id
 * root helper connects over the socket by peer authentication as root;
 * the map lets root log in as SETUP_AUTOPAY_ROLE, a login role that is a
 * member of pepsi_autopay and of nothing else, with no password, so that
 * the map is its only way in.  Its pg_hba.conf line joins the others
 * (appended to hba_lines), its pg_ident.conf line comes back (allocated:
 * ident_lines with it); the role is made, or brought back to that, by
 * setup_autopay_role, which changes nothing when it already is so.
 */
static json_t *
setup_autopay_hba(const char *database)
{
	return json_pack("{s:s, s:s, s:s, s:s, s:s}", "type", "local", "database", database, "user", SETUP_AUTOPAY_ROLE,
					 "method", "peer", "map", "pepsi");
}

char *
setup_autopay_lines(const char *database, struct buf *hba_lines, const char *ident_lines)
{
	json_t *params = setup_autopay_hba(database);
	char   *line = setup_pg_hba_text(params);

	buf_printf(hba_lines, "%s\n", line);
	free(line);
	json_decref(params);
	return xasprintf("%spepsi  root  %s\n", ident_lines, SETUP_AUTOPAY_ROLE);
}

static enum setup_outcome
setup_autopay_role_make(struct setup_ctx *ctx)
{
	const char *values[1] = {SETUP_AUTOPAY_ROLE};
	PGresult   *res = setup_query(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user", 0, NULL);
	bool		exists;
	bool		super;
	char	   *sql;

	if (res == NULL)
		return SETUP_FAILED;
	/* Only a superuser sees whether a role has a password (pg_authid). */
	super = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	sql = xasprintf("SELECT r.rolcanlogin AND NOT r.rolsuper AND NOT r.rolcreaterole AND NOT r.rolcreatedb"
					" AND NOT r.rolreplication AND NOT r.rolbypassrls%s"
					" AND (SELECT array_agg(g.rolname::text) FROM pg_auth_members m"
					"      JOIN pg_roles g ON g.oid = m.roleid WHERE m.member = r.oid) = '{pepsi_autopay}'"
					" FROM pg_roles r WHERE r.rolname = $1",
					super ? " AND (SELECT a.rolpassword IS NULL FROM pg_authid a WHERE a.oid = r.oid)" : "");
	res = setup_query(ctx, sql, 1, values);
	free(sql);
	if (res == NULL)
		return SETUP_FAILED;
	exists = PQntuples(res) == 1;
	if (exists && strcmp(PQgetvalue(res, 0, 0), "t") == 0)
	{
		PQclear(res);
		setup_say(ctx, "role %s: pepsi-helper-auto-pay's, a member of pepsi_autopay alone, no password, already",
				  SETUP_AUTOPAY_ROLE);
		return SETUP_UNCHANGED;
	}
	PQclear(res);
	/* Any other membership revoked: the helper gets pepsi_autopay's rights and nothing more. */
	sql = xasprintf("%s ROLE " SETUP_AUTOPAY_ROLE " LOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB NOREPLICATION "
					"NOBYPASSRLS PASSWORD NULL; "
					"DO $$ DECLARE g text; BEGIN FOR g IN SELECT r.rolname FROM pg_auth_members m "
					"JOIN pg_roles r ON r.oid = m.roleid WHERE m.member = '" SETUP_AUTOPAY_ROLE "'::regrole "
					"AND r.rolname <> 'pepsi_autopay' LOOP EXECUTE format('REVOKE %%I FROM " SETUP_AUTOPAY_ROLE
					"', g); END LOOP; END $$; GRANT pepsi_autopay TO " SETUP_AUTOPAY_ROLE,
					exists ? "ALTER" : "CREATE");
	res = PQexec(ctx->db, sql);
	free(sql);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		setup_say(ctx, "failed: %s", PQresultErrorMessage(res));
		PQclear(res);
		return SETUP_FAILED;
	}
	PQclear(res);
	setup_say(ctx, "role %s: %s, pepsi-helper-auto-pay's (a member of pepsi_autopay alone, no password: root logs "
				   "in as it by peer authentication through the map)",
			  SETUP_AUTOPAY_ROLE, exists ? "brought in line" : "created");
	return SETUP_DONE;
}

/* The role, as the map expects it; its pg_hba.conf line said, for the DBA, as the other roles' are. */
enum setup_outcome
setup_autopay_role(struct setup_ctx *ctx, const char *database)
{
	json_t			  *params = setup_autopay_hba(database);
	enum setup_outcome outcome = setup_autopay_role_make(ctx);

	if (outcome != SETUP_FAILED)
		setup_pg_hba_line(ctx, params);
	json_decref(params);
	return outcome;
}
