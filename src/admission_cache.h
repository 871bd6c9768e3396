/*
 * admission_cache.h
 *		The outbox a backend last admitted a publish to (src/admission_cache.c).
 */
#ifndef TIDE_ADMISSION_CACHE_H
#define TIDE_ADMISSION_CACHE_H

extern uint64 AdmissionGeneration(void);
extern void AdmissionRemember(const char *outbox, int64 position, int64 span,
							  uint64 generation);
extern bool AdmissionRemembered(const char *outbox, int64 *position, int64 *span);

#endif
