"""ShardedRotator with ``durability=`` on 3 masters with a replica each (the
`replicated_cluster` fixture, Redis 7.0: WAIT, no WAITAOF) and on a Valkey 8 one with AOF on
(conftest's valkey8_aof_cluster: WAIT, then WAITAOF):
each durable call and its wait go in one pipeline on one connection of the shard's master,
so a call returns only once the shard's replica has its write, and raises NotDurable (the
write applied, not confirmed) when that replica does not answer in time. The first two
tests run on AsyncShardedRotator too (redis.asyncio). The failover run with durable pushes
and acks is in test_sharded.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.retry import Retry

from rotator import Durability, InvalidArgument, NotDurable, Rotator, ShardedRotator, Stats
from rotator.script import function_name
from rotator.sharded import cluster_client
from rotator.sharded_aio import AsyncShardedRotator, async_cluster_client
from tests.servers import ReplicatedClusterProcess, ServerProcess

pytestmark = pytest.mark.cluster

REPLICA = Durability(replicas=1, timeout=3)


@pytest.fixture(autouse=True)
def _quiet_no_waitaof(monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis 7.0 has no WAITAOF: rotator warns once per process that the local AOF is not
    waited for. Said here as if already said, and unsaid after, so that the test of that
    warning (test_durability.py) still sees it whatever ran before."""
    monkeypatch.setattr("rotator.durability._warned_no_waitaof", True)


def shard_nodes(
    cluster: ReplicatedClusterProcess, queue: ShardedRotator | AsyncShardedRotator, job_id: str
) -> tuple[ServerProcess, ServerProcess]:
    """The master that holds ``job_id``'s shard now, and its replica."""
    name = queue.shard_names[queue.shard_of(job_id)]
    master = cluster.master_of_slot(key_slot(name.encode()))
    return master, cluster.replica_of(master)


def on_replica(
    replica: ServerProcess, queue: ShardedRotator | AsyncShardedRotator, job_id: str
) -> Stats:
    """The stats of ``job_id``'s shard as its replica has them now (read there, READONLY)."""
    with replica.client(socket_timeout=2, single_connection_client=True) as client:
        client.execute_command("READONLY")
        k = queue.shard_of(job_id)
        return Rotator(client, queue.shard_names[k], functions=False).stats()


class Stall:
    """``DEBUG SLEEP seconds`` on a node from a thread: it neither serves nor replicates
    (a replica sends no acks) until it wakes. Entered once the sleep has begun."""

    def __init__(self, node: ServerProcess, seconds: float) -> None:
        self.node = node
        self.seconds = seconds
        self.thread = threading.Thread(target=self._sleep)

    def _sleep(self) -> None:
        with self.node.client(socket_timeout=self.seconds + 5) as client:
            client.execute_command("DEBUG", "SLEEP", self.seconds)

    def __enter__(self) -> Stall:
        self.thread.start()
        # Asleep once a PING goes unanswered (a fixed pause raced the thread on a busy machine).
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:
            with self.node.client(socket_timeout=0.05, retry=Retry(NoBackoff(), 0)) as probe:
                try:
                    probe.ping()
                except redis.TimeoutError:
                    return self
            time.sleep(0.01)
        raise AssertionError(f"{self.node.url} never went to sleep")

    def __exit__(self, *exc: object) -> None:
        self.thread.join()


@pytest.fixture
def durable(
    replicated_cluster: ReplicatedClusterProcess, queue_name: str
) -> Iterator[ShardedRotator]:
    queue = ShardedRotator(
        replicated_cluster.client(socket_timeout=5), queue_name, shards=3, durability=REPLICA
    )
    yield queue
    queue.delete()
    queue.client.close()


def test_a_durable_push_and_ack_return_once_the_shards_replica_has_them(
    replicated_cluster: ReplicatedClusterProcess, durable: ShardedRotator
) -> None:
    """The shard's replica sleeps for 0.6 s: a durable push returns only when it woke and
    acked the write, and reading the replica at once finds the job; the same for an ack."""
    _, replica = shard_nodes(replicated_cluster, durable, "a")
    with Stall(replica, 0.6):
        began = time.monotonic()
        assert durable.push("a") == 1
        waited = time.monotonic() - began
        seen = on_replica(replica, durable, "a")
    assert waited > 0.3  # it waited for this replica to have this write
    assert (seen.pending, seen.pushed) == (1, 1)
    (job,) = durable.next()  # not a durable call: wait for the replica to see the lease
    deadline = time.monotonic() + 2
    while on_replica(replica, durable, "a").in_flight != 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with Stall(replica, 0.6):
        began = time.monotonic()
        assert durable.ack(job) == 1
        waited = time.monotonic() - began
        seen = on_replica(replica, durable, "a")
    assert waited > 0.3
    assert (seen.pending, seen.in_flight, seen.length - seen.done) == (0, 0, 0)


