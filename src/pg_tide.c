/*
 * pg_tide.c
 *		Library entry point: _PG_init, the preload check and shared memory.
 *
 * pg_tide keeps its publish tracker, wake-up state and relay worker slots in
 * shared memory, and registers the relay launcher (relay/launcher.c), so it
 * must be listed in shared_preload_libraries. Loaded any other way (for
 * example by CREATE EXTENSION in a server that did not preload it) the
 * library still loads, so the extension can be created and dropped, but
 * every function that needs shared memory refuses to run, and the install
 * script says so at once in a WARNING (tide._warn_unless_preloaded), rather
 * than at the first publish.
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/guc.h"

#include "pg_tide.h"
#include "partitions.h"
#include "relay_init.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(tide_warn_unless_preloaded);

bool		TidePreloaded = false;

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

	TideDefineConsumerGucs();
	TideDefineLimitGucs();
	TideDefinePartitionGucs();
	RelayDefineLauncherGucs();
	RelayDefineUnitsGucs();
	RelayDefineAttemptLogGucs();
	RelayDefineSecretsGucs();
	RelayDefineRetentionGucs();
	RelayDefineWebhookGucs();
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
 * Warns, at CREATE EXTENSION, that the server did not preload pg_tide: the
 * extension is created, but nothing that needs shared memory will run.
 */
Datum
tide_warn_unless_preloaded(PG_FUNCTION_ARGS)
{
	if (!TidePreloaded)
		ereport(WARNING,
				(errcode(ERRCODE_WARNING),
				 errmsg("pg_tide is not loaded via \"shared_preload_libraries\""),
				 errdetail("Publishing, consuming and the relay refuse to run until the server preloads it."),
				 errhint("Add pg_tide to shared_preload_libraries in postgresql.conf and restart the server.")));
	PG_RETURN_VOID();
}
