"""The load generator's parts: raw AMQP 0-9-1 over blocking sockets, with pre-encoded hot paths.

It imports the stdlib and pamqp only (pamqp for the handshake and the rare methods), never
`leveret.*`: it must measure any broker. The scripts `bench/load.py`, `bench/discard.py` and
`bench/compare.py` import it with `bench/` as sys.path[0]; the repository root is never put on
sys.path, because its `amqp/` folder would shadow py-amqp.

Threading contract: none. Every object here belongs to one thread of one process; aggregate
scenarios use several processes, one connection each.
"""
