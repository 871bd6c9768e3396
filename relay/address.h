/*
 * address.h
 *		Which network addresses the webhook sink's SSRF check refuses: the
 *		worker asks about the address curl is about to connect to (after
 *		DNS), the webhook config's validator about a URL whose host is an
 *		address.
 */
#ifndef TIDE_ADDRESS_H
#define TIDE_ADDRESS_H

#include <stdbool.h>
#include <sys/socket.h>

extern bool RelayAddressRefused(const struct sockaddr *sa);

/* What the host part of a URL is (the order is that of address.c's names). */
typedef enum RelayHostClass
{
	RELAY_HOST_NAME,			/* a DNS name: checked once resolved */
	RELAY_HOST_PUBLIC,			/* an address the check allows */
	RELAY_HOST_PRIVATE,			/* an address it refuses */
	RELAY_HOST_INVALID			/* in brackets, but no IPv6 address */
} RelayHostClass;

extern RelayHostClass RelayUrlHostClass(const char *url_host);

#endif							/* TIDE_ADDRESS_H */
