/*
 * address.c
 *		The SSRF check's rules: loopback, private, link-local (cloud
 *		metadata), carrier-grade NAT, unspecified, multicast and reserved
 *		addresses are refused unless a pipeline sets allow_private_network.
 *
 * One set of rules serves two callers. The webhook sink asks, from a curl
 * callback, about the address it is about to connect to once DNS has
 * answered (RelayAddressRefused must neither raise an ERROR nor palloc
 * there, and does neither). The webhook sink's config validator
 * (relay/endpoints/webhook/config.c) asks RelayUrlHostClass about a URL whose
 * host is written as an address, so that such a pipeline is refused when
 * it is set rather than failing at every delivery. A host given as a name
 * is only known at delivery, and only the worker's check applies to it.
 */
#include "postgres.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "fmgr.h"
#include "utils/builtins.h"

#include "address.h"

PG_FUNCTION_INFO_V1(tide_relay_url_host_class);

/* Whether an IPv4 address (host order) is one the SSRF check refuses. */
static bool
ipv4_refused(uint32 a)
{
	return (a >> 24) == 0 ||	/* 0/8, unspecified */
		(a >> 24) == 10 ||		/* 10/8 */
		(a >> 24) == 127 ||		/* loopback */
		(a >> 20) == 0xAC1 ||	/* 172.16/12 */
		(a >> 16) == 0xC0A8 ||	/* 192.168/16 */
		(a >> 16) == 0xA9FE ||	/* 169.254/16, cloud metadata */
		(a >> 22) == (100u << 2 | 1) || /* 100.64/10, carrier-grade NAT */
		(a >> 28) >= 0xE;		/* multicast and reserved, broadcast */
}

/* Whether an IPv6 address is one the SSRF check refuses. */
static bool
ipv6_refused(const struct in6_addr *a)
{
	const uint8 *b = a->s6_addr;

	if (IN6_IS_ADDR_V4MAPPED(a) || IN6_IS_ADDR_V4COMPAT(a))
		return ipv4_refused(((uint32) b[12] << 24) | ((uint32) b[13] << 16) |
							((uint32) b[14] << 8) | b[15]);
	return IN6_IS_ADDR_UNSPECIFIED(a) || IN6_IS_ADDR_LOOPBACK(a) ||
		(b[0] & 0xFE) == 0xFC ||	/* fc00::/7 */
		(b[0] == 0xFE && (b[1] & 0xC0) == 0x80) ||	/* fe80::/10 */
		(b[0] == 0xFE && (b[1] & 0xC0) == 0xC0) ||	/* fec0::/10 */
		b[0] == 0xFF;			/* multicast */
}

/* Whether a socket address is one the SSRF check refuses. */
bool
RelayAddressRefused(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return ipv4_refused(ntohl(((const struct sockaddr_in *) sa)->sin_addr.s_addr));
	if (sa->sa_family == AF_INET6)
		return ipv6_refused(&((const struct sockaddr_in6 *) sa)->sin6_addr);
	return true;				/* only IP is ever allowed */
}

/*
 * What the host part of a URL is, for the SSRF check: a DNS name (checked
 * at delivery), a public or a refused address, or invalid (in brackets,
 * but no IPv6 address). IPv4 is read the way inet_aton() and so the
 * resolver and curl read it: "2130706433", "0x7f.1" and "0177.0.0.1" are
 * all 127.0.0.1. One trailing dot is ignored, as the resolver ignores it.
 */
RelayHostClass
RelayUrlHostClass(const char *url_host)
{
	char	   *host = pstrdup(url_host);
	size_t		len = strlen(host);
	struct in_addr a4;
	struct in6_addr a6;

	if (len >= 2 && host[0] == '[' && host[len - 1] == ']')
	{
		host[len - 1] = '\0';
		if (inet_pton(AF_INET6, host + 1, &a6) != 1)
			return RELAY_HOST_INVALID;
		return ipv6_refused(&a6) ? RELAY_HOST_PRIVATE : RELAY_HOST_PUBLIC;
	}
	if (len > 1 && host[len - 1] == '.')
		host[len - 1] = '\0';
	if (inet_aton(host, &a4) != 0)
		return ipv4_refused(ntohl(a4.s_addr)) ? RELAY_HOST_PRIVATE : RELAY_HOST_PUBLIC;
	return RELAY_HOST_NAME;
}

/*
 * tide._relay_url_host_class(p_host text): RelayUrlHostClass as 'name',
 * 'public', 'private' or 'invalid'. Declared by the 0.1.0 install script
 * (its URL check in PL/pgSQL called it), so the symbol stays while that
 * script is on the upgrade path; 0.2.0 validates in C and drops it.
 */
Datum
tide_relay_url_host_class(PG_FUNCTION_ARGS)
{
	static const char *const names[] = {"name", "public", "private", "invalid"};

	PG_RETURN_TEXT_P(cstring_to_text(names[RelayUrlHostClass(text_to_cstring(PG_GETARG_TEXT_PP(0)))]));
}
