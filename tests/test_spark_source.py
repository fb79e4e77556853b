"""The ``rotator`` Spark data source: batch and streaming reads and writes of queues and topics.

On the shared ``local[2]`` session of test_spark.py (``spark.task.maxFailures=1``: a retried
task cannot hide a double push), against the Valkey fixture; the chunk recorders also run
without Spark, on both servers. The queue stream whose driver is killed mid-batch runs on the
standalone cluster of test_spark_cluster.py, its driver a process of its own. One test reaches
a Valkey behind Sentinel through its ``redis+sentinel://`` URL (push_dataframe, drain, the
data source's queue and topic reads and writes).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from rotator import Retention, Rotator, Topic, WrongKeyType
from rotator.keys import queue_keys, topic_keys
from rotator.protocol import text
from tests import test_spark, test_spark_cluster
from tests.servers import SentinelGroup, ServerProcess
from tests.test_spark import ROOT, noop, python_env, ring_ids

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from rotator import spark as rspark
    from rotator import spark_source
except ImportError as missing:
    pytest.fail(
        f"{missing}: the Spark tests need the spark extra: pip install -e '.[dev]'", pytrace=False
    )

# The fixtures of the Spark tests, shared: one local[2] session, one standalone cluster.
spark = test_spark.spark
url = test_spark.url
conn = test_spark.conn
spark_master = test_spark_cluster.spark_master

RUN_TIMEOUT = 240.0  # seconds for a driver process: JVM, executors, the batches, a lease


@pytest.fixture
def registered(spark: SparkSession) -> SparkSession:
    rspark.register(spark)
    return spark


def reader(spark: SparkSession, url: str, stream: bool = False, **options: str) -> Any:
    source = spark.readStream if stream else spark.read
    return source.format("rotator").option("url", url).options(**options)


def drop_last_commit(checkpoint: Path) -> int:
    """Forgets the last committed micro-batch, as if the driver died after the sink wrote it
    and before Spark noted the commit: a restart runs that batch again. Returns its id."""
    last = max(int(path.name) for path in (checkpoint / "commits").iterdir() if path.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    return last


# -- the chunk recorders, without Spark ---------------------------------------------------------


def publish_pusher(client: redis.Redis, topic: str, marker: str) -> rspark.TransactionPusher[bytes]:
    keys = topic_keys(topic)
    plan = spark_source._WritePlan("", keys, None, "payload", 100, Retention())
    built: list[Any] = []

    def build(pipe: Any, chunk: list[bytes]) -> Any:
        built.append(chunk)
        groups = sorted(text(g) for g in pipe.hkeys(keys.groups))
        group_keys = [key for group in groups for key in keys.group(group).all]
        from rotator import commands  # noqa: PLC0415

        return commands.tpublish((*keys.all, *group_keys), 100_000, 0, chunk)

    assert plan.marker("x") == f"rotator:{{{topic}}}:spark:x"
    return rspark.TransactionPusher(client, marker, build, (keys.groups,))


def test_a_publish_rerun_after_a_crash_publishes_only_the_missing_chunks(
    client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("all")
    marker = f"rotator:{{{queue_name}}}:spark:write:run:0"
    payloads = [f"m{n:03d}".encode() for n in range(250)]

    def dies_after_120() -> Iterator[bytes]:
        yield from payloads[:120]
        raise RuntimeError("the task died")

    pusher = publish_pusher(client, queue_name, marker)
    with pytest.raises(RuntimeError):
        rspark.push_chunks(pusher.push, dies_after_120(), 50)
    assert topic.stats().last_seq == 100  # two whole chunks
    assert rspark.push_chunks(pusher.push, payloads, 50) == 250
    assert rspark.push_chunks(pusher.push, payloads, 50) == 250  # a late speculative copy
    bodies = client.hgetall(topic.keys.bodies)
    assert sorted(bodies.values()) == payloads  # each message once
    assert topic.stats().groups["all"].pending == 250
    assert client.hget(marker, "chunks") == b"5"
    assert 0 < client.ttl(marker) <= 86_400


def test_two_attempts_publishing_at_once_publish_each_chunk_once(
    server: ServerProcess, queue_name: str
) -> None:
    marker = f"rotator:{{{queue_name}}}:spark:write:run:0"
    payloads = [str(n).encode() for n in range(3000)]
    counts: list[int] = []

    def attempt() -> None:
        with server.client() as own:
            counts.append(rspark.push_chunks(publish_pusher(own, queue_name, marker).push,
                                             payloads, 20))  # fmt: skip

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert counts == [3000, 3000]
    with server.client() as client:
        assert Counter(client.hvals(topic_keys(queue_name).bodies)) == Counter(payloads)


def test_a_chunk_whose_push_fails_is_not_counted(client: redis.Redis, queue_name: str) -> None:
    """A payload write goes as ``once`` before ``pushp``: refused, it writes nothing, its
    marker neither; the same write succeeds once the queue is fixed, and counts its chunk."""
    keys = queue_keys(queue_name)
    marker = f"rotator:{{{queue_name}}}:spark:write:run:0"
    plan = spark_source._WritePlan("", keys, "id", "payload", 10, Retention())
    client.set(keys.ring, "not a list")
    table = pa.table({"id": ["b", "a"], "payload": [b"2", b"1"]})
    with pytest.raises(WrongKeyType):
        plan._push(client, table, marker, 60)
    assert client.exists(marker) == 0  # nothing written
    client.delete(keys.ring)
    client.script_flush()  # (the pusher loads the module again)
    assert plan._push(client, table, marker, 60) == 2
    assert client.hget(marker, "chunks") == b"1"
    assert plan._push(client, table, marker, 60) == 2  # counted: nothing pushed again
    jobs = Rotator(client, queue_name, payloads=True).next(10)
    assert sorted((job.id, job.payload) for job in jobs) == [("a", b"1"), ("b", b"2")]


def test_a_transaction_whose_publish_fails_moves_its_marker_back(
    client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("all")
    ring = topic.group_keys("all").ring
    client.set(ring, "not a list")
    marker = f"rotator:{{{queue_name}}}:spark:write:run:0"
    pusher = publish_pusher(client, queue_name, marker)
    with pytest.raises(WrongKeyType):
        rspark.push_chunks(pusher.push, [b"m1", b"m2"], 10)
    assert client.hget(marker, "chunks") == b"0"  # moved back: the chunk is not counted
    client.delete(ring)
    assert rspark.push_chunks(pusher.push, [b"m1", b"m2"], 10) == 2
    assert rspark.push_chunks(pusher.push, [b"m1", b"m2"], 10) == 2  # counted
    assert topic.stats().last_seq == 2


def test_a_group_registering_during_a_publish_gets_the_chunk_or_came_after_it(
    client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("early")
    marker = f"rotator:{{{queue_name}}}:spark:write:run:0"
    pusher = publish_pusher(client, queue_name, marker)
    original = pusher.build

    def registers_a_group_first(pipe: Any, chunk: list[bytes]) -> Any:
        call = original(pipe, chunk)
        if topic.groups() != ["early", "late"]:
            topic.subscribe("late")  # the watched groups hash changes: EXEC must abort
        return call

    pusher.build = registers_a_group_first
    assert pusher.push(0, [b"x"]) == 1
    stats = topic.stats()
    assert stats.last_seq == 1
    assert stats.groups["early"].pending == 1
    assert stats.groups["late"].pending == 1  # published after the group registered


# -- batch writes and reads ---------------------------------------------------------------------


def test_a_batch_write_pushes_every_id_once_and_a_read_shows_them(
    registered: SparkSession, url: str, conn: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    ids = [f"order-{n}" for n in range(5000)]
    for part in range(3):
        pq.write_table(pa.table({"order": ids[part::3]}), tmp_path / f"part-{part}.parquet")
    df = registered.read.parquet(str(tmp_path))
    assert df.rdd.getNumPartitions() >= 2
    df.write.format("rotator").option("url", url).option("queue", queue_name).option(
        "column", "order"
    ).option("batchSize", "700").mode("append").save()
    assert ring_ids(conn, queue_name) == Counter(ids)

    snapshot = reader(registered, url, queue=queue_name).load()
    assert snapshot.columns == [
        "id", "state", "stamp_ms", "age_ms", "deliveries", "reclaimed", "payload",
    ]  # fmt: skip
    rows = snapshot.collect()
    assert sorted(row.id for row in rows) == sorted(ids)
    assert {row.state for row in rows} == {"pending"}
    same = rspark.snapshot(registered, queue_name, url=url)
    assert sorted(tuple(r) for r in same.collect()) == sorted(tuple(r)[:5] for r in rows)


def test_a_batch_write_with_payloads_and_a_topic_write_then_read(
    registered: SparkSession, url: str, conn: redis.Redis, queue_name: str
) -> None:
    df = registered.createDataFrame([(n, f"body {n}") for n in range(300)], "n int, body string")
    df.write.format("rotator").option("url", url).option("queue", queue_name).option(
        "column", "n"
    ).option("payloadColumn", "body").mode("append").save()
    queue = Rotator(conn, queue_name, payloads=True)
    jobs = queue.next(1000)
    assert sorted((int(job.id), job.payload) for job in jobs) == [
        (n, f"body {n}".encode()) for n in range(300)
    ]

    topic = Topic(conn, queue_name)
    topic.subscribe("audit")
    df.repartition(2).write.format("rotator").option("url", url).option("topic", queue_name).option(
        "payloadColumn", "body"
    ).mode("append").save()
    messages = reader(registered, url, topic=queue_name).load()
    assert messages.columns == ["id", "seq", "ms", "payload"]
    rows = messages.orderBy("seq").collect()
    assert [row.seq for row in rows] == list(range(1, 301))
    assert sorted(row.payload for row in rows) == sorted(f"body {n}".encode() for n in range(300))
    assert all(row.id == f"{row.ms}-{row.seq}" for row in rows)
    assert topic.stats().groups["audit"].pending == 300


@pytest.mark.parametrize("sentinel_group_process", ["valkey"], indirect=True)
def test_spark_reaches_queues_and_topics_behind_sentinel_through_their_url(
    registered: SparkSession, sentinel_group: SentinelGroup, queue_name: str
) -> None:
    """A ``redis+sentinel://`` URL, as Spark's executors resolve it: the master the
    Sentinels name. push_dataframe, the data source's writes and reads, and drain."""
    url = sentinel_group.url
    ids = [f"job-{n}" for n in range(600)]
    df = registered.createDataFrame([(job_id,) for job_id in ids], "id string").repartition(2)
    assert rspark.push_dataframe(df, queue_name, url=url, batch_size=100) == 600
    with sentinel_group.master().client() as master:
        assert ring_ids(master, queue_name) == Counter(ids)
        snapshot = reader(registered, url, queue=queue_name).load()
        assert {(row.id, row.state) for row in snapshot.collect()} == {(i, "pending") for i in ids}

        ran = rspark.drain(registered, queue_name, noop, url=url, parallelism=2, poll=0.2)
        assert Counter(row.id for row in ran.collect()) == Counter(ids)
        assert Rotator(master, queue_name).stats().length == 0

        topic = Topic(master, queue_name)
        topic.subscribe("audit")
        bodies = registered.createDataFrame([(f"body {n}",) for n in range(50)], "payload string")
        bodies.write.format("rotator").option("url", url).option("topic", queue_name).mode(
            "append"
        ).save()
        read = reader(registered, url, topic=queue_name).load().collect()
        assert sorted(row.payload for row in read) == sorted(
            f"body {n}".encode() for n in range(50)
        )
        assert topic.stats().groups["audit"].pending == 50