def test_an_unconfirmed_durable_push_raises_not_durable_after_it_was_applied(
    replicated_cluster: ReplicatedClusterProcess, durable: ShardedRotator, queue_name: str
) -> None:
    """The shard's replica sleeps for 1.5 s: a durable push with a 0.3 s timeout raises
    NotDurable within it, a plain push returns at once, and both jobs are in. A WAIT sent
    through the cluster client meanwhile (to a node redis-py picks, its default node in
    8.1, on a connection that made no write: what a keyless WAIT gets there) says a
    replica answered: it proves nothing about the write, so the wait must go on the
    connection that wrote."""
    _, replica = shard_nodes(replicated_cluster, durable, "b")
    impatient = ShardedRotator(
        durable.client, queue_name, shards=3, durability=Durability(replicas=1, timeout=0.3)
    )
    plain = ShardedRotator(durable.client, queue_name, shards=3)
    with Stall(replica, 1.5):
        began = time.monotonic()
        with pytest.raises(NotDurable, match="0 replicas"):
            impatient.push("b")
        refused_in = time.monotonic() - began
        began = time.monotonic()
        assert plain.push("c") == 1
        plain_in = time.monotonic() - began
        anywhere = durable.client.execute_command("WAIT", 1, 300)
    assert 0.25 < refused_in < 1.0
    assert plain_in < 0.2
    assert anywhere >= 1  # "confirmed" by replicas that never saw the write
    assert durable.stats().pending == 2  # the unconfirmed push was applied


def test_an_async_durable_push_and_ack_return_once_the_shards_replica_has_them(
    replicated_cluster: ReplicatedClusterProcess, queue_name: str
) -> None:
    """The first test on AsyncShardedRotator: each node pipeline on one connection of the
    redis.asyncio ClusterNode."""
    timings: list[float] = []

    async def main(client: AsyncRedisCluster) -> None:
        durable = AsyncShardedRotator(client, queue_name, shards=3, durability=REPLICA)
        _, replica = shard_nodes(replicated_cluster, durable, "a")
        try:
            with Stall(replica, 0.6):
                began = time.monotonic()
                assert await durable.push("a") == 1
                timings.append(time.monotonic() - began)
                seen = on_replica(replica, durable, "a")
            assert (seen.pending, seen.pushed) == (1, 1)
            (job,) = await durable.next()
            deadline = time.monotonic() + 2
            while on_replica(replica, durable, "a").in_flight != 1:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            with Stall(replica, 0.6):
                began = time.monotonic()
                assert await durable.ack(job) == 1
                timings.append(time.monotonic() - began)
                seen = on_replica(replica, durable, "a")
            assert (seen.pending, seen.in_flight, seen.length - seen.done) == (0, 0, 0)
        finally:
            await durable.delete()

    run_async_on(replicated_cluster, main)
    assert min(timings) > 0.3


def test_an_async_unconfirmed_durable_push_raises_not_durable_after_it_was_applied(
    replicated_cluster: ReplicatedClusterProcess, queue_name: str
) -> None:
    """The second test on AsyncShardedRotator."""
    timings: dict[str, float] = {}

    async def main(client: AsyncRedisCluster) -> None:
        durable = AsyncShardedRotator(client, queue_name, shards=3, durability=REPLICA)
        impatient = AsyncShardedRotator(
            client, queue_name, shards=3, durability=Durability(replicas=1, timeout=0.3)
        )
        plain = AsyncShardedRotator(client, queue_name, shards=3)
        _, replica = shard_nodes(replicated_cluster, durable, "b")
        try:
            with Stall(replica, 1.5):
                began = time.monotonic()
                with pytest.raises(NotDurable, match="0 replicas"):
                    await impatient.push("b")
                timings["refused_in"] = time.monotonic() - began
                began = time.monotonic()
                assert await plain.push("c") == 1
                timings["plain_in"] = time.monotonic() - began
            assert (await durable.stats()).pending == 2  # the unconfirmed push was applied
        finally:
            await durable.delete()

    run_async_on(replicated_cluster, main)
    assert 0.25 < timings["refused_in"] < 1.0
    assert timings["plain_in"] < 0.2


