"""The stream queue type: an append-only, replayable log behind an AMQP queue.

Publishing goes through the stream's writer (writer.py): whatever arrived during one turn of the
event loop becomes chunks of the storage engine's log, one per run of one record kind (AMQP 0.9.1
records in USER chunks, stream-protocol messages in STREAM_ENTRIES chunks: amqp/stored.py), with
their filter values and publisher ids, and every publish of the turn is confirmed at once, at
the commit point. A run is cut into several chunks at a bound that adapts as RabbitMQ's writer
batch does (`ChunkBound`), so that a burst makes chunks of growing size and `last` means its last
part, as on RabbitMQ. Publisher
deduplication (x-stream-publisher-name / x-stream-publishing-id) drops a publish whose id is not
above that publisher's last stored id, and still confirms it. Each consumer is a cursor with
its own reader: it reads chunks from the files, up to the committed offset, spending the credit
its channel gives it (prefetch minus unacked). Acks free credit and, for tracked consumers,
advance the stored offset, which is written into the log (batched). Consumers that share a tag
with x-single-active-consumer form a group with one active member (see sac.py).

Where one node and a member of a replicated stream differ, the queue asks its replication (the
replication.py port), given when it is created and kept: one node's `ONE_NODE` by default, a
cluster member's in a cluster. It never asks which it has: it must not know the cluster.

Single-threaded: runs on the event loop; storage calls are synchronous.
"""

from __future__ import annotations

import bisect
import shutil
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from leveret.broker.model import args as qargs
from leveret.broker.model import stream_args as sargs
from leveret.broker.model import superstream
from leveret.broker.model.consumer import Consumer
from leveret.broker.model.delayed_ids import MARK, TakenIds
from leveret.broker.model.errors import NotImplementedFeature, PreconditionFailed
from leveret.broker.model.log_queue import MemberAnswers
from leveret.broker.model.message import Confirm, InboundMessage
from leveret.broker.model.queue import Queue, QueueOwner
from leveret.broker.model.replication import ONE_NODE, Replication
from leveret.broker.model.sac import SacGroups
from leveret.broker.model.storage_env import STREAM_CHUNK_TYPES, STREAM_ENTRIES, USER, StorageEnv
from leveret.broker.model.stream_cursor import Cursor
from leveret.broker.model.writer import Writer
from leveret.broker.process import logs
from leveret.storage import ChunkView, Log, LogConfig, OffsetSpec, ReaderFilter, StorageError

if TYPE_CHECKING:
    from leveret.broker.model.scheduler import Timer

log = logs.get("leveret.stream")
TRACKING_FLUSH_MS = 1000
SAC_DRAIN_TIMEOUT_MS = 30_000
RETENTION_CHECK_MS = 60_000


