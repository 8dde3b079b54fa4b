"""The Spark data source for Leveret (a sink and a source).

It runs in Spark's Python workers and talks to the broker over AMQP only; it imports nothing
from leveret.broker or leveret.storage.
"""
