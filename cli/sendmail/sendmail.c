/*
 * pepsi-sendmail: the sendmail(8) interface for local programs.
 *
 *   pepsi-sendmail [-t] [-i | -oi] [-f sender] [-F fullname] [-C config] [recipient ...]
 *
 * Reads a message on stdin and admits it with pepsi.workqueue_inject at
 * [sendmail] INIT_STAGE (default init), which wakes the dispatcher.  With
 * -t the recipients are taken from the To, Cc and Bcc headers (added to
 * any on the command line) and Bcc is removed.  Without -i a line with a
 * single dot ends the message.  Missing From, Date and Message-ID headers
 * are added; an Authentication-Results that claims our authserv-id is
 * removed (RFC 8601 5: only ingress may say what we checked).  The -f
 * sender is a mailbox (local@domain) or <> for none.  Exit codes are
 * sysexits(3): 0 admitted, 64 usage, 65 bad
 * message, 75 the queue is unreachable (try again), 78 bad configuration.
 * Other sendmail options (-oXXX, -bm, -v, -N, -R, -V, -B) are accepted and
 * ignored, as mail programs pass them freely.
 */
#include <ctype.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "config/config.h"
#include "config/log_config.h"
#include "delivery/maillog.h"
#include "message/header.h"
#include "message/message.h"
#include "message/origin.h"
#include "message/queue_id.h"
#include "process/cli.h"
#include "runtime/db.h"
#include "smtp/smtp_address.h"

#define EX_OK 0
#define EX_USAGE 64
#define EX_DATAERR 65
#define EX_TEMPFAIL 75
#define EX_CONFIG 78

int pepsi_sendmail_main(int argc, char **argv);

struct sendmail_options
{
	bool		from_headers; /* -t */
	bool		ignore_dots;  /* -i, -oi */
	const char *sender;		  /* -f */
	char	   *bracketed;	  /* -f <sender>, its brackets taken off */
	const char *full_name;	  /* -F */
	const char *config_path;  /* -C */
	char	  **rcpt;
	size_t		nrcpt;
};

static void
sendmail_usage(FILE *out)
{
	fprintf(out, "usage: pepsi-sendmail [-t] [-i] [-f sender] [-F full name] [-C config] "
				 "[recipient ...] < message\n");
}

/* Options that take a value, attached (-fx) or as the next word (-f x). */
static const char *
sendmail_value(int argc, char **argv, int *i, const char *arg)
{
	if (arg[2])
		return arg + 2;
	if (*i + 1 < argc)
		return argv[++*i];
	return NULL;
}

/*
 * A control character in an envelope address or the full name would end
 * up in an SMTP command or a header line (CR LF forging one); refused
 * with what it was found in.
 */
static bool
sendmail_one_line(const char *what, const char *value)
{
	for (const char *p = value; *p; p++)
		if ((unsigned char) *p < 0x20 || *p == 0x7f)
		{
			fprintf(stderr, "pepsi-sendmail: %s has a control character (0x%02x); refused\n",
					what, (unsigned char) *p);
			return false;
		}
	return true;
}

/*
 * The -f sender: a mailbox, bare or in angle brackets, or "" or "<>" for
 * the null sender; o->sender becomes the bare mailbox.  What the queue
 * would take but no SMTP server downstream would is refused here.
 */
static bool
sendmail_sender_valid(struct sendmail_options *o)
{
	size_t len = strlen(o->sender);

	if (len >= 2 && o->sender[0] == '<' && o->sender[len - 1] == '>')
	{
		o->bracketed = xstrndup(o->sender + 1, len - 2);
		o->sender = o->bracketed;
	}
	if (o->sender[0] == '\0' || smtp_mailbox_valid(o->sender, true))
		return true;
	fprintf(stderr,
			"pepsi-sendmail: the sender (-f) \"%s\" is not an address: local@domain of at most "
			"%d octets (RFC 5321 4.1.2), or <> for none; refused\n",
			o->sender, SMTP_PATH_MAX);
	return false;
}

