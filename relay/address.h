/*
 * address.h
 *		Which network addresses the webhook sink's SSRF check refuses: the
 *		worker asks about the address curl is about to connect to (after
 *		DNS), tide.relay_set_outbox about a URL whose host is an address.
 */
#ifndef TIDE_ADDRESS_H
#define TIDE_ADDRESS_H

#include <stdbool.h>
#include <sys/socket.h>

extern bool RelayAddressRefused(const struct sockaddr *sa);

#endif							/* TIDE_ADDRESS_H */
