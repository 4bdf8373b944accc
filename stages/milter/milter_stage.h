/*
 * milter_stage.h: the parts of pepsi-stage-milter.
 *
 *   main.c  the stage: options, the filters in order, the verdict and
 *           the terminal that records it
 *
 * The message, the MILTERS list and one filter's conversation are
 * common/message/milter_filter.h's: pepsi-ingress shows the same filters
 * the message before it is queued (its listeners' MILTERS).
 */
#ifndef PEPSI_MILTER_STAGE_H
#define PEPSI_MILTER_STAGE_H

#include "message/milter_filter.h"

#endif