def test_a_write_schedules_prioritises_or_skips_held_ids_as_push_does(
    registered: SparkSession, url: str, conn: redis.Redis, queue_name: str
) -> None:
    """``delay``/``at``, ``priority`` and ``unique``: the options of Rotator.push, for every row."""
    rows = registered.createDataFrame(
        [(f"j{n}", f"body {n}") for n in range(40)], "id string, body string"
    )
    tomorrow = datetime.now(UTC) + timedelta(days=1)

    def write(df: DataFrame, target: str, **options: str) -> None:
        df.write.format("rotator").option("url", url).option("queue", target).options(
            **options
        ).mode("append").save()

    write(rows.limit(10), f"{queue_name}-later", delay="3600")
    write(rows.limit(10), f"{queue_name}-at", at=tomorrow.isoformat())
    write(rows.limit(5), f"{queue_name}-unix", at=str(tomorrow.timestamp()))
    write(rows.limit(10), f"{queue_name}-low", priority="7")
    write(rows.limit(10), f"{queue_name}-bodies", delay="3600", payloadColumn="body")
    later, at, low = (Rotator(conn, f"{queue_name}-{tag}") for tag in ("later", "at", "low"))
    assert (later.stats().scheduled, later.stats().pending) == (10, 0)
    assert at.stats().scheduled == 10
    assert Rotator(conn, f"{queue_name}-unix").stats().scheduled == 5
    assert (low.stats().prioritized, low.stats().pending) == (10, 10)
    bodies = Rotator(conn, f"{queue_name}-bodies", payloads=True)
    assert bodies.stats().scheduled == 10
    assert conn.hget(bodies.keys.payloads, "j3") == b"body 3"

    tracked = Rotator(conn, queue_name)
    tracked.configure(track_ids=True)
    tracked.push("j0", "j1")
    write(rows, queue_name, unique="true", batchSize="7")
    assert ring_ids(conn, queue_name) == Counter(f"j{n}" for n in range(40))  # j0, j1 once
    write(rows, queue_name, unique="true")  # a second run: everything is held
    assert tracked.stats().pending == 40


