"""ShardedRotator on real 3-master clusters, Redis 7.0 and Valkey 8.1: routing by id, shards
spread over the masters, the stored shard count, blocking wake-ups across shards, bounded
retries, and worker processes completing every job once; and on 3 masters with a replica
each (the `replicated_cluster` fixture: Redis 7.0, and Redis 8.2 and Valkey 8.1 with AOF on):
a master killed mid-run with durable pushes and acks, and a shard's slot migrated to another
master mid-run, while a producer pushes and worker processes run
(tests/test_sharded_durability.py has the rest of ``durability=``)."""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import ClusterDownError, ClusterError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rotator import (
    Durability,
    InvalidToken,
    Job,
    NotDurable,
    NotTracked,
    Rotator,
    ShardedRotator,
    ShardsMismatch,
    WrongKeyType,
)
from rotator.cli import main
from rotator.commands import once, push_chunk, push_ids
from rotator.protocol import Due
from rotator.retries import CONNECT_TIMEOUT, SOCKET_TIMEOUT, RetryingSender, retryable
from rotator.sending import cluster_socket_timeout
from rotator.sharded import WAKE_TOKENS, shard_names, shard_of_id
from tests.helpers import (
    EACH_PLAIN_CLUSTER,
    ON_EACH_CLUSTER,
    confirmed_acks,
    runs_after_confirmed_ack,
    worker_notes,
)
from tests.servers import ClusterProcess, ReplicatedClusterProcess

CLUSTER_KINDS = EACH_PLAIN_CLUSTER
ROOT = Path(__file__).resolve().parent.parent


def url_of(cluster: ClusterProcess) -> str:
    return cluster.nodes[0].url


def sharded(client: RedisCluster, name: str, shards: int = 6, **options: Any) -> ShardedRotator:
    return ShardedRotator(client, name, shards=shards, **options)


# -- no server ------------------------------------------------------------------------------