static int
sendmail_parse(int argc, char **argv, struct sendmail_options *o)
{
	int i;

	for (i = 1; i < argc && argv[i][0] == '-' && argv[i][1]; i++)
	{
		const char *arg = argv[i];

		if (strcmp(arg, "--") == 0)
		{
			i++;
			break;
		}
		if (cli_is_help(arg))
		{
			sendmail_usage(stdout);
			exit(EX_OK);
		}
		switch (arg[1])
		{
			case 't':
				o->from_headers = true;
				break;
			case 'i':
				o->ignore_dots = true;
				break;
			case 'o':
				if (strcmp(arg, "-oi") == 0 || strcmp(arg, "-oitrue") == 0)
					o->ignore_dots = true;
				else if (strcmp(arg, "-o") == 0)
					i++;
				break;
			case 'f':
			case 'r':
				if ((o->sender = sendmail_value(argc, argv, &i, arg)) == NULL)
					return EX_USAGE;
				break;
			case 'F':
				if ((o->full_name = sendmail_value(argc, argv, &i, arg)) == NULL)
					return EX_USAGE;
				break;
			case 'C':
				if ((o->config_path = sendmail_value(argc, argv, &i, arg)) == NULL)
					return EX_USAGE;
				break;
			case 'N':
			case 'R':
			case 'V':
			case 'B':
			case 'L':
				if (sendmail_value(argc, argv, &i, arg) == NULL)
					return EX_USAGE;
				break;
			case 'b':
				if (strcmp(arg, "-bm") != 0)
				{
					fprintf(stderr, "pepsi-sendmail: mode %s is not supported (only -bm)\n", arg);
					return EX_USAGE;
				}
				break;
			case 'v':
			case 'm':
			case 'U':
				break;
			default:
				fprintf(stderr, "pepsi-sendmail: unknown option %s\n", arg);
				return EX_USAGE;
		}
	}
	for (; i < argc; i++)
	{
		/* A recipient argument may itself be a comma-separated list. */
		char **list = NULL;
		size_t n = 0;

		header_addresses(argv[i], &list, &n);
		o->rcpt = xrealloc(o->rcpt, (o->nrcpt + n + 1) * sizeof(char *));
		if (n > 0)
			memcpy(o->rcpt + o->nrcpt, list, n * sizeof(char *));
		o->nrcpt += n;
		free(list);
		if (n == 0)
		{
			fprintf(stderr, "pepsi-sendmail: \"%s\" is not an address\n", argv[i]);
			return EX_USAGE;
		}
		if (!sendmail_one_line("a recipient", argv[i]))
			return EX_USAGE;
	}
	if ((o->sender && !sendmail_one_line("the sender (-f)", o->sender))
		|| (o->full_name && !sendmail_one_line("the full name (-F)", o->full_name)))
		return EX_USAGE;
	if (o->sender && !sendmail_sender_valid(o))
		return EX_USAGE;
	return EX_OK;
}

/* The message on stdin; without -i a "." line ends it. */
static void
sendmail_read(bool ignore_dots, struct buf *raw)
{
	char   *line = NULL;
	size_t	size = 0;
	ssize_t n;

	while ((n = getline(&line, &size, stdin)) > 0)
	{
		if (!ignore_dots && (strcmp(line, ".\n") == 0 || strcmp(line, ".\r\n") == 0))
			break;
		buf_append(raw, line, (size_t) n);
	}
	free(line);
}

static char *
sendmail_login(void)
{
	struct passwd *pw = getpwuid(getuid());

	return xstrdup(pw ? pw->pw_name : "nobody");
}

static bool
sendmail_has_header(const struct buf *headers, const char *name)
{
	char *value = header_get(headers->data ? headers->data : "", headers->len, name);
	bool  has = value != NULL;

	free(value);
	return has;
}

/*
 * Where the pickup line goes ([pepsi] LOG): with LOG = auto, the mail
 * log even on a terminal, as Postfix's pickup writes it; sendmail's
 * stderr is its caller's (cron mails it, a web application shows it),
 * so only errors go there.
 */
static bool
sendmail_log_configure(const struct pepsi_config *cfg, char *err, size_t errlen)
{
	const char *from_env = getenv("PEPSI_LOG");

	if (!log_configure(cfg, err, errlen))
		return false;
	if ((from_env == NULL || *from_env == '\0') && config_enum(cfg, "pepsi", "LOG") == 0)
		log_set_destination(true);
	return true;
}

