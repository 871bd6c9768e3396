# How the Makefile builds the kafka endpoint (its comment "The endpoints").
kafka.order = 30
kafka.provides = sink
kafka.module = rdkafka librdkafka-dev librdkafka1