def test_shard_names_are_stable_and_spread_over_equal_slot_ranges() -> None:
    names = shard_names("orders", 6)
    assert names == shard_names("orders", 6)
    assert [name.split(".")[0] for name in names] == [f"orders:{k}" for k in range(6)]
    slots = [key_slot(name.encode()) for name in names]
    assert [slot * 6 // 16384 for slot in slots] == list(range(6))


def test_a_job_id_maps_to_one_shard_by_crc32() -> None:
    assert shard_of_id(b"job-1", 6) == zlib.crc32(b"job-1") % 6
    assert len({shard_of_id(f"j{i}".encode(), 6) for i in range(100)}) == 6


def test_only_calls_that_are_harmless_twice_are_retried_after_a_lost_connection() -> None:
    keys = ("k",) * 14
    lost = RedisConnectionError("Connection closed by server.")
    refused = RedisConnectionError("Error 111 connecting to 127.0.0.1:7000. Connection refused.")
    down = ClusterDownError("CLUSTERDOWN The cluster is down")
    plain = push_ids(keys[:13], [b"a"], None)
    marked = push_chunk(keys, 0, 60000, [b"a"])
    unique = push_ids(keys[:13], [b"a"], None, unique=True)
    assert not retryable(plain, lost)  # it may be in: pushing it again could double it
    assert retryable(plain, refused)  # never sent
    assert retryable(plain, down)  # refused by the cluster: nothing ran
    # redis-py followed ASK/TRYAGAIN 16 times (a slot migration), then gave up: nothing ran
    assert retryable(plain, ClusterError("TTL exhausted."))
    assert not retryable(plain, ClusterError("something else"))
    assert retryable(marked, lost)  # the marker makes the second try push nothing
    assert retryable(unique, lost)  # the id index does
    later = push_ids(keys[:13], [b"a"], Due(b"IN", 1000))
    assert not retryable(later, lost)
    assert retryable(once(later, "k", 0, 60000), lost)  # as `once`, under a marker


class _DownCluster:
    """A client whose every command gets CLUSTERDOWN."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        raise ClusterDownError("CLUSTERDOWN The cluster is down")

    def register_script(self, source: str) -> Any:
        return object()


def test_a_call_retries_cluster_errors_for_retry_for_seconds_and_no_longer() -> None:
    sender = RetryingSender(_DownCluster(), True, 0.5)
    began = time.monotonic()
    with pytest.raises(ClusterDownError):
        sender.perform(push_ids(("k",) * 13, [b"a"], None))
    assert 0.5 <= time.monotonic() - began < 1.0


# -- on the cluster -------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_a_rotator_from_url_on_a_cluster_fails_fast_on_a_dead_or_frozen_master(
    tmp_path: Path,
) -> None:
    """``Rotator.from_url(url, cluster=True)`` makes its client as ``cluster_client`` does:
    a call whose master was killed (no replica to take over) raises ConnectionError at once,
    and one whose master is frozen (SIGSTOP: it accepts connections and never answers, as a
    host gone from the network does) raises TimeoutError after the documented 5 s socket
    timeout, where redis-py's default client waits until the master comes back."""
    with ClusterProcess(tmp_path / "own") as own:  # a master dies: not the session's cluster
        queue = Rotator.from_url(url_of(own), "from-url", cluster=True)
        assert cluster_socket_timeout(queue.client) == SOCKET_TIMEOUT
        assert queue.push("a") == 1
        frozen = own.master_of_slot(key_slot(queue.keys.ring.encode()))
        frozen._signal(signal.SIGSTOP)
        try:
            began = time.monotonic()
            with pytest.raises(RedisTimeoutError):
                queue.stats()
            took = time.monotonic() - began
        finally:
            frozen._signal(signal.SIGCONT)
        assert SOCKET_TIMEOUT - 0.5 < took < SOCKET_TIMEOUT + CONNECT_TIMEOUT + 1, took
        assert queue.stats().pending == 1  # back: the client carries on
        frozen.kill9()
        began = time.monotonic()
        with pytest.raises(RedisConnectionError, match="Connection refused"):
            Rotator.from_url(url_of(own), "from-url", cluster=True).stats()
        assert time.monotonic() - began < CONNECT_TIMEOUT + 1
        queue.client.close()


@pytest.mark.cluster
def test_shards_spread_over_every_master(cluster_client: RedisCluster, queue_name: str) -> None:
    queue = sharded(cluster_client, queue_name)
    placement = queue.placement()
    assert len(set(placement)) == 3, placement
    # two shards per master, give or take the one whose slot range starts at 10922, the
    # second master's last slot (which side it lands on depends on the random name)
    assert Counter(placement).most_common(1)[0][1] in {2, 3}


@pytest.mark.cluster
def test_an_id_goes_to_one_shard_where_unique_pushes_and_cancels_find_it(
    cluster_client: RedisCluster, queue_name: str
) -> None:
    queue = sharded(cluster_client, queue_name, timeout=30)
    with pytest.raises(NotTracked):
        queue.push("a", unique=True)
    queue.configure(track_ids=True)
    ids = [f"job-{i}" for i in range(60)]
    assert queue.push(*ids) == 60
    for k, stats in enumerate(queue.shard_stats()):
        assert stats.pending == sum(queue.shard_of(i) == k for i in ids)
    assert queue.push(*ids[:10], unique=True) == 0  # each held already, on its own shard
    assert queue.cancel("job-3", "job-7", "nope") == 2
    assert queue.push("job-3", unique=True) == 1  # cancelled: free again at once
    seen = []
    while jobs := queue.next(25):
        seen += [job.id for job in jobs]
        assert queue.ack(*jobs) == len(jobs)
    assert sorted(seen) == sorted(i for i in ids if i != "job-7")
    assert queue.stats().cancelled == 2  # job-3 counts too: it was cancelled, then pushed again


@pytest.mark.cluster
def test_pushes_keep_the_wake_list_short_and_trim_it_only_once_it_grows_past_that(
    cluster_client: RedisCluster, queue_name: str
) -> None:
    queue = sharded(cluster_client, queue_name)
    wake = queue.keys.wake
    calls: list[str] = []
    real: Callable[..., Any] = cluster_client.execute_command

    def counting(*args: Any, **options: Any) -> Any:
        calls.append(str(args[0]).upper())
        return real(*args, **options)

    cluster_client.execute_command = counting  # type: ignore[method-assign]
    try:
        queue.push("a", "b")  # 2 tokens: no trim
        assert cluster_client.llen(wake) == 2
        assert calls.count("LTRIM") == 0
        queue.push(*[f"job-{i}" for i in range(40)])  # 16 more: the list would hold 18
        assert cluster_client.llen(wake) == WAKE_TOKENS
        assert calls.count("LTRIM") == 1
    finally:
        del cluster_client.execute_command
    while jobs := queue.next(50):
        queue.ack(*jobs)


@pytest.mark.cluster
def test_the_stored_shard_count_refuses_another(
    cluster_client: RedisCluster, queue_name: str
) -> None:
    queue = sharded(cluster_client, queue_name, shards=4)
    assert queue.push("a") == 1
    with pytest.raises(ShardsMismatch):
        sharded(cluster_client, queue_name, shards=5).push("b")
    with pytest.raises(ShardsMismatch):
        sharded(cluster_client, queue_name, shards=5).stats()
    assert ShardedRotator(cluster_client, queue_name, shards=None).shards == 4
    with pytest.raises(ShardsMismatch):
        ShardedRotator(cluster_client, f"{queue_name}-never", shards=None)
    assert queue.delete()
    assert sharded(cluster_client, queue_name, shards=5).push("b") == 1  # deleted: a new count


class CountingCluster(RedisCluster):
    """A real cluster client that counts the pipelines it makes and the module calls it
    sends one at a time (those in a pipeline go through the pipeline instead)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pipelines = 0
        self.single_calls = 0

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        self.pipelines += 1
        return super().pipeline(*args, **kwargs)  # type: ignore[no-untyped-call]

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if str(args[0]).upper() in ("EVALSHA", "EVAL", "FCALL"):
            self.single_calls += 1
        return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]


@pytest.mark.cluster
def test_a_push_sends_its_shards_chunks_in_pipelines_and_makes_failed_ones_again_alone(
    cluster: ClusterProcess, queue_name: str
) -> None:
    client = CountingCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    try:
        queue = sharded(client, queue_name)
        assert queue.push("warm") == 1  # the script is loaded on that shard's master
        ids = [f"job-{n}" for n in range(2500)]
        client.pipelines = client.single_calls = 0
        assert queue.push_many(ids, chunk=1000) == 2500
        # Chunk 0 of every shard in one pipeline (each shard holds about 417 ids): a round
        # trip per node; each call whose reply was NOSCRIPT (a master not used yet) again.
        assert client.pipelines == 1
        assert client.single_calls <= 3
        client.pipelines = client.single_calls = 0
        assert queue.push_many(ids[:1200], chunk=100) == 1200
        per_shard = Counter(queue.shard_of(job_id) for job_id in ids[:1200])
        rounds = max(-(-n // 100) for n in per_shard.values())  # about 200 a shard: 2 or 3
        assert (client.pipelines, client.single_calls) == (rounds, 0)

        for node in cluster.nodes:  # replies of NOSCRIPT: each call made again, loading it
            node.client().script_flush()
        assert queue.push_many([f"after-flush-{n}" for n in range(60)]) == 60
        assert queue.stats().pending == 1 + 2500 + 1200 + 60

        # A refused call raises its typed error; the other shards' chunks are in (each
        # shard is atomic on its own, not all of them together).
        bad = queue.shard_of("x-0")
        client.delete(queue.shard(bad).keys.ring)
        client.set(queue.shard(bad).keys.ring, "not a list")
        with pytest.raises(WrongKeyType):
            queue.push_many([f"x-{n}" for n in range(60)])
        pushed = sum(queue.shard(k).stats().pending for k in range(queue.shards) if k != bad)
        assert pushed >= 60 - sum(1 for n in range(60) if queue.shard_of(f"x-{n}") == bad)
    finally:
        client.close()


@pytest.mark.cluster
def test_an_async_push_sends_its_chunks_in_a_pipeline_and_loads_the_script_where_missing(
    cluster: ClusterProcess, queue_name: str
) -> None:
    from rotator.sharded_aio import AsyncShardedRotator  # noqa: PLC0415

    async def scenario() -> tuple[int, int, int]:
        queue = AsyncShardedRotator.from_url(url_of(cluster), queue_name, shards=6)
        try:
            made = 0
            original = queue.client.pipeline

            def counted(*args: Any, **kwargs: Any) -> Any:
                nonlocal made
                made += 1
                return original(*args, **kwargs)

            queue.client.pipeline = counted
            for node in cluster.nodes:
                node.client().script_flush()
            pushed = await queue.push_many(f"a-{n}" for n in range(600))
            return pushed, (await queue.stats()).pending, made
        finally:
            await queue.client.aclose()

    assert asyncio.run(scenario()) == (600, 600, 1)


@pytest.mark.cluster
def test_reads_acks_and_deletes_never_store_a_shard_count(
    cluster_client: RedisCluster, queue_name: str
) -> None:
    """Only writes that make the queue (pushes, claims, settings) store its count: a read of
    a queue that is gone must not fix the count of the next queue of that name."""
    layout = f"rotator:{{{queue_name}}}:shards"
    reader = sharded(cluster_client, queue_name, shards=4)
    assert not reader.exists()
    assert reader.stats().length == 0
    assert (reader.dead(), reader.drained()) == ([], True)
    assert (reader.ack("x*1.1.1"), reader.sweep(), reader.durations().counts[0]) == (0, 0, 0)
    assert cluster_client.exists(layout) == 0
    six = sharded(cluster_client, queue_name, shards=6)
    assert six.push("a") == 1
    with pytest.raises(ShardsMismatch):
        reader.stats()  # a count stored since is still compared
    assert cluster_client.hget(layout, "shards") == b"6"
    assert six.delete()
    assert not six.exists()  # a read after the delete (the same instance, too)
    assert reader.stats().length == 0
    assert cluster_client.exists(layout) == 0
    assert sharded(cluster_client, queue_name, shards=5).push("b") == 1


@pytest.mark.cluster
def test_the_api_across_shards(cluster_client: RedisCluster, queue_name: str) -> None:
    queue = sharded(cluster_client, queue_name, timeout=30, max_deliveries=2)
    assert not queue.exists()
    assert queue.push_many((f"j{i}" for i in range(40)), chunk=3) == 40
    assert queue.exists()
    stats = queue.stats()
    assert (stats.length, stats.pending, stats.pushed) == (40, 40, 40)
    assert sum(part.pending for part in queue.shard_stats()) == 40

    jobs = queue.next(30)  # gathered from several shards
    assert len(jobs) == 30
    assert len({queue.shard_of(job.id) for job in jobs}) > 1
    assert queue.stats().in_flight == 30
    assert queue.ack(*jobs[:19]) == 19
    assert queue.ack(jobs[19].token) == 1  # a token string finds its shard too
    with pytest.raises(InvalidToken):
        queue.ack("not-a-token")
    assert queue.extend(jobs[20], 60) * 1000 > jobs[20].deadline_ms
    assert queue.extend_many(jobs[20:25]) == [True] * 5
    assert queue.nack(*jobs[20:25]) == 5
    assert queue.bury(*jobs[25:30], error="no good") == 5
    rest: list[Job] = []
    while more := queue.next(50, ack=rest):
        rest = more
    assert queue.ack(*rest) == len(rest)
    assert len(rest) == 15  # ten never delivered and the five given back
    queue.sweep()
    letters = queue.dead()
    assert sorted(letter.id for letter in letters) == sorted(job.id for job in jobs[25:30])
    assert {letter.error for letter in letters} == {"no good"}
    assert queue.requeue_dead(jobs[25].id) == 1
    assert queue.requeue_dead() == 4
    with queue.claim() as claimed:
        assert claimed is not None
    again = queue.next(10)
    assert len(again) == 4
    assert queue.next(10, ack=again) == []
    assert queue.drained()
    assert queue.stats().completed == 40
    assert queue.delete()
    assert not queue.exists()


@pytest.mark.cluster
def test_delayed_and_prioritized_pushes_go_as_once_under_a_marker_per_shard(
    cluster_client: RedisCluster, queue_name: str
) -> None:
    """Each shard's call is its push command after ``once CHUNK TTL_MS``, its marker a key
    under the shard's tag: sent again after a lost reply, it pushes nothing twice."""
    queue = sharded(cluster_client, queue_name)
    ids = [f"j{n}" for n in range(40)]
    assert queue.push(*ids, delay=60) == 40
    assert queue.push(*(f"p{n}" for n in range(40)), priority=5) == 40
    markers = list(cluster_client.scan_iter(match=f"rotator:{{{queue_name}*}}:push:*"))
    shards = {key_slot(f.keys.ring.encode()) for f in queue._flows.shards}
    assert {key_slot(marker) for marker in markers} == shards  # one a shard, each push
    assert len(markers) == 2 * queue.shards
    assert {int(cluster_client.hget(m, "chunks") or 0) for m in markers} == {1}
    stats = queue.stats()
    assert (stats.scheduled, stats.prioritized) == (40, 40)


@pytest.mark.cluster
def test_a_delayed_push_is_claimed_when_due(cluster_client: RedisCluster, queue_name: str) -> None:
    queue = sharded(cluster_client, queue_name)
    assert queue.push("later", delay=0.3) == 1
    assert queue.stats().scheduled == 1
    began = time.monotonic()
    (job,) = queue.next(block=5)
    assert job.id == "later"
    assert 0.2 < time.monotonic() - began < 2.0  # woken by the due time, not the block


@pytest.mark.cluster
def test_prioritized_pushes_are_delivered_most_urgent_first_within_each_shard(
    cluster_client: RedisCluster, queue_name: str
) -> None:
    queue = sharded(cluster_client, queue_name, timeout=30)
    levels = {9: [f"p9-{i}" for i in range(24)], 5: [f"p5-{i}" for i in range(24)]}
    levels[0] = [f"p0-{i}" for i in range(24)]
    for priority, ids in levels.items():  # the least urgent pushed first
        assert queue.push(*ids, priority=priority) == 24
    assert queue.stats().prioritized == 48
    per_shard: dict[int, list[int]] = {}
    while jobs := queue.next(1):
        (job,) = jobs
        per_shard.setdefault(queue.shard_of(job.id), []).append(int(job.id[1]))
        queue.ack(job)
    assert len(per_shard) == 6
    assert sum(map(len, per_shard.values())) == 72
    for k, order in per_shard.items():
        assert order == sorted(order), (k, order)  # 0s, then 5s, then 9s, on every shard
        assert set(order) == {0, 5, 9}, (k, order)


@pytest.mark.cluster
def test_delayed_and_at_pushes_wait_for_their_time_on_every_shard(
    cluster_client: RedisCluster, queue_name: str
) -> None:
    queue = sharded(cluster_client, queue_name, timeout=30)
    now = time.time()
    soon = [f"d{i}" for i in range(12)]
    later = [f"a{i}" for i in range(12)]
    assert queue.push(*soon, delay=0.6) == 12
    assert queue.push_many(later, at=datetime.fromtimestamp(now + 1.2, UTC)) == 12
    assert queue.push("now") == 1
    assert len({queue.shard_of(i) for i in soon}) > 3
    assert len({queue.shard_of(i) for i in later}) > 3
    assert queue.stats().scheduled == 24
    (first,) = queue.next(30)
    assert first.id == "now"  # nothing scheduled is delivered before its time
    queue.ack(first)
    delivered: dict[str, float] = {}
    while len(delivered) < 24:
        jobs = queue.next(30, block=3)
        assert jobs, delivered
        at = time.time()
        delivered.update((job.id, at) for job in jobs)
        queue.ack(*jobs)
    assert sorted(delivered) == sorted(soon + later)
    slack = 0.05  # the server's clock against ours (the same machine)
    assert all(delivered[i] >= now + 0.6 - slack for i in soon)
    assert all(delivered[i] >= now + 1.2 - slack for i in later)
    assert min(delivered[i] for i in soon) < now + 1.2  # when due, not with the last ones
    assert queue.stats().scheduled == 0


@pytest.mark.cluster
def test_claims_start_at_the_next_shard_each_call_and_consumers_start_apart(
    cluster_client: RedisCluster, queue_name: str
) -> None:
    """ShardedFlows.next starts at a random shard per consumer and moves on one shard per
    call: one consumer's consecutive one-job claims take each shard in turn, and several
    consumers' first claims land on several shards, not all on one."""
    queue = sharded(cluster_client, queue_name, timeout=30)
    ids = [f"r{i}" for i in range(240)]
    assert queue.push(*ids) == 240
    assert min(part.pending for part in queue.shard_stats()) >= 12
    consumer = sharded(cluster_client, queue_name, timeout=30)
    visited = [queue.shard_of(consumer.next(1)[0].id) for _ in range(12)]
    first = visited[0]
    assert visited == [(first + step) % 6 for step in range(12)], visited
    starts = [
        queue.shard_of(sharded(cluster_client, queue_name, timeout=30).next(1)[0].id)
        for _ in range(12)
    ]
    # 12 consumers with a uniform random start each: all on 2 shards or fewer has odds
    # below 1 in 30,000.
    assert len(set(starts)) >= 3, starts
    assert queue.delete()


def wake_latencies(
    consumer: Any, push: Any, rounds: int, ids: list[str] | None = None
) -> list[float]:
    """Seconds from just before a push to the blocked consumer's return, per round."""
    found = []
    for i in range(rounds):
        stamp: list[float] = []
        job_id = ids[i] if ids else f"w{i}"

        def later(job_id: str = job_id, stamp: list[float] = stamp) -> None:
            time.sleep(0.02)
            stamp.append(time.monotonic())
            push(job_id)

        pusher = threading.Thread(target=later)
        pusher.start()
        jobs = consumer.next(block=5)
        returned = time.monotonic()
        pusher.join()
        assert [job.id for job in jobs] == [job_id]
        consumer.ack(*jobs)
        found.append(returned - stamp[0])
    return found


WOKEN_WITHIN_S = 1.0  # (a blocked consumer's block in wake_latencies: 5 s)


@pytest.mark.cluster
def test_a_blocked_consumer_is_woken_by_a_push_to_any_shard(
    cluster: ClusterProcess, cluster_client: RedisCluster, queue_name: str
) -> None:
    """A consumer blocked on a sharded queue gets a job pushed to any of its shards when it is
    pushed, as one blocked on a single queue does: not when its block runs out (5 s), which
    is what a wake-up that missed it would cost. How fast, beside one queue, is a
    measurement: ``python -m bench.sharded`` (the wake latency rows), not an assertion."""
    pusher_client = cluster.client()
    try:
        single = Rotator(cluster_client, f"{queue_name}-single", timeout=30)
        single_pusher = Rotator(pusher_client, f"{queue_name}-single")
        base = wake_latencies(single, single_pusher.push, 40)
        queue = sharded(cluster_client, queue_name, timeout=30)
        pusher = sharded(pusher_client, queue_name)
        ids = [f"w{i}" for i in range(40)]
        assert len({queue.shard_of(i) for i in ids}) == 6  # every shard is pushed to
        ours = wake_latencies(queue, pusher.push, 40, ids)
    finally:
        pusher_client.close()
    print(f"wake latency ms: one queue p50 {statistics.median(base) * 1000:.2f} "
          f"max {max(base) * 1000:.2f}; sharded (6) p50 {statistics.median(ours) * 1000:.2f} "
          f"max {max(ours) * 1000:.2f}")  # fmt: skip
    # Every round woken by its push: a missed wake-up leaves the consumer blocked until its
    # 5 s block runs out (then this bound, or wake_latencies' check of the job, fails). A
    # round takes 2-25 ms on this VM, and one stalled once to 376 ms: 1 s is far from both.
    assert max(base) < WOKEN_WITHIN_S, base
    assert max(ours) < WOKEN_WITHIN_S, ours


WORKER = """
import sys
import time
from pathlib import Path
from rotator import ShardedRotator

url, name, shards, out = sys.argv[1:]
queue = ShardedRotator.from_url(url, name, shards=int(shards), timeout=10)
with Path(out).open("w", encoding="utf-8") as lines:
    def handler(job):
        time.sleep(0.001)  # a job takes a little time: every process gets a share
        lines.write(job.id + "\\n")
    summary = queue.work(handler, stop_when_empty=True, batch=50, poll=0.2)
print(summary.processed)
"""


JOBS, SHARDS, WORKERS = 30_000, 12, 4


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_four_worker_processes_complete_30000_jobs_on_12_shards_each_once(
    cluster: ClusterProcess, cluster_client: RedisCluster, queue_name: str, tmp_path: Path
) -> None:
    """Issue 19's full-size run: every job completed, each once unless a reclaim explains
    it, every master holds shards and every shard and worker takes part."""
    queue = sharded(cluster_client, queue_name, shards=SHARDS, timeout=10)
    placement = queue.placement()
    assert set(placement) == {f"{node.host}:{node.port}" for node in cluster.nodes}
    # 4 shards on each master, give or take the one whose slot range straddles a master's
    # first or last slot (shard 8's range starts at 10922, the second master's last slot):
    # which side it lands on depends on the queue's name, random here.
    assert set(Counter(placement).values()) <= {SHARDS // 3 - 1, SHARDS // 3, SHARDS // 3 + 1}
    ids = [f"job-{i}" for i in range(JOBS)]
    began = time.monotonic()
    assert queue.push_many(ids) == JOBS
    pushed = time.monotonic() - began
    outs = [tmp_path / f"worker-{n}.txt" for n in range(WORKERS)]
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, url_of(cluster), queue_name, str(SHARDS), str(out)],
            cwd=ROOT,
        )
        for out in outs
    ]
    for worker in workers:
        assert worker.wait(timeout=100) == 0
    elapsed = time.monotonic() - began
    shares = [len(out.read_text().split()) for out in outs]
    done = Counter(line for out in outs for line in out.read_text().split())
    stats = queue.stats()
    print(f"{JOBS} jobs, {SHARDS} shards, {WORKERS} workers: {elapsed:.1f} s "
          f"(pushed in {pushed:.1f} s); per worker {shares}")  # fmt: skip
    assert set(done) == set(ids)
    doubled = sum(n - 1 for n in done.values())
    assert doubled <= (stats.reclaimed or 0), doubled  # only a reclaim may repeat a job
    assert (stats.length, stats.completed) == (0, JOBS)
    assert all(part.completed for part in queue.shard_stats())  # every shard took part
    assert all(share > 0 for share in shares)  # every worker too
    assert queue.delete()


