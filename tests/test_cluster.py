"""Rotator on a real 3-master cluster, Redis 7.0 and Valkey 8.1: queues on different nodes, one
slot per queue."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from rotator import Rotator
from rotator.aio import AsyncRotator
from rotator.script import chosen_mode
from tests.helpers import EACH_PLAIN_CLUSTER, later
from tests.servers import ClusterProcess

pytestmark = pytest.mark.cluster
CLUSTER_KINDS = EACH_PLAIN_CLUSTER


def slot(client: RedisCluster, key: str) -> int:
    found: int = client.keyslot(key)  # type: ignore[no-untyped-call]
    return found


def node_of(client: RedisCluster, key: str) -> ClusterNode:
    node: ClusterNode | None = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
    assert node is not None, key
    return node


def names_on_distinct_nodes(client: RedisCluster, base: str, count: int = 3) -> list[str]:
    """Queue names whose hash tags land on `count` different slots of `count` different nodes."""
    picked: dict[str, str] = {}  # node name -> queue name
    for i in range(1000):
        name = f"{base}-{i}"
        ring = f"rotator:{{{name}}}:ring"
        picked.setdefault(node_of(client, ring).name, name)
        if len(picked) == count:
            return list(picked.values())
    raise AssertionError(f"no {count} names on distinct nodes among 1000 tries")


def test_queues_on_three_nodes_each_run_the_whole_api(
    cluster_client: RedisCluster, queue_name: str
) -> None:
    names = names_on_distinct_nodes(cluster_client, queue_name)
    assert len({slot(cluster_client, f"{{{name}}}") for name in names}) == 3
    for name in names:
        queue = Rotator(cluster_client, name, timeout=30, max_deliveries=2)
        slots = {slot(cluster_client, key) for key in queue.keys.all}
        assert slots == {slot(cluster_client, queue.keys.ring)}, name

        assert queue.push("a", "b", "c") == 3
        a, b = queue.next(2)
        assert (a.id, b.id) == ("a", "b")
        assert queue.ack(a) == 1
        assert [entry.state for entry in queue.peek(5)] == ["pending", "lap", "done", "leased"]
        deadline = queue.extend(b, 60)
        assert deadline * 1000 > b.deadline_ms
        assert queue.nack(b) == 1
        c, b_again = queue.next(2)  # the lap drops "a"; "b" is delivered a second time
        assert (c.id, b_again.id, b_again.deliveries) == ("c", "b", 2)
        assert queue.stats().in_flight == 2
        assert queue.ack(c) == 1
        assert queue.nack(b_again) == 1
        assert queue.next() == []  # delivered twice already: "b" is dead-lettered
        (letter,) = queue.dead()
        assert (letter.id, letter.reason, letter.deliveries) == ("b", "max_deliveries", 2)
        assert queue.requeue_dead("b") == 1
        (b_new,) = queue.next()
        assert (b_new.id, b_new.deliveries) == ("b", 1)
        assert queue.ack(b_new) == 1
        assert queue.next() == []  # a lap removes what was acked
        stats = queue.stats()
        assert (stats.length, stats.in_flight, stats.done, stats.dead) == (0, 0, 0, 0)
        on_node = cluster_client.get_redis_connection(
            node_of(cluster_client, queue.keys.ring)
        )  # the queue lives on its own node
        assert on_node.exists(queue.keys.ring, queue.keys.meta) == 2  # the ring and meta


def test_a_blocking_next_on_the_cluster_is_woken_by_a_push(
    cluster: ClusterProcess, cluster_client: RedisCluster, queue_name: str
) -> None:
    queue = Rotator(cluster_client, queue_name, timeout=30)
    pusher_client = cluster.client()
    began = time.monotonic()
    try:
        with later(0.3, lambda: Rotator(pusher_client, queue_name).push("late")):
            jobs = queue.next(block=10)
    finally:
        pusher_client.close()
    assert [job.id for job in jobs] == ["late"]
    assert time.monotonic() - began < 5  # woken by the push, not by the 10 s block
    assert queue.ack(*jobs) == 1


def test_async_rotator_on_an_asyncio_cluster_client(
    cluster: ClusterProcess, queue_name: str
) -> None:
    async def scenario() -> None:
        nodes = [AsyncClusterNode(node.host, node.port) for node in cluster.startup_nodes]
        client = AsyncRedisCluster(startup_nodes=nodes)
        try:
            queue = AsyncRotator(client, queue_name, timeout=30)
            waiting = asyncio.create_task(queue.next(2, block=10))
            await asyncio.sleep(0.2)
            assert await queue.push("x", "y") == 2
            jobs = await asyncio.wait_for(waiting, timeout=10)
            assert [job.id for job in jobs] == ["x", "y"]
            assert await queue.nack(jobs[1]) == 1
            (again,) = await queue.next(ack=[jobs[0]])
            assert (again.id, again.deliveries) == ("y", 2)
            assert await queue.ack(again) == 1
            assert await queue.next() == []
            assert (await queue.stats()).length == 0
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_a_queue_on_a_cluster_client_calls_the_module_by_fcall_in_one_round_trip(
    cluster_client: RedisCluster, queue_name: str
) -> None:
    """redis-py routes an FCALL by asking a node for its keys first (COMMAND GETKEYS), a round
    trip more per call, unless it is told the node: the default caller names the master of
    the queue's slot."""
    nodes = [node.redis_connection for node in cluster_client.get_nodes()]  # type: ignore[no-untyped-call]

    def calls(name: str) -> int:
        return sum(
            int(node.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))
            for node in nodes
            if node is not None
        )

    getkeys, evalsha, fcall = calls("command|getkeys"), calls("evalsha"), calls("fcall")
    queue = Rotator(cluster_client, queue_name)
    assert queue.push("a", "b") == 2
    jobs = queue.next(2)
    assert queue.ack(*jobs) == 2
    assert calls("fcall") - fcall >= 3  # (the first may find the library not loaded yet)
    assert (calls("evalsha"), calls("command|getkeys")) == (evalsha, getkeys)
    assert chosen_mode(cluster_client) == "fcall"


