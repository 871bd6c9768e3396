/*
 * relay.h
 *		Every declaration of the relay, for the files that use several of
 *		its parts: the headers by role, which a file that needs only one
 *		includes instead. launcher.h: the launcher and shared memory;
 *		relay_xact.h: short transactions and the worker's process helpers;
 *		flow.h: the engine's interface to its flows; forward.h: the forward
 *		flow's kit; sink.h: the sink interface; secrets.h: secrets.
 */
#ifndef TIDE_RELAY_H
#define TIDE_RELAY_H

#include "postgres.h"

#include "filter.h"
#include "forward.h"
#include "launcher.h"
#include "log_repeat.h"
#include "relay_init.h"
#include "relay_xact.h"
#include "secrets.h"
#include "sink.h"

#endif							/* TIDE_RELAY_H */
