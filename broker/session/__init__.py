"""The session: glue between the wire state machines (leveret.amqp) and the model.

One Session per client connection implements the wire's handler interface; one Channel per
open channel turns methods into model calls and deliveries into frames. `errors` holds the one
map from domain errors to reply codes.
"""
