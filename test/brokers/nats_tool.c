/*
 * nats_tool.c
 *		The JetStream side of the NATS sink's tests (test/t/042, 043) and of
 *		docs/sinks/local.md (Debian has no nats CLI), written with nats.c,
 *		not with the sink's code:
 *
 *	nats_tool URL create STREAM SUBJECT DUPLICATE_WINDOW_S [MAX_MSG_SIZE [MAX_MSGS]]
 *		creates (or updates) a file-stored stream on SUBJECT ("orders.>")
 *		with that duplicate window; MAX_MSGS > 0 with discard new
 *	nats_tool URL seal STREAM
 *		seals the stream: it takes no more messages
 *	nats_tool URL dump STREAM
 *		prints every message of the stream, read by a pull consumer, as a
 *		JSON line: {"seq": n, "subject": ..., "headers": {name: value}, "body": "..."}
 *	nats_tool URL count STREAM
 *		prints the number of messages in the stream
 *	nats_tool URL silent SUBJECT
 *		subscribes to SUBJECT (core NATS) and never answers, until stdin
 *		closes: a publish there is heard but never acknowledged
 *
 * NATS_USER and NATS_PASSWORD, or NATS_TOKEN, when set, authenticate;
 * NATS_CA_FILE is the CA of a TLS server. Exits 1 with the error on
 * stderr on any failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <nats/nats.h>

static void
die(const char *what, natsStatus s, jsErrCode code)
{
	const char *text = nats_GetLastError(NULL);

	fprintf(stderr, "nats_tool: %s: %s (%s, JetStream error %d)\n", what, natsStatus_GetText(s),
			text ? text : "", (int) code);
	exit(1);
}

static void
print_msg(natsMsg *m, uint64_t seq)
{
	cJSON	   *o = cJSON_CreateObject();
	cJSON	   *h = cJSON_AddObjectToObject(o, "headers");
	const char **keys = NULL;
	int			nkeys = 0;
	char	   *body;
	char	   *line;

	cJSON_AddNumberToObject(o, "seq", (double) seq);
	cJSON_AddStringToObject(o, "subject", natsMsg_GetSubject(m));
	if (natsMsgHeader_Keys(m, &keys, &nkeys) == NATS_OK)
	{
		for (int i = 0; i < nkeys; i++)
		{
			const char *v = NULL;

			if (natsMsgHeader_Get(m, keys[i], &v) == NATS_OK)
				cJSON_AddStringToObject(h, keys[i], v ? v : "");
		}
		free((void *) keys);
	}
	body = malloc(natsMsg_GetDataLength(m) + 1);
	memcpy(body, natsMsg_GetData(m), natsMsg_GetDataLength(m));
	body[natsMsg_GetDataLength(m)] = '\0';
	cJSON_AddStringToObject(o, "body", body);
	line = cJSON_PrintUnformatted(o);
	printf("%s\n", line);
	free(line);
	free(body);
	cJSON_Delete(o);
}

/*
 * Reads the stream's n messages through a pull consumer of its own (no
 * acknowledgements), as a consumer of the stream would, in stream order.
 */
static void
dump(jsCtx *js, const char *stream, const char *subject, uint64_t n)
{
	natsSubscription *sub = NULL;
	jsSubOptions so;
	jsErrCode	code = 0;
	natsStatus	s;
	uint64_t	seen = 0;
	char		durable[64];

	snprintf(durable, sizeof(durable), "nats_tool_%d", (int) getpid());
	jsSubOptions_Init(&so);
	so.Stream = stream;
	so.Config.AckPolicy = js_AckNone;
	so.Config.DeliverPolicy = js_DeliverAll;
	if ((s = js_PullSubscribe(&sub, js, subject, durable, NULL, &so, &code)) != NATS_OK)
		die("pull subscribe", s, code);
	while (seen < n)
	{
		natsMsgList list = {0};

		s = natsSubscription_Fetch(&list, sub, 1000, 5000, &code);
		if (s != NATS_OK)
			die("fetch", s, code);
		for (int i = 0; i < list.Count; i++)
		{
			jsMsgMetaData *meta = NULL;

			if ((s = natsMsg_GetMetaData(&meta, list.Msgs[i])) != NATS_OK)
				die("metadata", s, 0);
			print_msg(list.Msgs[i], meta->Sequence.Stream);
			jsMsgMetaData_Destroy(meta);
			seen++;
		}
		natsMsgList_Destroy(&list);
	}
	natsSubscription_Unsubscribe(sub);
	natsSubscription_Destroy(sub);
	js_DeleteConsumer(js, stream, durable, NULL, &code);
}