def run_async_on(
    cluster: ReplicatedClusterProcess,
    scenario: Callable[[AsyncRedisCluster], Awaitable[None]],
) -> None:
    """Runs ``scenario`` on an async cluster client of its own, closed after."""

    async def main() -> None:
        client = async_cluster_client(cluster.nodes[0].url)
        try:
            await scenario(client)
        finally:
            await client.aclose()

    asyncio.run(main())


def test_a_durable_push_after_the_masters_scripts_were_flushed_sends_the_module_source(
    replicated_cluster: ReplicatedClusterProcess, durable: ShardedRotator, queue_name: str
) -> None:
    """SCRIPT FLUSH on the shard's master: the durable EVALSHA meets NOSCRIPT (nothing ran)
    and goes again as EVAL of the source, with its wait. With ``functions=True``, after
    FUNCTION FLUSH: FCALL meets "function not found", the library is loaded on that master
    and the call goes as EVAL; the next FCALL finds it. Every push is on the replica."""
    ids = [f"s{i}" for i in range(100) if durable.shard_of(f"s{i}") == 0][:3]
    master, replica = shard_nodes(replicated_cluster, durable, ids[0])
    with master.client(socket_timeout=2) as client:
        client.script_flush()
    assert durable.push(ids[0]) == 1
    fcalls = ShardedRotator(
        durable.client, queue_name, shards=3, functions=True, durability=REPLICA
    )
    with master.client(socket_timeout=2) as client:
        client.function_flush()
        assert fcalls.push(ids[1]) == 1
        loaded = client.function_list(library=function_name())
        assert len(loaded) == 1  # (a library of this module's version)
    assert fcalls.push(ids[2]) == 1
    assert on_replica(replica, durable, ids[0]).pending == 3


def test_a_durable_push_follows_a_slot_that_moved_and_one_that_is_moving(
    replicated_cluster: ReplicatedClusterProcess, durable: ShardedRotator
) -> None:
    """Shard 0's slot moves to another master behind the client's back: its next durable
    push meets MOVED on the old master, refreshes the slot map and lands on the new one
    (its replica has it). Then the slot starts moving back, the shard's keys deleted first:
    a durable push meets ASK at the owner, ASKING plus the call at the importing node gets
    TRYAGAIN there (a multi-key call whose keys are not all in), and it is retried until
    the move is completed, then lands on the importing node."""
    shard = durable.shard_names[0]
    slot = key_slot(shard.encode())
    job_id = next(f"m{i}" for i in range(100) if durable.shard_of(f"m{i}") == 0)
    source = replicated_cluster.master_of_slot(slot)
    target = next(node for node in masters(replicated_cluster) if node is not source)
    assert durable.push(job_id) == 1  # the client's slot map has the source
    try:
        assert replicated_cluster.migrate_slot(slot, target) > 0
        assert durable.push(job_id) == 1  # a second copy: the first one moved with the slot
        assert on_replica(replicated_cluster.replica_of(target), durable, job_id).pending == 2

        source_id, target_id = (replicated_cluster.node_id(n) for n in (source, target))
        with target.client(socket_timeout=2) as dst, source.client(socket_timeout=2) as src:
            for key in dst.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000):
                if shard.encode() in key:
                    dst.delete(key)
            tryagain_before = tryagain(src)
            src.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", target_id)
            dst.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", source_id)

            def finish() -> None:
                time.sleep(0.5)
                for node in (source, *masters(replicated_cluster)):
                    with node.client(socket_timeout=2) as client:
                        client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", source_id)

            mover = threading.Thread(target=finish)
            mover.start()
            began = time.monotonic()
            assert durable.push(job_id) == 1
            took = time.monotonic() - began
            mover.join()
            asked = tryagain(src) - tryagain_before
        assert took > 0.3  # retried until the slot was the source's
        assert asked > 0  # the ASK was followed: the importing node answered TRYAGAIN
        assert on_replica(replicated_cluster.replica_of(source), durable, job_id).pending == 1
    finally:
        for node in masters(replicated_cluster):
            with node.client(socket_timeout=2) as client:
                client.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
        replicated_cluster.migrate_slot(slot, source)


