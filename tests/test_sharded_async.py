"""AsyncShardedRotator, the asyncio twin of ShardedRotator, on real 3-master clusters (Redis
7.0 and Valkey 8.1): the same API (compared by introspection), the same queue (a sync
ShardedRotator reads what the async one wrote), the stored shard count, a blocked consumer
woken across shards without polling, the async worker loop completing every job once,
bounded retries that do not block the event loop, and bad input refused with typed errors
and nothing changed.

Each scenario runs with ``asyncio.run`` on an async cluster client of its own (made by
``async_cluster_client``, as ``from_url`` makes it) that it closes.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import typing
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError
from redis.exceptions import ConnectionError as RedisConnectionError

from rotator import (
    InvalidArgument,
    InvalidJobId,
    InvalidQueueName,
    InvalidToken,
    Job,
    NotTracked,
    ShardedRotator,
    ShardsMismatch,
)
from rotator.aio import AsyncRetryingSender, AsyncRotator
from rotator.commands import push_chunk, push_ids
from rotator.retries import CONNECT_TIMEOUT, SOCKET_TIMEOUT
from rotator.sharded import layout_key
from rotator.sharded_aio import AsyncShardedRotator, async_cluster_client
from tests.helpers import EACH_PLAIN_CLUSTER, snapshot
from tests.servers import ClusterProcess
from tests.test_api_parity import public_methods, public_properties

CLUSTER_KINDS = EACH_PLAIN_CLUSTER
Scenario = Callable[[AsyncRedisCluster], Awaitable[None]]


def run_on(cluster: ClusterProcess, scenario: Scenario) -> None:
    async def main() -> None:
        client = async_cluster_client(cluster.nodes[0].url)
        try:
            await scenario(client)
        finally:
            await client.aclose()

    asyncio.run(main())


def sharded(client: Any, name: str, shards: int = 6, **options: Any) -> AsyncShardedRotator:
    return AsyncShardedRotator(client, name, shards=shards, **options)


def command_calls(cluster_client: RedisCluster) -> Counter[str]:
    """Calls of each command so far, summed over the cluster's masters (INFO commandstats)."""
    found: Counter[str] = Counter()
    for node in cluster_client.get_primaries():  # type: ignore[no-untyped-call]
        for name, stat in node.redis_connection.info("commandstats").items():
            found[name.removeprefix("cmdstat_")] += int(stat["calls"])
    return found


# -- no server ------------------------------------------------------------------------------

# Methods that build or compute without I/O on both sides: not awaited.
NOT_AWAITED = {"from_url", "claim", "shard", "shard_of"}
# Parameters whose types differ only by the client or callback being async.
ASYNC_TYPES = {"cluster", "idempotency", "handler"}


def test_the_async_twin_has_every_method_and_property_with_the_same_parameters() -> None:
    ours, theirs = public_methods(ShardedRotator), public_methods(AsyncShardedRotator)
    assert set(theirs) == set(ours) | {"open"}  # open: a constructor cannot await
    assert public_properties(AsyncShardedRotator) == public_properties(ShardedRotator)
    for name, method in ours.items():
        twin = theirs[name]
        sync_sig, async_sig = inspect.signature(method), inspect.signature(twin)
        assert [(p.name, p.kind, p.default) for p in sync_sig.parameters.values()] == [
            (p.name, p.kind, p.default) for p in async_sig.parameters.values()
        ], name
        if name in NOT_AWAITED:
            continue
        assert inspect.iscoroutinefunction(twin), f"AsyncShardedRotator.{name} is not async"
        hints, async_hints = typing.get_type_hints(method), typing.get_type_hints(twin)
        assert hints["return"] == async_hints["return"], name
        for parameter in sync_sig.parameters:
            if parameter not in ASYNC_TYPES and parameter in hints:
                assert hints[parameter] == async_hints[parameter], f"{name}({parameter})"
    init = inspect.signature(AsyncShardedRotator.__init__).parameters
    sync_init = inspect.signature(ShardedRotator.__init__).parameters
    assert list(init) == list(sync_init)


