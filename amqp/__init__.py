"""The AMQP 0.9.1 wire layer, with no I/O.

Bytes go in and frames, methods and assembled content come out; replies go back out as bytes.
It knows nothing of sockets, asyncio, structlog, the broker model or storage, and imports pamqp
and the standard library only (an import-linter contract in pyproject.toml). Every object here
belongs to one connection and is used from one thread.

Modules:

- `frames`: FrameBuffer, bytes in and raw frames out, frame_max checked before decoding;
- `codec`: method codecs, pamqp for every method and struct codecs for the hot ones;
- `content`: the inbound message, its assembly from frames, and its splitting into frames;
- `properties`, `tables`: encoded content headers and field tables, changed without decoding;
- `stored`: the stored form of a message, and deliveries built from it;
- `handshake`: the connection handshake and channel 0; `connection`: the connection and
  channel state machines; `split_input`: their input when a wire worker split the frames;
- `auth`: SASL responses; `errors`: reply-code errors; `constants`: the wire's numbers.
"""
