# How the Makefile builds the inbox endpoint (its comment "The endpoints").
inbox.order = 25
inbox.provides = sink
