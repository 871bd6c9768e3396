/*
 * sink.c
 *		The file sink: appends one JSON line per message to a file, for
 *		diagnostics. Its config: "path" (required) and "fsync" (default
 *		true).
 *
 * 1. Build the whole batch as one buffer of lines:
 *	  {"id": "outbox_<outbox>:<id>", "outbox": …, "message_id": …,
 *	   "payload": …, "headers": …, "created_at": …}
 *	  from the jsonb text of payload and headers.
 * 2. Open the file for appending (created 0600 when missing). A last line
 *	  left without its newline (a worker killed while writing) is ended
 *	  first, so the next line stays readable.
 * 3. Write the buffer, then fsync unless the config says "fsync": false.
 *	  A failed write or fsync cuts the file back to its size before the
 *	  batch, so a retried batch does not follow a torn copy of itself.
 *
 * A batch is written at once by `start` (a local file has nothing to wait
 * for), so `progress` only says it is finished. Runs with no transaction
 * open. Every failure is returned as data, never raised: the caller logs
 * it and the batch is leased again.
 */
#include "postgres.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/stringinfo.h"
#include "portability/instr_time.h"

#include "sink.h"
#include "endpoints/registry.h"
#include "file.h"

/* A file pipeline's settings, from its config. */
typedef struct FileSinkConfig
{
	char	   *path;
	bool		fsync;
} FileSinkConfig;

/* What a batch came to, between `start` and `outcomes`. */
typedef struct FileBatch
{
	RelayDeliveryResult result;
} FileBatch;

/* Writes all of buf, retrying short writes and EINTR; false with errno set. */
static bool
write_all(int fd, const char *buf, size_t len)
{
	while (len > 0)
	{
		ssize_t		n = write(fd, buf, len);

		if (n < 0)
		{
			if (errno == EINTR)
				continue;
			return false;
		}
		if (n == 0)
		{
			errno = ENOSPC;
			return false;
		}
		buf += n;
		len -= n;
	}
	return true;
}

/* Cuts the file back to the size it had before the batch, as far as it can. */
static void
cut_back(int fd, off_t size)
{
	if (ftruncate(fd, size) != 0)
	{
		/* A torn batch stays; the next one starts on a line of its own. */
	}
}

/*
 * Fails the whole batch from errno: a file that cannot be written is the
 * destination's failure, not any message's.
 */
static void
fail(RelayDeliveryResult *result, int nmsgs, const char *what, const char *path)
{
	char		error[256];
	int			i;

	snprintf(error, sizeof(error), "could not %s file \"%s\": %s",
			 what, path, strerror(errno));
	for (i = 0; i < nmsgs; i++)
		RelaySetFailure(&result->each[i], RELAY_UNREACHABLE, "file", 0, error);
}

/* Appends a batch to the sink's file: see the top of this file. */
static void
append_batch(const FileSinkConfig *cfg, const RelayMessage *msgs, int nmsgs,
			 RelayDeliveryResult *result)
{
	const char *path = cfg->path;
	StringInfoData buf;
	struct stat st;
	int			fd;
	int			i;
	bool		ok = false;
	instr_time	start;
	instr_time	elapsed;

	initStringInfo(&buf);
	for (i = 0; i < nmsgs; i++)
	{
		RelayAppendMessageJson(&buf, &msgs[i]);
		appendStringInfoChar(&buf, '\n');
	}

	INSTR_TIME_SET_CURRENT(start);
	fd = open(path, O_RDWR | O_APPEND | O_CREAT | PG_BINARY, S_IRUSR | S_IWUSR);
	if (fd < 0)
	{
		fail(result, nmsgs, "open", path);
		pfree(buf.data);
		return;
	}
	if (fstat(fd, &st) != 0)
	{
		fail(result, nmsgs, "stat", path);
		goto done;
	}
	if (st.st_size > 0)
	{
		char		last;

		if (pread(fd, &last, 1, st.st_size - 1) == 1 && last != '\n')
		{
			if (!write_all(fd, "\n", 1))
			{
				fail(result, nmsgs, "write to", path);
				goto done;
			}
			st.st_size++;
		}
	}
	if (!write_all(fd, buf.data, buf.len))
	{
		fail(result, nmsgs, "write to", path);
		cut_back(fd, st.st_size);
		goto done;
	}
	if (cfg->fsync && fsync(fd) != 0)
	{
		fail(result, nmsgs, "fsync", path);
		cut_back(fd, st.st_size);
		goto done;
	}
	ok = true;
	for (i = 0; i < nmsgs; i++)
		result->each[i].outcome = RELAY_DELIVERED;

done:
	if (close(fd) != 0 && ok)
		fail(result, nmsgs, "close", path);
	INSTR_TIME_SET_CURRENT(elapsed);
	INSTR_TIME_SUBTRACT(elapsed, start);
	for (i = 0; i < nmsgs; i++)
		result->each[i].latency_ms = INSTR_TIME_GET_MILLISEC(elapsed);
	pfree(buf.data);
}

/* The pipeline's settings: a path is required. */
static bool
file_open(const cJSON *config, RelaySinkOpened *opened)
{
	FileSinkConfig *cfg;

	if (!cJSON_IsString(RelayConfigMember(config, "path")))
	{
		opened->error = "its config has no \"path\"";
		return false;
	}
	cfg = palloc0(sizeof(FileSinkConfig));
	cfg->path = RelayConfigString(config, "path");
	cfg->fsync = !RelayConfigIs(config, "fsync", false);
	opened->state = cfg;
	/* a file that cannot be written is retried soon */
	opened->retry_at_once = true;
	return true;
}

/* Writes the batch at once: there is nothing to wait for. */
static void
file_start(void *state, RelaySinkBatch *batch)
{
	FileBatch  *fb = palloc0(sizeof(FileBatch));

	fb->result.each = palloc0(sizeof(RelayMessageOutcome) * Max(batch->nmsgs, 1));
	for (int i = 0; i < batch->nmsgs; i++)
		fb->result.each[i].wait_ms = -1;
	append_batch(state, batch->msgs, batch->nmsgs, &fb->result);
	batch->sink_private = fb;
}

static bool
file_progress(void *state, RelaySinkBatch *batch)
{
	return true;
}

static void
file_outcomes(void *state, RelaySinkBatch *batch, RelayDeliveryResult *result)
{
	FileBatch  *fb = batch->sink_private;

	memcpy(result->each, fb->result.each, sizeof(RelayMessageOutcome) * batch->nmsgs);
}

/* Nothing is left in flight once `start` returned. */
static void
file_cancel(void *state, RelaySinkBatch *batch)
{
}

/* The routine and init symbol of the file sink, built into pg_tide.so (endpoints/registry.h). */
RELAY_SINK_ENDPOINT(file, RelayFileConfigKeys, RelayFileValidate);
