/*
 * payload_schema.h
 *		Checking payloads against their outbox's JSON Schema at publish
 *		(src/payload_schema.c).
 */
#ifndef TIDE_PAYLOAD_SCHEMA_H
#define TIDE_PAYLOAD_SCHEMA_H

#include "postgres.h"

#include "utils/jsonb.h"

extern void TidePayloadSchemaCheck(const char *outbox, Jsonb *headers, Datum *payloads,
								   int count, bool batch);

#endif							/* TIDE_PAYLOAD_SCHEMA_H */
