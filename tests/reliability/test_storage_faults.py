"""Storage faults under a real `leveret serve`: each one is repaired at start with a log line
that says what was repaired, or the broker refuses to start with one line naming the file, or
(for damage that only a read can find) the data is refused to readers. Corrupt data is never
served.

- a torn tail (the last chunk cut short, as a crash leaves it): cut back, logged, and the log
  carries on with dense offsets;
- damage in the middle of a log (a truncated older segment, a bad file header, a flipped byte
  in a durable queue, which is read whole at start): exit code 1 and one line naming the queue
  and the file;
- a flipped byte in the middle of a stream chunk: opening a stream does not read its middle
  (that is what keeps a restart under 2 s for a log of 1 GB), so the broker starts; a consumer
  that reaches the damaged chunk gets everything before it, then basic.cancel, and the log
  names the file and position; the rest of the broker is unaffected;
- a deleted index: rebuilt from its segment, logged;
- a full disk (a 3 MiB tmpfs when this runs as root, else RLIMIT_FSIZE): publishes are nacked,
  nothing half-written stays on disk, what was confirmed survives a kill -9, and publishing
  resumes once there is room;
- a data directory that cannot be written, or a damaged metadata database: exit code 1 and
  one line.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest
from pamqp import commands as C
from support.brokers import BrokerProcess, InProcessBroker
from support.faults import (
    chunks,
    connect,
    drain_queue,
    error_lines,
    flip,
    publish_confirmed,
    queue_dir,
    read_only_bind,
    read_stream,
    segments,
    tmpfs,
)

from leveret.storage import DiskFullError, inspect

STREAM = "faults-stream"
QUEUE = "faults-queue"
OTHER = "faults-other"
COUNT = 300


def body(i: int, size: int = 40) -> bytes:
    return f"{i:06d}:".encode() + b"x" * (size - 7)


@pytest.fixture(scope="module")
def filled_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory with a stream of COUNT messages over several segments (one chunk
    each), a durable queue of COUNT messages and another, empty stream; built once."""
    broker = BrokerProcess(tmp_path_factory.mktemp("filled") / "data").start()
    try:
        _fill(broker)
    finally:
        broker.kill()
    return broker.data_dir


