/*
 * pepsi-keys: the DKIM keys of pepsi-stage-dkim-sign and pepsi-stage-arc-seal.
 *
 *   pepsi-keys generate -a rsa-sha256|ed25519-sha256 [-b 2048|3072] -o KEYFILE
 *       make a key pair: the private key to KEYFILE (PEM, mode 0600, never
 *       over an existing file), and print the DNS TXT record to publish
 *   pepsi-keys record -a ALGORITHM KEYFILE
 *       print the TXT record of an existing private key
 *   pepsi-keys show [-c CONFIG]
 *       every [dkim-key-*] of the configuration: domain, selector, the DNS
 *       name to publish at, and the record (a key that cannot be loaded is
 *       named with the reason, and the exit status is 78)
 *   pepsi-keys check [-c CONFIG]
 *       look every [dkim-key-*]'s record up through the resolver ([pepsi]
 *       DNS_*) and compare it with the private key: "ok", or what is wrong
 *       (no record, a malformed or revoked one, another key); exit status
 *       0 only when every key is published as it should be, else 65
 *
 * and the key store's identities and key-encryption key (identity.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/pem.h>

#include "auth/keys.h"
#include "base/log.h"
#include "config/config.h"
#include "dns/dns.h"
#include "identity.h"
#include "process/cli.h"

int pepsi_keys_main(int argc, char **argv);

static int
keys_usage(FILE *out)
{
	fprintf(out,
			"usage: pepsi-keys generate -a rsa-sha256|ed25519-sha256 [-b BITS] -o KEYFILE\n"
			"       pepsi-keys record -a rsa-sha256|ed25519-sha256 KEYFILE\n"
			"       pepsi-keys show [-c CONFIG]\n"
			"       pepsi-keys check [-c CONFIG]\n"
			"%s",
			keys_identity_usage);
	return out == stdout ? CLI_EX_OK : CLI_EX_USAGE;
}

/* Print the TXT record of pkey; frees pkey. */
static int
keys_print_record(EVP_PKEY *pkey, enum sign_algorithm algorithm)
{
	struct buf record = BUF_INIT;

	keys_public_record(pkey, algorithm, &record);
	printf("%s\n", record.data);
	buf_free(&record);
	EVP_PKEY_free(pkey);
	return CLI_EX_OK;
}

static int
keys_generate_command(enum sign_algorithm algorithm, int bits, const char *out)
{
	EVP_PKEY *pkey;
	char	  err[512];

	if (algorithm == SIGN_RSA_SHA256 && (bits < KEYS_RSA_MIN_BITS || bits > KEYS_RSA_MAX_BITS))
	{
		fprintf(stderr, "pepsi-keys: -b %d: RSA keys are %d to %d bits (2048 or 3072)\n",
				bits, KEYS_RSA_MIN_BITS, KEYS_RSA_MAX_BITS);
		return CLI_EX_USAGE;
	}
	pkey = keys_generate(algorithm, bits);
	if (pkey == NULL)
	{
		fprintf(stderr, "pepsi-keys: key generation failed\n");
		return CLI_EX_DATAERR;
	}
	if (!keys_write_private(out, pkey, err, sizeof(err)))
	{
		fprintf(stderr, "pepsi-keys: %s\n", err);
		EVP_PKEY_free(pkey);
		return CLI_EX_CONFIG;
	}
	return keys_print_record(pkey, algorithm);
}

static int
keys_record_command(enum sign_algorithm algorithm, const char *path)
{
	char	  err[512];
	EVP_PKEY *pkey = keys_load_private(path, algorithm, err, sizeof(err));

	if (pkey == NULL)
	{
		fprintf(stderr, "pepsi-keys: %s\n", err);
		return CLI_EX_CONFIG;
	}
	return keys_print_record(pkey, algorithm);
}

static int
keys_show_command(const char *config_path)
{
	char				 err[512];
	struct pepsi_config *cfg = config_load(config_path, err, sizeof(err));
	struct keyring		 ring = {0};
	int					 rc = CLI_EX_OK;

	if (cfg == NULL)
	{
		fprintf(stderr, "pepsi-keys: %s\n", err);
		return CLI_EX_CONFIG;
	}
	if (!keyring_from_config(cfg, &ring, err, sizeof(err)))
	{
		fprintf(stderr, "pepsi-keys: %s\n", err);
		config_free(cfg);
		return CLI_EX_CONFIG;
	}
	for (size_t i = 0; i < ring.count; i++)
	{
		struct signing_key *k = &ring.key[i];
		struct buf			record = BUF_INIT;

		if (!signing_key_ready(k, err, sizeof(err)))
		{
			fprintf(stderr, "pepsi-keys: %s\n", err);
			rc = CLI_EX_CONFIG;
			continue;
		}
		keys_public_record(k->pkey, k->algorithm, &record);
		printf("[%s] %s._domainkey.%s TXT \"%s\"\n", k->section, k->selector, k->domain, record.data);
		buf_free(&record);
	}
	keyring_free(&ring);
	config_free(cfg);
	return rc;
}

