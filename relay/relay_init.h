/*
 * relay_init.h
 *		What the library's entry point (_PG_init, src/pg_tide.c) calls to set
 *		up the relay: its settings (each module defines its own), its shared
 *		memory, its ProcessUtility hook and its launcher. The only header of relay/ that src/ includes;
 *		it needs nothing of either directory.
 */
#ifndef TIDE_RELAY_INIT_H
#define TIDE_RELAY_INIT_H

#include "postgres.h"

/* each relay module's settings, defined in this order */
extern void RelayDefineLauncherGucs(void);	/* launcher.c */
extern void RelayDefineUnitsGucs(void); /* units.c */
extern void RelayDefineAttemptLogGucs(void);	/* attempt_log.c */
extern void RelayDefineSecretsGucs(void);	/* secrets.c */
extern void RelayDefineRetentionGucs(void); /* retention.c */
extern void RelayDefineWebhookGucs(void);	/* endpoints/webhook/sink.c */

/* launcher.c */
extern Size RelayShmemSize(void);
extern void RelayShmemInit(void *place, bool found);
extern void RelayRegisterLauncher(void);

/* backend.c */
extern void RelayInstallHooks(void);

#endif							/* TIDE_RELAY_INIT_H */
