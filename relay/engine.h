/*
 * engine.h
 *		What the relay worker's process (worker.c) calls of its engine: the
 *		operations in flight (engine.c) and the table of units (units.c).
 *		Flows use flow.h, never this header.
 */
#ifndef TIDE_ENGINE_H
#define TIDE_ENGINE_H

#include "postgres.h"

#include "datatype/timestamp.h"

#include "flow.h"
#include "launcher.h"
#include "relay_xact.h"

/* engine.c */
extern void RelayEngineInit(void);
extern MemoryContext RelayEngineContext(void);
extern int	RelayOperationsInFlight(void);
extern int	RelayAbandonOperations(void);
extern void RelayProgressOperations(void);
extern TimestampTz RelayOperationsDueBy(TimestampTz until);
extern bool RelayDatabaseTurn(void);
extern void RelayRunForUnit(RelayUnit *unit, void (*what) (RelayUnit *unit));
extern void RelayEngineRetire(void);
extern void RelayEndErrors(RelayUnit *unit, const char *why);
extern void RelayLogUnitLetGo(RelayUnit *unit, const char *why);

/* units.c */
extern RelayUnit *RelayUnitFind(const RelayFlowRoutine *flow, const char *name);
extern void RelayUnitTakeReading(RelayUnit *unit, RelayUnitReading *reading);
extern void RelayUnitReleaseReading(RelayUnitReading *reading);
extern void RelayReadUnitsAgain(bool reopen);
extern bool RelayReadingDue(TimestampTz now);
extern TimestampTz RelayNextReadingAt(void);
extern bool RelayReadUnits(RelayWorkerSlot *slot);
extern bool RelayUnitsEnabled(void);
extern void RelayUnitsLookForWork(void);
extern void RelayScanNeeded(void);
extern bool RelayScanDue(TimestampTz now);
extern TimestampTz RelayScanWakeAt(void);
extern void RelayScanUnits(RelayWorkerSlot *slot);

/* worker.c: ends the worker cleanly, telling the launcher why */
#if PG_VERSION_NUM >= 180000
/* 18 spells "never returns" as a prefix, earlier versions as an attribute. */
extern pg_noreturn void RelayWorkerLeave(RelayExitReason reason, const char *why);
#else
extern void RelayWorkerLeave(RelayExitReason reason, const char *why) pg_attribute_noreturn();
#endif

#endif							/* TIDE_ENGINE_H */
