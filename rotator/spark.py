"""The PySpark pipeline: bulk-push ids from a DataFrame, drain a queue with Spark tasks, and
read the ring as a DataFrame. Spark distributes the work; this module only says what one task
does. Needs the ``spark`` extra (``pip install 'rotator-queue[spark]'``); ``import rotator``
never imports it.

Every task opens its own connection on its executor (connections are never pickled), and ids
and result rows cross between the JVM and Python as Arrow batches (``mapInArrow``), never
through pickle. Bookkeeping keys live under the queue's own prefix and hash tag
(``rotator:{queue}:spark:...``), so they share its ACL pattern, and expire after a day.

Retries. Spark re-runs a failed task from the start, so:

- ``push_dataframe`` pushes each partition in chunks (sorted, so a re-run cuts the same
  chunks) and records, per partition, how many chunks are in, inside the same MULTI as each
  chunk's push. A re-run skips the chunks already in: every id is pushed once, however often
  its task runs, even when two attempts run at once (speculation).
- ``drain`` writes the result row of every delivery to a journal in Redis just before the
  call that acks it; the returned DataFrame is read from that journal, so it includes the
  work of task attempts that died later. A task that dies holds its jobs until their lease
  runs out; then the other tasks (or the retry) deliver them again, flagged ``reclaimed``.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import socket
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError, WatchError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

try:
    import pyarrow as pa
    from py4j.protocol import Py4JJavaError
    from pyspark import TaskContext, cloudpickle
    from pyspark.errors import PySparkException
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
except ImportError as missing:
    from rotator.defaults import DISTRIBUTION

    raise ImportError(
        f"rotator.spark needs PySpark and pyarrow ({missing}): pip install '{DISTRIBUTION}[spark]'"
    ) from missing

from rotator import protocol
from rotator.core import Rotator
from rotator.defaults import (
    DEFAULT_DRAIN_BATCH,
    DEFAULT_DRAIN_MAX_DELIVERIES,
    DEFAULT_DRAIN_POLL,
    DEFAULT_LEASE_TIMEOUT,
    DEFAULT_SPARK_MASTER,
    DEFAULT_SPARK_PUSH_BATCH,
    MAX_BATCH,
    MAX_ID_BYTES,
    SPARK_KEY_TTL,
    SPARK_READ_PAGE,
)
from rotator.errors import InvalidArgument, InvalidJobId, ProtocolError, RotatorError
from rotator.errors import error_from_reply as typed_error
from rotator.keys import QueueKeys, queue_keys
from rotator.models import Handler, Job
from rotator.protocol import JobRef
from rotator.script import module_sha, module_source
from rotator.worker import Worker

__all__ = [
    "RESULT_COLUMNS",
    "SNAPSHOT_COLUMNS",
    "SparkFailure",
    "describe_failure",
    "drain",
    "invalid_ids",
    "load_callable",
    "output_exists",
    "push_dataframe",
    "read_dataset",
    "session",
    "snapshot",
]

log = logging.getLogger("rotator.spark")

Idempotency = Callable[[str], bool]
# What a Spark job failure surfaces as in the driver: analysis errors, task failures.
SparkFailure = (PySparkException, Py4JJavaError)

RESULT_COLUMNS = (
    "id string, status string, deliveries int, reclaimed boolean, seconds double,"
    " worker string, error string"
)
SNAPSHOT_COLUMNS = "id string, state string, stamp_ms bigint, age_ms bigint, deliveries int"

_RESULT_ARROW = pa.schema(
    [
        ("id", pa.string()),
        ("status", pa.string()),
        ("deliveries", pa.int32()),
        ("reclaimed", pa.bool_()),
        ("seconds", pa.float64()),
        ("worker", pa.string()),
        ("error", pa.string()),
    ]
)
_SNAPSHOT_ARROW = pa.schema(
    [
        ("id", pa.string()),
        ("state", pa.string()),
        ("stamp_ms", pa.int64()),
        ("age_ms", pa.int64()),
        ("deliveries", pa.int32()),
    ]
)
_TASK_ARROW = pa.schema(
    [
        ("worker", pa.string()),
        ("processed", pa.int64()),
        ("failed", pa.int64()),
        ("leases_lost", pa.int64()),
    ]
)
_TASK_COLUMNS = "worker string, processed bigint, failed bigint, leases_lost bigint"

_ID_TYPES = (T.StringType, T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_SENTINEL = b"*lap"
_ERROR_CHARS = 2000  # of a handler's error kept in its result row
_PUSH_ATTEMPTS = 5  # per chunk, against connection drops; the marker says whether it landed


# -- keys and connections ---------------------------------------------------------------------


def _spark_key(keys: QueueKeys, *parts: str) -> str:
    # Appended to the queue's own prefix (keys.py builds it), so the key shares the queue's
    # hash tag (its cluster slot) and its ACL pattern.
    return keys.acl_pattern.removesuffix("*") + ":".join(("spark", *parts))


def _task() -> tuple[int, int]:
    """(partition, attempt) of the Spark task running this code; (0, 0) outside Spark."""
    context = TaskContext.get()
    if context is None:
        return 0, 0
    return context.partitionId(), context.attemptNumber()


def _utf8(value: Any) -> Any:
    """Text that Arrow can hold: an id pushed as bytes that are not UTF-8 comes back from
    rotator surrogate-escaped; shown here with replacement characters."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return value