@pytest.mark.cluster
def test_the_cli_pushes_leases_and_counts_a_sharded_queue(
    cluster: ClusterProcess, queue_name: str
) -> None:
    def cli(*args: str) -> Result:
        return CliRunner().invoke(main, ["--url", url_of(cluster), *args], catch_exceptions=False)

    pushed = cli("push", queue_name, "a", "b", "c", "d", "--shards", "6", "--json")
    assert (pushed.exit_code, json.loads(pushed.output)) == (0, {"pushed": 4})
    leased = cli("next", queue_name, "--count", "4", "--shards", "6", "--json")
    assert sorted(job["id"] for job in json.loads(leased.output)) == ["a", "b", "c", "d"]
    counted = cli("stats", queue_name, "--shards", "6", "--json")
    assert json.loads(counted.output)["in_flight"] == 4
    refused = cli("stats", queue_name, "--shards", "5")
    assert refused.exit_code == 1
    assert "stored with 6 shards" in refused.output


def sharded_cli(cluster: ClusterProcess) -> Callable[..., Result]:
    def cli(*args: str) -> Result:
        return CliRunner().invoke(main, ["--url", url_of(cluster), *args], catch_exceptions=False)

    return cli


@pytest.mark.cluster
def test_the_cli_settles_a_sharded_queues_deliveries_with_shards(
    cluster: ClusterProcess, cluster_client: RedisCluster, queue_name: str
) -> None:
    """Tokens leased by `rotator next --shards` are acked, nacked and buried from the CLI
    (each finds its id's shard); dead letters are listed and requeued, ids cancelled, the
    queue paused, resumed and deleted, all with --shards."""
    cli = sharded_cli(cluster)

    def ok(*args: str) -> Any:
        done = cli(*args, "--shards", "6", "--json")
        assert done.exit_code == 0, (args, done.stdout, done.stderr)
        return json.loads(done.stdout)

    ids = [f"c{i}" for i in range(8)]
    assert ok("track-ids", queue_name, "on") == {"track_ids": True}
    assert ok("push", queue_name, *ids) == {"pushed": 8}
    assert ok("cancel", queue_name, "c7") == {"cancelled": 1}
    leased = {job["id"]: job["token"] for job in ok("next", queue_name, "--count", "7")}
    assert sorted(leased) == ids[:7]
    queue = sharded(cluster_client, queue_name)
    assert len({queue.shard_of(job_id) for job_id in leased}) > 2  # tokens of several shards
    assert ok("ack", queue_name, *(leased[i] for i in ids[:4])) == {"acked": 4}
    assert ok("nack", queue_name, leased["c4"]) == {"nacked": 1}
    assert ok("bury", queue_name, leased["c5"], leased["c6"], "--error", "bad") == {"buried": 2}
    refused = cli("nack", queue_name, leased["c0"], "--shards", "6")  # acked already
    assert refused.exit_code == 1
    assert "1 of 1 tokens refused" in refused.stderr
    queue.sweep()  # buried leases go to the dead letters when the walk meets them
    letters = ok("dead", queue_name)
    assert sorted(letter["id"] for letter in letters) == ["c5", "c6"]
    assert {letter["error"] for letter in letters} == {"bad"}
    assert ok("dead", queue_name, "--requeue", "c5") == {"requeued": 1}
    assert ok("pause", queue_name) == {"paused": True, "changed": True}
    assert ok("next", queue_name) == []  # every shard paused
    assert ok("resume", queue_name) == {"paused": False, "changed": True}
    again = ok("next", queue_name, "--count", "5")
    assert sorted(job["id"] for job in again) == ["c4", "c5"]
    assert ok("ack", queue_name, *(job["token"] for job in again)) == {"acked": 2}
    queue.sweep()  # and acked ones are counted completed then
    counts = ok("stats", queue_name)
    assert (counts["length"], counts["completed"], counts["cancelled"], counts["dead"]) == (
        0,
        6,
        1,
        1,
    )
    assert ok("workers", queue_name) == []
    assert ok("delete", queue_name, "--yes") == {"deleted": True}
    assert not queue.exists()