int
pepsi_sendmail_main(int argc, char **argv)
{
	struct sendmail_options o = {0};
	const char			   *hostname;
	const char			   *stage;
	char					err[1024];
	struct pepsi_config	   *cfg = NULL;
	struct buf				raw = BUF_INIT;
	struct buf				headers = BUF_INIT;
	struct buf				body = BUF_INIT;
	struct buf				added = BUF_INIT;
	struct buf				rcpt_array = BUF_INIT;
	char				   *login = sendmail_login();
	char				   *sender = NULL;
	json_t				   *state = NULL;
	char				   *state_text = NULL;
	char					queue_id[QUEUE_ID_LEN + 1];
	PGconn				   *conn = NULL;
	PGresult			   *res;
	int						rc;

	log_init("pepsi-sendmail", false);
	if ((rc = sendmail_parse(argc, argv, &o)) != EX_OK)
	{
		sendmail_usage(stderr);
		goto out;
	}
	if (o.config_path == NULL)
		o.config_path = getenv("PEPSI_CONFIG");
	if (o.config_path == NULL)
		o.config_path = PEPSI_CONFIG_DEFAULT_PATH;
	if ((cfg = config_load(o.config_path, err, sizeof(err))) == NULL)
	{
		fprintf(stderr, "pepsi-sendmail: %s\n", err);
		rc = EX_CONFIG;
		goto out;
	}
	if (!sendmail_log_configure(cfg, err, sizeof(err)))
	{
		fprintf(stderr, "pepsi-sendmail: %s\n", err);
		rc = EX_CONFIG;
		goto out;
	}
	hostname = config_hostname(cfg);
	stage = config_text(cfg, "sendmail", "INIT_STAGE");
	sender = o.sender ? xstrdup(o.sender) : xasprintf("%s@%s", login, hostname);

	sendmail_read(o.ignore_dots, &raw);
	message_split(raw.data ? raw.data : "", raw.len, &headers, &body);
	if (headers.len == 0 && body.len == 0)
	{
		fprintf(stderr, "pepsi-sendmail: the message is empty\n");
		rc = EX_DATAERR;
		goto out;
	}

	if (o.from_headers)
	{
		struct buf	values = BUF_INIT;
		struct buf	without_bcc = BUF_INIT;
		char	  **list = NULL;
		size_t		n = 0;
		const char *names[] = {"To", "Cc", "Bcc"};

		for (size_t k = 0; k < 3; k++)
		{
			buf_reset(&values);
			header_get_all(headers.data ? headers.data : "", headers.len, names[k], &values);
			if (values.len)
				header_addresses(values.data, &list, &n);
		}
		o.rcpt = xrealloc(o.rcpt, (o.nrcpt + n + 1) * sizeof(char *));
		for (size_t k = 0; k < n; k++)
			o.rcpt[o.nrcpt++] = list[k];
		free(list);
		header_remove(headers.data ? headers.data : "", headers.len, "Bcc", &without_bcc);
		buf_free(&headers);
		headers = without_bcc;
		buf_free(&values);
	}
	{
		/* Only ingress says what we checked (RFC 8601 5): a claim of our authserv-id goes. */
		struct buf kept = BUF_INIT;

		if (header_remove_results_of(headers.data ? headers.data : "", headers.len,
									 config_authserv_id(cfg), &kept)
			> 0)
		{
			buf_free(&headers);
			headers = kept;
		}
		else
			buf_free(&kept);
	}
	for (size_t k = 0; k < o.nrcpt; k++)
		if (!sendmail_one_line("a recipient", o.rcpt[k]))
		{
			rc = EX_DATAERR;
			goto out;
		}
	if (o.nrcpt == 0)
	{
		fprintf(stderr, "pepsi-sendmail: no recipients%s\n",
				o.from_headers ? " (none on the command line, none in To, Cc or Bcc)" : "");
		rc = EX_USAGE;
		goto out;
	}

	/* Headers a message must have, added in front. */
	if (!sendmail_has_header(&headers, "From"))
	{
		if (o.full_name)
		{
			/* A quoted-string (RFC 5322 3.2.4): its quotes and backslashes escaped. */
			buf_append_str(&added, "From: \"");
			for (const char *p = o.full_name; *p; p++)
			{
				if (*p == '"' || *p == '\\')
					buf_append_char(&added, '\\');
				buf_append_char(&added, *p);
			}
			buf_printf(&added, "\" <%s>\r\n", sender[0] ? sender : login);
		}
		else
			buf_printf(&added, "From: %s\r\n", sender[0] ? sender : login);
	}
	if (!sendmail_has_header(&headers, "Date"))
	{
		char   date[64];
		time_t now = time(NULL);

		strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S %z", localtime(&now));
		buf_printf(&added, "Date: %s\r\n", date);
	}
	if (!sendmail_has_header(&headers, "Message-ID"))
		buf_printf(&added, "Message-ID: <%ld.%d.%ld@%s>\r\n", (long) time(NULL), (int) getpid(),
				   random() % 1000000, hostname);
	buf_append(&added, headers.data, headers.len);

	buf_append_char(&rcpt_array, '{');
	for (size_t k = 0; k < o.nrcpt; k++)
		db_array_append(&rcpt_array, o.rcpt[k]);
	buf_append_char(&rcpt_array, '}');
	/* Local submission is inside the trust boundary (common/message/origin.h). */
	state = json_pack("{s:{s:s,s:b,s:s,s:s},s:{s:n,s:n,s:o}}", "origin", "trust", ORIGIN_TRUST_LOCAL,
					  "local", 1, "user", login, "program", "pepsi-sendmail", "dsn", "ret", "envid",
					  "rcpt", json_array());
	for (size_t k = 0; k < o.nrcpt; k++)
		json_array_append_new(json_object_get(json_object_get(state, "dsn"), "rcpt"),
							  json_pack("{s:n,s:n}", "notify", "orcpt"));
	/* The message's one name from here on (common/message/queue_id.h). */
	queue_id_make(queue_id_host(cfg), queue_id);
	json_object_set_new(state, "queue_id", json_string(queue_id));
	state_text = json_dumps(state, JSON_COMPACT);

	if ((conn = db_connect_as(cfg, "sendmail", "CONNINFO", "pepsi-sendmail", err, sizeof(err))) == NULL)
	{
		fprintf(stderr, "pepsi-sendmail: %s\n", err);
		rc = EX_TEMPFAIL;
		goto out;
	}
	{
		const char *values[6] = {stage, sender, rcpt_array.data, added.data ? added.data : "",
								 body.data ? body.data : "", state_text};
		int			lengths[6] = {0, 0, 0, (int) added.len, (int) body.len, 0};
		int			formats[6] = {0, 0, 0, 1, 1, 0};

		res = PQexecParams(conn, "SELECT pepsi.workqueue_inject($1, $2, $3, $4, $5, $6)", 6, NULL,
						   values, lengths, formats, 0);
	}
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		fprintf(stderr, "pepsi-sendmail: the queue refused the message: %s\n", db_error(res, conn));
		rc = db_error_is_transient(res) || PQstatus(conn) != CONNECTION_OK ? EX_TEMPFAIL : EX_DATAERR;
	}
	else
	{
		/* The lines Postfix's pickup and qmgr write for a local submission. */
		maillog_pickup(queue_id, (unsigned long) getuid(), sender);
		maillog_queued(queue_id, sender, added.len + body.len + 2, o.nrcpt, atoll(PQgetvalue(res, 0, 0)));
		rc = EX_OK;
	}
	PQclear(res);
out:
	if (conn)
		PQfinish(conn);
	json_decref(state);
	free(state_text);
	buf_free(&raw);
	buf_free(&headers);
	buf_free(&body);
	buf_free(&added);
	buf_free(&rcpt_array);
	free(login);
	free(sender);
	free(o.bracketed);
	for (size_t k = 0; k < o.nrcpt; k++)
		free(o.rcpt[k]);
	free(o.rcpt);
	if (cfg)
		config_free(cfg);
	return rc;
}