class ChunkBound:
    """How many records (and bytes) a stream's next chunk takes, as osiris's writer batches:
    gen_batch_server starts a writer's batch at 32 commands, doubles it each time a batch
    fills (up to 8,192) and halves it (down to 32 again) each time the writer's mailbox runs
    dry first; each batch is one chunk. Here a turn's run of publishes is one chunk until it
    reaches `records` (which then doubles, for the next chunk of the turn), and a turn that
    ends having taken less than half of `records` halves it (where osiris halves at every
    batch that ends short: a turn is not a mailbox, and a steady load of turns that needs the
    bound keeps it, one chunk a turn, rather than two). A chunk also ends once its records
    reach `max_bytes` (osiris has no such bound; a chunk holds at least one record)."""

    __slots__ = ("max_bytes", "max_records", "min_records", "records")

    def __init__(self, min_records: int, max_records: int, max_bytes: int) -> None:
        self.min_records = max(1, min_records)
        self.max_records = max(self.min_records, max_records)
        self.max_bytes = max(1, max_bytes)
        self.records = self.min_records

    def filled(self) -> None:
        self.records = min(self.max_records, self.records * 2)

    def ran_dry(self) -> None:
        self.records = max(self.min_records, self.records // 2)


@dataclass(slots=True)
class _Run:
    """Consecutive publishes of one record kind: one chunk of that type, of at most `bound`
    records and about the byte bound. `limit` is the record count at which it is looked at
    next (_Batch.check): its bound, or before that a count of its bytes."""

    chunk_type: int
    bound: int
    limit: int
    records: list[bytes] = field(default_factory=list)
    filters: list[bytes | None] = field(default_factory=list)
    # the last publishing id of each publisher of this run, stored with its chunk
    publishers: dict[str | bytes, int] = field(default_factory=dict)
    any_filter: bool = False
    # the ids of the delayed copies among its records (delayed_ids.py), kept in its chunk's
    # tracking trailer: a restart or a new leader reads them back (`_load_taken`)
    taken: list[tuple[bytes, int]] = field(default_factory=list)
    written: bool = False  # its chunk is in the log (a later one of the turn may fail)


@dataclass
class _Batch:
    """A turn's publishes, as runs in arrival order: 0.9.1 records (USER chunks) and
    stream-protocol entries (STREAM_ENTRIES chunks) each make one chunk per run, cut at the
    stream's ChunkBound. After adding a record to the `open` run, a publish calls check() once
    the run reached its `limit` (one comparison per record on the publish path)."""

    bound: ChunkBound
    runs: list[_Run] = field(default_factory=list)
    # the last publishing id of each publisher, by its x-stream-publisher-name as it came (a
    # str, or bytes when it is not UTF-8: the two never name the same publisher)
    publishers: dict[str | bytes, int] = field(default_factory=dict)
    open: _Run | None = None  # the run the next record of its type goes to (None: a new one)

    def run(self, chunk_type: int) -> _Run:
        """The run the next record of this type goes to: the open one, or a new one when
        that is of another type or full."""
        run = self.open
        if run is not None and run.chunk_type == chunk_type:
            return run
        records = self.bound.records
        run = self.open = _Run(chunk_type, records, 1)  # its bytes counted at its first record
        self.runs.append(run)
        return run

    def check(self, run: _Run) -> None:
        """`run` reached its limit: it is full at its bound in records (which then doubles)
        or once its records reach the bound in bytes; otherwise its next limit is as many
        more records as its largest one so far fits in the bytes it has left."""
        records = run.records
        count = len(records)
        if count >= run.bound:
            self.open = None
            self.bound.filled()
            return
        room = self.bound.max_bytes - sum(map(len, records))
        if room <= 0:
            self.open = None
            return
        run.limit = min(run.bound, count + max(1, room // max(map(len, records))))

    def extend(self, chunk_type: int, records: list[bytes]) -> None:
        """Add records without filter values or publishers, cut at the bound."""
        while records:
            run = self.run(chunk_type)
            room = run.limit - len(run.records)
            part = records[:room] if len(records) > room else records
            run.records += part
            run.filters += [None] * len(part)
            if len(run.records) >= run.limit:
                self.check(run)
            records = records[len(part):]

    def ended(self) -> None:
        """The turn is over: one that took less than half the bound halves it (a steady
        load that needs the bound keeps it, and its turns stay one chunk each)."""
        runs = self.runs
        if runs and 2 * sum(len(run.records) for run in runs) < self.bound.records:
            self.bound.ran_dry()


class StreamQueue(MemberAnswers, Queue):
    type = "stream"

    def __init__(
        self,
        vhost: QueueOwner,
        name: str,
        *,
        env: StorageEnv,
        storage_id: str | None = None,
        replication: Replication = ONE_NODE,
        **kwargs: Any,
    ) -> None:
        super().__init__(vhost, name, **kwargs)
        self.replication = replication  # one node's, or this node's member of a cluster's
        self.env = env
        self.storage_id = storage_id or uuid.uuid4().hex
        self.directory = env.directory(self.storage_id)
        a = self.arguments
        self.segment_size = (a.get("x-stream-max-segment-size-bytes")
                             or sargs.DEFAULT_SEGMENT_SIZE_BYTES)
        self.filter_size = a.get("x-stream-filter-size-bytes") or sargs.DEFAULT_FILTER_SIZE_BYTES
        try:
            self.log = self._open_log()
        except StorageError:
            if storage_id is None:  # a new stream (a full disk): leave no empty folder behind
                shutil.rmtree(self.directory, ignore_errors=True)
            raise
        self.chunk_bound = ChunkBound(env.chunk_min_records, env.chunk_max_records,
                                      env.chunk_max_bytes)
        self.writer = Writer(vhost.scheduler, env.fsync_policy, lambda: self.log,
                             batch=lambda: _Batch(self.chunk_bound),
                             append=self._append, failed=self._append_failed,
                             on_commit=self.dispatch, name=name, replication=replication)
        self.groups = SacGroups(self, replication)
        self._tracking_timer: Timer | None = None
        self._retention_timer: Timer | None = None
        self.stats_deduplicated = 0
        self._taking: tuple[str, int] | None = None  # the id of the copy being published
        self._load_taken()
        self._arm_retention_timer()

    # -- configuration ------------------------------------------------------------------------

    def _open_log(self) -> Log:
        """Open (and recover) the log; segment and filter sizes apply only here."""
        max_bytes, max_age = self._retention()
        self.max_age_ms = max_age
        return Log.open(self.directory, LogConfig(
            max_segment_size_bytes=self.segment_size, filter_size_bytes=self.filter_size,
            fsync=self.env.fsync_policy, max_length_bytes=max_bytes, max_age_ms=max_age,
            folder_lock=self.env.folder_locks, open_logs=self.env.open_logs,
        ))

    def _retention(self) -> tuple[int | None, int | None]:
        """max-length-bytes and max-age: a policy wins over the queue argument."""
        policy = self.vhost.policy_for("queues", self.name)
        definition = policy.definition if policy is not None else {}
        max_bytes = definition.get("max-length-bytes", self.arguments.get("x-max-length-bytes"))
        age = definition.get("max-age", self.arguments.get("x-max-age"))
        max_age = qargs.parse_max_age(qargs.text(age)) if age is not None else None
        return (max_bytes if qargs.is_int(max_bytes) else None), max_age

    def policy_changed(self) -> None:
        max_bytes, max_age = self._retention()
        self.max_age_ms = max_age
        self.log.set_retention(max_length_bytes=max_bytes, max_age_ms=max_age)
        self._arm_retention_timer()

    def _arm_retention_timer(self) -> None:
        if self._retention_timer is not None:
            self._retention_timer.cancel()
            self._retention_timer = None
        if self.max_age_ms is not None and not self.deleted:
            self._retention_timer = self.vhost.scheduler.call_later(
                RETENTION_CHECK_MS, self._retention_tick
            )

    def _retention_tick(self) -> None:
        self._retention_timer = None
        if self.deleted:
            return
        self.log.apply_retention()
        self._arm_retention_timer()

    # -- the replication's answers (docs/REPLICATION.md) -------------------------------------

    def took_role(self) -> None:
        """A new leader takes the ids of the delayed copies its log holds (those the last
        leader took); otherwise the role is asked when it matters."""
        self._load_taken()

    def _load_taken(self) -> None:
        """The delayed copies' ids the log keeps (each chunk's tracking trailer, and the
        tracking snapshot that starts each segment): the newest 100,000 per exchange log."""
        self.taken_ids = TakenIds()
        for name, offsets in self.log.taken().items():
            log_id = name.decode()
            for offset in offsets:
                self.taken_ids.seen(log_id, offset)

    def took_delayed(self, log_id: str, offset: int) -> None:
        self._taking = (log_id, offset)

    # -- counts -------------------------------------------------------------------------------

    @property
    def message_count(self) -> int:
        committed = self.log.committed_offset
        bound = self.replication.commit_bound
        if bound is not None:
            committed = min(committed, bound)
        return max(0, committed + 1 - self.log.first_offset)

    def _commit_limit(self) -> int:
        bound = self.replication.commit_bound
        return bound if bound is not None else self.log.committed_offset

    @property
    def consumer_count(self) -> int:
        return 0  # as RabbitMQ reports for streams

    @property
    def count_on_delete(self) -> int:
        return 0  # as RabbitMQ's stream coordinator reports

    # -- publishing ---------------------------------------------------------------------------

    def publish(self, message: InboundMessage, confirm: Confirm | None) -> bool:
        leader = self.replication.forward_to
        if leader is not None:  # a replica: the leader writes, and confirms
            return bool(leader.publish(message, confirm))
        taking = None
        if MARK in message.header:  # a delayed exchange's copy (delayed_ids.py)
            self._taking = None
            kept = self.delayed_copy(message)  # (took_delayed sets _taking)
            if kept is None:
                return True  # taken already: a delayed exchange's new leader routed it again
            message = kept
            taking, self._taking = self._taking, None
        writer = self.writer
        batch = writer.batch
        headers = message.headers
        if headers:
            if self.dedup is not None and self.dedup.seen(headers):
                return False
            publisher = headers.get("x-stream-publisher-name")
            if publisher is not None:
                last = (batch.publishers.get(publisher)
                        if isinstance(publisher, sargs.PUBLISHER_NAME) else None)
                if last is None:  # publisher_key checks the name
                    last = self.log.publisher_id(sargs.publisher_key(publisher))
                publishing_id = headers.get("x-stream-publishing-id")
                if type(publishing_id) is not int:  # a bool is not a publishing id either
                    raise PreconditionFailed("x-stream-publishing-id must be an integer when "
                                             "x-stream-publisher-name is set")
                if last is not None and publishing_id <= last:
                    self.stats_deduplicated += 1
                    if confirm is not None:
                        writer.confirm_later(confirm)
                    writer.schedule()
                    return True
                batch.publishers[publisher] = publishing_id
                run = batch.run(USER)
                run.publishers[publisher] = publishing_id
            value = (sargs.filter_value(headers) if "x-stream-filter-value" in headers
                     else None)
        else:  # nothing to deduplicate on, and no filter value
            value = None
        run = batch.run(USER)
        record = self.env.encode_record(message)
        run.records.append(record)
        run.filters.append(value)
        if taking is not None:  # a delayed copy: its id goes in its chunk's trailer
            run.taken.append((taking[0].encode(), taking[1]))
        if value is not None:
            run.any_filter = True
        if len(run.records) >= run.limit:
            batch.check(run)
        if confirm is not None:
            writer.confirm_later(confirm)
        self.stats_published += 1
        writer.schedule()
        return True

    def takes_run(self) -> bool:
        """Whether `publish_many` takes a run of plain messages now: always."""
        return True

    def publish_many(self, messages: list[InboundMessage],
                     confirms: list[Confirm] | None) -> None:
        """`publish` for messages without headers (so with nothing to deduplicate, no
        publisher id and no filter value), in one go: a run of them from one channel."""
        leader = self.replication.forward_to
        if leader is not None:  # a replica: the leader writes, and confirms
            for i, message in enumerate(messages):
                leader.publish(message, confirms[i] if confirms is not None else None)
            return
        writer = self.writer
        encode = self.env.encode_record
        writer.batch.extend(USER, [encode(message) for message in messages])
        if confirms is not None:
            for confirm in confirms:
                writer.confirm_later(confirm)
        self.stats_published += len(messages)
        writer.schedule()

    def publish_record(self, record: bytes, value: bytes | None, publisher: str | None,
                       publishing_id: int, confirm: Confirm | None) -> bool:
        """A message already in its stored form (the stream protocol's publish: a
        STREAM_ENTRIES record, amqp.stored.stream_entry), stored in a chunk of that type,
        deduplicated by publisher name and publishing id through the same tracking as
        x-stream-publisher-name, and False when it was a duplicate (it is still confirmed). A
        replica writes nothing itself: the publish is nack'ed (stream protocol clients publish
        to the leader)."""
        if self.replication.forward_to is not None:
            if confirm is not None:
                confirm.settle(False)
            return True
        writer = self.writer
        batch = writer.batch
        if publisher is not None:
            last = batch.publishers.get(publisher)
            if last is None:
                last = self.log.publisher_id(sargs.publisher_key(publisher))
            if last is not None and publishing_id <= last:
                self.stats_deduplicated += 1
                if confirm is not None:
                    writer.confirm_later(confirm)
                writer.schedule()
                return False
            batch.publishers[publisher] = publishing_id
        run = batch.open
        if run is None or run.chunk_type != STREAM_ENTRIES:
            run = batch.run(STREAM_ENTRIES)
        if publisher is not None:
            run.publishers[publisher] = publishing_id
        records = run.records
        records.append(record)
        run.filters.append(value)
        if value is not None:
            run.any_filter = True
        if len(records) >= run.limit:
            batch.check(run)
        if confirm is not None:
            writer.confirm_later(confirm)
        self.stats_published += 1
        writer.schedule()
        return True

    def last_publishing_id(self, name: bytes) -> int:
        """The last stored publishing id of a publisher, 0 if unknown (as RabbitMQ answers)."""
        pending = self.writer.batch.publishers.get(sargs.publisher_header(name))
        if pending is not None:
            return pending
        stored = self.log.publisher_id(name)
        return 0 if stored is None else stored

    def _append(self, batch: _Batch) -> None:
        """The writer's append: a turn's publishes as one chunk per run of one record kind
        (in arrival order, cut at the stream's ChunkBound), each with its filter values and
        the last publishing id of each publisher of that run. The writer's commit point is
        then the last chunk's.
        STREAM_ENTRIES chunks keep the CRC-32 of their records: a stream-protocol Deliver
        carries it, so it is computed once here rather than per delivery. A log that never
        had a record is written from epoch 1, as osiris's writers start (a replicated stream's
        leader has set its own epoch, >= 1, before it appends; a log written before keeps
        its epoch)."""
        batch.ended()
        log_ = self.log
        if not log_.epoch and not log_.next_offset:
            log_.set_epoch(1)
        for run in batch.runs:
            log_.append(run.records, run.filters if run.any_filter else None,
                        publishers=sargs.stored_publishers(run.publishers) or None,
                        chunk_type=run.chunk_type,
                        records_crc=run.chunk_type == STREAM_ENTRIES, taken=run.taken or None)
            run.written = True
        if not batch.runs and batch.publishers:
            log_.append([], publishers=sargs.stored_publishers(batch.publishers))

    def _append_failed(self, batch: _Batch, error: StorageError) -> bool:
        log.error("stream append failed", stream=self.name, vhost=self.vhost.name,
                  error=str(error))
        for run in batch.runs:  # delayed copies not stored: their exchange may send them again
            if not run.written:
                for name, offset in run.taken:
                    self.taken_ids.forget(name.decode(), offset)
        return False  # the chunk was not written: its publishes are nacked

    def commit_pending(self) -> None:
        self.writer.commit_pending()

    # -- consuming ----------------------------------------------------------------------------

    def validate_consumer(
        self, tag: str, no_ack: bool, prefetch: int, global_prefetch: int, arguments: dict[str, Any]
    ) -> None:
        super().validate_consumer(tag, no_ack, prefetch, global_prefetch, arguments)
        if "x-stream-offset" in arguments:
            sargs.parse_offset(
                arguments["x-stream-offset"], self.vhost.scheduler.now_ms(), self.resource
            )
        sargs.check_extension_args(arguments, self.resource)
        sargs.check_consumer(
            self.resource, no_ack=no_ack, prefetch=prefetch, global_prefetch=global_prefetch
        )

    def consumer_queue(self, arguments: dict[str, Any]) -> Queue:
        """A replica's single-active-consumer group is one for every node: it lives on the
        leader, and its members join there."""
        leader: Queue | None = self.forward_to
        if leader is not None and arguments.get("x-single-active-consumer") is True:
            return leader
        return self

    def add_consumer(self, consumer: Consumer) -> None:
        arguments = consumer.arguments
        given = arguments.get("x-stream-offset")
        if isinstance(given, sargs.StartSpec):  # the stream protocol's subscribe
            spec = given
        elif given is not None:
            spec = sargs.parse_offset(given, self.vhost.scheduler.now_ms(), self.resource)
        else:
            spec = sargs.StartSpec("next")
        cursor = Cursor(
            consumer.tag.encode("utf-8")[:255],
            sargs.tracking_enabled(consumer.tag, arguments),
            spec,
            sargs.end_offset(arguments),
        )
        consumer.state = cursor
        self.consumers.append(consumer)
        self.had_consumers = True
        if arguments.get("x-single-active-consumer") is True:
            self.groups.join(consumer)
        else:
            self.attach(consumer)
            self.pump(consumer)

    def attach(self, consumer: Consumer, prefer_stored: bool = False) -> None:
        """Open the consumer's reader: after its stored offset when it tracks one (and, unless
        `prefer_stored`, gave no x-stream-offset), else where its x-stream-offset says."""
        cursor: Cursor = consumer.state
        stored = self.log.consumer_offset(cursor.name) if cursor.tracking else None
        if stored is not None and stored < 0:
            stored = None  # reset
        spec = cursor.spec
        if not (prefer_stored or "x-stream-offset" not in consumer.arguments):
            stored = None
        if stored is not None:
            start = OffsetSpec.offset(stored + 1)
            cursor.skip_below = stored + 1
        else:
            start = self._start_of(cursor, spec)
        self._open_reader(consumer, start)
        position = stored if stored is not None else cursor.reader.position - 1
        cursor.stored = cursor.delivered = position
        cursor.pending.clear()
        cursor.active = True

    @staticmethod
    def _start_of(cursor: Cursor, spec: sargs.StartSpec) -> OffsetSpec:
        if spec.kind == "offset":
            cursor.skip_below = spec.value
            return OffsetSpec.offset(max(0, spec.value))
        if spec.kind == "timestamp":
            return OffsetSpec.timestamp(spec.value)
        start: OffsetSpec = getattr(OffsetSpec, spec.kind)()
        return start

    def reposition(self, consumer: Consumer, spec: sargs.StartSpec) -> None:
        """Restart an active consumer's reader where `spec` says (the offset that the stream
        protocol's ConsumerUpdate answer chooses for a newly active member)."""
        cursor: Cursor = consumer.state
        cursor.skip_below = 0
        self._open_reader(consumer, self._start_of(cursor, spec))
        cursor.delivered = cursor.reader.position - 1

    def _open_reader(self, consumer: Consumer, start: OffsetSpec) -> None:
        cursor: Cursor = consumer.state
        wanted = sargs.parse_filter(consumer.arguments)
        reader_filter = (ReaderFilter(wanted.values, wanted.match_unfiltered, exact=True)
                         if wanted is not None else None)
        if cursor.reader is not None:
            cursor.reader.close()
        cursor.reader = self.log.reader(
            start, filter=reader_filter, chunk_types=STREAM_CHUNK_TYPES,
            limit=self._commit_limit if self.replication.commit_bound is not None else None)
        cursor.records, cursor.offsets, cursor.take = [], (), 0

    def deactivate(self, consumer: Consumer) -> None:
        """A single-active-consumer group hands this consumer's place to another: stop its
        reader, then wait (draining) until what it was given is settled before its position
        is stored and the next member starts right after it."""
        cursor: Cursor = consumer.state
        if cursor.reader is not None:
            cursor.reader.close()
            cursor.reader = None
        cursor.records, cursor.offsets, cursor.take = [], (), 0
        cursor.active = False
        stepped_down = getattr(consumer.sink, "deactivated", None)  # the stream protocol's
        answer_due = bool(stepped_down(consumer)) if stepped_down is not None else False
        if cursor.pending or answer_due:
            self.await_hand_over(consumer)
        else:
            self._store_offsets([cursor])
            self._stepped_down(consumer)

    def await_hand_over(self, consumer: Consumer) -> None:
        """The group waits (draining) until this member has settled what it was given, or
        its client answered the ConsumerUpdate that made it inactive (`handed_over`), as
        RabbitMQ's stream coordinator waits for a stepping-down member; at most
        SAC_DRAIN_TIMEOUT_MS."""
        cursor: Cursor = consumer.state
        cursor.draining = True
        if cursor.drain_timer is not None:
            cursor.drain_timer.cancel()
        cursor.drain_timer = self.vhost.scheduler.call_later(
            SAC_DRAIN_TIMEOUT_MS, lambda: self._drained(consumer)
        )

    def handed_over(self, consumer: Consumer) -> None:
        """A stepping-down member is done (its client answered the inactive ConsumerUpdate,
        or its node said so): the next member may start."""
        cursor: Cursor | None = consumer.state
        if cursor is not None and cursor.draining and not cursor.pending:
            self._drained(consumer)

    def _stepped_down(self, consumer: Consumer) -> None:
        """A member whose group is on another node (a replica's, on the leader): tell it."""
        self.replication.stepped_down(consumer)

    def _drained(self, consumer: Consumer) -> None:
        """The draining member settled everything (or ran out of time): hand over."""
        cursor: Cursor = consumer.state
        if not cursor.draining:
            return
        cursor.draining = False
        if cursor.drain_timer is not None:
            cursor.drain_timer.cancel()
            cursor.drain_timer = None
        self._store_offsets([cursor])
        cursor.pending.clear()
        if not self.deleted:
            self.groups.rebalance(consumer.tag)
            self._stepped_down(consumer)

    def dispatch(self) -> None:
        for consumer in list(self.consumers):
            cursor = consumer.state
            if cursor is not None and cursor.active and cursor.reader is not None:
                self.pump(consumer)

    def records_of(self, chunk: ChunkView) -> list[bytes]:
        """A chunk's records as records of the broker's encoding, whatever its type."""
        if chunk.chunk_type == STREAM_ENTRIES:  # stream-protocol messages
            return self.env.entries_as_records(chunk.records, self.name)
        return chunk.records

    def pump(self, consumer: Consumer) -> None:
        """Deliver to one consumer as far as its credit and the committed offset allow."""
        cursor: Cursor = consumer.state
        sink = consumer.sink
        credit = sink.credit(consumer)
        while credit > 0:
            if cursor.take >= len(cursor.records):
                if cursor.past_end():
                    self._reached_end(consumer)
                    return
                try:
                    chunk = cursor.reader.read()
                except StorageError as error:
                    self._read_failed(consumer, error)
                    return
                if chunk is None:  # caught up; a filter may have skipped to the end, though
                    if cursor.past_end():
                        self._reached_end(consumer)
                    return
                cursor.records = self.records_of(chunk)
                first = chunk.first_offset
                cursor.offsets = (
                    chunk.offsets
                    if chunk.offsets is not None
                    else range(first, first + len(chunk.records))
                )
                cursor.take = 0
                if cursor.end is not None and cursor.offsets[-1] >= cursor.end:
                    below = bisect.bisect_left(cursor.offsets, cursor.end)
                    cursor.records = cursor.records[:below]
                    cursor.offsets = cursor.offsets[:below]
                    if not below:
                        continue
            take = cursor.take
            end = min(len(cursor.records), take + credit)
            offsets = cursor.offsets[take:end]
            records = cursor.records[take:end]
            cursor.take = end
            if cursor.skip_below and offsets and offsets[0] < cursor.skip_below:
                keep = [i for i, o in enumerate(offsets) if o >= cursor.skip_below]
                offsets = [offsets[i] for i in keep]
                records = [records[i] for i in keep]
                if not keep:
                    continue
            if cursor.tracking:
                cursor.pending.extend(offsets)
            cursor.delivered = offsets[-1]
            sink.send_records(consumer, offsets, records)
            self.stats_delivered += len(records)
            credit -= len(records)
        if cursor.past_end():
            self._reached_end(consumer)

    def _reached_end(self, consumer: Consumer) -> None:
        """Every offset below the consumer's x-leveret-end-offset was delivered or filtered
        out: it is cancelled (basic.cancel, after its last delivery), so that a reader of a
        range knows it has it all, even when a filter leaves nothing at its end."""
        self.remove_consumer(consumer)
        consumer.sink.server_cancel(consumer)

    def _read_failed(self, consumer: Consumer, error: StorageError) -> None:
        """The consumer's next chunk cannot be read (damaged on disk, or the file is gone).
        Corrupt data is never delivered, and the consumer cannot move past it: it is cancelled
        (basic.cancel, as when its queue goes away), with one log line naming the file."""
        log.error("stream read failed; consumer cancelled", stream=self.name,
                  vhost=self.vhost.name, consumer=consumer.tag, error=str(error))
        self.remove_consumer(consumer)
        consumer.sink.server_cancel(consumer)

    def ack(self, entry: Any, consumer: Consumer | None = None) -> None:
        """An ack is credit; for a tracked consumer it also moves the stored offset."""
        if consumer is None or consumer.state is None:
            return
        cursor: Cursor = consumer.state
        if not cursor.tracking or not (cursor.active or cursor.draining):
            return
        pending = cursor.pending
        if not pending:
            return
        if pending[0] != entry:
            try:
                pending.remove(entry)  # acked out of order: the stored offset waits
            except ValueError:
                pass
            return
        pending.popleft()
        cursor.stored = pending[0] - 1 if pending else cursor.delivered
        if not cursor.dirty:
            cursor.dirty = True
            self._arm_tracking_timer()
        if cursor.draining and not pending:
            self._drained(consumer)

    def ack_many(self, entries: list[Any], consumer: Consumer | None = None) -> None:
        cursor = consumer.state if consumer is not None else None
        if cursor is None or not cursor.tracking:  # credit only: the channel counted it
            return
        for entry in entries:
            self.ack(entry, consumer)

    def reject(self, entry: Any, consumer: Consumer | None = None) -> None:
        """nack/reject on a stream only returns credit: nothing is requeued or deleted. For
        offset tracking the message counts as handled, as it will never come back."""
        self.ack(entry, consumer)

    def requeue(self, entries: list[Any], delivery_failed: bool = True) -> None:
        """Requeue on a stream only returns credit (RabbitMQ does not redeliver)."""

    def settled(self, entry: Any) -> None:
        pass

    def get(self, no_ack: bool) -> Any:
        raise NotImplementedFeature(f"basic.get not supported by stream queues {self.resource}")

    def purge(self) -> int:
        raise NotImplementedFeature(f"queue.purge not supported by stream queues {self.resource}")

    def check_delete(self, if_unused: bool, if_empty: bool) -> None:
        """if-unused and if-empty are ignored for streams, as in RabbitMQ."""

    def remove_consumer(self, consumer: Consumer) -> None:
        cursor: Cursor | None = consumer.state
        if cursor is not None:
            if cursor.drain_timer is not None:
                cursor.drain_timer.cancel()
            cursor.draining = False
            self._store_offsets([cursor])
            if cursor.reader is not None:
                cursor.reader.close()
                cursor.reader = None
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        if consumer.arguments.get("x-single-active-consumer") is True:
            self.groups.leave(consumer)

    # -- offset tracking ----------------------------------------------------------------------

    def _arm_tracking_timer(self) -> None:
        if self._tracking_timer is None and not self.deleted:
            self._tracking_timer = self.vhost.scheduler.call_later(
                TRACKING_FLUSH_MS, self._flush_tracking
            )

    def _flush_tracking(self) -> None:
        self._tracking_timer = None
        self._store_offsets([c.state for c in self.consumers if c.state is not None])

    def _store_offsets(self, cursors: list[Cursor]) -> None:
        dirty = {c.name: c.stored for c in cursors if c.tracking and c.dirty and c.stored >= 0}
        for cursor in cursors:
            cursor.dirty = False
        if dirty and self.replication.store_at_leader(dirty):  # a replica: the leader writes
            return
        if dirty and not self.deleted and self.replication.role != "replica":
            try:
                self.log.store_offsets(dirty)
            except StorageError as error:
                log.error("storing consumer offsets failed", stream=self.name, error=str(error))

    def partition_index(self, super_stream: str | None = None) -> int:
        """This stream's position in a super stream (the one named, if any), or -1."""
        return superstream.partition_index(self.vhost, self, super_stream)

    def stored_offset(self, name: bytes) -> int | None:
        return self.log.consumer_offset(name)

    def reset_offset(self, name: bytes) -> bool:
        """Forget a stored offset (the CLI's reset_offset); False if there was none."""
        if self.log.consumer_offset(name) is None:
            return False
        self.log.store_offsets({name: -1})
        return True

    # -- lifecycle ----------------------------------------------------------------------------

    def on_delete(self) -> None:
        for consumer in list(self.consumers):
            cursor = consumer.state
            if cursor is not None and cursor.reader is not None:
                cursor.reader.close()
                cursor.reader = None
        super().on_delete()
        for timer in (self._tracking_timer, self._retention_timer):
            if timer is not None:
                timer.cancel()
        self.writer.delete()
        self.log.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def restart(self) -> None:
        """restart_stream on a single node: close the log, reopen (recover) it, and move every
        active consumer on from just after what it was last given."""
        self.close()
        self.log = self._open_log()
        for consumer in self.consumers:
            cursor = consumer.state
            if cursor is not None and cursor.active:
                position = max(0, cursor.delivered + 1)
                self._open_reader(consumer, OffsetSpec.offset(position))
                cursor.skip_below = position
        self._arm_retention_timer()
        self.replication.restarted()
        self.dispatch()

    def close(self) -> None:
        """Broker shutdown: store tracked offsets and close the log (files stay)."""
        self.writer.flush()
        self._store_offsets([c.state for c in self.consumers if c.state is not None])
        self.writer.close()
        for consumer in self.consumers:
            cursor = consumer.state
            if cursor is not None and cursor.reader is not None:
                cursor.reader.close()
                cursor.reader = None
        self.log.close()
