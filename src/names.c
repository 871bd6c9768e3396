/*
 * names.c
 *		What outbox and consumer group names and consumer ids may be: the
 *		checks the C entry points make, with the same rules and messages as
 *		tide._check_name(), tide._check_consumer() and tide._check_chars()
 *		in the install script.
 */
#include "postgres.h"

#include "pg_tide.h"

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