int
main(int argc, char **argv)
{
	natsOptions *opts = NULL;
	natsConnection *nc = NULL;
	jsCtx	   *js = NULL;
	jsErrCode	code = 0;
	natsStatus	s;

	if (argc < 4)
	{
		fprintf(stderr, "usage: nats_tool URL create|seal|dump|count STREAM ...\n");
		return 2;
	}
	if ((s = natsOptions_Create(&opts)) != NATS_OK ||
		(s = natsOptions_SetURL(opts, argv[1])) != NATS_OK ||
		(s = natsOptions_SetTimeout(opts, 5000)) != NATS_OK)
		die("options", s, 0);
	if (getenv("NATS_USER") && (s = natsOptions_SetUserInfo(opts, getenv("NATS_USER"), getenv("NATS_PASSWORD"))) != NATS_OK)
		die("options", s, 0);
	if (getenv("NATS_TOKEN") && (s = natsOptions_SetToken(opts, getenv("NATS_TOKEN"))) != NATS_OK)
		die("options", s, 0);
	if (getenv("NATS_CA_FILE") &&
		((s = natsOptions_SetSecure(opts, true)) != NATS_OK ||
		 (s = natsOptions_LoadCATrustedCertificates(opts, getenv("NATS_CA_FILE"))) != NATS_OK))
		die("options", s, 0);
	if ((s = natsConnection_Connect(&nc, opts)) != NATS_OK)
		die("connect", s, 0);
	if ((s = natsConnection_JetStream(&js, nc, NULL)) != NATS_OK)
		die("jetstream", s, 0);

	if (strcmp(argv[2], "create") == 0 && argc >= 6)
	{
		jsStreamConfig cfg;
		jsStreamInfo *si = NULL;
		const char *subjects[1] = {argv[4]};

		jsStreamConfig_Init(&cfg);
		cfg.Name = argv[3];
		cfg.Subjects = subjects;
		cfg.SubjectsLen = 1;
		cfg.Storage = js_FileStorage;
		cfg.Duplicates = (int64_t) atoll(argv[5]) * 1000000000LL;
		if (argc >= 7 && atoi(argv[6]) > 0)
			cfg.MaxMsgSize = atoi(argv[6]);
		if (argc >= 8 && atoll(argv[7]) > 0)
		{
			cfg.MaxMsgs = atoll(argv[7]);
			cfg.Discard = js_DiscardNew;
		}
		s = js_AddStream(&si, js, &cfg, NULL, &code);
		if (s != NATS_OK && code == JSStreamNameExistErr)
			s = js_UpdateStream(&si, js, &cfg, NULL, &code);
		if (s != NATS_OK)
			die("create stream", s, code);
		jsStreamInfo_Destroy(si);
	}
	else if (strcmp(argv[2], "seal") == 0 && argc >= 4)
	{
		jsStreamInfo *si = NULL;
		jsStreamInfo *updated = NULL;

		if ((s = js_GetStreamInfo(&si, js, argv[3], NULL, &code)) != NATS_OK)
			die("stream info", s, code);
		si->Config->Sealed = true;
		if ((s = js_UpdateStream(&updated, js, si->Config, NULL, &code)) != NATS_OK)
			die("seal stream", s, code);
		jsStreamInfo_Destroy(updated);
		jsStreamInfo_Destroy(si);
	}
	else if (strcmp(argv[2], "dump") == 0 || strcmp(argv[2], "count") == 0)
	{
		jsStreamInfo *si = NULL;

		if ((s = js_GetStreamInfo(&si, js, argv[3], NULL, &code)) != NATS_OK)
			die("stream info", s, code);
		if (strcmp(argv[2], "count") == 0)
			printf("%llu\n", (unsigned long long) si->State.Msgs);
		else if (si->State.Msgs > 0)
			dump(js, argv[3], si->Config->Subjects[0], si->State.Msgs);
		jsStreamInfo_Destroy(si);
	}
	else if (strcmp(argv[2], "silent") == 0)
	{
		natsSubscription *sub = NULL;
		char		line[64];

		if ((s = natsConnection_SubscribeSync(&sub, nc, argv[3])) != NATS_OK ||
			(s = natsConnection_Flush(nc)) != NATS_OK)
			die("subscribe", s, 0);
		printf("subscribed\n");
		fflush(stdout);
		while (fgets(line, sizeof(line), stdin) != NULL)
			;
		natsSubscription_Destroy(sub);
	}
	else
	{
		fprintf(stderr, "nats_tool: unknown command %s\n", argv[2]);
		return 2;
	}
	fflush(stdout);
	jsCtx_Destroy(js);
	natsConnection_Destroy(nc);
	natsOptions_Destroy(opts);
	return 0;
}