@pytest.mark.cluster
def test_the_cli_refuses_shards_where_a_sharded_queue_lacks_the_operation(
    cluster: ClusterProcess, queue_name: str
) -> None:
    cli = sharded_cli(cluster)
    for args, what in [
        (("limit", queue_name, "10/s"), "rate limits (ShardedRotator has no set_rate_limit)"),
        (("peek", queue_name), "peek (ShardedRotator has no peek)"),
        (("schedule", "add", queue_name, "s", "--every", "60"), "schedules"),
        (("schedule", "list", queue_name), "schedules"),
        (("schedule", "rm", queue_name, "s"), "schedules"),
    ]:
        refused = cli(*args, "--shards", "6")
        assert refused.exit_code == 2, (args, refused.stderr)
        assert f"--shards: sharded queues do not offer {what}" in refused.stderr
    wrong = cli("ack", queue_name, "x*1.1.1", "--shards", "6")  # no such queue
    assert wrong.exit_code == 1
    assert "unknown queue" in wrong.stderr


@pytest.mark.cluster
def test_rotator_work_with_shards_runs_a_command_per_job_of_every_shard(
    cluster: ClusterProcess, cluster_client: RedisCluster, queue_name: str, tmp_path: Path
) -> None:
    ids = [f"w{i}" for i in range(30)]
    queue = sharded(cluster_client, queue_name, timeout=30)
    assert queue.push(*ids) == 30
    assert len({queue.shard_of(job_id) for job_id in ids}) == 6
    done = tmp_path / "done"
    rotator = str(Path(sys.executable).parent / "rotator")
    worked = subprocess.run(
        [rotator, "--url", url_of(cluster), "work", queue_name, "--shards", "6",
         "--concurrency", "2", "--until-empty", "--json", "--", "sh", "-c",
         f"echo {{}} >> {done}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert worked.returncode == 0, worked.stderr
    assert json.loads(worked.stdout)["completed"] == 30
    assert sorted(done.read_text().split()) == sorted(ids)
    stats = queue.stats()
    assert (stats.completed, stats.pending, stats.in_flight) == (30, 0, 0)
    assert all(part.completed for part in queue.shard_stats())
    assert queue.delete()


# -- failover and slot migration on 3 masters with a replica each ------------------------------

LONG_WORKER = """
import sys
from pathlib import Path
from rotator import ShardedRotator

url, name, shards, out = sys.argv[1:]
queue = ShardedRotator.from_url(url, name, shards=int(shards), timeout=5, retry_for=20)
with Path(out).open("w", encoding="utf-8") as lines:
    def handler(job):
        lines.write(job.id + "\\n")
        lines.flush()
    summary = queue.work(handler, batch=20, poll=0.2)
print("worker", summary)
"""

# A worker that acks each shard's jobs with Durability(replicas=1), and notes each job id
# with the time it ran it (OUT) and the time its ack was confirmed (OUT.acked).
DURABLE_WORKER = """
import sys
import time
from pathlib import Path
from rotator import Durability, ShardedRotator

url, name, shards, out = sys.argv[1:]
queue = ShardedRotator.from_url(
    url, name, shards=int(shards), timeout=5, retry_for=20,
    durability=Durability(replicas=1, timeout=2),
)
ran = Path(out).open("w", encoding="utf-8")
acked = Path(out + ".acked").open("w", encoding="utf-8")

def note(lines, ids):
    lines.write("".join(f"{job_id} {time.time():.6f}\\n" for job_id in ids))
    lines.flush()

while True:
    try:
        jobs = queue.next(20, block=0.2)
    except Exception as error:
        print("worker: claim failed:", type(error).__name__, error)
        continue
    note(ran, [job.id for job in jobs])
    shards = {}
    for job in jobs:
        shards.setdefault(queue.shard_of(job.id), []).append(job)
    for part in shards.values():
        try:
            accepted = queue.ack(*part)
        except Exception as error:  # NotDurable: applied, not confirmed
            print("worker: ack not confirmed:", type(error).__name__, error)
            continue
        if accepted == len(part):
            note(acked, [job.id for job in part])
"""


def run_through(
    cluster: ReplicatedClusterProcess,
    name: str,
    workdir: Path,
    change: Callable[[ShardedRotator], None],
    batches: int = 60,
    *,
    worker_script: str = LONG_WORKER,
    durability: Durability | None = None,
) -> dict[str, Any]:
    """A producer (a thread here) pushing ``batches`` of 50 jobs, 20 a second, and 2 worker
    processes (``worker_script``) on 6 shards; ``change`` runs (in this thread) one second in.
    Returns once every confirmed push was completed (or 20 s after the producer's end) with
    what happened: confirmed, unconfirmed (NotDurable), failed, lost and doubled ids,
    reclaims, runs after a confirmed ack (DURABLE_WORKER's notes), seconds."""
    url = cluster.nodes[0].url
    queue = ShardedRotator.from_url(
        url, name, shards=6, timeout=5, retry_for=20, durability=durability
    )
    outs = [workdir / f"worker-{n}.txt" for n in range(2)]
    workers = [
        subprocess.Popen([sys.executable, "-c", worker_script, url, name, "6", str(out)], cwd=ROOT)
        for out in outs
    ]
    confirmed: list[str] = []
    unconfirmed: list[str] = []
    failed: list[str] = []

    def produce() -> None:
        for batch in range(batches):
            ids = [f"job-{batch}-{i}" for i in range(50)]
            try:
                queue.push(*ids)
            except NotDurable as error:  # applied (in part: the shards before the error)
                print("push not confirmed:", error)
                unconfirmed.extend(ids)
            except Exception as error:
                print("push failed:", type(error).__module__, type(error).__name__, error)
                failed.extend(ids)
            else:
                confirmed.extend(ids)
            time.sleep(0.05)

    def completed() -> Counter[str]:
        return Counter(job_id for out in outs for job_id, _ in worker_notes(out))

    producer = threading.Thread(target=produce)
    began = time.monotonic()
    try:
        producer.start()
        time.sleep(1.0)
        change(queue)
        producer.join()
        produced = time.monotonic() - began
        deadline = time.monotonic() + 20
        while not set(confirmed) <= set(completed()) and time.monotonic() < deadline:
            time.sleep(0.2)
        alive = [worker.poll() is None for worker in workers]
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(timeout=30)
        producer.join()
    done = completed()
    acked = confirmed_acks(outs)  # (DURABLE_WORKER's notes)
    late = runs_after_confirmed_ack(outs, acked)
    stats = queue.stats()
    queue.delete()
    queue.client.close()
    result = {
        "seconds": round(time.monotonic() - began, 1),
        "produced_in": round(produced, 1),
        "confirmed": len(confirmed),
        "unconfirmed": len(unconfirmed),
        "failed": len(failed),
        "lost": len(set(confirmed) - set(done)),
        "doubled": sum(n - 1 for n in done.values()),
        "reclaimed": stats.reclaimed or 0,
        "confirmed_acks": len(acked),
        "ran_after_a_confirmed_ack": late,
        "workers_alive": alive,
    }
    print(result)
    return result


@pytest.mark.cluster
@pytest.mark.timeout(60)
@ON_EACH_CLUSTER
def test_a_master_killed_mid_run_fails_over_and_no_durable_push_or_ack_is_lost(
    replicated_cluster: ReplicatedClusterProcess,
    queue_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGKILL of the master holding shard 0 while a producer pushes and workers ack with
    ``Durability(replicas=1)``, its replica cut off for the half second before (its link
    killed, its reconnection refused): the master dies holding writes its replica never
    got, which without durability include confirmed pushes (about 10 of them here). The
    replica is promoted, producer and workers go on without a restart, and the killed
    server is started again (it rejoins as the new master's replica; a master without one
    answers durable calls with NotDurable after their 2 s timeout). Every confirmed push
    is completed, and no job whose ack was confirmed runs again: claims are durable calls
    too, so a job is handled only once its lease has reached the replica (a claim made in
    that half second raises NotDurable, and its jobs come back), and the promoted replica
    holds every lease a confirmed ack completes."""
    events: dict[str, Any] = {}
    # Redis 7.0 has no WAITAOF: its once-per-process warning stays for test_durability.py.
    monkeypatch.setattr("rotator.durability._warned_no_waitaof", True)

    def kill_a_master(queue: ShardedRotator) -> None:
        victim = replicated_cluster.master_of_slot(key_slot(queue.shard_names[0].encode()))
        heir = replicated_cluster.replica_of(victim)
        with heir.client(socket_timeout=2) as client:
            client.config_set("masterauth", "not-the-password")  # it cannot sync again
        with victim.client(socket_timeout=2) as client:
            events["cut"] = time.time()
            client.execute_command("CLIENT", "KILL", "TYPE", "replica")
            time.sleep(0.5)  # the master alone takes writes
            written = int(client.info("replication")["master_repl_offset"])
        with heir.client(socket_timeout=2) as client:
            replicated = int(client.info("replication")["slave_repl_offset"])
        killed = time.monotonic()
        victim.kill9()
        events["killed"] = time.time()
        with heir.client(socket_timeout=2) as client:
            while client.info("replication")["role"] != "master":
                assert time.monotonic() - killed < 15, "the replica was not promoted"
                time.sleep(0.05)
            promoted = time.monotonic() - killed
            client.config_set("masterauth", "")
            victim.start()  # as a supervisor would: it comes back as the heir's replica
            while client.info("replication").get("slave0", {}).get("state") != "online":
                assert time.monotonic() - killed < 20, "the old master did not rejoin"
                time.sleep(0.05)
        events.update(
            promoted=promoted, rejoined=time.monotonic() - killed, unreplicated=written - replicated
        )

    result = run_through(
        replicated_cluster,
        queue_name,
        tmp_path,
        kill_a_master,
        worker_script=DURABLE_WORKER,
        durability=Durability(replicas=1, timeout=2),
    )
    print(f"the master died with {events['unreplicated']} bytes of writes its replica never "
          f"got; replica promoted {events['promoted']:.1f} s after the kill, the old master "
          f"its replica {events['rejoined']:.1f} s after it")  # fmt: skip
    assert events["unreplicated"] > 0  # acknowledged writes were lost with the master
    assert result["workers_alive"] == [True, True]  # no restart
    assert (result["failed"], result["lost"]) == (0, 0), result
    assert result["confirmed"] + result["unconfirmed"] == 60 * 50
    assert result["confirmed"] >= 40 * 50, result  # NotDurable only around the failover
    assert result["ran_after_a_confirmed_ack"] == [], result


@pytest.mark.cluster
@pytest.mark.timeout(60)
@ON_EACH_CLUSTER
def test_a_shards_slot_migrates_to_another_master_mid_run_and_nothing_is_lost(
    replicated_cluster: ReplicatedClusterProcess, queue_name: str, tmp_path: Path
) -> None:
    """Shard 0's slot moves to another master (SETSLOT IMPORTING/MIGRATING, MIGRATE of 3
    keys at a time with pauses, so that it takes about a second and the queue's keys are
    split between the two for a while: ASK and TRYAGAIN) while a producer pushes and
    workers run: every confirmed push is completed, none lost, none twice unless a reclaim
    explains it, and the shard is served by its new master."""
    events: dict[str, Any] = {}

    def migrate(queue: ShardedRotator) -> None:
        slot = key_slot(queue.shard_names[0].encode())
        source = replicated_cluster.master_of_slot(slot)
        target = next(
            replicated_cluster.master_of_slot(key_slot(shard.encode()))
            for shard in queue.shard_names
            if replicated_cluster.master_of_slot(key_slot(shard.encode())) is not source
        )
        began = time.monotonic()
        moved = replicated_cluster.migrate_slot(slot, target, batch=3, pause=0.15)
        took = time.monotonic() - began
        with source.client(socket_timeout=2) as client:
            refused = client.info("errorstats").get("errorstat_TRYAGAIN", {}).get("count", 0)
        events.update(
            slot=slot, source=source, target=target, moved=moved, took=took, tryagain=refused
        )

    try:
        result = run_through(replicated_cluster, queue_name, tmp_path, migrate, batches=50)
    finally:
        if events:  # the slot goes home: later tests find the slots where create put them
            replicated_cluster.migrate_slot(events["slot"], events["source"])
    print(f"slot {events['slot']}: {events['moved']} keys moved in {events['took']:.1f} s; "
          f"TRYAGAIN replies from the source: {events['tryagain']}")  # fmt: skip
    assert events["moved"] > 10  # the queue's keys and the push markers
    assert events["tryagain"] > 0  # calls did meet the shard's keys split over two masters
    assert result["workers_alive"] == [True, True]
    assert (result["failed"], result["lost"]) == (0, 0), result
    assert result["confirmed"] == 50 * 50
    assert result["doubled"] <= result["reclaimed"], result