class _FakeCluster:
    """A client whose every module call raises ``error``, counting the tries and the
    default nodes it was asked to replace."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.tries = 0
        self.replaced = 0

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.tries += 1
        raise self.error

    def register_script(self, source: str) -> Any:
        return object()

    def replace_default_node(self) -> None:
        self.replaced += 1


def test_a_call_retries_cluster_errors_for_retry_for_seconds_and_no_longer() -> None:
    async def scenario() -> None:
        down = _FakeCluster(ClusterDownError("CLUSTERDOWN The cluster is down"))
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        began = time.monotonic()
        with pytest.raises(ClusterDownError):
            await AsyncRetryingSender(down, True, 0.5).perform(push_ids(("k",) * 13, [b"a"], None))
        took = time.monotonic() - began
        ticker.cancel()
        assert 0.5 <= took < 1.0
        assert 4 <= down.tries <= 8  # paused 50, 100, 200 ms ... not a busy loop
        assert ticks >= 20  # the loop ran other tasks meanwhile: the pauses are asyncio.sleep

        # A connection lost after a plain push was sent: it may be in, so no second try.
        lost = _FakeCluster(RedisConnectionError("Connection closed by server."))
        with pytest.raises(RedisConnectionError):
            await AsyncRetryingSender(lost, True, 5.0).perform(push_ids(("k",) * 13, [b"a"], None))
        assert lost.tries == 1
        # The same with a marker is harmless twice: retried, each time on another default node.
        marked = _FakeCluster(RedisConnectionError("Connection closed by server."))
        with pytest.raises(RedisConnectionError):
            await AsyncRetryingSender(marked, True, 0.3).perform(
                push_chunk(("k",) * 14, 0, 60000, [b"a"])
            )
        assert marked.tries >= 3
        assert marked.replaced == marked.tries - 1

    asyncio.run(scenario())


def test_the_constructor_wants_a_count_and_bad_options_are_refused_before_any_call() -> None:
    async def scenario() -> None:
        client = _FakeCluster(ClusterDownError("never sent"))
        with pytest.raises(InvalidArgument, match="open"):
            AsyncShardedRotator(client, "q", shards=None)  # type: ignore[arg-type]
        for bad in (0, 257, -1, 2.5, True, "6"):
            with pytest.raises(InvalidArgument):
                sharded(client, "q", shards=bad)  # type: ignore[arg-type]
        for bad_for in (-1, 3601, float("nan"), "10", None):
            with pytest.raises(InvalidArgument):
                sharded(client, "q", retry_for=bad_for)
        with pytest.raises(InvalidQueueName):
            sharded(client, "bad*name")
        with pytest.raises(InvalidQueueName):
            await AsyncShardedRotator.open(client, "bad*name")  # type: ignore[arg-type]
        assert client.tries == 0

    asyncio.run(scenario())


# -- on the cluster -------------------------------------------------------------------------


@pytest.mark.cluster
def test_from_url_makes_a_client_with_the_sharded_settings_and_shards_spread_over_masters(
    cluster: ClusterProcess, queue_name: str
) -> None:
    async def scenario() -> None:
        queue = AsyncShardedRotator.from_url(cluster.nodes[0].url, queue_name, shards=6)
        try:
            client = queue.client
            assert isinstance(client, AsyncRedisCluster)
            assert client.retry.get_retries() == 0  # the queue retries, not redis-py
            kwargs = client.nodes_manager.connection_kwargs
            assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (
                SOCKET_TIMEOUT,
                CONNECT_TIMEOUT,
            )
            placement = await queue.placement()
            assert len(set(placement)) == 3, placement
            # two shards per master, give or take the one whose slot range starts at 10922, the
            # second master's last slot (which side it lands on depends on the random name)
            assert Counter(placement).most_common(1)[0][1] in {2, 3}
            assert await queue.push("x") == 1
            shard = queue.shard(queue.shard_of("x"))  # an ordinary AsyncRotator on the shard
            assert (await shard.stats()).pending == 1
            assert repr(queue) == f"AsyncShardedRotator({queue_name!r}, shards=6, timeout=30.0)"
            assert await queue.delete()
        finally:
            await queue.client.aclose()

    asyncio.run(scenario())


@pytest.mark.cluster
def test_an_async_rotator_from_url_on_a_cluster_has_the_bounded_settings(
    cluster: ClusterProcess, queue_name: str
) -> None:
    """``AsyncRotator.from_url(url, cluster=True)`` makes its client as
    ``async_cluster_client`` does (redis-py's default has its own retries and no socket
    timeout, so a call to a frozen master would wait for it), and works on it."""

    async def scenario() -> None:
        queue = AsyncRotator.from_url(cluster.nodes[0].url, queue_name, cluster=True)
        try:
            client = queue.client
            assert isinstance(client, AsyncRedisCluster)
            assert client.retry.get_retries() == 0
            kwargs = client.nodes_manager.connection_kwargs
            assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (
                SOCKET_TIMEOUT,
                CONNECT_TIMEOUT,
            )
            assert await queue.push("x") == 1
            assert (await queue.stats()).pending == 1
            assert await queue.delete()
        finally:
            await queue.client.aclose()

    asyncio.run(scenario())


@pytest.mark.cluster
def test_the_api_across_shards(
    cluster: ClusterProcess, cluster_client: RedisCluster, queue_name: str
) -> None:
    async def scenario(client: AsyncRedisCluster) -> None:
        queue = sharded(client, queue_name, timeout=30, max_deliveries=2)
        assert not await queue.exists()
        assert await queue.push_many((f"j{i}" for i in range(40)), chunk=3) == 40
        assert await queue.exists()
        stats = await queue.stats()
        assert (stats.length, stats.pending, stats.pushed) == (40, 40, 40)
        parts = await queue.shard_stats()
        assert [part.pending for part in parts] == [
            sum(queue.shard_of(f"j{i}") == k for i in range(40)) for k in range(6)
        ]
        # The sync twin sees the same queue: same layout, names and routing.
        twin = ShardedRotator(cluster_client, queue_name, shards=None)
        assert (twin.shards, twin.shard_names) == (6, queue.shard_names)
        assert [part.pending for part in twin.shard_stats()] == [part.pending for part in parts]

        jobs = await queue.next(30)  # gathered from several shards
        assert len(jobs) == 30
        assert len({queue.shard_of(job.id) for job in jobs}) > 1
        assert (await queue.stats()).in_flight == 30
        assert await queue.ack(*jobs[:19]) == 19
        assert await queue.ack(jobs[19].token) == 1  # a token string finds its shard too
        assert await queue.extend(jobs[20], 60) * 1000 > jobs[20].deadline_ms
        assert await queue.extend_many(jobs[20:25]) == [True] * 5
        assert await queue.nack(*jobs[20:25]) == 5
        assert await queue.bury(*jobs[25:28], error="no good") == 3
        assert await queue.fail(*jobs[28:30], error="try again") == 2
        rest: list[Job] = []
        while more := await queue.next(50, ack=rest):
            rest = more
        assert await queue.ack(*rest) == len(rest)
        assert len(rest) == 17  # ten never delivered, five given back, two failed once
        assert await queue.sweep() >= 0
        letters = await queue.dead()
        assert sorted(letter.id for letter in letters) == sorted(job.id for job in jobs[25:28])
        assert {letter.error for letter in letters} == {"no good"}
        assert [letter.id for letter in await queue.dead(1, 1)] == [letters[1].id]
        assert await queue.requeue_dead(jobs[25].id) == 1
        assert await queue.requeue_dead() == 2

        async with queue.claim() as claimed:
            assert claimed is not None

        async def fail_in_claim() -> None:
            async with queue.claim() as failing:
                assert failing is not None
                raise RuntimeError("handler failed")  # nacked on the way out

        with pytest.raises(RuntimeError):
            await fail_in_claim()
        again = await queue.next(10)
        assert len(again) == 2
        assert max(job.deliveries for job in again) == 2  # the one the claim gave back
        assert await queue.next(10, ack=again) == []
        async with queue.claim() as nothing:
            assert nothing is None
        assert await queue.drained()
        final = await queue.stats()
        assert (final.completed, final.dead_lettered, final.length) == (40, 3, 0)
        assert await queue.delete()
        assert not cluster_client.exists(layout_key(queue_name, "rotator"), queue.keys.wake)
        assert not await queue.exists()

    run_on(cluster, scenario)


@pytest.mark.cluster
def test_unique_pushes_cancels_pause_resume_and_settings_reach_every_shard(
    cluster: ClusterProcess, queue_name: str
) -> None:
    async def scenario(client: AsyncRedisCluster) -> None:
        queue = sharded(client, queue_name, timeout=30)
        with pytest.raises(NotTracked):
            await queue.push("a", unique=True)
        settings = await queue.configure(track_ids=True, dead_max=50)
        assert settings.track_ids
        ids = [f"u{i}" for i in range(30)]
        assert await queue.push(*ids, unique=True) == 30
        assert await queue.push(*ids[:10], unique=True) == 0  # each held on its own shard
        assert await queue.cancel("u3", "u7", "nope") == 2
        assert await queue.pause()
        assert not await queue.pause()  # already paused
        assert await queue.next(5) == []
        assert all(part.paused for part in await queue.shard_stats())
        assert await queue.resume()
        seen: list[str] = []
        while jobs := await queue.next(8):
            seen += [job.id for job in jobs]
            assert await queue.ack(*jobs) == len(jobs)
        assert sorted(seen) == sorted(set(ids) - {"u3", "u7"})
        histogram = await queue.durations(0.002, 0.5)
        assert sum(histogram.counts) == 2
        assert await queue.delete()

    run_on(cluster, scenario)


@pytest.mark.cluster
def test_the_stored_shard_count_refuses_another_and_open_reads_it(
    cluster: ClusterProcess, cluster_client: RedisCluster, queue_name: str
) -> None:
    async def scenario(client: AsyncRedisCluster) -> None:
        queue = sharded(client, queue_name, shards=4)
        assert await queue.push("a") == 1
        with pytest.raises(ShardsMismatch):
            await sharded(client, queue_name, shards=5).push("b")
        with pytest.raises(ShardsMismatch):
            await sharded(client, queue_name, shards=5).stats()
        opened = await AsyncShardedRotator.open(client, queue_name, timeout=7)
        assert (opened.shards, opened.timeout) == (4, 7)
        assert [job.id for job in await opened.next()] == ["a"]
        assert ShardedRotator(cluster_client, queue_name, shards=None).shards == 4  # the sync twin
        with pytest.raises(ShardsMismatch):
            ShardedRotator(cluster_client, queue_name, shards=3).stats()
        with pytest.raises(ShardsMismatch):
            await AsyncShardedRotator.open(client, f"{queue_name}-never")
        assert await queue.delete()
        assert await sharded(client, queue_name, shards=5).push("b") == 1  # a new count
        assert (await AsyncShardedRotator.open(client, queue_name)).shards == 5

    run_on(cluster, scenario)


@pytest.mark.cluster
def test_a_blocked_consumer_is_woken_by_a_push_to_a_shard_on_another_master_without_polling(
    cluster: ClusterProcess, cluster_client: RedisCluster, queue_name: str
) -> None:
    async def scenario(client: AsyncRedisCluster) -> None:
        consumer = sharded(client, queue_name, timeout=30)
        pusher = sharded(client, queue_name)
        # The layout stored, and the module loaded on every master (NOSCRIPT, SCRIPT LOAD).
        assert await consumer.next() == []
        # An id whose shard is on another master than the wake list (the slot of {NAME}).
        wake_master = cluster_client.get_node_from_key(consumer.keys.wake).name  # type: ignore[no-untyped-call]
        placement = await consumer.placement()
        job_id = next(
            f"w{i}" for i in range(100) if placement[consumer.shard_of(f"w{i}")] != wake_master
        )

        before = command_calls(cluster_client)
        began = time.monotonic()
        waiting = asyncio.create_task(consumer.next(block=10))
        await asyncio.sleep(1.0)  # the consumer is blocked by now
        assert not waiting.done()
        pushed = time.monotonic()
        assert await pusher.push(job_id) == 1
        jobs = await asyncio.wait_for(waiting, timeout=10)
        woken = time.monotonic()
        calls = command_calls(cluster_client) - before
        print(f"woken {(woken - pushed) * 1000:.1f} ms after the push; calls {dict(calls)}")
        assert [job.id for job in jobs] == [job_id]
        assert woken - pushed < 0.5  # the push woke it, not the 10 s block
        assert woken - began < 3.0
        # No polling: one visit of the 6 shards, one BLPOP, then one claim on the shard the
        # wake token named; the pusher's one push_chunk is the other EVALSHA.
        assert calls["blpop"] == 1, calls
        assert calls["evalsha"] <= 6 + 1 + 1, calls
        assert await consumer.ack(*jobs) == 1
        assert await consumer.delete()

    run_on(cluster, scenario)


@pytest.mark.cluster
def test_a_delayed_push_wakes_a_blocked_consumer_when_due(
    cluster: ClusterProcess, queue_name: str
) -> None:
    async def scenario(client: AsyncRedisCluster) -> None:
        queue = sharded(client, queue_name)
        assert await queue.push("later", delay=0.3) == 1
        assert (await queue.stats()).scheduled == 1
        began = time.monotonic()
        (job,) = await queue.next(block=5)
        assert job.id == "later"
        assert 0.2 < time.monotonic() - began < 2.0  # woken by the due time, not the block
        assert await queue.delete()

    run_on(cluster, scenario)


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_two_async_workers_complete_every_job_once_and_stop_when_empty(
    cluster: ClusterProcess, queue_name: str
) -> None:
    async def scenario(client: AsyncRedisCluster) -> None:
        other = async_cluster_client(cluster.nodes[1].url)
        try:
            queues = [sharded(client, queue_name, timeout=30), sharded(other, queue_name)]
            ids = [f"job-{i}" for i in range(1200)]
            assert await queues[0].push_many(ids) == 1200
            done: list[Counter[str]] = [Counter(), Counter()]

            def handler(n: int) -> Callable[[Job], Awaitable[None]]:
                async def handle(job: Job) -> None:
                    await asyncio.sleep(0.001)  # a job takes a little time: both get a share
                    done[n][job.id] += 1

                return handle

            summaries = await asyncio.gather(
                *(
                    queue.work(
                        handler(n),
                        concurrency=2,
                        stop_when_empty=True,
                        batch=20,
                        poll=0.2,
                        install_signal_handlers=False,
                    )
                    for n, queue in enumerate(queues)
                )
            )
            total = done[0] + done[1]
            assert set(total) == set(ids)
            assert set(total.values()) == {1}  # each once: nothing was reclaimed
            assert [summary.processed for summary in summaries] == [sum(c.values()) for c in done]
            assert all(summary.processed > 0 for summary in summaries)  # both took part
            stats = await queues[0].stats()
            assert (stats.length, stats.completed, stats.reclaimed) == (0, 1200, 0)
            assert all(part.completed for part in await queues[0].shard_stats())
            assert sum((await queues[0].durations()).counts) == 1200  # times were reported
            assert await queues[0].workers(include_stale=True) == []  # both left the registry
            assert await queues[0].delete()
        finally:
            await other.aclose()

    run_on(cluster, scenario)


@pytest.mark.cluster
def test_bad_input_raises_typed_errors_and_changes_nothing(
    cluster: ClusterProcess, cluster_client: RedisCluster, queue_name: str
) -> None:
    twin = ShardedRotator(cluster_client, queue_name, shards=6)

    def state() -> list[Any]:
        keys = (layout_key(queue_name, "rotator"), twin.keys.wake)
        client = cast("redis.Redis", cluster_client)  # one key at a time: any client will do
        return [snapshot(client, twin.shard(k)) for k in range(6)] + [
            (cluster_client.hgetall(keys[0]), cluster_client.lrange(keys[1], 0, -1))
        ]

    async def scenario(client: AsyncRedisCluster) -> None:
        fresh = sharded(client, f"{queue_name}-fresh")
        with pytest.raises(InvalidArgument):
            await fresh.push("a", delay=-1)
        assert not cluster_client.exists(layout_key(f"{queue_name}-fresh", "rotator"))

        queue = sharded(client, queue_name, timeout=30)
        await queue.push(*(f"e{i}" for i in range(12)))
        held = await queue.next(3)
        before = state()
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: queue.push("a*b"),
            lambda: queue.push("good", ""),
            lambda: queue.push("a", delay=-1),
            lambda: queue.push("a", delay=1, at=1.0),
            lambda: queue.push("a", priority=10),
            lambda: queue.push_many(["a"], chunk=0),
            lambda: queue.next(0),
            lambda: queue.next(1, block=-1),
            lambda: queue.next(1, block=float("nan")),
            lambda: queue.next(1, ack=["not-a-token"]),
            lambda: queue.ack("not-a-token"),
            lambda: queue.nack(held[0], "nope"),
            lambda: queue.extend(held[0], -5),
            lambda: queue.extend_many(held, 0),
            lambda: queue.cancel("x*"),
            lambda: queue.dead(limit=0),
            lambda: queue.requeue_dead(count=0),
            lambda: queue.configure(dead_max=0),
            lambda: queue.configure(track_ids="yes"),  # type: ignore[arg-type]
        ]
        errors = (InvalidArgument, InvalidJobId, InvalidToken)
        for n, call in enumerate(calls):
            with pytest.raises(errors):
                await call()
            assert state() == before, n
        assert await queue.ack(*held) == 3  # the leases were untouched
        assert await queue.delete()

    run_on(cluster, scenario)
