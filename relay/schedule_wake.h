/*
 * schedule_wake.h
 *		What a scheduling transaction tells the relay (relay/backend.c):
 *		wake it at commit, and when its message is due.
 */
#ifndef TIDE_SCHEDULE_WAKE_H
#define TIDE_SCHEDULE_WAKE_H

#include "datatype/timestamp.h"

extern void RelayWakeForScheduled(TimestampTz deliver_at);

#endif							/* TIDE_SCHEDULE_WAKE_H */
