/*
 * expect_error.h: the check the parser tests share: a refusal's message
 * must start with the place (file:line) and name the problem.
 */
#ifndef PEPSI_EXPECT_ERROR_H
#define PEPSI_EXPECT_ERROR_H

#include <string.h>

/* Fail the test unless err starts with want_prefix and contains want (if given). */
static inline void
expect_error(const char *err, const char *want_prefix, const char *want)
{
	if (strncmp(err, want_prefix, strlen(want_prefix)) != 0)
		fail_msg("error \"%s\" does not start with \"%s\"", err, want_prefix);
	if (want && strstr(err, want) == NULL)
		fail_msg("error \"%s\" does not mention \"%s\"", err, want);
}

#endif