/* Is the published record of key the key?  Prints the verdict; false if not. */
static bool
keys_check_one(struct dns_resolver *resolver, struct signing_key *k)
{
	char name[512];
	char verdict[512];
	bool ok = keys_check_published(resolver, k, name, sizeof(name), verdict, sizeof(verdict));

	printf("[%s] %s: %s\n", k->section, name, verdict);
	return ok;
}

static int
keys_check_command(const char *config_path)
{
	char				 err[512];
	struct pepsi_config *cfg = config_load(config_path, err, sizeof(err));
	struct keyring		 ring = {0};
	struct dns_config	 dns;
	struct dns_resolver *resolver = NULL;
	int					 rc = CLI_EX_OK;

	if (cfg == NULL || !keyring_from_config(cfg, &ring, err, sizeof(err))
		|| !dns_config_load(cfg, &dns, err, sizeof(err)))
	{
		fprintf(stderr, "pepsi-keys: %s\n", err);
		if (cfg)
			config_free(cfg);
		keyring_free(&ring);
		return CLI_EX_CONFIG;
	}
	resolver = dns_resolver_new(NULL, &dns, err, sizeof(err));
	dns_config_free(&dns);
	if (resolver == NULL)
	{
		fprintf(stderr, "pepsi-keys: %s\n", err);
		rc = CLI_EX_CONFIG;
	}
	for (size_t i = 0; resolver && i < ring.count; i++)
		if (!keys_check_one(resolver, &ring.key[i]))
			rc = CLI_EX_DATAERR;
	if (resolver)
		dns_resolver_free(resolver);
	keyring_free(&ring);
	config_free(cfg);
	return rc;
}

int
pepsi_keys_main(int argc, char **argv)
{
	const char		   *command = argc > 1 ? argv[1] : NULL;
	const char		   *algorithm_name = NULL;
	const char		   *out = NULL;
	const char		   *config_path = PEPSI_CONFIG_DEFAULT_PATH;
	enum sign_algorithm algorithm = SIGN_RSA_SHA256;
	long				bits = 2048;
	int					c;

	log_init("pepsi-keys", false);
	if (command == NULL)
		return keys_usage(stderr);
	if (cli_is_help(command))
		return keys_usage(stdout);
	if (keys_identity_command(command))
	{
		int rc = keys_identity_main(argc, argv);

		return rc == CLI_EX_USAGE ? keys_usage(stderr) : rc;
	}
	optind = 2;
	while ((c = getopt(argc, argv, "a:b:o:c:")) != -1)
	{
		switch (c)
		{
			case 'a':
				algorithm_name = optarg;
				break;
			case 'b':
				if (!cli_parse_int_range(optarg, 1, KEYS_RSA_MAX_BITS, &bits))
				{
					fprintf(stderr, "pepsi-keys: -b %s: RSA keys are %d to %d bits (2048 or 3072)\n", optarg,
							KEYS_RSA_MIN_BITS, KEYS_RSA_MAX_BITS);
					return CLI_EX_USAGE;
				}
				break;
			case 'o':
				out = optarg;
				break;
			case 'c':
				config_path = optarg;
				break;
			default:
				return keys_usage(stderr);
		}
	}
	if (algorithm_name && !sign_algorithm_parse(algorithm_name, strlen(algorithm_name), &algorithm))
	{
		fprintf(stderr, "pepsi-keys: -a %s: use rsa-sha256 or ed25519-sha256\n", algorithm_name);
		return CLI_EX_USAGE;
	}
	if (strcmp(command, "generate") == 0 && algorithm_name && out && optind == argc)
		return keys_generate_command(algorithm, bits, out);
	if (strcmp(command, "record") == 0 && algorithm_name && optind == argc - 1)
		return keys_record_command(algorithm, argv[optind]);
	if (strcmp(command, "show") == 0 && optind == argc)
		return keys_show_command(config_path);
	if (strcmp(command, "check") == 0 && optind == argc)
		return keys_check_command(config_path);
	return keys_usage(stderr);
}
