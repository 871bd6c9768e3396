/*
 * sink_file.c
 *		The file sink: appends one JSON line per message to a file, for
 *		diagnostics.
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
 * Runs with no transaction open. Every failure is returned as data, never
 * raised: the caller logs it and the batch is leased again.
 */
#include "postgres.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/stringinfo.h"
#include "utils/json.h"

#include "sink.h"

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

/* Appends one message's JSON line to buf. */
static void
append_line(StringInfo buf, const char *outbox, const RelayMessage *m)
{
	char		idbuf[NAMEDATALEN * 2 + 64];

	snprintf(idbuf, sizeof(idbuf), "outbox_%s:" INT64_FORMAT, outbox, m->id);
	appendStringInfoString(buf, "{\"id\": ");
	escape_json(buf, idbuf);
	appendStringInfoString(buf, ", \"outbox\": ");
	escape_json(buf, outbox);
	appendStringInfo(buf, ", \"message_id\": " INT64_FORMAT ", \"payload\": ", m->id);
	appendStringInfoString(buf, m->payload ? m->payload : "null");
	appendStringInfoString(buf, ", \"headers\": ");
	appendStringInfoString(buf, m->headers ? m->headers : "null");
	appendStringInfoString(buf, ", \"created_at\": ");
	appendStringInfoString(buf, m->created_at ? m->created_at : "null");
	appendStringInfoString(buf, "}\n");
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

/* Sets a failed result from errno. */
static void
fail(RelayDeliveryResult *result, const char *what, const char *path)
{
	result->ok = false;
	snprintf(result->error, sizeof(result->error), "could not %s file \"%s\": %s",
			 what, path, strerror(errno));
}

/* Appends a batch to the sink's file: see the top of this file. */
void
RelayFileSinkDeliver(const RelaySink *sink, const RelayMessage *msgs, int nmsgs,
					 RelayDeliveryResult *result)
{
	const char *path = sink->u.file.path;
	StringInfoData buf;
	struct stat st;
	int			fd;
	int			i;

	initStringInfo(&buf);
	for (i = 0; i < nmsgs; i++)
		append_line(&buf, sink->outbox, &msgs[i]);

	fd = open(path, O_RDWR | O_APPEND | O_CREAT | PG_BINARY, S_IRUSR | S_IWUSR);
	if (fd < 0)
	{
		fail(result, "open", path);
		pfree(buf.data);
		return;
	}
	if (fstat(fd, &st) != 0)
	{
		fail(result, "stat", path);
		goto done;
	}
	if (st.st_size > 0)
	{
		char		last;

		if (pread(fd, &last, 1, st.st_size - 1) == 1 && last != '\n')
		{
			if (!write_all(fd, "\n", 1))
			{
				fail(result, "write to", path);
				goto done;
			}
			st.st_size++;
		}
	}
	if (!write_all(fd, buf.data, buf.len))
	{
		fail(result, "write to", path);
		cut_back(fd, st.st_size);
		goto done;
	}
	if (sink->u.file.fsync && fsync(fd) != 0)
	{
		fail(result, "fsync", path);
		cut_back(fd, st.st_size);
		goto done;
	}
	result->ok = true;

done:
	if (close(fd) != 0 && result->ok)
		fail(result, "close", path);
	pfree(buf.data);
}
