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

Sharded queues. With ``shards=N``, ``push_dataframe`` and ``drain`` work on the sharded queue
``queue`` of a Redis Cluster (:class:`rotator.sharded.ShardedRotator`; ``url`` names any
node). The stored shard count is checked on the driver first (ShardsMismatch, before any
Spark job runs). A push task routes each id to its shard (crc32) and cuts each shard's ids
into chunks with a marker of that shard's own (``rotator:{queue:k.SALT}:spark:push:...``, in
the shard's slot, as ``push_chunk`` needs), so a re-run skips what is in exactly as above.
A drain task runs the same worker loop over every shard; the journal lives in the queue's
own hash tag (``rotator:{queue}:spark:drain:...``, one slot), read back on a cluster client.
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
from typing import Any, Generic, Protocol, TypeVar, cast

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import WatchError
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

from rotator import commands, protocol
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
from rotator.errors import InvalidArgument, InvalidJobId, RotatorError
from rotator.keys import QueueKeys, queue_keys
from rotator.models import Handler, Job, RingEntry
from rotator.protocol import JobRef
from rotator.retries import DEFAULT_RETRY_FOR, RetryingSender
from rotator.script import module_caller, module_command, module_source, not_loaded, pipeline_reply
from rotator.sending import Sender
from rotator.sharded import ShardedFlows, ShardedRotator, check_shards, cluster_client
from rotator.urls import client_from_url
from rotator.worker import Worker

__all__ = [
    "RESULT_COLUMNS",
    "SNAPSHOT_COLUMNS",
    "SparkFailure",
    "TransactionPusher",
    "describe_failure",
    "drain",
    "invalid_ids",
    "load_callable",
    "output_exists",
    "push_chunks",
    "push_dataframe",
    "push_partition",
    "push_sharded_partition",
    "read_dataset",
    "register",
    "session",
    "snapshot",
]

log = logging.getLogger("rotator.spark")

Idempotency = Callable[[str], bool]
Item = TypeVar("Item")
# Sends chunk i of a write at most once for its marker; returns how many items it holds.
ChunkPush = Callable[[int, list[Item]], int]
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


class _ChunkPusher(Generic[Item]):
    """Pushes one partition's chunks, each at most once for the marker it is given.

    The marker is a hash holding ``chunks``, how many of the partition's chunks are in the
    ring. The module's ``push_chunk`` pushes chunk ``i`` and moves the marker to ``i + 1`` in
    one atomic call, only while the marker says ``i``: a later attempt of the same task skips
    the chunk, and of two attempts running at once the second finds it counted. With
    ``command`` (a chunk's push call: scheduled, prioritized, unique, with payloads), the
    call is that command after ``once CHUNK TTL_MS``, which does the same.
    """

    def __init__(
        self,
        client: redis.Redis | RedisCluster,
        keys: QueueKeys,
        marker: str,
        ttl: int = SPARK_KEY_TTL,
        *,
        sender: Sender | None = None,
        command: Callable[[list[Item]], commands.ModuleCall[int]] | None = None,
    ) -> None:
        # A cluster's shard is pushed through its queue's RetryingSender (cluster errors).
        self.sender = sender or Sender(client, False, None)
        self.keys = (*keys.all, marker)
        self.marker = marker
        self.ttl_ms = ttl * 1000
        self.command = command

    def push(self, index: int, chunk: list[Item]) -> int:
        """Returns len(chunk) once the chunk is in the ring, pushed now or by an earlier run."""
        if self.command is not None:
            call = commands.once(self.command(chunk), self.marker, index, self.ttl_ms)
        else:
            call = commands.push_chunk(self.keys, index, self.ttl_ms, cast(list[bytes], chunk))
        for attempt in range(_PUSH_ATTEMPTS):
            try:
                self.sender.perform(call)
            except (RedisConnectionError, RedisTimeoutError):
                if attempt == _PUSH_ATTEMPTS - 1:
                    raise
                time.sleep(0.1 * 2**attempt)  # whether it landed is the marker's to say
                continue
            # Pushed now, or counted by an earlier attempt (the module refuses a chunk the
            # marker has not reached: its markers expired or were deleted during the run).
            return len(chunk)
        raise RotatorError(
            f"chunk {index} of {self.marker} was not pushed in {_PUSH_ATTEMPTS} tries"
        )


