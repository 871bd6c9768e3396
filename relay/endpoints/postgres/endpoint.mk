# How the Makefile builds the postgres endpoint (its comment "The endpoints").
postgres.order = 60
postgres.provides = sink source
postgres.module = libpq libpq-dev libpq5
