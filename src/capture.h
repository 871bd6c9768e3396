/*
 * capture.h
 *		Change capture from tables (docs/capture.md): the options of a
 *		capture, shared by tide.outbox_capture (src/capture_admin.c), which
 *		checks them and installs the triggers, and by the triggers
 *		(src/capture.c), which read them back from their arguments.
 */
#ifndef TIDE_CAPTURE_H
#define TIDE_CAPTURE_H

#include "postgres.h"

#include "access/htup.h"
#include "access/tupdesc.h"
#include "fmgr.h"
#include "nodes/pg_list.h"
#include "storage/lockdefs.h"
#include "utils/jsonb.h"
#include "utils/relcache.h"

#include "compat.h"

/* The row operations a capture may publish, in the order of their names. */
typedef enum CaptureOp
{
	CAPTURE_INSERT = 0,
	CAPTURE_UPDATE = 1,
	CAPTURE_DELETE = 2
} CaptureOp;

#define CAPTURE_OPS 3

extern const char *const CaptureOpNames[CAPTURE_OPS];

/* A capture's options, normalised (docs/capture.md#options). */
typedef struct CaptureOptions
{
	bool		ops[CAPTURE_OPS];	/* "operations" */
	List	   *key;			/* "key": column names (char *) */
	List	   *ignore;			/* "ignore": left out of the payload */
	List	   *ignore_changes_of;	/* "ignore_changes_of" */
	char	   *when;			/* "when": a boolean SQL expression, or NULL */
	bool		old_row;		/* "old_row" */
	char	   *type;			/* "type": the event type's prefix, or NULL */
	bool		truncate_publish;	/* "truncate": "publish" (else "refuse") */
} CaptureOptions;

/* capture_options.c */
extern void CaptureParseOptions(Jsonb *options, CaptureOptions *out);
extern char *CaptureOptionsText(const CaptureOptions *options);

/* capture_row.c: a row as to_jsonb(row) makes it, each column's conversion kept */
typedef struct CaptureRowColumns CaptureRowColumns;
extern CaptureRowColumns *CaptureRowColumnsFor(TupleDesc desc, MemoryContext context);
extern Jsonb *CaptureRowJsonb(CaptureRowColumns *row, TupleDesc desc, HeapTuple tuple);

/* capture.c: one row's message, published as the table's owner; returns the key */
extern Jsonb *CapturePublish(Oid table, const char *outbox, CaptureOptions *options,
							 const char *op, Jsonb *new_row, Jsonb *old_row);

extern TideNoReturn void CaptureRefuseMissingKey(const char *table, const char *column);

/* capture_admin.c: the table argument, the table opened and checked as the rights say, SPI */
extern Oid	CaptureTableArg(FunctionCallInfo fcinfo);
extern Relation CaptureOpenTable(Oid relid, LOCKMODE lockmode);
extern void CaptureRun(const char *sql, int nargs, Oid *types, Datum *args, const char *nulls,
					   int expected);

/* outbox.c: tide.outbox_publish's entry point, which the triggers call directly */
extern PGDLLEXPORT Datum tide_outbox_publish(PG_FUNCTION_ARGS);

#endif							/* TIDE_CAPTURE_H */
