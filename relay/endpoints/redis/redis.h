/*
 * redis.h
 *		What the Redis Streams sink's two files share (sink.c delivers,
 *		config.c validates): the address a "url" names, its parser,
 *		and the validator the routine points at.
 */
#ifndef TIDE_REDIS_H
#define TIDE_REDIS_H

#include "sink.h"

#define REDIS_DEFAULT_PORT 6379

/* Where a redis:// URL points: a host, a port, a database number. */
typedef struct RedisAddress
{
	char		host[256];		/* a name or an address, IPv6 without brackets */
	int			port;
	int			db;
} RedisAddress;

/*
 * Parses "redis://host[:port][/db]" into addr; false, with *why (a
 * static message), when it is not one. No ERROR, no palloc: `open`
 * calls it too.
 */
extern bool RedisParseUrl(const char *url, RedisAddress *addr, const char **why);

/* config.c: the validator and the keys of the sink. */
extern void RedisValidate(const cJSON *config, cJSON *out);
extern const char *const RedisConfigKeys[];

#endif							/* TIDE_REDIS_H */
