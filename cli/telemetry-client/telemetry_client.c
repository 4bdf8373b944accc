/*
 * pepsi-telemetry-client: send this installation's aggregate counts to a
 * pepsi-telemetry collector, if the operator opted in.
 *
 *   pepsi-telemetry-client [-C CONFIG] [--dry-run]
 *
 * Off unless [telemetry] ENABLED = yes: then it exits at once, connecting
 * to nothing.  --dry-run prints the report, byte for byte what would be
 * posted, and sends nothing, on or off.  The report (payload.c) holds
 * versions, volumes by day and the stage graph's shape, never a message,
 * an address or (unless SEND_HOSTNAME) a host name; it is tied to an
 * install id that is random (getrandom), kept in INSTALL_ID_FILE, and
 * derived from nothing on the host.  The POST (libcurl) is https only,
 * the certificate verified (CA_FILE), redirects not followed, within
 * TIMEOUT; a network error or a 5xx is retried once after RETRY_DELAY,
 * a refusal (a 4xx; 429 says this install reported too recently) or a
 * certificate that does not verify is not.  Run daily by pepsi-telemetry-client.timer.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "base/buf.h"
#include "base/log.h"
#include "config/config.h"
#include "payload.h"
#include "process/cli.h"
#include "runtime/db.h"

int pepsi_telemetry_client_main(int argc, char **argv);

#define TC_PROGRAM "pepsi-telemetry-client"
#define TC_ID_LEN 36
/* What is kept of the collector's answer, for the message. */
#define TC_MAX_ANSWER 512

static void
tc_usage(FILE *out)
{
	fprintf(out, "usage: " TC_PROGRAM " [-C CONFIG] [--dry-run]\n"
				 "  send the aggregate counts of pepsi-telemetry-client(8) to [telemetry] URL,\n"
				 "  when [telemetry] ENABLED = yes; --dry-run prints them and sends nothing\n");
}

/* 8-4-4-4-12 lower-case hex digits. */
static bool
tc_id_valid(const char *id)
{
	for (int i = 0; i < TC_ID_LEN; i++)
	{
		bool dash = i == 8 || i == 13 || i == 18 || i == 23;

		if (dash ? id[i] != '-' : strchr("0123456789abcdef", id[i]) == NULL || id[i] == '\0')
			return false;
	}
	return id[TC_ID_LEN] == '\0';
}

/* A version 4 UUID from the kernel's random numbers. */
static bool
tc_id_make(char *id, char *err, size_t errlen)
{
	unsigned char r[16];

	if (getrandom(r, sizeof(r), 0) != (ssize_t) sizeof(r))
	{
		snprintf(err, errlen, "getrandom: %s", strerror(errno));
		return false;
	}
	r[6] = (unsigned char) ((r[6] & 0x0f) | 0x40);
	r[8] = (unsigned char) ((r[8] & 0x3f) | 0x80);
	snprintf(id, TC_ID_LEN + 1, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", r[0],
			 r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]);
	return true;
}

/*
 * The install id in path, made there (O_EXCL, whole or not at all) at the
 * first run.  false with err when the file cannot be read or made, or
 * holds something else.
 */
static bool
tc_install_id(const char *path, char *id, char *err, size_t errlen)
{
	char  line[64] = "";
	FILE *f = fopen(path, "r");
	int	  fd;

	if (f)
	{
		if (fgets(line, sizeof(line), f) == NULL)
			line[0] = '\0';
		fclose(f);
		line[strcspn(line, "\r\n")] = '\0';
		if (!tc_id_valid(line))
		{
			snprintf(err, errlen, "%s ([telemetry] INSTALL_ID_FILE) holds no install id; delete it to get a new one",
					 path);
			return false;
		}
		memcpy(id, line, TC_ID_LEN + 1);
		return true;
	}
	if (errno != ENOENT)
	{
		snprintf(err, errlen, "%s ([telemetry] INSTALL_ID_FILE): %s", path, strerror(errno));
		return false;
	}
	if (!tc_id_make(id, err, errlen))
		return false;
	snprintf(line, sizeof(line), "%s.%ld", path, (long) getpid());
	if ((fd = open(line, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)) < 0 || dprintf(fd, "%s\n", id) < 0
		|| fsync(fd) != 0 || close(fd) != 0 || link(line, path) != 0)
	{
		/* (link, not rename: a racing first run's id is kept, and read below) */
		int saved = errno;

		unlink(line);
		if (saved == EEXIST)
			return tc_install_id(path, id, err, errlen);
		snprintf(err, errlen, "cannot make %s ([telemetry] INSTALL_ID_FILE): %s", path, strerror(saved));
		return false;
	}
	unlink(line);
	return true;
}

