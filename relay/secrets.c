/*
 * secrets.c
 *		Secrets kept outside the database: a pipeline's signing secret or
 *		header value given as {"env": "PG_TIDE_..."} or {"file": "name"}.
 *
 * The install script validates the form; pipelines.c hands the worker the
 * references marked with a leading \x01 ("\x01env:NAME", "\x01file:NAME",
 * a byte no inline value may hold), and this file replaces them with what
 * they refer to, each time the worker reads its pipelines, so a rotated
 * secret is used from the next pass on.
 *
 * A pipeline's administrator chooses where its secrets are sent, so a
 * reference must not reach anything else of the server: environment
 * variables only with the prefix PG_TIDE_, files only directly inside
 * pg_tide.secrets_directory (set in postgresql.conf; empty refuses file
 * references), by a plain name without "/", not opened through a symbolic
 * link. The names are checked again here, for rows written by hand.
 */
#include "postgres.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/stringinfo.h"
#include "utils/guc.h"

#include "relay_init.h"
#include "secrets.h"

#define SECRET_REF_MARK '\x01'
#define SECRET_ENV_PREFIX "PG_TIDE_"
#define SECRET_FILE_MAX 65536

char	   *RelaySecretsDirectory = NULL;

/* Defines pg_tide.secrets_directory; called from _PG_init. */
void
RelayDefineSecretsGucs(void)
{
	DefineCustomStringVariable("pg_tide.secrets_directory",
							   "The directory whose files pipelines may name as secrets.",
							   "A pipeline's {\"file\": \"name\"} reads the file of that name directly "
							   "inside this directory. Empty: file references are refused.",
							   &RelaySecretsDirectory,
							   "",
							   PGC_SIGHUP, 0,
							   NULL, NULL, NULL);
}

/* Whether name is a plain file name: no "/", not starting with ".". */
static bool
plain_file_name(const char *name)
{
	if (name[0] == '\0' || name[0] == '.' || strlen(name) > 255)
		return false;
	for (const char *c = name; *c; c++)
		if (!(isalnum((unsigned char) *c) || *c == '.' || *c == '_' || *c == '-'))
			return false;
	return true;
}

/* Reads the secret file `name`; NULL with *error set when it cannot. */
static char *
read_secret_file(const char *name, char **error)
{
	char	   *path;
	int			fd;
	struct stat st;
	char	   *buf;
	ssize_t		n;

	if (RelaySecretsDirectory == NULL || RelaySecretsDirectory[0] == '\0')
	{
		*error = psprintf("secret file \"%s\" cannot be read: pg_tide.secrets_directory is not set", name);
		return NULL;
	}
	if (!plain_file_name(name))
	{
		*error = psprintf("secret file \"%s\" is not a plain file name", name);
		return NULL;
	}
	path = psprintf("%s/%s", RelaySecretsDirectory, name);
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
	{
		*error = psprintf("could not open secret file \"%s\": %m", path);
		return NULL;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > SECRET_FILE_MAX)
	{
		close(fd);
		*error = psprintf("secret file \"%s\" is not a regular file of at most %d bytes", path, SECRET_FILE_MAX);
		return NULL;
	}
	buf = palloc(st.st_size + 1);
	n = read(fd, buf, st.st_size);
	close(fd);
	if (n != st.st_size)
	{
		*error = psprintf("could not read secret file \"%s\"", path);
		return NULL;
	}
	buf[n] = '\0';
	return buf;
}

/*
 * The value a marked reference ("\x01env:NAME" or "\x01file:NAME") refers
 * to, without trailing white space; NULL with *error set when it cannot be
 * read.
 */
static char *
resolve_ref(const char *ref, char **error)
{
	char	   *value;
	size_t		len;

	if (strncmp(ref + 1, "env:", 4) == 0)
	{
		const char *name = ref + 5;

		if (strncmp(name, SECRET_ENV_PREFIX, strlen(SECRET_ENV_PREFIX)) != 0)
		{
			*error = psprintf("environment variable \"%s\" does not start with \"%s\"", name, SECRET_ENV_PREFIX);
			return NULL;
		}
		value = getenv(name);
		if (value == NULL)
		{
			*error = psprintf("environment variable \"%s\" is not set in the server's environment", name);
			return NULL;
		}
		value = pstrdup(value);
	}
	else if (strncmp(ref + 1, "file:", 5) == 0)
	{
		value = read_secret_file(ref + 6, error);
		if (value == NULL)
			return NULL;
	}
	else
	{
		*error = psprintf("invalid secret reference");
		return NULL;
	}
	len = strlen(value);
	while (len > 0 && isspace((unsigned char) value[len - 1]))
		value[--len] = '\0';
	if (len == 0)
	{
		*error = psprintf("secret reference \"%s\" is empty", ref + 1);
		return NULL;
	}
	return value;
}

/* Whether s holds a line break or another control character. */
static bool
has_control(const char *s)
{
	for (; *s; s++)
		if ((unsigned char) *s < 0x20 || *s == 0x7f)
			return true;
	return false;
}

/*
 * The value of one secret reference, marked as pipelines.c marks it
 * ("\x01env:NAME", "\x01file:NAME"), for a broker's credential; NULL,
 * with *error, when it cannot be read or holds a control character.
 */
char *
RelayReadSecretRef(const char *marked, char **error)
{
	char	   *value = resolve_ref(marked, error);

	if (value != NULL && has_control(value))
	{
		*error = psprintf("secret reference \"%s\" holds a line break or control character", marked + 1);
		return NULL;
	}
	return value;
}

/*
 * Replaces the references among a webhook's headers ("Name: value" lines)
 * and signing secrets (base64 after whsec_, space-separated) with their
 * values. False, with *error, when one cannot be read or is not valid.
 */
bool
RelayResolveSecrets(char **headers, char **secrets, char **error)
{
	if (*headers && strchr(*headers, SECRET_REF_MARK))
	{
		StringInfoData out;
		char	   *lines = pstrdup(*headers);
		char	   *save = NULL;

		initStringInfo(&out);
		for (char *line = strtok_r(lines, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
		{
			char	   *ref = strchr(line, SECRET_REF_MARK);

			if (out.len > 0)
				appendStringInfoChar(&out, '\n');
			if (ref == NULL)
				appendStringInfoString(&out, line);
			else
			{
				char	   *value = resolve_ref(ref, error);

				if (value == NULL)
					return false;
				if (has_control(value))
				{
					*error = psprintf("secret reference \"%s\" holds a line break or control character", ref + 1);
					return false;
				}
				appendBinaryStringInfo(&out, line, ref - line);
				appendStringInfoString(&out, value);
			}
		}
		*headers = out.data;
	}
	if (*secrets && strchr(*secrets, SECRET_REF_MARK))
	{
		StringInfoData out;
		char	   *tokens = pstrdup(*secrets);
		char	   *save = NULL;

		initStringInfo(&out);
		for (char *t = strtok_r(tokens, " ", &save); t; t = strtok_r(NULL, " ", &save))
		{
			char	   *value = t;

			if (t[0] == SECRET_REF_MARK)
			{
				value = resolve_ref(t, error);
				if (value == NULL)
					return false;
				if (strncmp(value, "whsec_", 6) != 0 || value[6] == '\0' ||
					strspn(value + 6, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")
					!= strlen(value + 6))
				{
					*error = psprintf("signing secret from \"%s\" is not \"whsec_\" followed by base64", t + 1);
					return false;
				}
				value += 6;
			}
			if (out.len > 0)
				appendStringInfoChar(&out, ' ');
			appendStringInfoString(&out, value);
		}
		*secrets = out.data;
	}
	return true;
}
