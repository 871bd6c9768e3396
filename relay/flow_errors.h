/*
 * flow_errors.h
 *		What every flow does with an ERROR: whether it can be a message's
 *		own (error_class.c), and how a unit's turn that ended in one is
 *		shown in the status views (pipeline_state.c).
 */
#ifndef TIDE_FLOW_ERRORS_H
#define TIDE_FLOW_ERRORS_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "executor/spi.h"

#include "log_repeat.h"

/* error_class.c */
extern bool RelayErrorIsEnvironmental(int sqlerrcode);

/* pipeline_state.c */
extern bool RelayRecordInOwnXact(const char *table, SPIPlanPtr *plan, const char *sql, int nargs,
								 Oid *types, Datum *values, const char *what, RelayRepeat *log);
extern void RelayRecordTurnError(const char *pipeline, const char *message, int errors,
								 TimestampTz until, RelayRepeat *log);
extern void RelayRecordTurnOk(const char *pipeline, RelayRepeat *log);

#endif							/* TIDE_FLOW_ERRORS_H */
