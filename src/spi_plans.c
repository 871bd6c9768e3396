/*
 * spi_plans.c
 *		SPI helpers shared by src/ and the relay: saved plans prepared once
 *		per backend, and reading a value from the first result row.
 */
#include "postgres.h"

#include "executor/spi.h"

#include "pg_tide.h"

/*
 * Returns a saved SPI plan, preparing it on first use in this backend.
 * Saved plans are re-analysed by the plan cache when the objects they use
 * change, so they survive DROP and CREATE EXTENSION.
 */
SPIPlanPtr
TidePlan(SPIPlanPtr *cache, const char *sql, int nargs, Oid *argtypes)
{
	return TidePlanWithOptions(cache, sql, nargs, argtypes, 0);
}

/*
 * TidePlan with planner options: CURSOR_OPT_CUSTOM_PLAN plans each run for
 * its values and the tables' size then, where a generic plan made while a
 * table was small would scan it whole once it has grown.
 */
SPIPlanPtr
TidePlanWithOptions(SPIPlanPtr *cache, const char *sql, int nargs, Oid *argtypes, int options)
{
	if (*cache == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare_cursor(sql, nargs, argtypes, options);

		if (plan == NULL)
			elog(ERROR, "could not prepare \"%s\": %s",
				 sql, SPI_result_code_string(SPI_result));
		SPI_keepplan(plan);
		*cache = plan;
	}
	return *cache;
}

/* Column `col` (1-based) of the first SPI result row as int64; NULL as -1 with *isnull set. */
int64
TideSpiInt64(int col, bool *isnull)
{
	Datum		value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, col, isnull);

	return *isnull ? -1 : DatumGetInt64(value);
}

/* Column `col` (1-based) of the first SPI result row; NULL as (Datum) 0. */
Datum
TideSpiDatum(int col)
{
	bool		isnull;
	Datum		value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, col, &isnull);

	return isnull ? (Datum) 0 : value;
}

/* Column `col` (1-based) of the first SPI result row as a bool; NULL as false. */
bool
TideSpiBool(int col)
{
	return DatumGetBool(TideSpiDatum(col));
}

/* Column `col` (1-based) of the first SPI result row as text; NULL as NULL. */
char *
TideSpiText(int col)
{
	return SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, col);
}
