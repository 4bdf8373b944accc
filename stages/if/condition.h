/*
 * condition.h: the CONDITION of pepsi-stage-if, parsed once and compared
 * with a value; no I/O, so the unit tests drive it with vectors.
 */
#ifndef PEPSI_STAGE_IF_CONDITION_H
#define PEPSI_STAGE_IF_CONDITION_H

#include <regex.h>
#include <stdbool.h>
#include <stddef.h>

enum if_op
{
	IF_EQ,
	IF_NE,
	IF_MATCH,
	IF_NOMATCH,
	IF_LT,
	IF_GT,
	IF_EXISTS,
	IF_MISSING
};

struct if_condition
{
	char	  *text; /* as configured, to reuse a parse */
	char	  *subject;
	enum if_op op;
	char	  *value;
	regex_t	   regex;
	bool	   has_regex;
};

/* Parse text into c; false with a reason in err (and c left empty). */
bool if_condition_parse(const char *text, struct if_condition *c, char *err, size_t errlen);
void if_condition_free(struct if_condition *c);
/* Does value (NULL: the subject is absent) satisfy the condition's operator? */
bool if_compare(const struct if_condition *c, const char *value);

#endif