def test_a_unique_write_to_a_queue_that_does_not_track_ids_fails_and_pushes_nothing(
    registered: SparkSession, url: str, conn: redis.Redis, queue_name: str
) -> None:
    rows = registered.createDataFrame([("a",), ("b",)], "id string")
    with pytest.raises(rspark.SparkFailure, match=r"NotTracked|ROTATOR_NOTTRACKED"):
        rows.write.format("rotator").option("url", url).option("queue", queue_name).option(
            "unique", "true"
        ).mode("append").save()
    assert Rotator(conn, queue_name).stats().pushed == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queue": "q"}, 'needs .option("url"'),
        ({"url": "redis://x", "queue": "q", "topic": "t"}, "exactly one of the options queue"),
        ({"url": "redis://x", "queue": "q", "delay": "soon"}, "option delay must be seconds"),
        ({"url": "redis://x", "queue": "q", "delay": "-1"}, "delay must be"),
        ({"url": "redis://x", "queue": "q", "at": "noon"}, "option at must be unix seconds"),
        ({"url": "redis://x", "queue": "q", "at": "2026-12-01T09:00"}, "timezone-aware"),
        ({"url": "redis://x", "queue": "q", "delay": "5", "at": "1"}, "give delay or at, not both"),
        ({"url": "redis://x", "queue": "q", "priority": "10"}, "priority must be"),
        ({"url": "redis://x", "queue": "q", "unique": "yes"}, "unique must be true or false"),
        ({"url": "redis://x", "topic": "t", "delay": "5"}, "'delay' does not apply to a topic"),
        (
            {"url": "redis://x", "queue": "q", "priority": "1", "payloadColumn": "id"},
            "priority does not apply to jobs with payloads",
        ),
        ({"url": "redis://x", "queue": "q", "colum": "id"}, "unknown option 'colum'"),
        ({"url": "redis://x", "queue": "q", "column": "nope"}, "no column 'nope'"),
        ({"url": "redis://x", "queue": "q", "column": "when"}, "job ids are strings or integers"),
        ({"url": "redis://x", "queue": "a b"}, "queue name must be"),
        ({"url": "redis://x", "topic": "t", "column": "id"}, "'column' does not apply to a topic"),
        ({"url": "redis://x", "queue": "q", "batchSize": "0"}, "batchSize must be"),
    ],
)
def test_bad_write_options_are_refused_with_a_clear_error(
    registered: SparkSession, options: dict[str, str], message: str
) -> None:
    df = registered.createDataFrame([("a", 1.5)], "id string, when double")
    with pytest.raises(rspark.SparkFailure, match=re.escape(message)):
        df.write.format("rotator").options(**options).mode("append").save()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "t", "startingOffsets": "soon"}, "startingOffsets must be earliest, latest"),
        ({"topic": "t", "failOnDataLoss": "maybe"}, "failOnDataLoss must be true or false"),
        ({"topic": "t", "leaseSeconds": "5"}, "'leaseSeconds' does not apply to a topic read"),
        ({"queue": "q", "startingOffsets": "earliest"}, "does not apply to a queue read"),
        ({"queue": "q", "leaseSeconds": "-1"}, "leaseSeconds must be more than 0"),
    ],
)
def test_bad_stream_options_are_refused_with_a_clear_error(
    registered: SparkSession, url: str, options: dict[str, str], message: str
) -> None:
    stream = reader(registered, url, stream=True, **options)
    with pytest.raises(rspark.SparkFailure, match=re.escape(message)):
        run_to_end(stream.load().writeStream.format("memory").queryName("bad").start())