def push_partition(
    client: redis.Redis, keys: QueueKeys, marker: str, ids: Iterable[str], batch_size: int
) -> int:
    """Pushes ``ids`` in chunks of ``batch_size``, skipping the chunks ``marker`` says are in.

    Returns how many ids of this partition are in the ring now (pushed by this call or by an
    earlier run with the same marker). The ids must come in the same order on every run.
    """
    pusher: _ChunkPusher[bytes] = _ChunkPusher(client, keys, marker)
    return push_chunks(pusher.push, (protocol.encode_id(job_id) for job_id in ids), batch_size)


def push_chunks(push: ChunkPush[Item], items: Iterable[Item], size: int) -> int:
    """Cuts ``items`` into chunks of ``size`` and hands chunk ``i`` to ``push(i, chunk)``,
    which sends it at most once for its marker (:class:`_ChunkPusher`,
    :class:`TransactionPusher`); returns how many items are in, now or from earlier runs.

    This is what makes a Spark write exactly once per marker: a re-run with the same items in
    the same order cuts the same chunks, and the marker skips those already in.
    """
    chunker = _Chunker(push, size)
    for item in items:
        chunker.add(item)
    return chunker.close()


class _Chunker(Generic[Item]):
    """:func:`push_chunks` one item at a time: chunk ``i`` goes to ``push(i, chunk)`` as soon
    as it is full, the last one at :meth:`close`. One per marker."""

    def __init__(self, push: ChunkPush[Item], size: int) -> None:
        self.push = push
        self.size = size
        self.index = 0
        self.total = 0
        self.chunk: list[Item] = []

    def add(self, item: Item) -> None:
        self.chunk.append(item)
        if len(self.chunk) == self.size:
            self._send()

    def close(self) -> int:
        """Sends the last chunk; how many items are in, now or from earlier runs."""
        if self.chunk:
            self._send()
        return self.total

    def _send(self) -> None:
        self.total += self.push(self.index, self.chunk)
        self.index += 1
        self.chunk = []


def push_sharded_partition(
    client: RedisCluster,
    queue: str,
    run: str,
    ids: Iterable[str],
    batch_size: int,
    *,
    shards: int,
    retry_for: float = DEFAULT_RETRY_FOR,
) -> int:
    """:func:`push_partition` for the sharded queue ``queue`` of ``shards`` shards: each id
    goes to its shard (``crc32(id) % shards``, as :class:`rotator.ShardedRotator` routes),
    and each shard's ids are cut into chunks of ``batch_size`` pushed under a marker of that
    shard's own, ``rotator:{SHARD}:spark:push:RUN`` (in the shard's slot, with its keys).

    A re-run with the same ids in the same order cuts the same chunks per shard, so each
    shard's marker skips those in: every id is pushed once per ``run``. The stored shard
    count is checked first (ShardsMismatch, nothing pushed). Each chunk adds wake tokens
    for its shard, so blocked consumers look there. Cluster errors are retried for
    ``retry_for`` seconds per call. Returns how many ids are in (now or from earlier runs).
    """
    flows = ShardedFlows(queue, shards, retry_for=retry_for)
    sender = RetryingSender(client, False, retry_for)
    sender.run(flows.check_layout())

    def pusher(k: int) -> ChunkPush[bytes]:
        keys = flows.shards[k].keys
        marked: _ChunkPusher[bytes] = _ChunkPusher(
            client, keys, _spark_key(keys, "push", run), sender=sender
        )

        def push(index: int, chunk: list[bytes]) -> int:
            done = marked.push(index, chunk)
            sender.run(flows.wake({k: len(chunk)}))
            return done

        return push

    chunkers: dict[int, _Chunker[bytes]] = {}
    for job_id in ids:
        raw = protocol.encode_id(job_id)
        k = flows.of_id(raw)
        if k not in chunkers:
            chunkers[k] = _Chunker(pusher(k), batch_size)
        chunkers[k].add(raw)
    return sum(chunker.close() for chunker in chunkers.values())


