/*
 * helper_call.h: running a set-user-id helper from its set-group-id stage
 * (pepsi-stage-dot-forward, pepsi-stage-auto-pay): where the helper is,
 * and one call of it with the stage's group taken up for that execution
 * only.
 */
#ifndef PEPSI_HELPER_CALL_H
#define PEPSI_HELPER_CALL_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"

/*
 * The helper name: configured (the stage's HELPER option, or NULL), else
 * beside this program (where make install puts both).  Set-group-id,
 * always the one beside it: the group's right must not pass to a program
 * the configuration names.  Allocated.
 */
char *helper_call_path(const char *configured, const char *name);

/*
 * Run the helper at path with argv (argv[0] its name, NULL-terminated),
 * input (or NULL) on its stdin; its standard output, up to max_answer
 * bytes, in *answer (NUL-terminated).  False with err when it could not
 * be run or did not exit 0.
 */
bool helper_call(const char *path, const char *const *argv, const struct buf *input, size_t max_answer,
				 struct buf *answer, char *err, size_t errlen);

#endif
