"""The AMQP 0.9.1 wire layer, with no I/O.

Bytes go in and frames, methods and assembled content come out; replies go back out as bytes.
It knows nothing of sockets, asyncio, the broker model or storage, and imports pamqp and the
standard library only. Every object here belongs to one connection and is used from one thread.
"""
