# How the Makefile builds the webhook endpoint (its comment "The endpoints").
webhook.order = 10
webhook.provides = sink
