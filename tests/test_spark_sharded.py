"""rotator.spark on sharded queues (issue 19): ``push_dataframe`` and ``drain`` with
``shards``, against the real 3-master Redis Cluster of the ``cluster`` fixture and the shared
``local[2]`` Spark session of test_spark.py (``spark.task.maxFailures=1``: a retry cannot
hide a double push or run, so the tests re-run tasks themselves).

Without Spark, on the cluster: a partition pushed again after dying midway, two attempts of
one partition at once, and a journal row whose write failed.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from pyspark import TaskContext
from redis.cluster import RedisCluster
from redis.exceptions import ResponseError

from rotator import InvalidArgument, InvalidJobId, Job, ShardedRotator, ShardsMismatch
from rotator.cli import main
from rotator.protocol import text
from tests import test_spark
from tests.servers import ClusterProcess
from tests.test_spark import noop, rows

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import DataFrame, SparkSession

    from rotator import spark as rspark
except ImportError as missing:
    pytest.fail(
        f"{missing}: the Spark tests need the spark extra: pip install -e '.[dev]'", pytrace=False
    )

pytestmark = pytest.mark.cluster

spark = test_spark.spark  # the shared local[2] session
SHARDS = 6
DAY = 86_400


@pytest.fixture
def url(cluster: ClusterProcess) -> str:
    """Any node of the cluster: the client learns the others."""
    return cluster.nodes[0].url


def shard_rings(client: RedisCluster, queue: ShardedRotator) -> list[Counter[str]]:
    """How often each id is in each shard's ring, whatever its state; shard 0 first."""
    found = []
    for k in range(queue.shards):
        elements = client.lrange(queue.shard(k).keys.ring, 0, -1)
        found.append(Counter(text(e).partition("*")[0] for e in elements if e != b"*lap"))
    return found


def assert_each_id_once_in_its_shard(
    client: RedisCluster, queue: ShardedRotator, ids: Iterable[str]
) -> None:
    """Every id in exactly one shard, each shard's ids those crc32 routes there, and the
    shards that hold ids on every master."""
    found = shard_rings(client, queue)
    routed: list[Counter[str]] = [Counter() for _ in range(queue.shards)]
    for job_id in ids:
        routed[zlib.crc32(job_id.encode()) % queue.shards][job_id] += 1
    assert max(max(c.values(), default=0) for c in routed) == 1, "the ids given repeat"
    assert found == routed
    placement = queue.placement()
    assert len({placement[k] for k, ring in enumerate(found) if ring}) == 3


def push_markers(client: RedisCluster, name: str) -> dict[str, int]:
    """Each shard push marker of queue ``name`` (every master's keys): its chunk count."""
    found = {}
    for key in client.scan_iter(match=f"rotator:{{{name}:*:spark:push:*"):
        found[text(key)] = int(client.hget(key, "chunks") or 0)
    return found


def tag_of(key: str) -> str:
    return key[key.index("{") + 1 : key.index("}")]


_SIDE: dict[str, RedisCluster] = {}


def side(url: str) -> RedisCluster:
    """The cluster, from a handler (one client per executor process)."""
    if url not in _SIDE:
        _SIDE[url] = RedisCluster.from_url(url)
    return _SIDE[url]


def note_run(url: str, key: str, job_id: str) -> None:
    """Records on the cluster that a handler ran."""
    side(url).rpush(key, job_id)


_JOINED: set[tuple[str, int]] = set()  # (key, partition) of the tasks of this process that met


def meet(url: str, key: str, tasks: int, timeout: float = 30.0) -> None:
    """Holds a drain task's first job until ``tasks`` tasks each hold one, so that every task
    takes work however late Spark starts one (on a loaded machine the first task once drained
    the whole queue before the second began)."""
    context = TaskContext.get()
    assert context is not None, "meet() runs in a Spark task"
    partition = context.partitionId()
    if (key, partition) in _JOINED:
        return
    cluster = side(url)
    cluster.sadd(key, partition)
    deadline = time.monotonic() + timeout
    while cluster.scard(key) < tasks and time.monotonic() < deadline:
        time.sleep(0.01)
    _JOINED.add((key, partition))


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), env={"ROTATOR_URL": None}, catch_exceptions=False)


