/*
 * identity.h: pepsi-keys' commands over the key store (pepsi.crypto_identity
 * and the key-encryption key), beside its DKIM ones (keys.c).
 */
#ifndef PEPSI_KEYS_IDENTITY_H
#define PEPSI_KEYS_IDENTITY_H

/* pepsi-keys identity ... and kek-...: argv[1] is the command; the exit status. */
int keys_identity_main(int argc, char **argv);
/* Whether argv[1] is one of them. */
int keys_identity_command(const char *command);
/* Their usage lines. */
extern const char keys_identity_usage[];

#endif
