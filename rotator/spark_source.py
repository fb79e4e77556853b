"""rotator as a Spark data source: format ``rotator``, for batch and streaming reads and writes.

Built on PySpark 4's Python Data Source API (no JVM code). :func:`rotator.spark.register`
registers it (:func:`rotator.spark.session` does that for you); then::

    df.write.format("rotator").option("url", URL).option("queue", "orders").save()
    spark.read.format("rotator").option("url", URL).option("queue", "orders").load()
    spark.readStream.format("rotator").option("url", URL).option("topic", "news").load()
    df.writeStream.format("rotator").option("url", URL).option("topic", "news").start()

Options (names are case-insensitive): ``url`` and exactly one of ``queue`` or ``topic``.

Writes (batch and streaming). A queue gets the ids of ``column`` (default ``id``; strings or
integers), with the payloads of ``payloadColumn`` if given (string or binary); a topic gets
one message per row of ``payloadColumn`` (default ``payload``), under the retention of
``retentionCount`` (default 100,000) and ``retentionSeconds``. ``batchSize`` ids per atomic
chunk. Each partition's chunks are recorded on the server in the same atomic step as their
push (a marker under the target's hash tag, as :func:`rotator.spark.push_dataframe` does), so
a task that Spark retries, or runs twice (speculation), pushes nothing twice. Queue rows are
sorted within each partition first, so a re-run cuts the same chunks; topic rows keep their
order (the messages' order), so a re-run must see them in the same order (files and
micro-batches do; a shuffle without a sort does not). A streaming write records its chunks per
query id (kept in the checkpoint) and batch id: a micro-batch that Spark runs again after a
restart from the checkpoint pushes or publishes nothing twice. Markers expire after a day
(batch) or a week (streaming). A queue write also takes ``delay`` (seconds) or ``at`` (unix
seconds, or ISO 8601 with a time zone): the jobs are scheduled, as ``Rotator.push(delay=,
at=)`` (a delay counts from each chunk's call); ``priority`` (0..9, not with payloads); and
``unique`` (``true``: the queue must track ids, and an id it holds is skipped). Such chunks,
and payload chunks, go as their push command after ``once CHUNK TTL_MS`` with their marker
(one call); a topic's, in a WATCH/MULTI/EXEC with theirs.

Reads. A queue read in batch is its snapshot (:func:`rotator.spark.snapshot`'s columns, then
``reclaimed`` and ``payload``, null there); a topic read is its retained messages (``id``,
``seq``, ``ms``, ``payload``).

A streaming read of a topic uses message seqs as offsets: a query restarted from its
checkpoint goes on exactly after the last seq it committed, reading again from the topic's
retention (like Kafka's source); nothing is consumed or acked. ``startingOffsets``:
``earliest`` (the oldest retained message), ``latest`` (the default: what is published from
now on) or a seq (that message on). ``maxMessagesPerTrigger`` bounds a micro-batch. Messages
that left retention before the query read them are reported: the query fails
(``failOnDataLoss``, default true) or, with ``failOnDataLoss=false``, a warning is logged and
they are skipped.

A streaming read of a queue is work: each micro-batch claims up to ``maxJobsPerTrigger`` jobs
(default 10,000) under a lease of ``leaseSeconds`` (default 300: long enough for the batch),
and Spark's commit of the batch acks them. The claimed jobs are recorded on the server per
query and batch, so a batch that Spark runs again (a retried task, a restart from the
checkpoint) delivers the same jobs, their leases extended; a query that dies before its commit
leaves its jobs leased, and once the lease runs out they are delivered again (``reclaimed``,
``deliveries`` + 1) to whoever claims next. Delivery is at least once: exactly once into a
sink that is idempotent by job id (a MERGE, a keyed upsert). ``maxDeliveries`` dead-letters a
job delivered that often; ``payloads=true`` reads each job's payload with it. The rows are
the snapshot's columns: ``state`` is ``leased``, ``stamp_ms`` the lease's deadline.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

try:
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark import TaskContext
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        DataSourceStreamArrowWriter,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
    from pyspark.sql.types import BinaryType, DataType, StringType, StructType
except ImportError as missing:
    from rotator.defaults import DISTRIBUTION

    raise ImportError(
        f"rotator.spark_source needs PySpark and pyarrow ({missing}):"
        f" pip install '{DISTRIBUTION}[spark]'"
    ) from missing

from rotator import commands, protocol
from rotator.core import Rotator
from rotator.defaults import (
    DEFAULT_SPARK_PUSH_BATCH,
    DEFAULT_TOPIC_RETENTION,
    MAX_BATCH,
    MAX_COUNT,
    MAX_LEASE_SECONDS,
    MAX_PUBLISH,
    MAX_RETENTION_COUNT,
    SPARK_KEY_TTL,
    SPARK_READ_PAGE,
)
from rotator.errors import InvalidArgument, InvalidJobId, RotatorError
from rotator.flows import TopicFlows
from rotator.keys import QueueKeys, TopicKeys, queue_keys, topic_keys
from rotator.models import Retention
from rotator.spark import (
    _ID_TYPES,
    SNAPSHOT_COLUMNS,
    TransactionPusher,
    _ChunkPusher,
    _spark_key,
    _task,
    push_chunks,
    ring_reader,
)
from rotator.urls import client_from_url

__all__ = [
    "QUEUE_COLUMNS",
    "TOPIC_COLUMNS",
    "MessagesLost",
    "RotatorDataSource",
]

log = logging.getLogger("rotator.spark")

# Seconds a streaming queue read's micro-batch holds its jobs: the batch, its sink and the
# commit that acks them must fit in it, or the jobs go to another consumer meanwhile.
DEFAULT_STREAM_LEASE = 300.0
# Jobs one micro-batch of a streaming queue read claims at most.
DEFAULT_MAX_JOBS_PER_TRIGGER = 10_000
# Messages (topic) or jobs (queue) one read task gets: a micro-batch is split into tasks.
READ_TASK_ROWS = 10_000
# Seconds a streaming write's chunk markers (and a queue read's batch records) are kept: a
# micro-batch Spark runs again after a restart within this time pushes nothing twice.
STREAM_RECORD_TTL = 7 * 86_400
# Ring pages one snapshot read task gets.
SNAPSHOT_TASK_PAGES = 10

QUEUE_COLUMNS = f"{SNAPSHOT_COLUMNS}, reclaimed boolean, payload binary"
TOPIC_COLUMNS = "id string, seq bigint, ms bigint, payload binary"

_QUEUE_ARROW = pa.schema(
    [
        ("id", pa.string()),
        ("state", pa.string()),
        ("stamp_ms", pa.int64()),
        ("age_ms", pa.int64()),
        ("deliveries", pa.int32()),
        ("reclaimed", pa.bool_()),
        ("payload", pa.binary()),
    ]
)
_TOPIC_ARROW = pa.schema(
    [("id", pa.string()), ("seq", pa.int64()), ("ms", pa.int64()), ("payload", pa.binary())]
)

# Every option, lower-cased as Spark hands them over; Spark's own are let through.
_OPTIONS = {
    "url", "queue", "topic", "column", "payloadcolumn", "batchsize", "retentioncount",
    "retentionseconds", "startingoffsets", "maxmessagespertrigger", "failondataloss",
    "leaseseconds", "maxjobspertrigger", "maxdeliveries", "payloads", "delay", "at",
    "priority", "unique",
}  # fmt: skip
_SPARKS_OWN = {"path", "checkpointlocation"}


class MessagesLost(RotatorError):
    """A streaming read of a topic found messages gone from retention before it read them."""


# -- options ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """The data source's options, checked on the driver before any task starts."""

    raw: Mapping[str, str]

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Options:
        raw = {key.lower(): str(value) for key, value in options.items()}
        for key in raw:
            if key not in _OPTIONS and key not in _SPARKS_OWN:
                known = ", ".join(sorted(_OPTIONS))
                raise InvalidArgument(f"unknown option {key!r} for format rotator; known: {known}")
        parsed = cls(raw)
        if "url" not in raw:
            raise InvalidArgument('format rotator needs .option("url", "redis://host:port")')
        if ("queue" in raw) == ("topic" in raw):
            raise InvalidArgument("format rotator needs exactly one of the options queue and topic")
        parsed.keys()  # checks the name
        return parsed

    @property
    def url(self) -> str:
        return self.raw["url"]

    @property
    def queue(self) -> str | None:
        return self.raw.get("queue")

    @property
    def topic(self) -> str | None:
        return self.raw.get("topic")

    def keys(self) -> QueueKeys | TopicKeys:
        if self.topic is not None:
            return topic_keys(self.topic)
        assert self.queue is not None
        return queue_keys(self.queue)

    def only_for(self, kind: str, *names: str) -> None:
        """Refuses options that mean nothing for a ``kind`` (a queue, a topic, a write...)."""
        for name in names:
            if name.lower() in self.raw:
                raise InvalidArgument(f"option {name!r} does not apply to {kind}")

    def text(self, name: str, default: str) -> str:
        return self.raw.get(name.lower(), default)

    def whole(self, name: str, default: int, low: int, high: int) -> int:
        value = self.raw.get(name.lower())
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise InvalidArgument(f"option {name} must be a whole number, got {value!r}") from None
        return protocol.whole(number, name, low, high)

    def seconds(self, name: str, default: float, high: float) -> float:
        value = self.raw.get(name.lower())
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise InvalidArgument(f"option {name} must be seconds, got {value!r}") from None
        if not 0 < number <= high:
            raise InvalidArgument(f"option {name} must be more than 0 and at most {high}")
        return number

    def flag(self, name: str, default: bool) -> bool:
        value = self.raw.get(name.lower())
        if value is None:
            return default
        if value.lower() not in ("true", "false"):
            raise InvalidArgument(f"option {name} must be true or false, got {value!r}")
        return value.lower() == "true"

    def due(self) -> protocol.Due | None:
        """A queue write's ``delay`` or ``at``: when its jobs are due (None: at once)."""
        delay, at = self.raw.get("delay"), self.raw.get("at")
        try:
            seconds = None if delay is None else float(delay)
        except ValueError:
            raise InvalidArgument(f"option delay must be seconds, got {delay!r}") from None
        return protocol.check_due(seconds, None if at is None else _moment(at))

    def retention(self) -> Retention:
        count = self.whole("retentionCount", DEFAULT_TOPIC_RETENTION, 1, MAX_RETENTION_COUNT)
        age = self.raw.get("retentionseconds")
        return Retention(count, float(age) if age is not None else None)


