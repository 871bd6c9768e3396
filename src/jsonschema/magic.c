/*
 * magic.c
 *		The PostgreSQL module block of pg_tide-jsonschema.so, in C: the
 *		rest of the module is C++ and includes no PostgreSQL header.
 */
#include "postgres.h"

#include "fmgr.h"

PG_MODULE_MAGIC;