static size_t
tc_collect_answer(char *data, size_t size, size_t n, void *arg)
{
	struct buf *answer = arg;
	size_t		len = size * n;

	if (answer->len < TC_MAX_ANSWER)
		buf_append(answer, data, answer->len + len > TC_MAX_ANSWER ? TC_MAX_ANSWER - answer->len : len);
	return len;
}

enum tc_outcome
{
	TC_SENT,
	TC_REFUSED,	  /* the collector said no: not retried */
	TC_UNTRUSTED, /* the certificate did not verify: not retried */
	TC_LATER,	  /* 429: this install reported too recently; not retried */
	TC_TRANSIENT, /* retried once */
};

/* One POST of body; why says what went wrong. */
static enum tc_outcome
tc_post(const struct pepsi_config *cfg, const char *body, char *why, size_t whylen)
{
	const char		  *ca_file = config_text(cfg, "telemetry", "CA_FILE");
	CURL			  *curl = curl_easy_init();
	struct curl_slist *headers = NULL;
	struct buf		   answer = BUF_INIT;
	char			   curl_error[CURL_ERROR_SIZE] = "";
	long			   status = 0;
	CURLcode		   rc;
	enum tc_outcome	   outcome;

	if (curl == NULL)
	{
		snprintf(why, whylen, "cannot start libcurl");
		return TC_TRANSIENT;
	}
	headers = curl_slist_append(NULL, "Content-Type: application/json");
	curl_easy_setopt(curl, CURLOPT_URL, config_text(cfg, "telemetry", "URL"));
	curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "https");
	curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 1L);
	curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 2L);
	if (ca_file)
		curl_easy_setopt(curl, CURLOPT_CAINFO, ca_file);
	curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long) config_duration_ms(cfg, "telemetry", "TIMEOUT"));
	curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
	curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) strlen(body));
	curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, curl_error);
	curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, tc_collect_answer);
	curl_easy_setopt(curl, CURLOPT_WRITEDATA, &answer);
	curl_easy_setopt(curl, CURLOPT_USERAGENT, "pepsi-telemetry-client");
	rc = curl_easy_perform(curl);
	curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
	buf_append(&answer, "", 0);
	if (rc != CURLE_OK)
	{
		snprintf(why, whylen, "%s", curl_error[0] ? curl_error : curl_easy_strerror(rc));
		outcome = rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CACERT_BADFILE ? TC_UNTRUSTED
																						 : TC_TRANSIENT;
	}
	else
	{
		answer.data[strcspn(answer.data, "\r\n")] = '\0';
		snprintf(why, whylen, "HTTP %ld %s", status, answer.data);
		if (status >= 200 && status < 300)
			outcome = TC_SENT;
		else if (status == 429)
			outcome = TC_LATER;
		else
			outcome = status >= 500 ? TC_TRANSIENT : TC_REFUSED;
	}
	buf_free(&answer);
	curl_slist_free_all(headers);
	curl_easy_cleanup(curl);
	return outcome;
}

/* Post body, retrying once; the sysexits status. */
static int
tc_send(const struct pepsi_config *cfg, const char *body)
{
	char			why[TC_MAX_ANSWER + 64];
	enum tc_outcome outcome = tc_post(cfg, body, why, sizeof(why));
	long long		delay_ms = config_duration_ms(cfg, "telemetry", "RETRY_DELAY");

	if (outcome == TC_TRANSIENT)
	{
		log_warnx("%s: %s; trying again in %lld ms ([telemetry] RETRY_DELAY)", config_text(cfg, "telemetry", "URL"),
				  why, delay_ms);
		if (delay_ms > 0)
			usleep((useconds_t) (delay_ms * 1000));
		outcome = tc_post(cfg, body, why, sizeof(why));
	}
	switch (outcome)
	{
		case TC_SENT:
			log_info("sent to %s: %s", config_text(cfg, "telemetry", "URL"), why);
			return CLI_EX_OK;
		case TC_REFUSED:
			log_warnx("%s refused the report: %s", config_text(cfg, "telemetry", "URL"), why);
			return CLI_EX_DATAERR;
		case TC_LATER:
			log_warnx("%s: %s; the next run tries again", config_text(cfg, "telemetry", "URL"), why);
			return CLI_EX_TEMPFAIL;
		case TC_UNTRUSTED:
			log_warnx("%s: %s; nothing sent ([telemetry] CA_FILE names the trust anchors)",
					  config_text(cfg, "telemetry", "URL"), why);
			return CLI_EX_NOPERM;
		default:
			log_warnx("%s: %s; nothing sent, the next run tries again", config_text(cfg, "telemetry", "URL"), why);
			return CLI_EX_TEMPFAIL;
	}
}