class LosesOneConnection(RedisCluster):
    """A real cluster client whose first command sent to a named node fails as a lost
    connection would, before anything is sent."""

    lost = 0

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if "target_nodes" in kwargs and not self.lost:
            self.lost += 1
            raise RedisConnectionError("lost (injected)")
        return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]


@pytest.mark.cluster
def test_an_fcall_to_a_named_node_goes_again_the_usual_way_after_a_lost_connection(
    cluster: ClusterProcess, queue_name: str
) -> None:
    """redis-py does not retry a command sent to a named node; where the client retries, the
    call goes again routed by redis-py, as it would have retried it. Where it does not
    (retries off, as a ShardedRotator's client), the error is raised."""
    port = cluster.nodes[0].port
    client = LosesOneConnection(host="127.0.0.1", port=port)
    strict = LosesOneConnection(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0))
    try:
        assert Rotator(client, queue_name, functions=True).push("a") == 1
        assert client.lost == 1
        with pytest.raises(RedisConnectionError):
            Rotator(strict, queue_name, functions=True).push("b")
        assert Rotator(strict, queue_name, functions=True).push("b") == 1
        assert Rotator(client, queue_name).stats().pending == 2
    finally:
        client.close()
        strict.close()


def test_an_async_queue_on_a_cluster_client_calls_the_module_by_fcall(
    cluster: ClusterProcess, queue_name: str
) -> None:
    async def scenario() -> None:
        client = AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        try:
            q = AsyncRotator(client, queue_name)
            assert await q.push("a", "b") == 2
            jobs = await q.next(2)
            assert await q.ack(*jobs) == 2
            assert chosen_mode(client) == "fcall"
        finally:
            await client.aclose()

    asyncio.run(scenario())


@pytest.mark.cluster
def test_a_block_longer_than_the_socket_timeout_waits_its_whole_time_on_a_cluster_client(
    cluster: ClusterProcess,
) -> None:
    """BLPOP on the wake list is cut to the connections' socket timeout, so a long block is
    several waits, not a read that times out (redis-py then retries, then raises)."""
    node = cluster.nodes[0]
    client = RedisCluster(host="127.0.0.1", port=node.port, socket_timeout=1)
    try:
        q = Rotator(client, "long-block")
        q.delete()
        began = time.monotonic()
        assert q.next(block=1.6) == []
        assert 1.5 <= time.monotonic() - began < 3
    finally:
        client.close()


@pytest.mark.cluster
def test_a_block_longer_than_the_socket_timeout_on_an_asyncio_cluster_client(
    cluster: ClusterProcess,
) -> None:
    async def scenario() -> float:
        node = cluster.nodes[0]
        client = AsyncRedisCluster(host="127.0.0.1", port=node.port, socket_timeout=1)
        try:
            q = AsyncRotator(client, "long-block-async")
            await q.delete()
            began = time.monotonic()
            assert await q.next(block=1.6) == []
            return time.monotonic() - began
        finally:
            await client.aclose()

    assert 1.5 <= asyncio.run(scenario()) < 3
