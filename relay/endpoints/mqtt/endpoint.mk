# How the Makefile builds the mqtt endpoint (its comment "The endpoints").
mqtt.order = 70
mqtt.provides = sink
mqtt.module = libmosquitto libmosquitto-dev libmosquitto1
