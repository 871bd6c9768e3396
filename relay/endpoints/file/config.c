/*
 * config.c
 *		The file sink's keys of a pipeline config: path and fsync; see
 *		docs/relay.md#file-sink.
 *
 * RelayFileValidate is the sink's validate callback (pipeline_config.c
 * has checked the common keys and refused unknown ones). The relay appends
 * to the file as the server's operating system user, so only those who may
 * write server files may name one: the check runs with the rights of the
 * role that sets the pipeline, or of the pipeline's owner (config_files.c).
 */
#include "postgres.h"

#include "catalog/pg_authid.h"

#include "config_value.h"
#include "file.h"

const char *const RelayFileConfigKeys[] = {"path", "batch_size", "fsync", NULL};

void
RelayFileValidate(const cJSON *config, cJSON *out)
{
	const char *hint = "Give \"path\" as an absolute file name such as \"/var/log/pg_tide/orders.jsonl\".";
	const cJSON *path;

	if (!RelayConfigRoleHas(ROLE_PG_WRITE_SERVER_FILES))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to set a file pipeline"),
				 errdetail("The relay writes the file as the operating system user of the server."),
				 errhint("Only superusers and members of pg_write_server_files may set a file pipeline.")));
	path = RelayConfigRequiredString(config, "path", hint);
	if (path->valuestring[0] != '/')
		RelayConfigError(hint, "config key \"path\" must be an absolute path: \"%s\"", path->valuestring);
	if (RelayConfigMatches(path->valuestring, "[[:cntrl:]]"))
		RelayConfigError(hint, "config key \"path\" must not contain control characters");
	RelayConfigAddCopy(out, "path", path);
	RelayConfigAddBool(out, "fsync", RelayConfigBool(config, "fsync", true));
}
