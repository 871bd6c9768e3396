/*
 * config_limits.c
 *		The limits of the network that every sink's validator applies to
 *		the hosts and ports of its config: a port from 1 to 65535, a host
 *		name of at most 253 bytes whose labels have 1 to 63 (RFC 1035).
 *
 * A value beyond them would not be refused by every client library: a
 * port parsed into 16 bits wraps (84387 is 18851), a 1 MB host name goes
 * to the name server. So they are refused when the pipeline is set.
 */
#include "postgres.h"

#include "config_value.h"

/* The longest host name and label (RFC 1035, 2.3.4). */
#define HOST_NAME_MAX_BYTES 253
#define HOST_LABEL_MAX_BYTES 63

void
RelayConfigCheckHost(const char *key, const char *host, size_t len, const char *hint)
{
	size_t		label = 0;

	if (len == 0 || (len == 1 && host[0] == '.'))
		RelayConfigError(hint, "config key \"%s\" has an empty host name", key);
	/* an address: [IPv6] or bare, or IPv4, which the sink's own check reads */
	if (len > 0 && (host[0] == '[' || memchr(host, ':', len) != NULL))
		return;
	if (len > HOST_NAME_MAX_BYTES)
		RelayConfigError(hint, "config key \"%s\" has a host name longer than %d bytes",
						 key, HOST_NAME_MAX_BYTES);
	for (size_t i = 0; i < len; i++)
	{
		if (host[i] != '.')
		{
			if (++label > HOST_LABEL_MAX_BYTES)
				RelayConfigError(hint, "config key \"%s\" has a host name with a label longer than %d bytes",
								 key, HOST_LABEL_MAX_BYTES);
			continue;
		}
		/* one final dot is the root: "example.com." */
		if (label == 0 && i + 1 < len)
			RelayConfigError(hint, "config key \"%s\" has a host name with an empty label: \"%.*s\"",
							 key, (int) len, host);
		label = 0;
	}
}

int
RelayConfigCheckPort(const char *key, const char *digits, size_t len, const char *hint)
{
	int			port = 0;

	for (size_t i = 0; i < len && port <= 65535; i++)
	{
		if (digits[i] < '0' || digits[i] > '9')
			RelayConfigError(hint, "config key \"%s\" has a port that is not a number: \"%.*s\"",
							 key, (int) len, digits);
		port = port * 10 + (digits[i] - '0');
	}
	if (len == 0 || port < 1 || port > 65535)
		RelayConfigError(hint, "config key \"%s\" has a port out of range (1 to 65535): \"%.*s\"",
						 key, (int) Min(len, 16), digits);
	return port;
}