# -- the partition pusher, without Spark ----------------------------------------------------


def test_a_sharded_partition_rerun_after_a_crash_pushes_only_each_shards_missing_chunks(
    cluster_client: RedisCluster, queue_name: str
) -> None:
    queue = ShardedRotator(cluster_client, queue_name, shards=SHARDS)
    ids = [f"id-{n:04d}" for n in range(3000)]

    def dies_after_1700() -> Iterator[str]:
        yield from ids[:1700]
        raise RuntimeError("the task died")

    with pytest.raises(RuntimeError):
        rspark.push_sharded_partition(
            cluster_client, queue_name, "run:0", dies_after_1700(), 100, shards=SHARDS
        )
    partly = sum(ring.total() for ring in shard_rings(cluster_client, queue))
    assert 0 < partly < 1700
    assert partly % 100 == 0  # whole chunks only, of some shards

    pushed = rspark.push_sharded_partition(
        cluster_client, queue_name, "run:0", ids, 100, shards=SHARDS
    )
    assert pushed == len(ids)
    assert_each_id_once_in_its_shard(cluster_client, queue, ids)
    markers = push_markers(cluster_client, queue_name)
    assert {tag_of(key) for key in markers} == set(queue.shard_names)  # each in its shard
    per_shard = [ring.total() for ring in shard_rings(cluster_client, queue)]
    expected = {name: -(-n // 100) for name, n in zip(queue.shard_names, per_shard, strict=True)}
    assert {tag_of(key): chunks for key, chunks in markers.items()} == expected
    assert all(0 < cluster_client.ttl(key) <= DAY for key in markers)
    # A third run (a speculative copy finishing late) pushes nothing and counts everything.
    assert rspark.push_sharded_partition(
        cluster_client, queue_name, "run:0", ids, 100, shards=SHARDS
    ) == len(ids)  # fmt: skip
    assert_each_id_once_in_its_shard(cluster_client, queue, ids)
    assert queue.stats().pending == len(ids)


def test_two_attempts_of_a_sharded_partition_at_once_push_each_chunk_once(
    cluster: ClusterProcess, cluster_client: RedisCluster, queue_name: str
) -> None:
    ids = [str(n) for n in range(12_000)]
    counts: list[int] = []

    def attempt() -> None:
        own = cluster.client()
        try:
            counts.append(
                rspark.push_sharded_partition(own, queue_name, "run:0", ids, 50, shards=SHARDS)
            )
        finally:
            own.close()

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert counts == [12_000, 12_000]
    queue = ShardedRotator(cluster_client, queue_name, shards=SHARDS)
    assert_each_id_once_in_its_shard(cluster_client, queue, ids)


def test_a_journal_row_whose_write_failed_is_written_by_the_retried_ack(
    cluster_client: RedisCluster, queue_name: str
) -> None:
    journal = rspark._Journal(f"rotator:{{{queue_name}}}:spark:drain:test", 2)
    queue = rspark._JournalingShardedRotator(
        cluster_client, queue_name, shards=SHARDS, journal=journal
    )
    queue.push("a", "b", "c")
    jobs = queue.next(3)
    assert len(jobs) == 3
    for job in jobs:
        queue.record(job, "completed", 0.0)
    broken = journal.shard(jobs[0].token.encode())
    cluster_client.set(broken, "not a hash")  # the journal write fails: WRONGTYPE

    with pytest.raises(ResponseError):
        queue.ack(*jobs)
    assert queue.stats().in_flight == 3  # the ack waits for the rows

    cluster_client.delete(broken)
    assert queue.ack(*jobs) == 3  # the worker's retry of the call
    keys = journal.keys()
    written: set[Any] = set()
    for key in keys:
        written |= set(cluster_client.hgetall(key))
    assert written == {job.token.encode() for job in jobs}
    assert all(0 < cluster_client.ttl(key) <= DAY for key in keys)


# -- push_dataframe -------------------------------------------------------------------------


def order_ids(spark: SparkSession, count: int, partitions: int = 3) -> DataFrame:
    return spark.range(0, count, numPartitions=partitions).selectExpr(
        "concat('order-', CAST(id AS STRING)) AS id"
    )


def test_push_dataframe_sends_every_id_once_to_the_shard_crc32_routes_it_to(
    spark: SparkSession, url: str, cluster_client: RedisCluster, queue_name: str
) -> None:
    df = order_ids(spark, 5000)
    assert df.rdd.getNumPartitions() == 3

    assert rspark.push_dataframe(df, queue_name, url=url, shards=SHARDS, batch_size=200) == 5000

    queue = ShardedRotator(cluster_client, queue_name, shards=None)  # the stored count
    assert queue.shards == SHARDS
    ids = [f"order-{n}" for n in range(5000)]
    assert_each_id_once_in_its_shard(cluster_client, queue, ids)
    assert queue.stats().pending == 5000
    markers = push_markers(cluster_client, queue_name)
    assert len(markers) == 3 * SHARDS  # a marker per partition and shard, in the shard's slot
    assert {tag_of(key) for key in markers} == set(queue.shard_names)
    assert all(0 < cluster_client.ttl(key) <= DAY for key in markers)
    assert cluster_client.llen(queue.keys.wake) > 0  # blocked consumers were told


@dataclass(frozen=True)
class DiesOnce(rspark._PushTask):
    """A push task whose partition 1 dies after ``after`` ids the first time (``flag``, a
    file, says it has died), as an executor lost mid-partition."""

    flag: str = ""
    after: int = 0

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from super().__call__(self.feed(batches))

    def feed(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partition, _ = rspark._task()
        seen = 0
        for batch in batches:
            for start in range(0, batch.num_rows, 100):
                if partition == 1 and seen >= self.after and not Path(self.flag).exists():
                    Path(self.flag).touch()
                    raise RuntimeError("the executor was lost")
                piece = batch.slice(start, 100)
                seen += piece.num_rows
                yield piece


def test_a_push_task_that_dies_midway_and_runs_again_pushes_nothing_twice(
    spark: SparkSession, url: str, cluster_client: RedisCluster, queue_name: str, tmp_path: Path
) -> None:
    df = order_ids(spark, 5000)
    task = DiesOnce(url, queue_name, "run", 100, SHARDS, flag=str(tmp_path / "died"), after=1200)
    queue = ShardedRotator(cluster_client, queue_name, shards=SHARDS)

    with pytest.raises(rspark.SparkFailure):
        rspark._push_ids(df, task)
    partly = sum(ring.total() for ring in shard_rings(cluster_client, queue))
    assert 0 < partly < 5000  # partition 1 had pushed some chunks of its shards

    # What Spark's retry of the tasks does: the same tasks, their markers, their rows.
    assert rspark._push_ids(df, task) == 5000
    ids = [f"order-{n}" for n in range(5000)]
    assert_each_id_once_in_its_shard(cluster_client, queue, ids)
    assert rspark._push_ids(df, task) == 5000  # a speculative copy finishing late
    assert_each_id_once_in_its_shard(cluster_client, queue, ids)
    assert queue.stats().pending == 5000


def test_a_mismatched_shard_count_or_a_bad_id_raises_before_anything_is_pushed(
    spark: SparkSession, url: str, cluster_client: RedisCluster, queue_name: str
) -> None:
    queue = ShardedRotator(cluster_client, queue_name, shards=SHARDS)
    queue.push("kept")
    df = spark.createDataFrame([("a",), ("b",)], "id string")

    with pytest.raises(ShardsMismatch, match="stored with 6 shards"):
        rspark.push_dataframe(df, queue_name, url=url, shards=4)
    with pytest.raises(ShardsMismatch, match="stored with 6 shards"):
        rspark.drain(spark, queue_name, noop, url=url, shards=4)
    with pytest.raises(InvalidArgument, match="shards"):
        rspark.push_dataframe(df, queue_name, url=url, shards=0)
    bad = spark.createDataFrame([("fine",), ("a*b",)], "id string")
    with pytest.raises(InvalidJobId, match="1 invalid job ids"):
        rspark.push_dataframe(bad, queue_name, url=url, shards=SHARDS)

    assert sum(shard_rings(cluster_client, queue), Counter()) == Counter(["kept"])
    assert push_markers(cluster_client, queue_name) == {}
    assert ShardedRotator(cluster_client, queue_name, shards=None).shards == SHARDS


# -- drain ----------------------------------------------------------------------------------


def test_drain_completes_every_job_once_and_leaves_every_shard_drained(
    spark: SparkSession, url: str, cluster_client: RedisCluster, queue_name: str
) -> None:
    queue = ShardedRotator(cluster_client, queue_name, shards=SHARDS, timeout=0.5)
    ids = [f"j{n}" for n in range(5000)]
    assert queue.push_many(ids) == 5000
    held = queue.next(6)  # a consumer that dies holding six jobs: their leases run out
    runs = f"{queue_name}:runs"

    def handler(job: Job) -> None:
        meet(url, f"{runs}:tasks", 2)
        note_run(url, runs, job.id)

    results = rspark.drain(
        spark, queue_name, handler, url=url, shards=SHARDS, parallelism=2, poll=0.2
    )

    found = rows(results)
    assert Counter(row["id"] for row in found) == Counter(ids)  # one row per job
    assert {row["status"] for row in found} == {"completed"}
    assert Counter(text(run) for run in cluster_client.lrange(runs, 0, -1)) == Counter(ids)
    reclaimed = {row["id"]: row["deliveries"] for row in found if row["reclaimed"]}
    assert reclaimed == {job.id: 2 for job in held}
    assert all(row["deliveries"] == 1 for row in found if not row["reclaimed"])
    tasks = {row["worker"].rsplit(":", 1)[1] for row in found}
    assert tasks == {"task0.0", "task1.0"}  # both tasks took work
    assert queue.drained()
    assert [s.length for s in queue.shard_stats()] == [0] * SHARDS  # swept
    assert list(cluster_client.scan_iter(match=f"rotator:{{{queue_name}}}:spark:*")) == []
    assert results.count() == 5000  # materialized: counting again runs nothing


# -- the CLI --------------------------------------------------------------------------------


def test_cli_spark_push_and_drain_take_shards(
    spark: SparkSession, url: str, cluster_client: RedisCluster, queue_name: str, tmp_path: Path
) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("job\n" + "".join(f"j-{n}\n" for n in range(300)))
    push = ["--url", url, "spark", "push", queue_name, "--input", str(path), "--format", "csv",
            "--column", "job", "--shards", str(SHARDS), "--json"]  # fmt: skip

    result = invoke(*push)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == '{"pushed": 300}'
    queue = ShardedRotator(cluster_client, queue_name, shards=SHARDS)
    assert_each_id_once_in_its_shard(cluster_client, queue, [f"j-{n}" for n in range(300)])

    output = tmp_path / "results"
    drain = ["--url", url, "spark", "drain", queue_name, "--handler", "tests.test_spark:noop",
             "--output", str(output), "--parallelism", "2", "--json"]  # fmt: skip
    mismatched = invoke(*drain, "--shards", "4")
    assert mismatched.exit_code == 1
    assert mismatched.stderr.startswith(f"rotator: error: queue '{queue_name}' is stored with 6")
    assert not output.exists()

    drained = invoke(*drain, "--shards", str(SHARDS))
    assert drained.exit_code == 0, drained.stderr
    assert '"completed": 300' in drained.stdout
    table = pq.read_table(output)
    assert sorted(table.column("id").to_pylist()) == sorted(f"j-{n}" for n in range(300))
    assert queue.drained()

    no_url = invoke("spark", "push", queue_name, "--input", str(path), "--shards", "6")
    assert no_url.exit_code == 2
    assert "needs --url" in no_url.stderr
