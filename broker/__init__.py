"""The broker: the model (vhosts, exchanges, queues, streams, consumers) and its runtime.

The runtime is an asyncio server that glues the wire layer (leveret.amqp) to the model and
keeps data in the storage engine (leveret.storage).
"""
