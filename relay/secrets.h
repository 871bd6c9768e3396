/*
 * secrets.h
 *		Secrets that pipeline configs refer to (secrets.c): files in
 *		pg_tide.secrets_directory, resolved when a pipeline is opened.
 */
#ifndef TIDE_SECRETS_H
#define TIDE_SECRETS_H

#include "postgres.h"

extern char *RelaySecretsDirectory;
extern bool RelayResolveSecrets(char **headers, char **secrets, char **error);
extern char *RelayReadSecretRef(const char *marked, char **error);

#endif							/* TIDE_SECRETS_H */