def _worker_name() -> str:
    partition, attempt = _task()
    return f"{socket.gethostname()}:{os.getpid()}:task{partition}.{attempt}"


# -- pushing ----------------------------------------------------------------------------------

# Run in the same MULTI as a chunk's push: BEGIN notes the queue's push counter, END checks
# that the push between them added exactly this chunk before recording it, so a push that
# failed inside the transaction (NOSCRIPT, a foreign key type) is never marked as done.
_BEGIN = """
redis.call('HSET', KEYS[1], 'before', redis.call('HGET', KEYS[2], 'pushed') or '0')
return 1
"""
_END = """
local before = tonumber(redis.call('HGET', KEYS[1], 'before'))
redis.call('HDEL', KEYS[1], 'before')
local now = tonumber(redis.call('HGET', KEYS[2], 'pushed') or '0')
if before == nil or now ~= before + tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'chunks', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""


class _ChunkPusher:
    """Pushes one partition's chunks, each at most once for the marker it is given.

    The marker is a hash holding ``chunks``, how many of the partition's chunks are in the
    ring. Chunk ``i`` is pushed by one transaction (WATCH marker; MULTI; BEGIN; push; END;
    EXEC) only while the marker says ``i``: a later attempt of the same task skips it, and of
    two attempts running at once the second's EXEC aborts on the WATCH and then skips it.
    """

    def __init__(self, client: redis.Redis, keys: QueueKeys, marker: str) -> None:
        self.client = client
        self.keys = keys
        self.marker = marker
        self.meta = keys.all[8]  # the module's counters; its `pushed` grows by each push
        self.loaded = False

    def push(self, index: int, chunk: list[bytes]) -> int:
        """Returns len(chunk) once the chunk is in the ring, pushed now or by an earlier run."""
        for attempt in range(_PUSH_ATTEMPTS):
            try:
                if self._push_once(index, chunk):
                    return len(chunk)
            except WatchError:
                continue  # another attempt of this task moved the marker: look again
            except (RedisConnectionError, RedisTimeoutError):
                if attempt == _PUSH_ATTEMPTS - 1:
                    raise
                time.sleep(0.1 * 2**attempt)  # whether it landed is the marker's to say
        raise RotatorError(
            f"chunk {index} of {self.marker} was not pushed in {_PUSH_ATTEMPTS} tries"
        )

    def _push_once(self, index: int, chunk: list[bytes]) -> bool:
        if not self.loaded:
            self.client.script_load(module_source())
            self.loaded = True
        with self.client.pipeline(transaction=True) as pipe:
            pipe.watch(self.marker)  # type: ignore[no-untyped-call]
            done = int(pipe.hget(self.marker, "chunks") or 0)
            if done > index:
                return True
            if done < index:
                raise RotatorError(
                    f"{self.marker} records {done} chunks, expected {index}: the run's markers"
                    " expired or were deleted while it ran"
                )
            pipe.multi()
            pipe.eval(_BEGIN, 2, self.marker, self.meta)
            pipe.evalsha(module_sha(), len(self.keys.all), *self.keys.all, b"push", *chunk)
            pipe.eval(_END, 2, self.marker, self.meta, len(chunk), index + 1, SPARK_KEY_TTL)
            _, pushed, marked = pipe.execute(raise_on_error=False)
        if marked == 1:
            return True
        if isinstance(pushed, NoScriptError):  # flushed since we loaded it; nothing was pushed
            self.loaded = False
            return False
        for reply in (pushed, marked):
            if isinstance(reply, ResponseError):
                raise typed_error(reply) from reply
        raise ProtocolError(f"push of chunk {index} added {pushed!r} ids, not {len(chunk)}")


def push_partition(
    client: redis.Redis, keys: QueueKeys, marker: str, ids: Iterable[str], batch_size: int
) -> int:
    """Pushes ``ids`` in chunks of ``batch_size``, skipping the chunks ``marker`` says are in.

    Returns how many ids of this partition are in the ring now (pushed by this call or by an
    earlier run with the same marker). The ids must come in the same order on every run.
    """
    pusher = _ChunkPusher(client, keys, marker)
    total = index = 0
    chunk: list[bytes] = []
    for job_id in ids:
        chunk.append(protocol.encode_id(job_id))
        if len(chunk) == batch_size:
            total += pusher.push(index, chunk)
            index += 1
            chunk = []
    if chunk:
        total += pusher.push(index, chunk)
    return total


@dataclass(frozen=True)
class _PushTask:
    """What every push task needs; pickled to the executors (no connection inside)."""

    url: str
    queue: str
    run: str
    batch_size: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition, attempt = _task()
        keys = queue_keys(self.queue)
        marker = _spark_key(keys, "push", self.run, str(partition))
        # No redis-py retries: a retried EXEC could push a chunk twice; _ChunkPusher retries
        # after asking the marker. The name shows in CLIENT LIST which task is pushing.
        client = redis.Redis.from_url(
            self.url,
            retry=Retry(NoBackoff(), 0),
            client_name=f"rotator-spark-push:{self.queue}:{partition}.{attempt}:{os.getpid()}",
        )
        try:
            ids = (job_id for batch in batches for job_id in batch.column(0).to_pylist())
            pushed = push_partition(client, keys, marker, ids, self.batch_size)
        finally:
            client.close()
        yield pa.RecordBatch.from_pydict({"pushed": pa.array([pushed], pa.int64())})


def _id_column(df: DataFrame, column: str) -> DataFrame:
    """``column`` as one string column named ``id``; refuses types that are not ids."""
    if column not in df.columns:
        raise InvalidArgument(f"no column {column!r} in the DataFrame; it has {df.columns}")
    kind = df.schema[column].dataType
    if not isinstance(kind, _ID_TYPES):
        raise InvalidArgument(
            f"column {column!r} is {kind.simpleString()}: job ids are strings or integers,"
            " cast it first"
        )
    quoted = "`" + column.replace("`", "``") + "`"
    return df.select(F.col(quoted).cast("string").alias("id"))


def invalid_ids(df: DataFrame, column: str = "id") -> DataFrame:
    """The values of ``column`` that are not job ids, with why: rows of (id, reason).

    The same rules as :func:`rotator.protocol.encode_id`: 1 to 1024 UTF-8 bytes, no ``*``;
    a null is not an id either.
    """
    value = F.col("id")
    reason = (
        F.when(value.isNull(), "null")
        .when(F.octet_length(value) == 0, "empty")
        .when(F.octet_length(value) > MAX_ID_BYTES, f"longer than {MAX_ID_BYTES} bytes")
        .when(value.contains("*"), 'contains "*"')
    )
    ids = _id_column(df, column)
    return ids.select(value, reason.alias("reason")).where(F.col("reason").isNotNull())


def push_dataframe(
    df: DataFrame,
    queue: str,
    *,
    url: str,
    column: str = "id",
    batch_size: int = DEFAULT_SPARK_PUSH_BATCH,
    distinct: bool = False,
) -> int:
    """Pushes the ids in ``column`` of ``df`` to ``queue``; returns how many were pushed.

    Every id is checked first, in one Spark job: if any is invalid (null, empty, over 1024
    bytes, containing ``*``), InvalidJobId says how many and shows some, and nothing is
    pushed (:func:`invalid_ids` lists them all). Then each partition opens one connection and
    pushes its ids, sorted, in atomic chunks of ``batch_size``. A task that Spark retries
    skips the chunks it had pushed: each row's id is pushed once per call, whatever the
    retries. That needs a DataFrame that yields the same rows per partition when a task is
    re-run (files and shuffles do; a filter on ``rand()`` does not). Rows that repeat an id
    push it again, as ``Rotator.push`` would; ``distinct=True`` pushes each id once (a
    shuffle). Partitions push concurrently, so there is no order across partitions.
    """
    keys = queue_keys(queue)
    size = protocol.whole(batch_size, "batch_size", 1, MAX_BATCH)
    bad = invalid_ids(df, column)
    examples = bad.limit(5).collect()
    if examples:
        shown = ", ".join(f"{row['id']!r:.80} ({row['reason']})" for row in examples)
        raise InvalidJobId(
            f"{bad.count()} invalid job ids in column {column!r}, so nothing was pushed:"
            f" {shown}; rotator.spark.invalid_ids(df, {column!r}) lists them"
        )
    ids = _id_column(df, column)
    if distinct:
        ids = ids.dropDuplicates(["id"])
    task = _PushTask(url, keys.name, uuid.uuid4().hex, size)
    # Sorted within each partition so that a re-run task cuts the same chunks, whatever
    # order a shuffle hands it its rows in.
    counts = ids.sortWithinPartitions("id").mapInArrow(task, "pushed bigint")
    total = counts.agg(F.sum("pushed")).first()
    return int(total[0] or 0) if total is not None else 0


# -- draining ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Journal:
    """Where a drain's result rows go: ``shards`` hashes of token -> row.

    Keyed by the delivery's token, so a write that redis-py retries after a lost reply lands
    on the same field; and all writes of one token land in one shard, so one Spark task per
    shard reads the rows back without a shuffle.
    """

    key: str
    shards: int

    def shard(self, token: bytes) -> str:
        return f"{self.key}:{zlib.crc32(token) % self.shards}"

    def keys(self) -> list[str]:
        return [f"{self.key}:{shard}" for shard in range(self.shards)]


class _JournalingRotator(Rotator):
    """A Rotator that writes the result rows of deliveries before the call that settles them.

    The worker acks a finished job with its next claim (or ``ack`` when it stops) and nacks a
    failed one: each of those calls first writes the rows of the deliveries it settles to
    the journal. So an acked delivery always has its row; a delivery whose task died first
    has none, and is delivered again (reclaimed) after its lease.
    """

    def __init__(
        self, client: redis.Redis, name: str, *, journal: _Journal, **options: Any
    ) -> None:
        super().__init__(client, name, **options)
        self.journal = journal
        self.worker = _worker_name()
        self._rows: dict[str, str] = {}
        self._expiring: set[str] = set()  # shards this task has given their TTL
        self._lock = threading.Lock()

    def record(self, job: Job, status: str, seconds: float, error: str | None = None) -> None:
        row = [job.id, status, job.deliveries, job.reclaimed, seconds, self.worker, error]
        with self._lock:
            self._rows[job.token] = json.dumps(row)

    def _write_rows(self, refs: Iterable[JobRef]) -> None:
        tokens = [ref.token if isinstance(ref, Job) else protocol.text(ref) for ref in refs]
        shards: dict[str, dict[Any, str]] = {}  # key -> token -> row
        with self._lock:
            for token in tokens:
                if (row := self._rows.pop(token, None)) is not None:
                    field = token.encode("utf-8", "surrogateescape")  # as the ring holds it
                    shards.setdefault(self.journal.shard(field), {})[field] = row
        if not shards:
            return
        pipe = self.client.pipeline(transaction=False)
        for key, rows in shards.items():
            pipe.hset(key, mapping=rows)
            if key not in self._expiring:
                pipe.expire(key, SPARK_KEY_TTL)
        pipe.execute()
        self._expiring.update(shards)

    def next(
        self, count: int = 1, block: float | None = None, *, ack: Iterable[JobRef] = ()
    ) -> list[Job]:
        acks = list(ack)
        self._write_rows(acks)
        return super().next(count, block, ack=acks)

    def ack(self, *jobs: JobRef) -> int:
        self._write_rows(jobs)
        return super().ack(*jobs)

    def nack(self, *jobs: JobRef, delay: float = 0.0) -> int:
        self._write_rows(jobs)
        return super().nack(*jobs, delay=delay)

    def recording(self, handler: Handler, idempotency: Idempotency | None) -> Handler:
        """``handler`` with its outcome recorded; reclaimed jobs go to ``idempotency`` first."""

        def run(job: Job) -> None:
            started = time.perf_counter()
            try:
                skip = job.reclaimed and idempotency is not None and idempotency(job.id)
                if not skip:
                    handler(job)
            except Exception as error:
                message = f"{type(error).__name__}: {error}"[:_ERROR_CHARS]
                self.record(job, "failed", time.perf_counter() - started, message)
                raise  # the worker nacks it, to be retried with backoff
            status = "skipped" if skip else "completed"
            self.record(job, status, time.perf_counter() - started)

        return run


@dataclass(frozen=True)
class _DrainTask:
    """What every drain task needs; pickled to the executors (no connection inside)."""

    url: str
    queue: str
    journal: _Journal
    handler: Handler
    idempotency: Idempotency | None
    timeout: float
    max_deliveries: int | None
    batch: int
    concurrency: int
    poll: float

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass  # the task's one input row only gets it scheduled
        client = redis.Redis.from_url(self.url)
        try:
            rotator = _JournalingRotator(
                client,
                self.queue,
                journal=self.journal,
                timeout=self.timeout,
                max_deliveries=self.max_deliveries,
            )
            worker = Worker(
                rotator,
                rotator.recording(self.handler, self.idempotency),
                concurrency=self.concurrency,
                batch=self.batch,
                poll=self.poll,
            )
            # Spark owns the process's signals; the loop ends when the queue is drained.
            summary = worker.run(stop_when_empty=True, install_signal_handlers=False)
        finally:
            client.close()
        row = [rotator.worker, summary.processed, summary.failed, summary.leases_lost]
        yield _batch([[value] for value in row], _TASK_ARROW)


def drain(
    spark: SparkSession,
    queue: str,
    handler: Handler,
    *,
    url: str,
    parallelism: int | None = None,
    idempotency: Idempotency | None = None,
    timeout: float = DEFAULT_LEASE_TIMEOUT,
    max_deliveries: int | None = DEFAULT_DRAIN_MAX_DELIVERIES,
    batch: int = DEFAULT_DRAIN_BATCH,
    concurrency: int = 1,
    poll: float = DEFAULT_DRAIN_POLL,
) -> DataFrame:
    """Runs ``handler(job)`` for every job of ``queue`` in ``parallelism`` Spark tasks (default:
    the cluster's cores) and returns one row per processed delivery: RESULT_COLUMNS.

    Each task runs a :class:`rotator.worker.Worker` (batches of ``batch``, ``concurrency``
    threads, leases of ``timeout`` s kept alive while a handler runs) until the queue has
    nothing pending, in flight or waiting for a retry, then sweeps acked elements out of the
    ring, so a drained queue ends empty. The drain ends when every task has; jobs pushed
    meanwhile are processed if a task is still running. Run it when its Spark job can get
    ``parallelism`` cores, or later tasks start after the work is done and find nothing.

    ``status`` is ``completed`` (the handler returned; the job was acked), ``failed`` (it
    raised: ``error`` says what; the job comes back after 1 s, 2 s, ... and goes to the dead
    letters after ``max_deliveries`` deliveries) or ``skipped`` (a reclaimed job that
    ``idempotency(job_id)`` said was done already: acked without running the handler).

    A task that dies (crash, lost executor) loses no job: its jobs are delivered again once
    their lease runs out, with ``reclaimed`` true, and ``idempotency`` is asked about them
    first. Rows are written to Redis just before each ack, so the result includes the rows a
    dead task had acked; the rows of jobs it held unacked are lost with it, and a reclaimed
    row is where a duplicate run can hide. The rows are read back and materialized (a local
    checkpoint) before this returns: later actions do not run anything again.
    """
    keys = queue_keys(queue)
    tasks = parallelism if parallelism is not None else spark.sparkContext.defaultParallelism
    tasks = protocol.whole(tasks, "parallelism", 1, 10_000)
    # Check on the driver what the tasks would only find out on the executors.
    protocol.seconds_to_ms(timeout, "timeout")
    protocol.check_max_deliveries(max_deliveries)
    protocol.check_count(batch)
    protocol.whole(concurrency, "concurrency", 1, 1024)
    protocol.seconds_to_ms(poll, "poll")
    shards = max(2, spark.sparkContext.defaultParallelism * 2)
    journal = _Journal(_spark_key(keys, "drain", uuid.uuid4().hex), shards)
    task = _DrainTask(
        url, keys.name, journal, handler, idempotency, timeout, max_deliveries, batch,
        concurrency, poll,
    )  # fmt: skip
    began = time.monotonic()
    ran = spark.range(0, tasks, numPartitions=tasks).mapInArrow(task, _TASK_COLUMNS).collect()
    for summary in ran:
        log.info(
            "drain %s: %s processed %d, failed %d, lost %d leases",
            queue, summary.worker, summary.processed, summary.failed, summary.leases_lost,
        )  # fmt: skip
    log.info("drain %s: %d tasks done in %.3f s", queue, tasks, time.monotonic() - began)
    reader = _JournalReader(url, journal)
    shard_ids = spark.range(0, shards, numPartitions=shards)
    results = shard_ids.mapInArrow(reader, RESULT_COLUMNS).localCheckpoint(eager=True)
    with redis.Redis.from_url(url) as client:
        client.delete(*journal.keys())
    return results


# -- reading back -----------------------------------------------------------------------------


def _batch(columns: list[list[Any]], schema: pa.Schema) -> pa.RecordBatch:
    arrays = [
        pa.array(values, type=field.type) for values, field in zip(columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


@dataclass(frozen=True)
class _JournalReader:
    """Reads the journal shards whose numbers come in, as result rows."""

    url: str
    journal: _Journal

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        client = redis.Redis.from_url(self.url)
        try:
            for batch in batches:
                for shard in batch.column(0).to_pylist():
                    yield from self.read(client, f"{self.journal.key}:{shard}")
        finally:
            client.close()

    def read(self, client: redis.Redis, key: str) -> Iterator[pa.RecordBatch]:
        seen: set[bytes] = set()  # HSCAN may repeat a field if the hash was being resized
        cursor = 0
        while True:
            cursor, page = client.hscan(key, cursor, count=SPARK_READ_PAGE)
            fields = cast("dict[bytes, bytes]", page)
            rows = [json.loads(row) for token, row in fields.items() if token not in seen]
            seen.update(fields)
            if rows:
                columns = [list(column) for column in zip(*rows, strict=True)]
                try:
                    yield _batch(columns, _RESULT_ARROW)
                except UnicodeEncodeError:  # an id that is not UTF-8 (surrogate-escaped)
                    yield _batch([[_utf8(v) for v in c] for c in columns], _RESULT_ARROW)
            if cursor == 0:
                return


@dataclass(frozen=True)
class _RingReader:
    """Reads pages of the ring from its tail, so rows come next-to-be-visited first."""

    url: str
    keys: QueueKeys
    now_ms: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        client = redis.Redis.from_url(self.url)
        try:
            for batch in batches:
                for page in batch.column(0).to_pylist():
                    end = -page * SPARK_READ_PAGE - 1
                    elements = client.lrange(self.keys.ring, end - SPARK_READ_PAGE + 1, end)
                    yield self.decode(client, cast("list[bytes]", elements)[::-1])
        finally:
            client.close()

    def decode(self, client: redis.Redis, packed: list[bytes]) -> pa.RecordBatch:
        # A packed batch is read as the leases it stands for, as the module's peek shows it.
        elements: list[bytes] = []
        batches: dict[bytes, list[bytes]] = {}
        for element in packed:
            unpacked = protocol.unpack_element(element)
            if unpacked is None:
                elements.append(element)
            else:
                batches[unpacked[0]] = unpacked[1]
                elements += unpacked[1]
        # Tokens have a "*" after their first byte (the sentinel starts with one); as the
        # module's peek does, look them up in both done sets, then in both marks hashes
        # (n<due>: nacked, e<deadline>: extended; a batch's "a<jobs>": acked whole).
        tokens = [element for element in elements if b"*" in element[1:]]
        names = list(batches)
        done: set[bytes] = set()
        marks: dict[bytes, bytes] = {}
        if tokens:
            k = self.keys.all
            with client.pipeline(transaction=True) as pipe:
                pipe.smismember(k[1], tokens)
                pipe.smismember(k[2], tokens)
                pipe.hmget(k[3], tokens + names)
                pipe.hmget(k[4], tokens + names)
                new_done, old_done, new_marks, old_marks = pipe.execute()
            for i, token in enumerate(tokens):
                if new_done[i] or old_done[i]:
                    done.add(token)
                elif (mark := new_marks[i] or old_marks[i]) is not None:
                    marks[token] = mark
            for j, name in enumerate(names, len(tokens)):
                if (new_marks[j] or b"").startswith(b"a") or (old_marks[j] or b"").startswith(b"a"):
                    done.update(batches[name])
        columns: list[list[Any]] = [[], [], [], [], []]
        for element in elements:
            if element != _SENTINEL:
                for column, value in zip(columns, self.row(element, done, marks), strict=True):
                    column.append(value)
        return _batch(columns, _SNAPSHOT_ARROW)

    def row(
        self, element: bytes, done: set[bytes], marks: dict[bytes, bytes]
    ) -> tuple[str, str, int | None, int | None, int]:
        shown = element.decode("utf-8", "replace")  # Arrow holds UTF-8 only
        if b"*" not in element:
            state = "pending" if 0 < len(element) <= MAX_ID_BYTES else "corrupt"
            return shown, state, None, None, 0
        parsed = protocol.parse_token(shown)
        if parsed is None:
            return shown, "corrupt", None, None, 0
        job_id, stamp, deliveries = parsed
        state, mark = "leased", marks.get(element, b"")
        if element in done:
            state = "done"
        elif mark[1:].isdigit():
            state, stamp = ("deferred" if mark[:1] == b"n" else "leased"), int(mark[1:])
        return job_id, state, stamp, self.now_ms - stamp, deliveries


def snapshot(spark: SparkSession, queue: str, *, url: str) -> DataFrame:
    """The ring of ``queue`` as rows of SNAPSHOT_COLUMNS, read without changing anything.

    One row per element, from the tail (the next to be visited) on; the sentinel is left
    out. ``state`` is pending, leased, done (acked, not yet removed), deferred (nacked, due
    at ``stamp_ms``) or corrupt. ``stamp_ms`` is the lease deadline (extended, if it was) or
    the due time, null for pending ids; ``age_ms`` is the server's time when the snapshot
    began minus ``stamp_ms``: negative while a lease is valid, positive once it is overdue.
    Pages of SPARK_READ_PAGE elements are read by Spark tasks; on a queue that consumers are
    rotating meanwhile, an element can be seen twice or missed (a warning says so). The rows
    are materialized (a local checkpoint) before this returns.
    """
    keys = queue_keys(queue)
    with redis.Redis.from_url(url) as client:
        seconds, micros = client.time()
        before = client.hmget(keys.all[8], "seq", "pushed")
        length = int(client.llen(keys.ring))
    reader = _RingReader(url, keys, seconds * 1000 + micros // 1000)
    pages = math.ceil(length / SPARK_READ_PAGE)
    slices = max(1, min(pages, spark.sparkContext.defaultParallelism * 4))
    page_ids = spark.range(0, pages, numPartitions=slices)
    rows = page_ids.mapInArrow(reader, SNAPSHOT_COLUMNS).localCheckpoint(eager=True)
    with redis.Redis.from_url(url) as client:
        if client.hmget(keys.all[8], "seq", "pushed") != before:
            log.warning("queue %s changed while its snapshot was read: rows may be off", queue)
    return rows


# -- the CLI's helpers ------------------------------------------------------------------------


@contextmanager
def session(
    master: str = DEFAULT_SPARK_MASTER, conf: Mapping[str, str] | None = None
) -> Iterator[SparkSession]:
    """A SparkSession on ``master``, stopped at the end unless one was running already.

    Executors run this interpreter (PYSPARK_PYTHON, unless set), so they find rotator; the
    web UI is off unless ``conf`` turns it on.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    running = SparkSession.getActiveSession()
    builder = SparkSession.builder.master(master).appName("rotator")
    builder = builder.config("spark.ui.enabled", "false")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        yield spark
    finally:
        if running is None:
            spark.stop()


def read_dataset(spark: SparkSession, path: str, fmt: str) -> DataFrame:
    """A dataset of ``fmt``: parquet, csv (with a header line), json (lines) or text."""
    reader = spark.read
    if fmt == "csv":
        return reader.option("header", True).csv(path)
    if fmt in ("parquet", "json", "text"):
        loaded: DataFrame = getattr(reader, fmt)(path)
        return loaded
    raise InvalidArgument(f"unknown format {fmt!r}: parquet, csv, json or text")


def load_callable(ref: str) -> Callable[..., Any]:
    """The function named by ``module:function``, imported here and shipped by value.

    The current directory is importable, as with ``python -m``. The module is pickled with
    the function (cloudpickle by value), so executors need what it imports but not the
    module itself.
    """
    module_name, _, name = ref.partition(":")
    if not module_name or not name:
        raise InvalidArgument(f"expected module:function, got {ref!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise InvalidArgument(f"cannot import {module_name}: {error}") from error
    module = found
    for part in name.split("."):
        found = getattr(found, part, None)
    if not callable(found):
        raise InvalidArgument(f"{ref} is not a function")
    cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    return found  # type: ignore[no-any-return]


def describe_failure(error: BaseException) -> str:
    """One line for a failed Spark job: the JVM's exception rather than py4j's call site."""
    java = getattr(error, "java_exception", None)
    text = str(java) if java is not None else str(error)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def output_exists(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` exists on its file system (local, HDFS, S3...), asked through Spark."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a running session has its gateway
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    file_system = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return bool(file_system.exists(hadoop_path))
