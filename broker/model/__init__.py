"""The broker's domain model: vhosts, exchanges, bindings, queues, streams and consumers.

It never sees pamqp or the wire layer: messages reach it with their content header still
encoded, and errors leave it as typed domain errors that the session maps to reply codes.
"""