class TransactionPusher(Generic[Item]):
    """Sends each chunk's module call (``build(pipe, chunk)``) and moves the marker past it in
    one MULTI/EXEC, under WATCH of the marker and of ``watched`` (keys the call was built
    from, read through ``pipe``): for a topic's ``tpublish``, whose groups are read under
    WATCH (a queue's pushes take their marker themselves: ``push_chunk``, ``once``). A chunk
    the marker counts already is skipped; a transaction whose watched keys changed is tried
    again; one whose module call failed has its marker moved back (the module writes
    nothing when it refuses a call) before the error is raised.
    """

    def __init__(
        self,
        client: redis.Redis,
        marker: str,
        build: Callable[[Any, list[Item]], commands.ModuleCall[Any]],
        watched: tuple[str, ...] = (),
        ttl: int = SPARK_KEY_TTL,
    ) -> None:
        self.client = client
        self.script: Any = module_caller(client, False)
        self.marker = marker
        self.build = build
        self.watched = watched
        self.ttl_ms = ttl * 1000

    def push(self, index: int, chunk: list[Item]) -> int:
        """Returns len(chunk) once the chunk is in, sent now or by an earlier run."""
        for attempt in range(_PUSH_ATTEMPTS * 4):
            try:
                reply = self._attempt(index, chunk)
            except WatchError:
                continue  # another attempt of the chunk moved the marker: look again
            except (RedisConnectionError, RedisTimeoutError):
                if attempt >= _PUSH_ATTEMPTS:
                    raise
                time.sleep(0.1 * 2 ** min(attempt, 4))  # the marker says whether it landed
                continue
            if not isinstance(reply, Exception):
                return len(chunk)
            self._move_back(index)
            if not_loaded(reply):
                continue  # flushed scripts: the next attempt loads the module again
            pipeline_reply(reply)  # raises the module's error as its typed exception
        raise RotatorError(f"chunk {index} of {self.marker} was not sent in {attempt + 1} tries")

    def _attempt(self, index: int, chunk: list[Item]) -> Any:
        """One WATCH/MULTI/EXEC; the module call's reply (an exception if it failed), or True
        for a chunk the marker counts already."""
        with self.client.pipeline(transaction=True) as started:
            pipe: Any = started  # redis-py's pipeline methods are untyped
            pipe.watch(self.marker, *self.watched)
            done = int(pipe.hget(self.marker, "chunks") or 0)
            if done > index:
                return True
            if done < index:
                raise RotatorError(
                    f"{self.marker} counts {done} chunks, not {index}: it expired or was"
                    " deleted during the run; nothing was sent"
                )
            call = self.build(pipe, chunk)
            self.client.script_load(module_source())  # so EXEC cannot meet NOSCRIPT
            pipe.multi()
            pipe.execute_command(*module_command(self.script, call.keys, call.args))
            pipe.hset(self.marker, "chunks", index + 1)
            pipe.pexpire(self.marker, self.ttl_ms)
            return pipe.execute(raise_on_error=False)[0]

    def _move_back(self, index: int) -> None:
        """Undoes the marker of a chunk whose call failed inside the transaction."""
        with self.client.pipeline(transaction=True) as started:
            pipe: Any = started
            try:
                pipe.watch(self.marker)
                if int(pipe.hget(self.marker, "chunks") or 0) == index + 1:
                    pipe.multi()
                    pipe.hset(self.marker, "chunks", index)
                    pipe.execute()
            except WatchError:
                pass  # moved by another attempt since: it is that attempt's to account for