def tryagain(client: redis.Redis) -> int:
    return int(client.info("errorstats").get("errorstat_TRYAGAIN", {}).get("count", 0))


def masters(cluster: ReplicatedClusterProcess) -> list[ServerProcess]:
    found = []
    for node in cluster.nodes:
        with node.client(socket_timeout=2, decode_responses=True) as client:
            if client.info("replication")["role"] == "master":
                found.append(node)
    return found


def test_a_durability_timeout_must_be_shorter_than_the_socket_timeout(
    replicated_cluster: ReplicatedClusterProcess, queue_name: str
) -> None:
    client: RedisCluster = cluster_client(replicated_cluster.nodes[0].url)  # 5 s sockets
    try:
        with pytest.raises(InvalidArgument, match="shorter than"):
            ShardedRotator(client, queue_name, shards=2, durability=Durability(timeout=5))
        with pytest.raises(InvalidArgument, match="Durability"):
            ShardedRotator(client, queue_name, shards=2, durability=1)  # type: ignore[arg-type]
        ShardedRotator(client, queue_name, shards=2, durability=Durability(timeout=4.5))
    finally:
        client.close()


# -- Valkey 8: WAITAOF ---------------------------------------------------------------------


def test_on_valkey_a_durable_push_waits_with_waitaof_for_the_shards_replica(
    valkey8_aof_cluster: ReplicatedClusterProcess, queue_name: str
) -> None:
    """Valkey has WAITAOF (found once per master by the probe): ``Durability(replicas=1)``
    waits for the master's AOF and the replica's. The replica sleeps for 0.6 s: the push
    returns once it woke and fsynced, and it has the job; with a 0.3 s timeout, the next
    push raises NotDurable, and was applied."""
    client = valkey8_aof_cluster.client(socket_timeout=5)
    queue = ShardedRotator(client, queue_name, shards=3, durability=REPLICA)
    impatient = ShardedRotator(
        client, queue_name, shards=3, durability=Durability(replicas=1, timeout=0.3)
    )
    try:
        _, replica = shard_nodes(valkey8_aof_cluster, queue, "v")
        with Stall(replica, 0.6):
            began = time.monotonic()
            assert queue.push("v") == 1
            waited = time.monotonic() - began
            seen = on_replica(replica, queue, "v")
        assert waited > 0.3
        assert seen.pending == 1
        assert list(queue._sender.waitaof.values()) == [True]  # the shard's master has it
        with Stall(replica, 1.0), pytest.raises(NotDurable, match="1 local AOF and 0 replicas"):
            impatient.push("v")
        assert queue.stats().pending == 2
    finally:
        queue.delete()
        client.close()


def test_on_valkey_a_rotator_on_the_cluster_client_waits_with_waitaof(
    valkey8_aof_cluster: ReplicatedClusterProcess, queue_name: str
) -> None:
    """A plain Rotator on the cluster client: its durable push goes as the shards' do, with
    WAITAOF on the queue's master (through the cluster client, WAITAOF went to the default
    node on a connection that made no write, and "confirmed" at once). It returns once the
    replica woke and fsynced; with a 0.3 s timeout, it raises NotDurable, and was
    applied."""
    client = valkey8_aof_cluster.client(socket_timeout=5)
    queue = Rotator(client, queue_name, durability=REPLICA)
    impatient = Rotator(client, queue_name, durability=Durability(replicas=1, timeout=0.3))
    try:
        master = valkey8_aof_cluster.master_of_slot(key_slot(queue.keys.ring.encode()))
        replica = valkey8_aof_cluster.replica_of(master)
        with Stall(replica, 0.6):
            began = time.monotonic()
            assert queue.push("v") == 1
            waited = time.monotonic() - began
        assert waited > 0.3
        with Stall(replica, 1.0), pytest.raises(NotDurable, match="1 local AOF and 0 replicas"):
            impatient.push("w")
        assert queue.stats().pending == 2
    finally:
        queue.delete()
        client.close()
