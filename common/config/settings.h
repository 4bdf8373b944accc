/*
 * settings.h: the per-address override layer (spec 22.1 and 22.3,
 * pepsi.settings): what an account's owner set for their own address, a
 * privilege boundary apart from the administrator's pepsi.config_override.
 * A stage reads them through pepsi_address_settings (stage.h); they are
 * written only through audited functions that check each value
 * (pepsi.settings_set, the confirmed requests of pepsi-stage-settings,
 * pepsi.vacation_set).
 *
 * A domain has rows too ("@example.org"), for the addresses that set
 * none of their own: an address's settings are its domain's with its own
 * over them.  Only the options schema/options.def marks OWNER are read
 * from them, and for those the owner's value wins over the
 * configuration's (settings_text_for): address, then domain, then the
 * configuration for that address.
 */
#ifndef PEPSI_SETTINGS_H
#define PEPSI_SETTINGS_H

#include <stddef.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "config/config.h"

/*
 * The settings of address (any case), its own over its domain's, as a
 * JSON object option -> value (new reference); NULL with err.
 */
json_t *settings_for_address(PGconn *conn, const char *address, char *err, size_t errlen);
/*
 * The settings of every address of addresses[0..count) with one statement:
 * a JSON object address (as given) -> its settings (an empty object for
 * one with none); a new reference, or NULL with err.
 */
json_t *settings_for_addresses(PGconn *conn, const char *const *addresses, size_t count, char *err,
							   size_t errlen);

/* The owner's value of option in settings (as read above), or NULL when unset or not an OWNER option. */
const char *settings_owner_value(const json_t *settings, const char *option);
/*
 * The value of option for address: the owner's (settings_owner_value),
 * else section's for address and its domain (config_text_for).
 */
const char *settings_text_for(const struct pepsi_config *cfg, const char *section, const json_t *settings,
							  const char *option, const char *address);

#endif