@pytest.fixture
def broker(filled_data: Path, tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker (not started) on a copy of the filled data directory."""
    shutil.copytree(filled_data, tmp_path / "data")
    server = BrokerProcess(tmp_path / "data")
    yield server
    server.kill()


def _fill(broker: BrokerProcess, segment_bytes: int = 8_000) -> None:
    conn = connect(broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(STREAM, durable=True, arguments={
        "x-queue-type": "stream", "x-stream-max-segment-size-bytes": segment_bytes})
    ch.queue_declare(OTHER, durable=True, arguments={"x-queue-type": "stream"})
    ch.queue_declare(QUEUE, durable=True)
    bodies = [body(i) for i in range(COUNT)]
    assert publish_confirmed(ch, STREAM, bodies) == (bodies, [])
    assert publish_confirmed(ch, QUEUE, bodies) == (bodies, [])
    conn.close()
    assert broker.stop() == 0
    assert len(segments(queue_dir(broker.data_dir, STREAM))) >= 4


def refused(broker: BrokerProcess) -> str:
    """Start the broker, expecting it to refuse: exit code 1, one line (besides its JSON log
    lines), no traceback. Returns that line."""
    done = broker.run_to_exit()
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Traceback" not in output
    lines = error_lines(output)
    assert len(lines) == 1, output
    assert lines[0].startswith("error: ")
    return lines[0]


def test_a_torn_tail_is_cut_back_and_logged(broker: BrokerProcess) -> None:
    data = broker.data_dir
    stream_segment = segments(queue_dir(data, STREAM))[-1]
    queue_segment = segments(queue_dir(data, QUEUE))[-1]
    for segment in (stream_segment, queue_segment):
        last = chunks(segment)[-1]
        os.truncate(segment, last["position"] + last["size"] - 5)  # as a crash mid-write

    broker.start()
    log = broker.log()
    for segment in (stream_segment, queue_segment):
        assert f"truncated torn tail of {segment}" in log
    got, cancelled = read_stream(broker.port, STREAM)
    assert not cancelled
    assert got == [(i, body(i)) for i in range(COUNT - 1)]  # the torn chunk held the last one
    conn = connect(broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    publish_confirmed(ch, STREAM, [b"after"])
    conn.close()
    got, _ = read_stream(broker.port, STREAM, offset=COUNT - 2)
    assert got == [(COUNT - 2, body(COUNT - 2)), (COUNT - 1, b"after")]  # dense offsets
    assert [b for b, _r in drain_queue(broker.port, QUEUE)] == [
        body(i) for i in range(COUNT - 1)
    ]


def _truncate_older_segment(data: Path) -> Path:
    older = segments(queue_dir(data, STREAM))[1]
    os.truncate(older, older.stat().st_size - 10)
    return older


def _bad_magic(data: Path) -> Path:
    older = segments(queue_dir(data, STREAM))[1]
    flip(older, 1)
    return older


def _flip_durable_queue(data: Path) -> Path:
    segment = segments(queue_dir(data, QUEUE))[0]
    middle = chunks(segment)[COUNT // 2]
    flip(segment, middle["position"] + middle["size"] - 10)  # in the record, under the CRC
    return segment


@pytest.mark.parametrize(
    ("damage", "queue"),
    [(_truncate_older_segment, STREAM), (_bad_magic, STREAM), (_flip_durable_queue, QUEUE)],
    ids=["truncated-older-segment", "bad-segment-magic", "flipped-byte-in-a-durable-queue"],
)
def test_damage_in_the_middle_refuses_to_start_naming_the_file(
    broker: BrokerProcess, damage: Callable[[Path], Path], queue: str
) -> None:
    damaged = damage(broker.data_dir)
    line = refused(broker)
    assert line.startswith(f"error: queue '{queue}' in vhost '/' cannot be recovered: ")
    assert str(damaged) in line


@pytest.mark.parametrize("where", ["older-segment", "active-segment"])
def test_a_flipped_byte_in_a_stream_is_never_served(
    broker: BrokerProcess, where: str
) -> None:
    files = segments(queue_dir(broker.data_dir, STREAM))
    segment = files[1] if where == "older-segment" else files[-1]
    user_chunks = [c for c in chunks(segment) if c["chunk_type"] == 0]
    damaged = user_chunks[len(user_chunks) // 2]
    flip(segment, damaged["position"] + damaged["size"] - 10)

    broker.start()  # opening reads the tail, not the middle
    got, cancelled = read_stream(broker.port, STREAM)
    first_bad = damaged["first_offset"]
    assert got == [(i, body(i)) for i in range(first_bad)]
    assert cancelled, "a consumer that cannot move on is cancelled"
    log = broker.log()
    assert "stream read failed; consumer cancelled" in log
    assert f"{segment} at {damaged['position']}: chunk CRC mismatch" in log
    # The damaged stream still takes publishes, and its other readers are fine; so is the
    # rest of the broker.
    conn = connect(broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    publish_confirmed(ch, STREAM, [b"new"])
    publish_confirmed(ch, OTHER, [b"other"])
    conn.close()
    assert read_stream(broker.port, STREAM, offset=COUNT)[0] == [(COUNT, b"new")]
    assert read_stream(broker.port, OTHER)[0] == [(0, b"other")]
    assert len(drain_queue(broker.port, QUEUE)) == COUNT


def test_deleted_indexes_are_rebuilt(broker: BrokerProcess) -> None:
    data = broker.data_dir
    indexes = [*queue_dir(data, STREAM).glob("*.index"), *queue_dir(data, QUEUE).glob("*.index")]
    assert len(indexes) >= 3
    for index in indexes:
        index.unlink()
    broker.start()
    assert all(index.exists() for index in indexes)
    log = broker.log()
    for index in indexes:
        assert str(index) in log  # "rebuilt index ..." or "... rebuilding it from its segment"
    got, _ = read_stream(broker.port, STREAM, offset=COUNT // 2)
    assert got == [(i, body(i)) for i in range(COUNT // 2, COUNT)]  # located by the index
    assert [b for b, _r in drain_queue(broker.port, QUEUE)] == [
        body(i) for i in range(COUNT)
    ]


# -- a full disk ------------------------------------------------------------------------------


def _file_size_limit(limit: int) -> Callable[[], None]:
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker whose data directory is on a 3 MiB tmpfs (as root), or whose files may not
    grow past 3 MB (RLIMIT_FSIZE: the same errors reach the storage engine, as EFBIG)."""
    with tmpfs(tmp_path / "small", "3m") as mounted:
        env = {"LEVERET_DISK_FREE_LIMIT_BYTES": "0"}  # no disk alarm: the writes must fail
        if mounted:
            broker = BrokerProcess(tmp_path / "small" / "data", env=env)
        else:
            broker = BrokerProcess(tmp_path / "data", env=env,
                                   preexec=_file_size_limit(3_000_000))
        broker.log_path = tmp_path / "broker.log"  # not on the full disk
        yield broker
        broker.kill()


def test_a_full_disk_nacks_publishes_and_corrupts_nothing(small_disk: BrokerProcess) -> None:
    broker = small_disk.start()
    conn = connect(broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(STREAM, durable=True, arguments={
        "x-queue-type": "stream", "x-stream-max-segment-size-bytes": 10_000_000})
    ch.queue_declare(QUEUE, durable=True)
    acked: dict[str, list[bytes]] = {STREAM: [], QUEUE: []}
    nacked: dict[str, list[bytes]] = {STREAM: [], QUEUE: []}
    for i in range(3000):
        for queue in (STREAM, QUEUE):
            ok, bad = publish_confirmed(ch, queue, [body(i, 5000)])
            acked[queue] += ok
            nacked[queue] += bad
        if len(nacked[STREAM]) >= 5 and len(nacked[QUEUE]) >= 5:
            break
    assert acked[STREAM] and acked[QUEUE]
    assert len(nacked[STREAM]) >= 5 and len(nacked[QUEUE]) >= 5
    assert broker.proc is not None and broker.proc.poll() is None
    conn.close()
    broker.kill()
    log = broker.log()
    assert "stream append failed" in log and "durable queue write failed" in log
    assert "No space left on device" in log or "File too large" in log
    for queue in (STREAM, QUEUE):
        assert inspect.verify(queue_dir(broker.data_dir, queue)) == []  # no partial chunk

    broker.start()
    got, _ = read_stream(broker.port, STREAM)
    assert [b for _o, b in got] == acked[STREAM]  # exactly what was confirmed, in order
    assert [o for o, _b in got] == list(range(len(acked[STREAM])))
    assert [b for b, _r in drain_queue(broker.port, QUEUE)] == acked[QUEUE]
    # Room again (the stream goes): publishing is confirmed again.
    conn = connect(broker.port)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_delete(STREAM)
    assert publish_confirmed(ch, QUEUE, [b"room again"]) == ([b"room again"], [])
    conn.close()


def test_a_paged_durable_queue_keeps_its_count_when_a_write_fails(tmp_path: Path) -> None:
    """Regression: messages past the in-memory page live only in the log; when their write
    failed they were still counted, so the queue reported messages it could never deliver."""
    server = InProcessBroker(tmp_path / "data").start()
    try:
        conn = connect(server.port)
        ch = conn.channel()
        ch.queue_declare(QUEUE, durable=True)
        for i in range(2100):  # past the 2048-message page: the rest goes to the log only
            ch.basic_publish("", QUEUE, body(i), pika.BasicProperties(delivery_mode=2))
        ch.confirm_delivery()
        publish_confirmed(ch, QUEUE, [b"sync"])
        queue = server.call(lambda: server.broker.vhosts["/"].queues[QUEUE])
        append = queue.log.append

        def full(*args: object, **kwargs: object) -> int:
            raise DiskFullError(queue.log.directory, "No space left on device", errno=28)

        server.call(lambda: setattr(queue.log, "append", full))
        acked, nacked = publish_confirmed(ch, QUEUE, [body(i) for i in range(2100, 2110)])
        server.call(lambda: setattr(queue.log, "append", append))
        assert (acked, len(nacked)) == ([], 10)
        acked, nacked = publish_confirmed(ch, QUEUE, [b"after"])
        assert (acked, nacked) == ([b"after"], [])
        count = ch.queue_declare(QUEUE, passive=True).method.message_count
        conn.close()
        drained = [b for b, _r in drain_queue(server.port, QUEUE)]
        assert count == len(drained) == 2102
        assert drained == [body(i) for i in range(2100)] + [b"sync", b"after"]
    finally:
        server.stop()


def test_a_stream_forgets_the_delayed_ids_of_copies_it_failed_to_store(tmp_path: Path) -> None:
    """A delayed exchange's copy whose append failed is nacked and not in the stream: its id
    (x-leveret-delayed-id) is forgotten, so the copy sent again (the exchange holds a refused
    copy again) is stored, once; a copy with an id taken before is still dropped."""
    server = InProcessBroker(tmp_path / "data").start()
    try:
        conn = connect(server.port)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream"})

        def send(body: bytes, ident: str) -> bool:
            try:
                ch.basic_publish("", STREAM, body, pika.BasicProperties(
                    delivery_mode=2, headers={"x-leveret-delayed-id": ident}))
                return True
            except pika.exceptions.NackError:
                return False

        assert send(b"kept", "somelog:1")
        queue = server.call(lambda: server.broker.vhosts["/"].queues[STREAM])
        append = queue.log.append

        def full(*args: object, **kwargs: object) -> int:
            raise DiskFullError(queue.log.directory, "No space left on device", errno=28)

        server.call(lambda: setattr(queue.log, "append", full))
        assert not send(b"refused", "somelog:2")
        server.call(lambda: setattr(queue.log, "append", append))
        assert send(b"sent again", "somelog:2")
        assert send(b"kept again", "somelog:1")  # confirmed, and dropped: taken before
        conn.close()
        got, _ = read_stream(server.port, STREAM)
        assert got == [(0, b"kept"), (1, b"sent again")]
    finally:
        server.stop()


def test_a_failed_turn_forgets_only_the_ids_of_the_copies_it_did_not_store(
        tmp_path: Path) -> None:
    """Two delayed copies in one turn, one chunk each (a chunk bound of one record): the
    first chunk is written, the second fails. The turn's publishes are nacked, but the first
    copy is in the stream: its id stays taken (sent again, it is dropped), the second's is
    forgotten (sent again, it is stored)."""
    from support import fuzzwire as fw
    from support.rawamqp import RawClient

    server = InProcessBroker(tmp_path / "data", stream_chunk_min_records=1,
                             stream_chunk_max_records=1).start()
    try:
        client = RawClient(server.port).handshake()
        client.open_channel(1)
        client.send(fw.method_frame(1, fw.make(C.Queue.Declare, queue=STREAM, durable=True,
                                               arguments={"x-queue-type": "stream"})))
        client.next_method()
        queue = server.call(lambda: server.broker.vhosts["/"].queues[STREAM])
        append = queue.log.append

        def second_fails(*args: object, **kwargs: object) -> int:
            if kwargs.get("taken") == [(b"somelog", 4)]:
                raise DiskFullError(queue.log.directory, "No space left on device", errno=28)
            return append(*args, **kwargs)  # type: ignore[arg-type]

        server.call(lambda: setattr(queue.log, "append", second_fails))
        client.send(b"".join(fw.publish(1, "", STREAM, f"copy {i}".encode(), delivery_mode=2,
                                        headers={"x-leveret-delayed-id": f"somelog:{i}"})
                             for i in (3, 4)))  # one write: one turn
        client.close_connection()
        client.close()
        server.call(lambda: setattr(queue.log, "append", append))
        conn = connect(server.port)
        ch = conn.channel()
        ch.confirm_delivery()
        for i in (3, 4):
            ch.basic_publish("", STREAM, f"copy {i} again".encode(), pika.BasicProperties(
                delivery_mode=2, headers={"x-leveret-delayed-id": f"somelog:{i}"}))
        conn.close()
        got, _ = read_stream(server.port, STREAM)
        assert got == [(0, b"copy 3"), (1, b"copy 4 again")]
    finally:
        server.stop()


# -- the data directory and the metadata database ----------------------------------------------


def test_a_data_dir_that_cannot_be_written_refuses_to_start(broker: BrokerProcess) -> None:
    data = broker.data_dir
    with read_only_bind(data) as read_only:
        if not read_only:  # not root: permissions are enough
            data.chmod(0o500)
        try:
            line = refused(broker)
        finally:
            if not read_only:
                data.chmod(0o755)
    assert line == f"error: data directory {data} is not writable: Read-only file system" or (
        line == f"error: data directory {data} is not writable: Permission denied"
    )


def test_one_lock_covers_the_queue_folders_and_a_second_server_is_refused(
        tmp_path: Path) -> None:
    """The server holds one flock over its queue folders, so a durable or quorum queue's log
    holds two descriptors (its active segment and index), not three (issue 28: 1,000 descriptors
    a node with 1,000 quorum queues); a second `leveret serve` on the same data directory is
    refused at once, in one line. The first one stopped, it starts."""
    first = BrokerProcess(tmp_path / "data").start()
    try:
        fds = lambda: len(os.listdir(f"/proc/{first.proc.pid}/fd"))  # type: ignore[union-attr]  # noqa: E731
        conn = pika.BlockingConnection(pika.URLParameters(first.url))
        ch = conn.channel()
        before = fds()
        for i in range(100):
            ch.queue_declare(f"q{i}", durable=True, arguments={"x-queue-type": "quorum"})
        ch.queue_declare("classic", durable=True)
        added = fds() - before
        assert 2 * 101 <= added <= 2 * 101 + 5, added
        second = BrokerProcess(tmp_path / "data")
        assert refused(second) == (f"error: data directory {tmp_path / 'data'} is in use by "
                                   "another leveret serve")
        conn.close()
    finally:
        assert first.stop() == 0
    again = BrokerProcess(tmp_path / "data").start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(again.url))
        assert conn.channel().queue_declare("q7", passive=True).method.message_count == 0
        conn.close()
    finally:
        assert again.stop() == 0


def test_a_damaged_metadata_database_refuses_to_start(broker: BrokerProcess) -> None:
    database = broker.data_dir / "metadata.sqlite3"
    raw = bytearray(database.read_bytes())
    raw[100:4096] = bytes(3996)  # the first page's b-tree header and cells
    database.write_bytes(bytes(raw))
    line = refused(broker)
    assert line.startswith(f"error: cannot open the metadata database {database}: ")


def test_restart_after_faults_is_quick(broker: BrokerProcess) -> None:
    """Repairs at start cost little: a torn tail and missing indexes on a few segments."""
    data = broker.data_dir
    for index in queue_dir(data, STREAM).glob("*.index"):
        index.unlink()
    segment = segments(queue_dir(data, STREAM))[-1]
    os.truncate(segment, segment.stat().st_size - 3)
    started = time.monotonic()
    broker.start()
    assert time.monotonic() - started < 10
    assert len(read_stream(broker.port, STREAM)[0]) == COUNT - 1


def test_declarations_on_a_full_disk_fail_cleanly(tmp_path: Path) -> None:
    """Regression: on a full disk a durable declaration crashed the connection with 541
    "internal error" and a traceback, and left behind a queue that existed in memory but not
    in the metadata (so it vanished at the next restart with whatever it had confirmed), and
    an empty storage folder. Now each is refused with a clear text and nothing stays."""
    with tmpfs(tmp_path / "small", "2m") as mounted:
        if not mounted:
            pytest.skip("needs a small tmpfs (root)")
        broker = BrokerProcess(tmp_path / "small" / "data",
                               env={"LEVERET_DISK_FREE_LIMIT_BYTES": "0"})
        broker.log_path = tmp_path / "broker.log"
        broker.start()
        try:
            filler = tmp_path / "small" / "filler"
            with pytest.raises(OSError), open(filler, "wb") as out:
                while True:
                    out.write(b"x" * 65536)
                    out.flush()
            attempts = {
                "queue": lambda ch: ch.queue_declare("full-q", durable=True),
                "stream": lambda ch: ch.queue_declare(
                    "full-s", durable=True, arguments={"x-queue-type": "stream"}),
                "exchange": lambda ch: ch.exchange_declare("full-x", "direct", durable=True),
            }
            for what, attempt in attempts.items():
                conn = connect(broker.port)
                with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
                    attempt(conn.channel())
                assert closed.value.reply_code == 541, what
                assert "No space left on device" in closed.value.reply_text or (
                    "database or disk is full" in closed.value.reply_text), what
            filler.unlink()
            conn = connect(broker.port)
            ch = conn.channel()
            for name in ("full-q", "full-s"):  # not half-declared: they do not exist
                with pytest.raises(pika.exceptions.ChannelClosedByBroker):
                    ch.queue_declare(name, passive=True)
                ch = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker):
                ch.exchange_declare("full-x", passive=True)
            conn.close()
            assert list((broker.data_dir / "queues").iterdir()) == []
            assert "Traceback" not in broker.log()
        finally:
            broker.kill()


