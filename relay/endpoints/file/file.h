/*
 * file.h
 *		What the file sink's two files share: the validator of its keys
 *		(config.c), which its routine (sink.c) points at.
 */
#ifndef TIDE_FILE_H
#define TIDE_FILE_H

#include <cjson/cJSON.h>

extern void RelayFileValidate(const cJSON *config, cJSON *out);
extern const char *const RelayFileConfigKeys[];

#endif							/* TIDE_FILE_H */