# -- the data source ----------------------------------------------------------------------------


class RotatorDataSource(DataSource):
    """Format ``rotator``: queues and topics, read and written in batch and streaming."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = Options.parse(options)

    @classmethod
    def name(cls) -> str:
        return "rotator"

    def schema(self) -> str:
        return TOPIC_COLUMNS if self.parsed.topic is not None else QUEUE_COLUMNS

    def reader(self, schema: StructType) -> DataSourceReader:
        self._reading()
        if self.parsed.topic is not None:
            return _TopicReader(self.parsed.url, topic_keys(self.parsed.topic))
        self.parsed.only_for("a batch read", "leaseSeconds", "maxJobsPerTrigger", "payloads",
                             "maxDeliveries")  # fmt: skip
        assert self.parsed.queue is not None
        return _SnapshotReader(self.parsed.url, queue_keys(self.parsed.queue))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._reading()
        if self.parsed.topic is not None:
            return _TopicStreamReader(self.parsed)
        return _QueueStreamReader(self.parsed)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return _BatchWriter(_write_plan(self.parsed, schema, overwrite), uuid.uuid4().hex)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return _StreamWriter(_write_plan(self.parsed, schema, overwrite))

    def _reading(self) -> None:
        self.parsed.only_for("a read", "column", "payloadColumn", "batchSize", "retentionCount",
                             "retentionSeconds")  # fmt: skip
        if self.parsed.topic is not None:
            self.parsed.only_for("a topic read", "leaseSeconds", "maxJobsPerTrigger",
                                 "maxDeliveries", "payloads")  # fmt: skip
        else:
            self.parsed.only_for("a queue read", "startingOffsets", "maxMessagesPerTrigger",
                                 "failOnDataLoss")  # fmt: skip


# -- writing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _WritePlan:
    """What every write task needs; sent to the executors by Spark (no connection inside)."""

    url: str
    keys: QueueKeys | TopicKeys
    column: str | None  # the ids (a queue); None for a topic
    payload_column: str | None
    batch_size: int
    retention: Retention
    due: protocol.Due | None = None  # a queue write's: scheduled
    priority: int = 0
    unique: bool = False

    def marker(self, *parts: str) -> str:
        if isinstance(self.keys, QueueKeys):
            return _spark_key(self.keys, *parts)
        base = self.keys.all[0].removesuffix(":topic:meta")  # "<prefix>:{<topic>}"
        return ":".join((base, "spark", *parts))

    def write(self, batches: Iterator[pa.RecordBatch], marker: str, ttl: int) -> int:
        """Pushes (publishes) one partition's rows at most once for ``marker``."""
        table = _table(batches)
        partition, attempt = _task()
        client = client_from_url(
            self.url,
            retry=Retry(NoBackoff(), 0),  # a call retried blindly could land twice: the
            # pushers retry after asking the marker
            client_name=f"rotator-spark-write:{self.keys.name}:{partition}.{attempt}",
        )
        try:
            if isinstance(self.keys, TopicKeys):
                return self._publish(client, table, marker, ttl)
            return self._push(client, table, marker, ttl)
        finally:
            client.close()

    def _push(self, client: redis.Redis, table: pa.Table, marker: str, ttl: int) -> int:
        assert isinstance(self.keys, QueueKeys)
        assert self.column is not None
        ids = _ids(table, self.column)
        due, priority, unique = self.due, self.priority, self.unique
        if self.payload_column is None:
            ids.sort()  # a re-run cuts the same chunks, whatever order its rows come in
            if due is None and not priority and not unique:
                pusher: _ChunkPusher[bytes] = _ChunkPusher(client, self.keys, marker, ttl)
                return push_chunks(pusher.push, ids, self.batch_size)
            plain_keys = self.keys.all

            def push(chunk: list[bytes]) -> commands.ModuleCall[int]:
                return commands.push_ids(plain_keys, chunk, due, priority=priority, unique=unique)

            scheduled = _ChunkPusher(client, self.keys, marker, ttl, command=push)
            return push_chunks(scheduled.push, ids, self.batch_size)
        pairs = sorted(zip(ids, _payloads(table, self.payload_column), strict=True))
        keys = self.keys.with_payloads

        def pushp(chunk: list[tuple[bytes, bytes]]) -> commands.ModuleCall[int]:
            flat = [half for pair in chunk for half in pair]
            return commands.pushp(keys, flat, due, unique=unique)

        paired = _ChunkPusher(client, self.keys, marker, ttl, command=pushp)
        return push_chunks(paired.push, pairs, min(self.batch_size, MAX_BATCH // 2))

    def _publish(self, client: redis.Redis, table: pa.Table, marker: str, ttl: int) -> int:
        assert isinstance(self.keys, TopicKeys)
        assert self.payload_column is not None
        payloads = _payloads(table, self.payload_column)
        flows = TopicFlows(self.keys.name, retention=self.retention, prefix=self.keys.prefix)
        keys = self.keys

        def tpublish(pipe: Any, chunk: list[bytes]) -> commands.ModuleCall[list[str]]:
            # Read under WATCH of the groups hash: a group registering meanwhile aborts the
            # transaction (then this is asked again) instead of failing the call inside it.
            groups = sorted(protocol.text(name) for name in pipe.hkeys(keys.groups))
            group_keys = [key for group in groups for key in keys.group(group).all]
            return commands.tpublish(
                (*keys.all, *group_keys), flows.max_len, flows.max_age_ms, chunk
            )

        pusher = TransactionPusher(client, marker, tpublish, (keys.groups,), ttl)
        return push_chunks(pusher.push, payloads, min(self.batch_size, MAX_PUBLISH))


def _write_plan(options: Options, schema: StructType, overwrite: bool) -> _WritePlan:
    if overwrite:
        raise InvalidArgument("format rotator only appends: a queue or topic is not overwritten")
    options.only_for("a write", "startingOffsets", "maxMessagesPerTrigger", "failOnDataLoss",
                     "leaseSeconds", "maxJobsPerTrigger", "maxDeliveries", "payloads")  # fmt: skip
    due, priority, unique = None, 0, False
    if options.topic is not None:
        options.only_for("a topic write (its rows are payloads)", "column", "delay", "at",
                         "priority", "unique")  # fmt: skip
        column = None
        payload_column: str | None = options.text("payloadColumn", "payload")
    else:
        options.only_for("a queue write", "retentionCount", "retentionSeconds")
        column = options.text("column", "id")
        _check_column(schema, column, _ID_TYPES, "job ids are strings or integers")
        payload_column = options.raw.get("payloadcolumn")
        due = options.due()
        priority = options.whole("priority", 0, 0, 9)
        unique = options.flag("unique", False)
        if priority and payload_column is not None:
            raise InvalidArgument("option priority does not apply to jobs with payloads")
    if payload_column is not None:
        kinds = (StringType, BinaryType)
        _check_column(schema, payload_column, kinds, "payloads are strings or binary")
    size = options.whole("batchSize", DEFAULT_SPARK_PUSH_BATCH, 1, MAX_BATCH)
    retention = options.retention() if options.topic is not None else Retention()
    return _WritePlan(
        options.url, options.keys(), column, payload_column, size, retention, due, priority, unique
    )


def _moment(value: str) -> float | datetime:
    """Option ``at``: unix seconds, or ISO 8601 with a time zone (check_due says if none)."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(
            f"option at must be unix seconds or an ISO 8601 time, got {value!r}"
        ) from None


def _check_column(
    schema: StructType, column: str, kinds: tuple[type[DataType], ...], rule: str
) -> None:
    if column not in schema.names:
        raise InvalidArgument(f"no column {column!r} in the DataFrame; it has {schema.names}")
    kind = schema[column].dataType
    if not isinstance(kind, kinds):
        raise InvalidArgument(f"column {column!r} is {kind.simpleString()}: {rule}, cast it first")


def _table(batches: Iterator[pa.RecordBatch]) -> pa.Table:
    collected = list(batches)
    if not collected:
        return pa.table({})
    return pa.Table.from_batches(collected)


def _ids(table: pa.Table, column: str) -> list[bytes]:
    """The partition's ids, every one checked before anything is pushed."""
    if table.num_rows == 0:
        return []
    values = pc.cast(table.column(column), pa.string())
    if values.null_count:
        raise InvalidJobId(f"{values.null_count} null job ids in column {column!r}: none pushed")
    return [protocol.encode_id(job_id) for job_id in values.to_pylist()]


def _payloads(table: pa.Table, column: str) -> list[bytes]:
    if table.num_rows == 0:
        return []
    values = table.column(column)
    if values.null_count:
        raise InvalidArgument(f"{values.null_count} null payloads in column {column!r}")
    return [protocol.encode_payload(value) for value in values.to_pylist()]


@dataclass(frozen=True)
class _Written(WriterCommitMessage):
    """A write task's report: how many of its rows are in (now or from an earlier attempt)."""

    rows: int


class _BatchWriter(DataSourceArrowWriter):
    """``df.write``: one marker per partition of this write (``run``)."""

    def __init__(self, plan: _WritePlan, run: str) -> None:
        self.plan = plan
        self.run = run

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Written:
        partition, _ = _task()
        marker = self.plan.marker("write", self.run, str(partition))
        return _Written(self.plan.write(iterator, marker, SPARK_KEY_TTL))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.rows for m in messages if isinstance(m, _Written))
        log.info("write to %s: %d rows in", self.plan.keys.name, total)


class _StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream``: one marker per query, micro-batch and partition, so a batch that
    Spark runs again after a restart from the checkpoint pushes nothing twice."""

    def __init__(self, plan: _WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Written:
        context = TaskContext.get()
        query = context.getLocalProperty("sql.streaming.queryId") if context else None
        batch = context.getLocalProperty("streaming.sql.batchId") if context else None
        if query is None or batch is None:
            raise RotatorError("a streaming write task without its query and batch ids")
        partition, _ = _task()
        marker = self.plan.marker("stream", query, batch, str(partition))
        return _Written(self.plan.write(iterator, marker, STREAM_RECORD_TTL))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        total = sum(m.rows for m in messages if isinstance(m, _Written))
        log.info("stream to %s: batch %d, %d rows in", self.plan.keys.name, batchId, total)


# -- reading a queue's snapshot -----------------------------------------------------------------


class _SnapshotReader(DataSourceReader):
    """The ring, page by page, as :func:`rotator.spark.snapshot` reads it."""

    def __init__(self, url: str, keys: QueueKeys) -> None:
        self.ring, self.pages, _ = ring_reader(url, keys)

    def partitions(self) -> Sequence[InputPartition]:
        step = SNAPSHOT_TASK_PAGES
        return [
            InputPartition(list(range(first, min(first + step, self.pages))))
            for first in range(0, self.pages, step)
        ] or [InputPartition([])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        for batch in self.ring.pages(partition.value):
            nulls = [pa.nulls(batch.num_rows, pa.bool_()), pa.nulls(batch.num_rows, pa.binary())]
            yield pa.RecordBatch.from_arrays([*batch.columns, *nulls], schema=_QUEUE_ARROW)


# -- reading a topic's messages -----------------------------------------------------------------


def _topic_client(url: str) -> redis.Redis:
    return client_from_url(url)


def _last_seq(client: redis.Redis, keys: TopicKeys) -> int:
    return int(client.hget(keys.all[0], "seq") or 0)


def _oldest_seq(client: redis.Redis, keys: TopicKeys) -> int | None:
    oldest = client.zrange(keys.log, 0, 0, withscores=True)
    return int(oldest[0][1]) if oldest else None


def _seq_ranges(after: int, last: int) -> list[InputPartition]:
    """Partitions of the seqs ``after`` + 1 .. ``last``, READ_TASK_ROWS each."""
    return [
        InputPartition((first, min(first + READ_TASK_ROWS - 1, last)))
        for first in range(after + 1, last + 1, READ_TASK_ROWS)
    ]


def _lost(topic: str, gaps: list[tuple[int, int]], fail: bool) -> None:
    """Reports seqs that left retention before they were read."""
    if not gaps:
        return
    count = sum(last - first + 1 for first, last in gaps)
    shown = ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in gaps[:5])
    message = f"topic {topic}: {count} messages (seq {shown}) left retention before they were read"
    if fail:
        raise MessagesLost(
            f"{message}; option failOnDataLoss=false skips them with a warning instead"
        )
    log.warning("%s; skipped (failOnDataLoss=false)", message)


@dataclass(frozen=True)
class _Run:
    """One entry of a topic's log: the messages ``first`` .. ``last`` of one publish, at ``ms``."""

    ms: int
    first: int
    last: int


def _runs_from(client: redis.Redis, keys: TopicKeys, seq: int, size: int) -> list[_Run]:
    """The log's runs from the one holding ``seq`` (else the oldest) on, at most ``size``, read
    together (a run ends where the next begins, the newest at the topic's seq)."""
    pipe = client.pipeline(transaction=True)
    pipe.zrevrangebyscore(keys.log, seq, "-inf", start=0, num=1, withscores=True)
    pipe.zrangebyscore(keys.log, f"({seq}", "+inf", start=0, num=size, withscores=True)
    pipe.hget(keys.all[0], "seq")
    holding, after, last_seq = pipe.execute()
    entries = cast("list[tuple[bytes, float]]", [*holding, *after])
    ends = [int(score) - 1 for _, score in entries[1:]]
    if len(after) < size:  # the newest run is among them
        ends.append(int(last_seq or 0))
    return [
        _Run(int(member.partition(b"-")[0]), int(score), end)
        for (member, score), end in zip(entries, ends, strict=False)
    ]


def read_messages(
    client: redis.Redis, keys: TopicKeys, first: int, last: int
) -> Iterator[tuple[pa.RecordBatch, list[tuple[int, int]]]]:
    """The retained messages with seqs ``first`` .. ``last`` in pages, each with the gaps
    before it (seqs no longer retained: a topic's seqs count up by one)."""
    expected = first
    while expected <= last:
        runs = _runs_from(client, keys, expected, SPARK_READ_PAGE)
        if not runs:
            break
        # A page of messages from the first one retained at or after `expected`.
        end = min(last, max(runs[0].first, expected) + SPARK_READ_PAGE - 1)
        seqs = [
            (seq, f"{run.ms}-{seq}")
            for run in runs
            for seq in range(max(run.first, expected), min(run.last, end) + 1)
        ]
        if not seqs:
            break
        bodies = cast("list[bytes | None]", client.hmget(keys.bodies, [i for _, i in seqs]))
        columns: list[list[Any]] = [[], [], [], []]
        gaps: list[tuple[int, int]] = []
        for (seq, message_id), body in zip(seqs, bodies, strict=True):
            if body is None:  # trimmed between the two reads
                continue
            if seq > expected:
                gaps.append((expected, seq - 1))
            expected = seq + 1
            for column, value in zip(columns, _message_row(message_id, seq, body), strict=True):
                column.append(value)
        if expected <= seqs[-1][0]:  # the page's last messages were trimmed meanwhile
            gaps.append((expected, seqs[-1][0]))
            expected = seqs[-1][0] + 1
        yield _arrow(columns, _TOPIC_ARROW), gaps
    if expected <= last:
        yield _arrow([[], [], [], []], _TOPIC_ARROW), [(expected, last)]


def _message_row(message_id: str, seq: int, body: bytes) -> tuple[str, int, int, bytes]:
    return message_id, seq, int(message_id.partition("-")[0]), body


def _arrow(columns: list[list[Any]], schema: pa.Schema) -> pa.RecordBatch:
    arrays = [
        pa.array(values, type=field.type) for values, field in zip(columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class _TopicReader(DataSourceReader):
    """A topic's retained messages, oldest first, as they are when the read is planned."""

    def __init__(self, url: str, keys: TopicKeys) -> None:
        self.url = url
        self.keys = keys
        with _topic_client(url) as client:
            oldest = _oldest_seq(client, keys)
            self.last = _last_seq(client, keys)
        self.after = self.last if oldest is None else oldest - 1

    def partitions(self) -> Sequence[InputPartition]:
        return _seq_ranges(self.after, self.last) or [InputPartition((1, 0))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        first, last = partition.value
        with _topic_client(self.url) as client:
            for batch, _ in read_messages(client, self.keys, first, last):
                yield batch  # trimmed since the plan: not part of the read


class _TopicStreamReader(DataSourceStreamReader):
    """A topic as a stream; offsets ``{"seq": n}``: every message up to seq n is read."""

    def __init__(self, options: Options) -> None:
        assert options.topic is not None
        self.url = options.url
        self.keys = topic_keys(options.topic)
        self.starting = _starting(options.text("startingOffsets", "latest"))
        self.limit = options.whole("maxMessagesPerTrigger", 0, 1, 10**9)
        self.fail = options.flag("failOnDataLoss", True)
        self._client: redis.Redis | None = None

    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = _topic_client(self.url)
        return self._client

    def initialOffset(self) -> dict[str, int]:
        if self.starting == "latest":
            return {"seq": _last_seq(self.client(), self.keys)}
        if self.starting == "earliest":
            oldest = _oldest_seq(self.client(), self.keys)
            return {"seq": _last_seq(self.client(), self.keys) if oldest is None else oldest - 1}
        return {"seq": int(self.starting) - 1}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.limit) if self.limit else ReadAllAvailable()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        last = _last_seq(self.client(), self.keys)
        if isinstance(limit, ReadMaxRows):
            last = min(last, start["seq"] + limit.max_rows)
        return {"seq": max(last, start["seq"])}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        after, last = start["seq"], end["seq"]
        if last > after:
            oldest = _oldest_seq(self.client(), self.keys)
            first_kept = last + 1 if oldest is None else oldest
            if first_kept > after + 1:  # reported here, before any task runs
                _lost(self.keys.name, [(after + 1, min(first_kept - 1, last))], self.fail)
        return _seq_ranges(after, last)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        first, last = partition.value
        with _topic_client(self.url) as client:
            for batch, gaps in read_messages(client, self.keys, first, last):
                _lost(self.keys.name, gaps, self.fail)
                yield batch

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()


def _starting(value: str) -> str:
    if value in ("earliest", "latest") or (value.isdigit() and int(value) >= 1):
        return value
    raise InvalidArgument(
        f"option startingOffsets must be earliest, latest or a message seq (1 or more),"
        f" got {value!r}"
    )


# -- reading a queue as work --------------------------------------------------------------------


class _QueueStreamReader(DataSourceStreamReader):
    """A queue as a stream of work; offsets ``{"run": r, "batch": n}``.

    ``run`` is made by the query's first offset and kept in its checkpoint; each batch's
    claimed tokens are recorded under ``<queue>:spark:consume:<run>:<batch>``. The record is
    written before Spark logs the batch's offset, so the batch is the same jobs however often
    Spark plans it; it is acked, and deleted, once Spark has committed the batch.
    """

    def __init__(self, options: Options) -> None:
        assert options.queue is not None
        self.url = options.url
        self.keys = queue_keys(options.queue)
        self.lease = options.seconds("leaseSeconds", DEFAULT_STREAM_LEASE, MAX_LEASE_SECONDS)
        self.most = options.whole("maxJobsPerTrigger", DEFAULT_MAX_JOBS_PER_TRIGGER, 1, 10**7)
        self.max_deliveries = options.whole("maxDeliveries", 0, 1, 1_000_000) or None
        self.payloads = options.flag("payloads", False)
        self._queue: Rotator | None = None
        self._fresh: set[str] = set()  # records claimed by this reader: leases still young

    def queue(self) -> Rotator:
        if self._queue is None:
            self._queue = Rotator.from_url(
                self.url, self.keys.name, timeout=self.lease,
                max_deliveries=self.max_deliveries, payloads=self.payloads,
            )  # fmt: skip
        return self._queue

    def record(self, run: str, batch: int) -> str:
        return _spark_key(self.keys, "consume", run, str(batch))

    def initialOffset(self) -> dict[str, Any]:
        return {"run": uuid.uuid4().hex, "batch": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.most)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Claims the next batch's jobs (or finds them claimed by an earlier plan of it)."""
        self._settle(start)  # Spark asks for a batch only once the one before is committed
        run, batch = start["run"], start["batch"] + 1
        key = self.record(run, batch)
        if self.queue().client.exists(key):
            return {"run": run, "batch": batch}
        most = min(limit.max_rows, self.most) if isinstance(limit, ReadMaxRows) else self.most
        jobs = self._claim(most)
        if not jobs:
            return start
        rows = [[job.token, job.reclaimed, _b64(job.payload)] for job in jobs]
        self.queue().client.set(key, json.dumps(rows), ex=STREAM_RECORD_TTL)
        self._fresh.add(key)
        return {"run": run, "batch": batch}

    def _claim(self, most: int) -> list[Any]:
        jobs: list[Any] = []
        while len(jobs) < most:
            got = self.queue().next(min(MAX_COUNT, most - len(jobs)))
            if not got:
                break
            jobs.extend(got)
        return jobs

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if end["batch"] == start["batch"]:
            return []
        key = self.record(end["run"], end["batch"])
        raw = self.queue().client.get(key)
        if raw is None:
            log.warning("queue %s: the record of batch %s expired: its jobs come back after"
                        " their lease", self.keys.name, end["batch"])  # fmt: skip
            return []
        rows = json.loads(raw)
        if key not in self._fresh:  # planned again (a restart): keep what is still ours
            kept = self.queue().extend_many([row[0] for row in rows])
            rows = [row for row, held in zip(rows, kept, strict=True) if held]
        columns = _job_columns(rows)
        step = READ_TASK_ROWS
        return [
            InputPartition([column[i : i + step] for column in columns])
            for i in range(0, len(rows), step)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield _arrow(partition.value, _QUEUE_ARROW)

    def commit(self, end: dict[str, Any]) -> None:
        self._settle(end)

    def _settle(self, offset: dict[str, Any]) -> None:
        """Acks the jobs of batch ``offset`` (committed by Spark) and drops its record."""
        if offset["batch"] == 0:
            return
        key = self.record(offset["run"], offset["batch"])
        raw = self.queue().client.get(key)
        if raw is not None:
            tokens = [row[0] for row in json.loads(raw)]
            acked = self.queue().ack(*tokens) if tokens else 0
            if acked < len(tokens):
                log.warning("queue %s: batch %s acked %d of %d jobs (the others' leases ran"
                            " out first: they are delivered again)", self.keys.name,
                            offset["batch"], acked, len(tokens))  # fmt: skip
            self.queue().client.delete(key)
        self._fresh.discard(key)

    def stop(self) -> None:
        if self._queue is not None:
            self._queue.client.close()


def _b64(payload: bytes | None) -> str | None:
    return None if payload is None else base64.b64encode(payload).decode("ascii")


def _job_columns(rows: list[list[Any]]) -> list[list[Any]]:
    """The QUEUE_COLUMNS of recorded jobs ``[token, reclaimed, payload (base64)]``."""
    columns: list[list[Any]] = [[], [], [], [], [], [], []]
    for token, reclaimed, payload in rows:
        parsed = protocol.parse_token(token)
        if parsed is None:
            raise RotatorError(f"a malformed token in a batch record: {token[:80]!r}")
        job_id, deadline_ms, deliveries = parsed
        row = (job_id, "leased", deadline_ms, None, deliveries, bool(reclaimed),
               None if payload is None else base64.b64decode(payload))  # fmt: skip
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    return columns
