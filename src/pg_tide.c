/*
 * pg_tide.c
 *		Library entry point: preload check, shared memory, shared helpers.
 *
 * pg_tide keeps its publish tracker, wake-up state and relay worker slots in
 * shared memory, and registers the relay launcher (relay/launcher.c), so it
 * must be listed in shared_preload_libraries. Loaded any other way (for
 * example by CREATE EXTENSION in a server that did not preload it) the
 * library still loads, so the extension can be created and dropped, but
 * every function that needs shared memory refuses to run.
 */
#include "postgres.h"

#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/guc.h"

#include "pg_tide.h"
#include "relay.h"

PG_MODULE_MAGIC;

bool		TidePreloaded = false;
int			TideWaitRecheckMs = 1000;

static bool shared_ready = false;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

void		_PG_init(void);

/* Total shared memory pg_tide asks for. */
static Size
tide_shmem_size(void)
{
	return add_size(add_size(MAXALIGN(TrackerShmemSize()), MAXALIGN(WakeShmemSize())),
					MAXALIGN(RelayShmemSize()));
}

/* Asks the postmaster for pg_tide's shared memory. */
static void
tide_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(tide_shmem_size());
}

/* Finds or creates pg_tide's shared memory and lays it out. */
static void
tide_shmem_startup(void)
{
	bool		found;
	char	   *base;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	base = ShmemInitStruct("pg_tide", tide_shmem_size(), &found);
	TrackerShmemInit(base, found);
	WakeShmemInit(base + MAXALIGN(TrackerShmemSize()), found);
	RelayShmemInit(base + MAXALIGN(TrackerShmemSize()) + MAXALIGN(WakeShmemSize()), found);
	LWLockRelease(AddinShmemInitLock);
	shared_ready = true;
}

/* Sets up pg_tide when it is preloaded; otherwise leaves it inert. */
void
_PG_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;

	TidePreloaded = true;

	DefineCustomIntVariable("pg_tide.wait_recheck_ms",
							"How often tide.wait_for_messages() looks again without a wake-up.",
							"Commits wake waiters at once; this only bounds how late a waiter "
							"notices a lease that expired.",
							&TideWaitRecheckMs,
							1000, 10, 3600 * 1000,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);
	TideDefineLimitGucs();
	RelayDefineGucs();
	MarkGUCPrefixReserved("pg_tide");

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = tide_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = tide_shmem_startup;

	TrackerRegisterXactCallback();
	RelayInstallHooks();
	RelayRegisterLauncher();
}

/* Refuses, with a hint, when the library was not preloaded. */
void
TideRequirePreload(void)
{
	if (!TidePreloaded || !shared_ready)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_tide must be loaded via \"shared_preload_libraries\""),
				 errhint("Add pg_tide to shared_preload_libraries in postgresql.conf and restart the server.")));
}

/*
 * Refuses a name or id with a character other than ASCII letters, digits,
 * "_", "-", "." and ":"; `what` names it in the message. Names travel into
 * HTTP headers (webhook-id), logs and file names: nothing in them needs
 * quoting or escaping anywhere. The same rules as tide._check_chars().
 */
static void
check_chars(const char *what, const char *value)
{
	for (const unsigned char *p = (const unsigned char *) value; *p; p++)
	{
		unsigned char c = *p;

		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			c == '_' || c == '-' || c == '.' || c == ':')
			continue;
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 c > ' ' && c < 0x7F ?
				 errmsg("%s must not contain \"%c\"", what, c) :
				 errmsg("%s must not contain white space, control or non-ASCII characters", what),
				 errhint("Names and ids consist of ASCII letters, digits, \"_\", \"-\", \".\" and \":\".")));
	}
}

/*
 * Checks an outbox or consumer group name; the same rules and messages as
 * tide._check_name() in the install script.
 */
void
TideValidateName(const char *kind, const char *name)
{
	if (name == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s name must not be null", kind),
				 errhint("Give the %s a name of 1 to 63 bytes.", kind)));
	if (name[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s name must not be empty", kind),
				 errhint("Give the %s a name of 1 to 63 bytes.", kind)));
	if (strlen(name) > TIDE_MAX_NAME_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s name \"%s\" is too long", kind, name),
				 errhint("Names have at most 63 bytes; this one has %zu.",
						 strlen(name))));
	check_chars(psprintf("%s name", kind), name);
}

/*
 * Checks a consumer id; the same rules and messages as
 * tide._check_consumer() in the install script.
 */
void
TideValidateConsumerId(const char *id)
{
	if (id == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("consumer id must not be null"),
				 errhint("Each consumer of a group identifies itself with a stable, non-empty id.")));
	if (id[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("consumer id must not be empty"),
				 errhint("Each consumer of a group identifies itself with a stable, non-empty id.")));
	if (strlen(id) > TIDE_MAX_ID_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("consumer id is too long"),
				 errhint("Consumer ids have at most %d bytes; this one has %zu.",
						 TIDE_MAX_ID_BYTES, strlen(id))));
	check_chars("consumer id", id);
}

/*
 * Returns a saved SPI plan, preparing it on first use in this backend.
 * Saved plans are re-analysed by the plan cache when the objects they use
 * change, so they survive DROP and CREATE EXTENSION.
 */
SPIPlanPtr
TidePlan(SPIPlanPtr *cache, const char *sql, int nargs, Oid *argtypes)
{
	if (*cache == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare(sql, nargs, argtypes);

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
