# How the Makefile builds the nats endpoint (its comment "The endpoints").
nats.order = 40
nats.provides = sink
nats.module = libnats libnats-dev libnats3.4