@dataclass(frozen=True)
class _PushTask:
    """What every push task needs; pickled to the executors (no connection inside)."""

    url: str
    queue: str
    run: str
    batch_size: int
    shards: int | None = None  # a sharded queue of this many shards on a Redis Cluster

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition, attempt = _task()
        ids = (job_id for batch in batches for job_id in batch.column(0).to_pylist())
        # No redis-py retries: a retried EXEC could push a chunk twice; _ChunkPusher retries
        # after asking the marker. The name shows in CLIENT LIST which task is pushing.
        name = f"rotator-spark-push:{self.queue}:{partition}.{attempt}:{os.getpid()}"
        if self.shards is not None:
            cluster = cluster_client(self.url, client_name=name)  # redis-py's retries off too
            try:
                run = f"{self.run}:{partition}"
                pushed = push_sharded_partition(
                    cluster, self.queue, run, ids, self.batch_size, shards=self.shards
                )
            finally:
                cluster.close()
        else:
            keys = queue_keys(self.queue)
            marker = _spark_key(keys, "push", self.run, str(partition))
            client = client_from_url(self.url, retry=Retry(NoBackoff(), 0), client_name=name)
            try:
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
    shards: int | None = None,
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

    With ``shards``, ``queue`` is the sharded queue of that many shards on the Redis Cluster
    at ``url`` (any node; see :class:`rotator.ShardedRotator`): the count is checked against
    the stored one before anything else (ShardsMismatch), each id goes to its shard, and
    each partition pushes each shard's ids in chunks of ``batch_size`` under a marker of
    that shard's own (:func:`push_sharded_partition`): a retried task still pushes nothing
    twice. Atomic per chunk, as above; a chunk holds one shard's ids.
    """
    keys = queue_keys(queue)
    size = protocol.whole(batch_size, "batch_size", 1, MAX_BATCH)
    if shards is not None:
        shards = _check_sharded(url, keys.name, shards)
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
    return _push_ids(ids, _PushTask(url, keys.name, uuid.uuid4().hex, size, shards))


def _push_ids(ids: DataFrame, task: _PushTask) -> int:
    """Runs ``task`` on every partition of ``ids`` (one string column ``id``); the sum of
    its counts. Running it again with the same task is what a Spark retry of every task is.
    """
    # Sorted within each partition so that a re-run task cuts the same chunks, whatever
    # order a shuffle hands it its rows in.
    counts = ids.sortWithinPartitions("id").mapInArrow(task, "pushed bigint")
    total = counts.agg(F.sum("pushed")).first()
    return int(total[0] or 0) if total is not None else 0


def _check_sharded(url: str, queue: str, shards: int) -> int:
    """Checks on the driver what every task would find out: that ``url`` is a node of a
    Redis Cluster and ``queue`` is stored with ``shards`` shards (ShardsMismatch), storing
    the count at its first use as any ShardedRotator does. Returns the count."""
    shards = check_shards(shards)
    cluster = cluster_client(url)
    try:
        RetryingSender(cluster, False, DEFAULT_RETRY_FOR).run(
            ShardedFlows(queue, shards).check_layout()
        )
    finally:
        cluster.close()
    return shards


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


class _Settles(Protocol):
    """The calls of the queue class that :class:`_Journaling` is mixed in before."""

    def next(
        self,
        count: int = 1,
        block: float | None = None,
        *,
        ack: Iterable[JobRef] = (),
        durations: Iterable[float] = (),
    ) -> list[Job]: ...
    def ack(self, *jobs: JobRef) -> int: ...
    def nack(self, *jobs: JobRef, delay: float = 0.0) -> int: ...
    def fail(self, *jobs: JobRef, error: str, delay: float = 0.0) -> int: ...
    def bury(self, *jobs: JobRef, error: str = "") -> int: ...


class _Journaling:
    """Writes the result rows of deliveries before the call that settles them; mixed in
    before Rotator or ShardedRotator, whose own calls it makes after the writes.

    The worker acks a finished job with its next claim (or ``ack`` when it stops) and nacks a
    failed one: each of those calls first writes the rows of the deliveries it settles to
    the journal. So an acked delivery always has its row; a delivery whose task died first
    has none, and is delivered again (reclaimed) after its lease. A row is forgotten only
    once written: when a write fails, the worker's retry of the call writes it again.
    """

    def _open_journal(self, client: redis.Redis | RedisCluster, journal: _Journal) -> None:
        self.journal = journal
        self.worker = _worker_name()
        self._journal_client = client
        self._rows: dict[str, str] = {}
        self._expiring: set[str] = set()  # shards this task has given their TTL
        self._rows_lock = threading.Lock()

    def _queue(self) -> _Settles:
        """The queue's own calls (of the class after this one)."""
        return cast("_Settles", super())

    def record(self, job: Job, status: str, seconds: float, error: str | None = None) -> None:
        row = [job.id, status, job.deliveries, job.reclaimed, seconds, self.worker, error]
        with self._rows_lock:
            self._rows[job.token] = json.dumps(row)

    def _write_rows(self, refs: Iterable[JobRef]) -> None:
        tokens = [ref.token if isinstance(ref, Job) else protocol.text(ref) for ref in refs]
        shards: dict[str, dict[Any, str]] = {}  # key -> token -> row
        with self._rows_lock:
            for token in tokens:
                if (row := self._rows.get(token)) is not None:
                    field = token.encode("utf-8", "surrogateescape")  # as the ring holds it
                    shards.setdefault(self.journal.shard(field), {})[field] = row
        if not shards:
            return
        # All of a journal's keys share one hash tag: on a cluster, one node's pipeline.
        pipe = self._journal_client.pipeline(transaction=False)
        for key, rows in shards.items():
            pipe.hset(key, mapping=rows)
            if key not in self._expiring:
                pipe.expire(key, SPARK_KEY_TTL)
        pipe.execute()
        with self._rows_lock:
            for token in tokens:
                self._rows.pop(token, None)
        self._expiring.update(shards)

    def next(
        self,
        count: int = 1,
        block: float | None = None,
        *,
        ack: Iterable[JobRef] = (),
        durations: Iterable[float] = (),
    ) -> list[Job]:
        acks = list(ack)
        self._write_rows(acks)
        return self._queue().next(count, block, ack=acks, durations=durations)

    def ack(self, *jobs: JobRef) -> int:
        self._write_rows(jobs)
        return self._queue().ack(*jobs)

    def nack(self, *jobs: JobRef, delay: float = 0.0) -> int:
        self._write_rows(jobs)
        return self._queue().nack(*jobs, delay=delay)

    def fail(self, *jobs: JobRef, error: str, delay: float = 0.0) -> int:
        self._write_rows(jobs)
        return self._queue().fail(*jobs, error=error, delay=delay)

    def bury(self, *jobs: JobRef, error: str = "") -> int:
        self._write_rows(jobs)
        return self._queue().bury(*jobs, error=error)

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


