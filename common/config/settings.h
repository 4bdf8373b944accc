/*
 * settings.h: the per-address override layer (spec 22.1 and 22.3,
 * pepsi.settings): what an account's owner set for their own address, a
 * privilege boundary apart from the administrator's pepsi.config_override.
 * A stage reads them through pepsi_address_settings (stage.h); they are
 * written only through audited functions that check each value (such as
 * pepsi.vacation_set).
 */
#ifndef PEPSI_SETTINGS_H
#define PEPSI_SETTINGS_H

#include <stddef.h>

#include <jansson.h>
#include <libpq-fe.h>

/* The settings of address (any case) as a JSON object option -> value (new reference); NULL with err. */
json_t *settings_for_address(PGconn *conn, const char *address, char *err, size_t errlen);
/*
 * The settings of every address of addresses[0..count) with one statement:
 * a JSON object address (as given) -> its settings (an empty object for
 * one with none); a new reference, or NULL with err.
 */
json_t *settings_for_addresses(PGconn *conn, const char *const *addresses, size_t count, char *err,
							   size_t errlen);

#endif
