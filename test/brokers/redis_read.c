/*
 * redis_read.c
 *		The consuming side of the redis sink's tests: reads streams with
 *		hiredis (XRANGE, a page at a time) and prints each entry as one
 *		JSON line {"stream": ..., "entry": "<entry id>", "fields": {...}},
 *		the fields' values as the strings Redis holds.
 *
 * usage: redis_read <host> <port> [-a <password>] [-u <user>] [-f <field>] <stream>...
 * With -f, each entry's value of that field alone is printed, a line each
 * (a large stream is read faster so).
 * A real Redis client, not the sink's code, so the tests see what a
 * consumer of the stream sees.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <hiredis/hiredis.h>

#define PAGE "1000"

/* Prints the entries of one XRANGE answer; the last entry id in last (or ""). */
static int
print_entries(const char *stream, redisReply *r, const char *only, char *last, size_t lastsize)
{
	last[0] = '\0';
	for (size_t i = 0; i < r->elements; i++)
	{
		redisReply *e = r->element[i];
		cJSON	   *line;
		cJSON	   *fields;
		char	   *text;

		if (e->type != REDIS_REPLY_ARRAY || e->elements != 2)
			return -1;
		snprintf(last, lastsize, "(%s", e->element[0]->str);
		if (only != NULL)
		{
			for (size_t f = 0; f + 1 < e->element[1]->elements; f += 2)
				if (strcmp(e->element[1]->element[f]->str, only) == 0)
					puts(e->element[1]->element[f + 1]->str);
			continue;
		}
		line = cJSON_CreateObject();
		fields = cJSON_CreateObject();
		cJSON_AddStringToObject(line, "stream", stream);
		cJSON_AddStringToObject(line, "entry", e->element[0]->str);
		for (size_t f = 0; f + 1 < e->element[1]->elements; f += 2)
			cJSON_AddItemToObject(fields, e->element[1]->element[f]->str,
								  cJSON_CreateString(e->element[1]->element[f + 1]->str));
		cJSON_AddItemToObject(line, "fields", fields);
		text = cJSON_PrintUnformatted(line);
		puts(text);
		free(text);
		cJSON_Delete(line);
	}
	return (int) r->elements;
}

int
main(int argc, char **argv)
{
	redisContext *c;
	const char *password = NULL;
	const char *user = NULL;
	const char *only = NULL;
	int			i = 3;

	if (argc < 4)
	{
		fprintf(stderr, "usage: %s <host> <port> [-a <password>] [-u <user>] [-f <field>] <stream>...\n", argv[0]);
		return 2;
	}
	for (; i + 1 < argc && argv[i][0] == '-'; i += 2)
	{
		if (strcmp(argv[i], "-a") == 0)
			password = argv[i + 1];
		else if (strcmp(argv[i], "-u") == 0)
			user = argv[i + 1];
		else if (strcmp(argv[i], "-f") == 0)
			only = argv[i + 1];
	}
	c = redisConnect(argv[1], atoi(argv[2]));
	if (c == NULL || c->err)
	{
		fprintf(stderr, "redis_read: cannot connect: %s\n", c ? c->errstr : "out of memory");
		return 1;
	}
	if (password)
	{
		redisReply *r = user ? redisCommand(c, "AUTH %s %s", user, password)
			: redisCommand(c, "AUTH %s", password);

		if (r == NULL || r->type == REDIS_REPLY_ERROR)
		{
			fprintf(stderr, "redis_read: AUTH: %s\n", r ? r->str : c->errstr);
			return 1;
		}
		freeReplyObject(r);
	}
	for (; i < argc; i++)
	{
		char		start[64] = "-";

		for (;;)
		{
			redisReply *r = redisCommand(c, "XRANGE %s %s + COUNT " PAGE, argv[i], start);
			int			n;

			if (r == NULL || r->type == REDIS_REPLY_ERROR || r->type != REDIS_REPLY_ARRAY)
			{
				fprintf(stderr, "redis_read: XRANGE %s: %s\n", argv[i],
						r ? (r->str ? r->str : "not an array") : c->errstr);
				return 1;
			}
			n = print_entries(argv[i], r, only, start, sizeof(start));
			freeReplyObject(r);
			if (n < 0)
				return 1;
			if (n == 0)
				break;
		}
	}
	redisFree(c);
	return 0;
}