class _JournalingRotator(_Journaling, Rotator):
    """A Rotator whose settling calls write their result rows first (:class:`_Journaling`)."""

    def __init__(
        self, client: redis.Redis, name: str, *, journal: _Journal, **options: Any
    ) -> None:
        super().__init__(client, name, **options)
        self._open_journal(client, journal)


class _JournalingShardedRotator(_Journaling, ShardedRotator):
    """A ShardedRotator whose settling calls write their result rows first."""

    def __init__(
        self, client: RedisCluster, name: str, *, shards: int, journal: _Journal, **options: Any
    ) -> None:
        super().__init__(client, name, shards=shards, **options)
        self._open_journal(client, journal)


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
    shards: int | None = None  # a sharded queue of this many shards on a Redis Cluster

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass  # the task's one input row only gets it scheduled
        rotator = self.open()
        try:
            worker = Worker(
                cast("Rotator", rotator),  # a ShardedRotator has what the worker calls
                rotator.recording(self.handler, self.idempotency),
                concurrency=self.concurrency,
                batch=self.batch,
                poll=self.poll,
            )
            # Spark owns the process's signals; the loop ends when the queue is drained.
            summary = worker.run(stop_when_empty=True, install_signal_handlers=False)
        finally:
            rotator.client.close()
        row = [rotator.worker, summary.processed, summary.failed, summary.leases_lost]
        yield _batch([[value] for value in row], _TASK_ARROW)

    def open(self) -> _JournalingRotator | _JournalingShardedRotator:
        """The queue on a connection of this task's own."""
        options: dict[str, Any] = {
            "journal": self.journal, "timeout": self.timeout, "max_deliveries": self.max_deliveries
        }  # fmt: skip
        if self.shards is None:
            return _JournalingRotator(client_from_url(self.url), self.queue, **options)
        return _JournalingShardedRotator(
            cluster_client(self.url), self.queue, shards=self.shards, **options
        )


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
    shards: int | None = None,
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

    With ``shards``, ``queue`` is the sharded queue of that many shards on the Redis Cluster
    at ``url`` (any node): the count is checked against the stored one before any task
    starts (ShardsMismatch), and each task runs the worker loop of
    :meth:`rotator.ShardedRotator.work`, claiming from every shard, until no shard holds
    anything. The journal lives in the queue's own hash tag (one slot).
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
    cluster = shards is not None
    if shards is not None:
        shards = _check_sharded(url, keys.name, shards)
    journal_shards = max(2, spark.sparkContext.defaultParallelism * 2)
    journal = _Journal(_spark_key(keys, "drain", uuid.uuid4().hex), journal_shards)
    task = _DrainTask(
        url, keys.name, journal, handler, idempotency, timeout, max_deliveries, batch,
        concurrency, poll, shards,
    )  # fmt: skip
    began = time.monotonic()
    ran = spark.range(0, tasks, numPartitions=tasks).mapInArrow(task, _TASK_COLUMNS).collect()
    for summary in ran:
        log.info(
            "drain %s: %s processed %d, failed %d, lost %d leases",
            queue, summary.worker, summary.processed, summary.failed, summary.leases_lost,
        )  # fmt: skip
    log.info("drain %s: %d tasks done in %.3f s", queue, tasks, time.monotonic() - began)
    reader = _JournalReader(url, journal, cluster)
    shard_ids = spark.range(0, journal_shards, numPartitions=journal_shards)
    results = shard_ids.mapInArrow(reader, RESULT_COLUMNS).localCheckpoint(eager=True)
    client = _connect(url, cluster)
    try:
        client.delete(*journal.keys())
    finally:
        client.close()
    return results


# -- reading back -----------------------------------------------------------------------------


