# How the Makefile builds the redis endpoint (its comment "The endpoints").
redis.order = 50
redis.provides = sink
redis.module = hiredis libhiredis-dev libhiredis0.14
