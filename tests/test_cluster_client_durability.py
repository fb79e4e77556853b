"""Rotator and AsyncRotator on a cluster client (``RedisCluster``, sync and asyncio) with
``durability=``, on 3 masters with a replica each: the `replicated_cluster` fixture's
(Redis 7.0: WAIT), and Redis 8.2 and Valkey 8.1 ones with every node's AOF on (WAIT, then
WAITAOF 1 1). The queue's keys share one hash tag, so one master holds it: each durable call goes
with its wait in one pipeline on one connection of that master's own client (as a sharded
queue's do), not through the cluster client, which sends a keyless WAIT to a node of its
choosing (redis-py 8.1: its default node) on a connection that made none of the writes: a
confirmation at once, whatever the queue's replica has (checked against the code before
this change: these tests failed there)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.crc import key_slot

from rotator import Durability, NotDurable, Rotator, Stats
from rotator.aio import AsyncRotator
from rotator.sharded_aio import async_cluster_client
from tests.helpers import ON_EACH_CLUSTER
from tests.servers import ReplicatedClusterProcess, ServerProcess
from tests.test_sharded_durability import Stall

pytestmark = [pytest.mark.cluster, ON_EACH_CLUSTER]

REPLICA = Durability(replicas=1, timeout=3)
IMPATIENT = Durability(replicas=1, timeout=0.3)


@pytest.fixture(autouse=True)
def _quiet_no_waitaof(monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis 7.0 has no WAITAOF: as in test_sharded_durability.py, the once-per-process
    warning is said here as if already said, and unsaid after."""
    monkeypatch.setattr("rotator.durability._warned_no_waitaof", True)


@pytest.fixture
def cluster_client(replicated_cluster: ReplicatedClusterProcess) -> Iterator[RedisCluster]:
    client = replicated_cluster.client(socket_timeout=5)
    yield client
    client.close()


def queue_nodes(
    cluster: ReplicatedClusterProcess, queue: Rotator | AsyncRotator
) -> tuple[ServerProcess, ServerProcess]:
    """The master that holds ``queue`` now, and its replica."""
    master = cluster.master_of_slot(key_slot(queue.keys.ring.encode()))
    return master, cluster.replica_of(master)


def on_replica(replica: ServerProcess, name: str) -> Stats:
    """Queue ``name``'s stats as the replica has them now (read there, READONLY)."""
    with replica.client(socket_timeout=2, single_connection_client=True) as client:
        client.execute_command("READONLY")
        return Rotator(client, name, functions=False).stats()


def test_a_durable_push_on_a_cluster_client_returns_once_the_replica_has_it(
    replicated_cluster: ReplicatedClusterProcess, cluster_client: RedisCluster, queue_name: str
) -> None:
    """The queue's replica sleeps for 0.6 s: a durable push returns only once it woke and
    acked the write, and reading the replica at once finds the job."""
    queue = Rotator(cluster_client, queue_name, durability=REPLICA)
    _, replica = queue_nodes(replicated_cluster, queue)
    try:
        with Stall(replica, 0.6):
            began = time.monotonic()
            assert queue.push("a") == 1
            waited = time.monotonic() - began
            seen = on_replica(replica, queue_name)
        assert waited > 0.3
        assert seen.pending == 1
    finally:
        queue.delete()


def test_an_unconfirmed_durable_push_on_a_cluster_client_raises_not_durable(
    replicated_cluster: ReplicatedClusterProcess, cluster_client: RedisCluster, queue_name: str
) -> None:
    """The queue's replica sleeps for 1.5 s: a durable push with a 0.3 s timeout raises
    NotDurable within it (not a confirmation from a connection that made no write), and
    the job is in."""
    queue = Rotator(cluster_client, queue_name, durability=IMPATIENT)
    _, replica = queue_nodes(replicated_cluster, queue)
    try:
        with Stall(replica, 1.5):
            began = time.monotonic()
            with pytest.raises(NotDurable, match="0 replicas"):
                queue.push("b")
            refused_in = time.monotonic() - began
        assert 0.25 < refused_in < 1.0
        assert queue.stats().pending == 1
    finally:
        queue.delete()


def test_an_async_durable_push_on_a_cluster_client_waits_for_the_replica(
    replicated_cluster: ReplicatedClusterProcess, queue_name: str
) -> None:
    """The two tests above on a redis.asyncio RedisCluster: the first durable call on a
    client that has not read the slot map yet, a push that returns once the replica has
    it, and one that raises NotDurable at its 0.3 s timeout."""
    timings: dict[str, float] = {}

    async def main(client: AsyncRedisCluster) -> None:
        queue = AsyncRotator(client, queue_name, durability=REPLICA)
        impatient = AsyncRotator(client, queue_name, durability=IMPATIENT)
        _, replica = queue_nodes(replicated_cluster, queue)
        try:
            with Stall(replica, 0.6):
                began = time.monotonic()
                assert await queue.push("a") == 1
                timings["waited"] = time.monotonic() - began
                assert on_replica(replica, queue_name).pending == 1
            with Stall(replica, 1.5):
                began = time.monotonic()
                with pytest.raises(NotDurable, match="0 replicas"):
                    await impatient.push("b")
                timings["refused_in"] = time.monotonic() - began
            assert (await queue.stats()).pending == 2
        finally:
            await queue.delete()

    async def run() -> None:
        client = async_cluster_client(replicated_cluster.nodes[0].url)
        try:
            await main(client)
        finally:
            await client.aclose()

    asyncio.run(run())
    assert timings["waited"] > 0.3
    assert 0.25 < timings["refused_in"] < 1.0
