/*
 * aliases.h: the aliases(5) file and its expansion: pepsi-stage-aliases
 * expands with it, and the local-recipient resolver (local.c) asks it
 * whether a name exists.
 */
#ifndef PEPSI_ALIASES_H
#define PEPSI_ALIASES_H

#include <stdbool.h>
#include <stddef.h>

struct alias_table;

/* Parse an aliases file (or text); NULL with "name:line: reason" in err. */
struct alias_table *aliases_load(const char *path, char *err, size_t errlen);
struct alias_table *aliases_parse(const char *text, const char *name, char *err, size_t errlen);
void				aliases_free(struct alias_table *table);
size_t				aliases_count(const struct alias_table *table);
/* Is local (a local part, any case) a name of the table? */
bool aliases_has(const struct alias_table *table, const char *local);

/*
 * Expand address recursively.  Its local part is looked up when its
 * domain is one of domains (comma/space separated) or it has none.  A
 * target without a domain takes the address's domain.  A name met again
 * on its own expansion path (a loop, or an alias to itself) is delivered
 * as the address it is rather than expanded again.  The final addresses
 * are appended to *out (each once, in order).  Returns false with err when
 * the expansion is larger or deeper than the limits (10,000 addresses,
 * 32 levels, 100,000 lookups).
 */
bool aliases_expand(const struct alias_table *table, const char *address,
					const char *domains, char ***out, size_t *count,
					char *err, size_t errlen);

#endif