def test_a_durable_queue_past_its_page_delivers_each_message_once(tmp_path: Path) -> None:
    """Regression (found by the backlog load test): when the in-memory page filled up in the
    middle of a turn, the tail that goes to the log only was taken to start at the log's next
    offset while that turn's head messages were still unwritten. They were then read back
    into the head a second time (delivered twice) and as many tail messages were never read
    (the queue reported them, or went negative, and they were lost)."""
    from support import fuzzwire as fw
    from support.rawamqp import RawClient

    server = InProcessBroker(tmp_path / "data").start()
    try:
        client = RawClient(server.port).handshake()
        client.open_channel(1)
        client.send(fw.method_frame(1, fw.make(C.Queue.Declare, queue=QUEUE, durable=True,
                                               arguments={})))
        client.next_method()
        # 3,000 persistent messages in one write: the 2,048-message page fills mid-turn.
        client.send(b"".join(fw.publish(1, "", QUEUE, body(i), delivery_mode=2)
                             for i in range(3000)))
        client.close_connection()
        client.close()
        conn = connect(server.port)
        ch = conn.channel()
        ch.confirm_delivery()
        publish_confirmed(ch, QUEUE, [body(i) for i in range(3000, 3100)])
        got = []  # taken without acks: the head is read back while its messages are unacked
        while True:
            method, _props, payload = ch.basic_get(QUEUE, auto_ack=False)
            if method is None:
                break
            got.append(payload)
        ch.basic_ack(0, multiple=True)
        conn.close()
        assert got == [body(i) for i in range(3100)]
    finally:
        server.stop()
