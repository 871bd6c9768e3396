# How the Makefile builds the file endpoint (its comment "The endpoints").
file.order = 20
file.provides = sink