def test_overwrite_is_refused(registered: SparkSession, url: str, queue_name: str) -> None:
    df = registered.createDataFrame([("a",)], "id string")
    with pytest.raises(rspark.SparkFailure, match="only appends"):
        df.write.format("rotator").option("url", url).option("queue", queue_name).mode(
            "overwrite"
        ).save()


# -- streaming a topic --------------------------------------------------------------------------


def topic_query(
    spark: SparkSession, url: str, topic: str, checkpoint: Path, out: Path, **options: str
) -> StreamingQuery:
    stream = reader(spark, url, stream=True, topic=topic, **options).load()
    query: StreamingQuery = (
        stream.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    return query


def run_to_end(query: StreamingQuery) -> list[int]:
    """Processes what is there, stops; the sizes of the batches that read something."""
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def test_a_topic_stream_restarted_from_its_checkpoint_loses_and_doubles_nothing(
    registered: SparkSession, url: str, conn: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    topic = Topic(conn, queue_name)
    topic.publish_many([f"before {n}" for n in range(40)])  # before the query: not read
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    query = topic_query(registered, url, queue_name, checkpoint, out,
                        maxMessagesPerTrigger="25")  # fmt: skip
    query.processAllAvailable()  # the first batch fixes the start: latest, seq 40
    topic.publish_many([f"one {n}" for n in range(60)])
    sizes = run_to_end(query)
    assert sizes == [25, 25, 10]  # maxMessagesPerTrigger

    topic.publish_many([f"two {n}" for n in range(30)])  # while the query is down
    replayed = drop_last_commit(checkpoint)  # and its last batch is run again
    sizes = run_to_end(topic_query(registered, url, queue_name, checkpoint, out,
                                   maxMessagesPerTrigger="25"))  # fmt: skip
    # Batch `replayed` runs again (the file sink keeps its first output), then the new 30.
    assert sizes[-2:] == [25, 5], f"after batch {replayed}: {sizes}"
    rows = registered.read.parquet(str(out)).collect()
    assert sorted(row.seq for row in rows) == list(range(41, 131))  # each once, none lost
    expected = [f"one {n}" for n in range(60)] + [f"two {n}" for n in range(30)]
    assert [row.payload.decode() for row in sorted(rows, key=lambda r: r.seq)] == expected


def test_a_topic_stream_reports_messages_that_left_retention(
    registered: SparkSession, url: str, conn: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    topic = Topic(conn, queue_name, retention=Retention(count=10))
    topic.publish_many([f"m{n}" for n in range(5)])
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    assert run_to_end(topic_query(registered, url, queue_name, checkpoint, out,
                                  startingOffsets="earliest")) == [5]  # fmt: skip
    topic.publish_many([f"m{n}" for n in range(5, 30)])  # seqs 6..20 leave retention unread
    query = topic_query(registered, url, queue_name, checkpoint, out)
    with pytest.raises(rspark.SparkFailure, match=r"15 messages \(seq 6\.\.20\) left retention"):
        run_to_end(query)

    sizes = run_to_end(topic_query(registered, url, queue_name, checkpoint, out,
                                   failOnDataLoss="false"))  # fmt: skip
    assert sizes == [10]
    seqs = sorted(row.seq for row in registered.read.parquet(str(out)).collect())
    assert seqs == [1, 2, 3, 4, 5, *range(21, 31)]


def test_reading_a_topics_seqs_expands_its_runs_in_pages_and_names_what_left(
    conn: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = Topic(conn, queue_name, retention=Retention(count=100))
    ids = topic.publish_many(["a"] * 3) + topic.publish_many(["b"] * 4)  # runs: seqs 1-3, 4-7
    ids += topic.publish_many(["c"] * 2)  # seqs 8-9
    assert (
        Topic(conn, queue_name, retention=Retention(count=5)).trim() == 4
    )  # 1-4: a run and a half
    monkeypatch.setattr(spark_source, "SPARK_READ_PAGE", 2)  # pages that begin and end inside runs
    pages = list(spark_source.read_messages(conn, topic.keys, 2, 9))
    rows = [row for batch, _ in pages for row in batch.to_pylist()]
    assert [(row["id"], row["seq"], row["payload"]) for row in rows] == [
        (ids[seq - 1], seq, b"b" if seq < 8 else b"c") for seq in range(5, 10)
    ]
    assert [gap for _, gaps in pages for gap in gaps] == [(2, 4)]
    assert [row["ms"] for row in rows] == [int(ids[seq - 1].split("-")[0]) for seq in range(5, 10)]
    topic.delete()


def test_a_topic_stream_starts_at_a_given_seq(
    registered: SparkSession, url: str, conn: redis.Redis, queue_name: str
) -> None:
    Topic(conn, queue_name).publish_many([f"m{n}" for n in range(1, 21)])
    stream = reader(registered, url, stream=True, topic=queue_name, startingOffsets="15").load()
    query = stream.writeStream.format("memory").queryName(queue_name.replace("-", "_")).start()
    run_to_end(query)
    seqs = [row.seq for row in registered.table(queue_name.replace("-", "_")).collect()]
    assert sorted(seqs) == list(range(15, 21))


# -- streaming a queue --------------------------------------------------------------------------


class FailingSink:
    """A foreachBatch sink that notes each batch's rows in Redis, failing once on batch
    ``fail_on`` after noting it (the query dies before Spark commits that batch)."""

    def __init__(self, url: str, key: str, fail_on: int | None) -> None:
        self.url, self.key, self.fail_on = url, key, fail_on

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        rows = batch.select("id", "deliveries", "reclaimed", "state").collect()
        with redis.Redis.from_url(self.url) as client:
            client.rpush(self.key, json.dumps([batch_id, [list(row) for row in rows]]))
        if batch_id == self.fail_on:
            raise RuntimeError(f"the sink died in batch {batch_id}")


def noted(conn: redis.Redis, key: str) -> list[Any]:
    """What the sink noted: ``[batch id, [[id, deliveries, reclaimed, state], ...]]`` each."""
    return [json.loads(raw) for raw in conn.lrange(key, 0, -1)]


def queue_query(
    spark: SparkSession, url: str, queue: str, checkpoint: Path, sink: FailingSink
) -> StreamingQuery:
    stream = reader(spark, url, stream=True, queue=queue, maxJobsPerTrigger="40",
                    leaseSeconds="60").load()  # fmt: skip
    writer = stream.writeStream.foreachBatch(sink)
    query: StreamingQuery = writer.option("checkpointLocation", str(checkpoint)).start()
    return query


def test_a_queue_stream_that_dies_mid_batch_delivers_that_batch_again_and_acks_it(
    registered: SparkSession, url: str, conn: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    queue = Rotator(conn, queue_name)
    ids = [f"job-{n:03d}" for n in range(100)]
    queue.push_many(ids)
    key, checkpoint = f"{queue_name}:sink", tmp_path / "checkpoint"
    with pytest.raises(rspark.SparkFailure, match="the sink died in batch 1"):
        run_to_end(queue_query(registered, url, queue_name, checkpoint,
                               FailingSink(url, key, fail_on=1)))  # fmt: skip
    first = noted(conn, key)
    assert [batch for batch, _ in first] == [0, 1]
    assert all(len(rows) == 40 for _, rows in first)  # maxJobsPerTrigger
    died = sorted(row[0] for row in first[1][1])
    stats = queue.stats()
    assert stats.in_flight == 40  # batch 0 was acked; the dead batch's jobs are still held
    assert stats.pending == 20

    run_to_end(queue_query(registered, url, queue_name, checkpoint, FailingSink(url, key, None)))
    again = noted(conn, key)[2:]
    assert again[0][0] == 1  # the restart ran batch 1 again, with the same jobs
    assert sorted(row[0] for row in again[0][1]) == died
    delivered = [row[0] for _, rows in [first[0], *again] for row in rows]
    assert Counter(delivered) == Counter(ids)  # committed batches: every job once
    assert all(row[3] == "leased" for _, rows in again for row in rows)
    stats = queue.stats()
    assert (stats.pending, stats.in_flight, stats.overdue) == (0, 0, 0)  # all acked
    assert not list(conn.scan_iter(match=f"rotator:{{{queue_name}}}:spark:consume:*"))


def test_a_queue_stream_reads_payloads_and_dead_letters_past_max_deliveries(
    registered: SparkSession, url: str, conn: redis.Redis, queue_name: str, tmp_path: Path
) -> None:
    queue = Rotator(conn, queue_name, payloads=True, timeout=0.2)
    queue.push_payloads({"a": b"alpha", "b": b"beta"})
    (held,) = queue.next(1)  # a crashed worker's delivery: its lease runs out
    time.sleep(0.3)
    stream = reader(registered, url, stream=True, queue=queue_name, payloads="true",
                    maxDeliveries="1", leaseSeconds="60").load()  # fmt: skip
    name = f"q{abs(hash(queue_name))}"
    query = (
        stream.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    run_to_end(query)
    rows = registered.sql(f"select id, payload, deliveries from {name}").collect()
    got = {row["id"]: (bytes(row["payload"]), row["deliveries"]) for row in rows}
    other = "b" if held.id == "a" else "a"
    assert got == {other: ({"a": b"alpha", "b": b"beta"}[other], 1)}
    # The job delivered once before had its one delivery: a dead letter, not a row.
    assert [(letter.id, letter.reason) for letter in queue.dead()] == [(held.id, "max_deliveries")]


# -- streaming writes ---------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["queue", "topic"])
def test_a_stream_write_restarted_mid_stream_pushes_each_row_once(
    *,
    registered: SparkSession,
    url: str,
    conn: redis.Redis,
    queue_name: str,
    tmp_path: Path,
    target: str,
) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    ids = [f"r{n:04d}" for n in range(600)]
    for part in range(3):
        pq.write_table(pa.table({"id": ids[part * 200 : (part + 1) * 200]}),
                       source / f"part-{part}.parquet")  # fmt: skip
    if target == "topic":
        Topic(conn, queue_name).subscribe("all")

    def start() -> StreamingQuery:
        stream = registered.readStream.schema("id string").option("maxFilesPerTrigger", 1)
        writer = stream.parquet(str(source)).writeStream.format("rotator").option("url", url)
        if target == "topic":
            writer = writer.option("topic", queue_name).option("payloadColumn", "id")
        else:
            writer = writer.option("queue", queue_name)
        return writer.option("batchSize", "64").option("checkpointLocation",
                                                        str(checkpoint)).start()  # fmt: skip

    assert run_to_end(start()) == [200, 200, 200]
    drop_last_commit(checkpoint)  # the last batch was pushed; its commit is forgotten
    pq.write_table(pa.table({"id": ["late-1", "late-2"]}), source / "part-3.parquet")
    assert run_to_end(start()) == [200, 2]  # batch 2 again, then the new file

    expected = Counter([*ids, "late-1", "late-2"])
    if target == "queue":
        assert ring_ids(conn, queue_name) == expected
    else:
        assert Counter(text(v) for v in conn.hvals(topic_keys(queue_name).bodies)) == expected
    markers = list(conn.scan_iter(match=f"rotator:{{{queue_name}}}:spark:stream:*"))
    assert markers
    assert all(86_400 < conn.ttl(marker) <= spark_source.STREAM_RECORD_TTL for marker in markers)


# -- on a standalone cluster: a driver killed mid-batch -----------------------------------------

DRIVER = """
import json, sys, time
import redis
from pyspark.sql import SparkSession
from rotator import spark as rspark

master, url, queue, checkpoint, key, mode = sys.argv[1:]
spark = (SparkSession.builder.master(master).appName("rotator-stream-test")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.memory", "512m").getOrCreate())
rspark.register(spark)
side = redis.Redis.from_url(url)

def sink(batch, batch_id):
    rows = [list(row) for row in batch.select("id", "deliveries", "reclaimed").collect()]
    side.rpush(key, json.dumps([mode, batch_id, rows]))
    if mode == "hang" and batch_id == 1:
        side.set(key + ":hung", "1")
        time.sleep(600)  # killed here, mid-batch

stream = (spark.readStream.format("rotator").option("url", url).option("queue", queue)
          .option("leaseSeconds", "3").option("maxJobsPerTrigger", "50").load())
query = stream.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint).start()
from rotator import Rotator
work = Rotator.from_url(url, queue)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    query.processAllAvailable()
    stats = work.stats()
    if stats.pending == 0 and stats.in_flight == 0 and stats.overdue == 0:
        break
    time.sleep(0.5)
query.processAllAvailable()
query.stop()
spark.stop()
"""


def driver(master: str, url: str, queue: str, checkpoint: Path, mode: str) -> Any:
    """A driver process running DRIVER's query; its sink notes batches at ``<queue>:sink``."""
    key = f"{queue}:sink"
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, master, url, queue, str(checkpoint), key, mode],
        cwd=ROOT,
        env={**os.environ, **python_env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the driver and its JVM: one group, killed together
    )


def test_a_queue_stream_killed_mid_batch_has_its_jobs_reclaimed_and_delivered_again(
    spark_master: str, valkey_server: ServerProcess, queue_name: str, tmp_path: Path
) -> None:
    url, key = valkey_server.url, f"{queue_name}:sink"
    ids = [f"k{n:03d}" for n in range(200)]
    with valkey_server.client() as client:
        queue = Rotator(client, queue_name)
        queue.push_many(ids)
        doomed = driver(spark_master, url, queue_name, tmp_path / "first", "hang")
        deadline = time.monotonic() + RUN_TIMEOUT
        while not client.exists(f"{key}:hung"):
            assert doomed.poll() is None, doomed.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the first driver never reached batch 1"
            time.sleep(0.2)
        os.killpg(doomed.pid, signal.SIGKILL)  # the driver and its JVM, mid-batch
        doomed.communicate()
        held = queue.stats()
        assert held.in_flight + held.overdue == 50  # batch 1's jobs: leased, never acked

        # Another query (a checkpoint of its own) takes the queue over.
        heir = driver(spark_master, url, queue_name, tmp_path / "second", "run")
        _, err = heir.communicate(timeout=RUN_TIMEOUT)
        assert heir.returncode == 0, err[-3000:]
        stats = queue.stats()
        assert (stats.pending, stats.in_flight, stats.overdue, stats.dead) == (0, 0, 0, 0)
        noted = [json.loads(raw) for raw in client.lrange(key, 0, -1)]

    first = {b: rows for mode, b, rows in noted if mode == "hang"}
    lost_batch = sorted(row[0] for row in first[1])
    second = [row for mode, _, rows in noted if mode == "run" for row in rows]
    committed = [row[0] for row in first[0]] + [row[0] for row in second]
    assert Counter(committed) == Counter(ids)  # every job delivered into a committed batch once
    again = sorted(row[0] for row in second if row[2])
    assert again == lost_batch  # the killed batch's jobs came back, reclaimed
    assert all(row[1] == 2 for row in second if row[2])
    assert all(row[1] == 1 for row in second if not row[2])


# -- the README ---------------------------------------------------------------------------------


def test_the_readme_streaming_example_runs_as_written(
    registered: SparkSession,
    url: str,
    conn: redis.Redis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    headlines = Topic(conn, "headlines")
    headlines.delete()  # the README's name
    try:
        test_spark.run_readme_block("spark-stream-example", url, tmp_path, monkeypatch)
        table = pq.read_table(tmp_path / "headlines.parquet")
        assert sorted(table.column("seq").to_pylist()) == list(range(1, 151))
        assert (tmp_path / "headlines.checkpoint" / "offsets").is_dir()
    finally:
        headlines.delete()