def _connect(url: str, cluster: bool) -> redis.Redis | RedisCluster:
    """A client for ``url``: of the Redis Cluster it is a node of, or of that server."""
    return cluster_client(url) if cluster else client_from_url(url)


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
    cluster: bool = False  # the journal is on a Redis Cluster (of a sharded queue)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        client = _connect(self.url, self.cluster)
        try:
            for batch in batches:
                for shard in batch.column(0).to_pylist():
                    yield from self.read(client, f"{self.journal.key}:{shard}")
        finally:
            client.close()

    def read(self, client: redis.Redis | RedisCluster, key: str) -> Iterator[pa.RecordBatch]:
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
    """Reads pages of the ring from its tail with the module's ``scan``, so rows come
    next-to-be-visited first and each element's state is the module's own."""

    url: str
    keys: QueueKeys
    now_ms: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pages = (page for batch in batches for page in batch.column(0).to_pylist())
        yield from self.pages(pages)

    def pages(self, pages: Iterable[int]) -> Iterator[pa.RecordBatch]:
        """The rows of pages ``pages`` (SPARK_READ_PAGE elements each), on a connection of
        its own."""
        client = client_from_url(self.url)
        sender = Sender(client, False, None)
        try:
            for page in pages:
                start, stop = page * SPARK_READ_PAGE, (page + 1) * SPARK_READ_PAGE
                while start < stop:
                    found = sender.perform(
                        commands.scan(self.keys.all, start, stop, SPARK_READ_PAGE)
                    )
                    yield self.decode(found.entries)
                    if found.next <= start or found.next >= found.length:
                        break
                    start = found.next
        finally:
            client.close()

    def decode(self, entries: list[RingEntry]) -> pa.RecordBatch:
        columns: list[list[Any]] = [[], [], [], [], []]
        for entry in entries:
            if entry.state != "lap":
                for column, value in zip(columns, self.row(entry), strict=True):
                    column.append(value)
        return _batch(columns, _SNAPSHOT_ARROW)

    def row(self, entry: RingEntry) -> tuple[str, str, int | None, int | None, int]:
        shown = _utf8(entry.element)  # Arrow holds UTF-8 only
        if entry.state in ("pending", "corrupt"):
            return shown, entry.state, None, None, 0
        parsed = protocol.parse_token(entry.element)
        if parsed is None:  # the module would have said corrupt
            return shown, "corrupt", None, None, 0
        job_id, deadline_ms, deliveries = parsed
        stamp = entry.time_ms or deadline_ms  # a done job's is its lease's
        return _utf8(job_id), entry.state, stamp, self.now_ms - stamp, deliveries


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
    reader, pages, version = ring_reader(url, keys)
    slices = max(1, min(pages, spark.sparkContext.defaultParallelism * 4))
    page_ids = spark.range(0, pages, numPartitions=slices)
    rows = page_ids.mapInArrow(reader, SNAPSHOT_COLUMNS).localCheckpoint(eager=True)
    warn_if_moved(url, keys, version)
    return rows


def ring_reader(url: str, keys: QueueKeys) -> tuple[_RingReader, int, tuple[int, int]]:
    """What reads the ring of ``keys`` page by page, how many pages it has now, and its
    version (the ring's seq and pushed count: unchanged means nothing moved)."""
    with client_from_url(url) as client:
        seconds, micros = client.time()
        first = Sender(client, False, None).perform(commands.scan(keys.all, 0, 0, 1))
    reader = _RingReader(url, keys, seconds * 1000 + micros // 1000)
    return reader, math.ceil(first.length / SPARK_READ_PAGE), first.version


def warn_if_moved(url: str, keys: QueueKeys, version: tuple[int, int]) -> None:
    """Logs a warning when the ring moved since ``version``: a read's rows may be off."""
    with client_from_url(url) as client:
        last = Sender(client, False, None).perform(commands.scan(keys.all, 0, 0, 1))
    if last.version != version:
        log.warning("queue %s changed while its snapshot was read: rows may be off", keys.name)


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
    register(spark)
    try:
        yield spark
    finally:
        if running is None:
            spark.stop()


def register(spark: SparkSession) -> None:
    """Registers the ``rotator`` data source with ``spark``: ``spark.read.format("rotator")``,
    ``df.write.format("rotator")`` and their streaming twins (see
    :mod:`rotator.spark_source`). :func:`session` does it for you."""
    from rotator.spark_source import RotatorDataSource  # noqa: PLC0415 (it imports this module)

    spark.dataSource.register(RotatorDataSource)


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
