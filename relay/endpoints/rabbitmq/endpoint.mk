# How the Makefile builds the rabbitmq endpoint (its comment "The endpoints").
rabbitmq.order = 60
rabbitmq.provides = sink
rabbitmq.module = librabbitmq librabbitmq-dev librabbitmq4
