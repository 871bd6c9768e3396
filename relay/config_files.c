/*
 * config_files.c
 *		Whose rights a pipeline config is checked with, and which server
 *		files a config may make the relay read: a TLS CA file, certificate
 *		or key, a NATS credentials file.
 *
 * The relay worker runs as a superuser and reads such a file as the
 * server's operating system user, then sends what it holds (a JWT and a
 * signature over a server's nonce, a client certificate) to the server the
 * config names. So a config may name a file only when
 * - the role it is checked with is a superuser or has the privileges of
 *	 pg_read_server_files (who may read any server file anyway), or
 * - the file lies inside pg_tide.secrets_directory, which the server's
 *	 administrator fills: the name has no "." or ".." component and, with
 *	 every symbolic link resolved, is still inside the directory.
 * For any other role a file outside the directory, a missing file and one
 * the server cannot read give one and the same error, and no file outside
 * the directory is looked at, so a config cannot tell which files exist.
 *
 * The role is the one that sets the pipeline (tide.relay_set_outbox), the
 * pipeline's owner as its row records it (the row's trigger and the relay
 * worker, which checks again at every reading, so a revoked right stops
 * the pipeline): RelayNormalizeConfig sets it for the time it validates.
 */
#include "postgres.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include "catalog/pg_authid.h"
#include "miscadmin.h"
#include "utils/acl.h"

#include "config_value.h"
#include "secrets.h"

/* The role a config is being checked with; InvalidOid: a role with no rights. */
static Oid	config_role = InvalidOid;

/* Sets the role a config is checked with; returns the one set before. */
Oid
RelayConfigSetRole(Oid role)
{
	Oid			before = config_role;

	config_role = role;
	return before;
}

/* The role a config is checked with; InvalidOid: a role with no rights. */
Oid
RelayConfigRole(void)
{
	return config_role;
}

/* Whether the role a config is checked with is a superuser or has the privileges of `builtin`. */
bool
RelayConfigRoleHas(Oid builtin)
{
	if (!OidIsValid(config_role))
		return false;
	return superuser_arg(config_role) || has_privs_of_role(config_role, builtin);
}

/*
 * Whether path names a readable regular file inside the secrets directory,
 * resolved; path has been checked to be absolute and to hold no "." or
 * ".." component, so nothing outside the directory is looked at unless a
 * link inside it points there.
 */
static bool
in_secrets_directory(const char *path)
{
	char		dir[PATH_MAX];
	char		file[PATH_MAX];
	size_t		len;

	if (RelaySecretsDirectory == NULL || RelaySecretsDirectory[0] != '/')
		return false;
	len = strlen(RelaySecretsDirectory);
	while (len > 1 && RelaySecretsDirectory[len - 1] == '/')
		len--;
	if (strncmp(path, RelaySecretsDirectory, len) != 0 || path[len] != '/')
		return false;
	if (realpath(RelaySecretsDirectory, dir) == NULL || realpath(path, file) == NULL)
		return false;
	len = strlen(dir);
	return strncmp(file, dir, len) == 0 && file[len] == '/' && access(file, R_OK) == 0;
}

/* Whether an absolute path has a "." or ".." component. */
static bool
has_dot_component(const char *path)
{
	for (const char *c = path; *c; c++)
	{
		if (*c != '/')
			continue;
		if ((c[1] == '.' && (c[2] == '/' || c[2] == '\0')) ||
			(c[1] == '.' && c[2] == '.' && (c[3] == '/' || c[3] == '\0')))
			return true;
	}
	return false;
}

/* The role a config is checked with, as a message names it. */
static char *
role_text(void)
{
	const char *name = OidIsValid(config_role) ? GetUserNameFromId(config_role, true) : NULL;

	return name ? psprintf("role \"%s\"", name) : pstrdup("a pipeline without an owner");
}

void
RelayConfigCheckFile(const char *key, const cJSON *v, const char *hint)
{
	RelayConfigCheckType(key, v, "string", hint);
	if (v->valuestring[0] != '/')
		RelayConfigError(hint, "config key \"%s\" must be an absolute path: \"%s\"", key, v->valuestring);
	if (RelayConfigMatches(v->valuestring, "[[:cntrl:]]"))
		RelayConfigError(hint, "config key \"%s\" must not contain control characters", key);
	if (strlen(v->valuestring) >= PATH_MAX)
		RelayConfigError(hint, "config key \"%s\" is longer than %d bytes", key, PATH_MAX - 1);
	if (RelayConfigRoleHas(ROLE_PG_READ_SERVER_FILES))
		return;
	if (has_dot_component(v->valuestring) || !in_secrets_directory(v->valuestring))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("config key \"%s\" names a file the relay may not read for %s: \"%s\"",
						key, role_text(), v->valuestring),
				 errdetail("Without the privileges of pg_read_server_files, a pipeline may name only a readable "
						   "file inside pg_tide.secrets_directory."),
				 errhint("Put the file in pg_tide.secrets_directory, or have a superuser or a member of "
						 "pg_read_server_files set the pipeline.")));
}
