/*
 * flows.c
 *		The table of flows (flow.h): the engine's only list of them. A new
 *		flow is one line here.
 */
#include "postgres.h"

#include "flow.h"

/* Every flow the engine drives, NULL-ended. */
const RelayFlowRoutine *const RelayFlows[] = {
	&RelayForwardFlow,
	&RelayReverseFlow,
	&RelayHandlerFlow,
	&RelayScheduleFlow,
	NULL
};