/* ENABLED needs an https: URL; false with the reason. */
static bool
tc_url_valid(const struct pepsi_config *cfg, char *err, size_t errlen)
{
	const char *url = config_text(cfg, "telemetry", "URL");

	if (url == NULL || strncasecmp(url, "https://", 8) != 0 || url[8] == '\0')
	{
		snprintf(err, errlen, "%s: [telemetry] URL must be the collector's https: address (it is %s%s%s)",
				 cfg->path, url ? "\"" : "", url ? url : "unset", url ? "\"" : "");
		return false;
	}
	return true;
}

/* The report, made and printed or sent; the exit status. */
static int
tc_report(struct pepsi_config *cfg, bool dry_run)
{
	char	err[1024];
	char	id[TC_ID_LEN + 1];
	PGconn *conn;
	json_t *report;
	char   *body;
	int		rc;

	if (!tc_install_id(config_text(cfg, "telemetry", "INSTALL_ID_FILE"), id, err, sizeof(err)))
	{
		log_warnx("%s", err);
		return CLI_EX_CONFIG;
	}
	if ((conn = db_connect_as(cfg, "database", "MONITOR_CONNINFO", TC_PROGRAM, err, sizeof(err))) == NULL)
	{
		log_warnx("%s", err);
		return CLI_EX_TEMPFAIL;
	}
	report = telemetry_payload(cfg, conn, id, err, sizeof(err));
	PQfinish(conn);
	if (report == NULL)
	{
		log_warnx("%s", err);
		return CLI_EX_TEMPFAIL;
	}
	body = json_dumps(report, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(report);
	if (dry_run)
	{
		printf("%s\n", body);
		rc = CLI_EX_OK;
	}
	else
		rc = tc_send(cfg, body);
	free(body);
	return rc;
}

int
pepsi_telemetry_client_main(int argc, char **argv)
{
	static const struct option longopts[] = {{"dry-run", no_argument, NULL, 'n'},
											 {"help", no_argument, NULL, 'h'},
											 {NULL, 0, NULL, 0}};
	const char				  *config_path = NULL;
	struct pepsi_config		  *cfg;
	char					   err[1024];
	bool					   dry_run = false;
	int						   c, rc;

	log_init(TC_PROGRAM, false);
	while ((c = getopt_long(argc, argv, "C:h", longopts, NULL)) != -1)
		switch (c)
		{
			case 'C':
				config_path = optarg;
				break;
			case 'n':
				dry_run = true;
				break;
			case 'h':
				tc_usage(stdout);
				return CLI_EX_OK;
			default:
				tc_usage(stderr);
				return CLI_EX_USAGE;
		}
	if (optind != argc)
	{
		tc_usage(stderr);
		return CLI_EX_USAGE;
	}
	if ((cfg = config_load(cli_config_path(config_path), err, sizeof(err))) == NULL)
	{
		fprintf(stderr, TC_PROGRAM ": %s\n", err);
		return CLI_EX_CONFIG;
	}
	if (!config_bool(cfg, "telemetry", "ENABLED") && !dry_run)
	{
		log_info("telemetry is off ([telemetry] ENABLED = no): nothing sent");
		config_free(cfg);
		return CLI_EX_OK;
	}
	if (!dry_run && !tc_url_valid(cfg, err, sizeof(err)))
	{
		log_warnx("%s", err);
		config_free(cfg);
		return CLI_EX_CONFIG;
	}
	rc = tc_report(cfg, dry_run);
	config_free(cfg);
	return rc;
}
