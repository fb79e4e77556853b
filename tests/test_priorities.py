"""Priorities (``push(..., priority=p)``): through the Python API (sync and async), the
producer buffer, the CLI, and on Redis Cluster, on real servers."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aredis
from redis.cluster import RedisCluster

from rotator import Rotator
from rotator.aio import AsyncRotator
from rotator.errors import InvalidArgument
from tests.servers import ServerProcess
from tests.test_cli import cli, ok, ok_json


def ids_of(q: Rotator, count: int = 100) -> list[str]:
    jobs = q.next(count)
    assert q.ack(*jobs) == len(jobs)
    return [job.id for job in jobs]


def test_a_claim_hands_out_the_most_urgent_level_first_and_fifo_within_one(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    assert q.push("a1") == 1
    assert q.push("low-1", "low-2", priority=9) == 2
    assert q.push("mid-1", priority=4) == 1
    assert q.push("a2", priority=0) == 1
    assert q.push("mid-2", priority=4) == 1
    stats = q.stats()
    assert (stats.pending, stats.prioritized, stats.length) == (6, 4, 6)
    assert ids_of(q, 3) == ["a1", "a2", "mid-1"]
    assert q.push("a3") == 1  # level 0 comes first again
    assert ids_of(q) == ["a3", "mid-2", "low-1", "low-2"]
    assert q.stats().prioritized == 0


def test_a_level_waits_while_a_more_urgent_one_has_jobs(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    q.push("later", priority=1)
    seen: list[str] = []
    for batch in range(3):
        q.push(f"now-{batch}")
        seen += ids_of(q, 1)
    assert seen == ["now-0", "now-1", "now-2"]
    assert ids_of(q) == ["later"]


def test_a_delayed_job_keeps_its_priority(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    assert q.push("urgent-later", delay=0.2, priority=1) == 1
    assert q.push("routine", priority=5) == 1
    assert q.stats().scheduled == 1
    [first] = q.next(1, block=3)
    assert first.id == "routine"  # the delayed one is not due yet
    q.ack(first)
    q.push("routine-2", priority=5)
    [job] = q.next(1, block=3)
    if job.id == "routine-2":  # the claim ran before it fell due
        q.ack(job)
        [job] = q.next(1, block=3)
    assert job.id == "urgent-later"


def test_a_priority_out_of_range_is_refused_and_pushes_nothing(
    client: redis.Redis, queue_name: str
) -> None:
    q = Rotator(client, queue_name)
    for bad in (10, -1, True, "1", 1.0):
        with pytest.raises(InvalidArgument, match="priority"):
            q.push("a", priority=bad)  # type: ignore[arg-type]
    assert not q.exists()


def test_a_tracked_queue_holds_a_prioritized_id_once(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    q.configure(track_ids=True)
    assert q.push("a", "b", priority=3, unique=True) == 2
    assert q.push("a", priority=1, unique=True) == 0
    assert q.cancel("b") == 1
    stats = q.stats()
    assert (stats.prioritized, stats.pending, stats.cancelled) == (1, 1, 1)
    assert ids_of(q) == ["a"]


def test_the_producer_buffer_takes_priorities(client: redis.Redis, queue_name: str) -> None:
    q = Rotator(client, queue_name)
    with q.producer(max_batch=10, max_delay=5) as p:
        p.push("low", priority=8)
        p.push("high")
        p.push("mid", priority=2)
    assert ids_of(q) == ["high", "mid", "low"]
    with pytest.raises(InvalidArgument, match="priority"), q.producer() as p:
        p.push("bad", priority=12)


def test_the_async_client_pushes_at_a_priority(server: ServerProcess, queue_name: str) -> None:
    async def scenario() -> None:
        client = aredis.Redis.from_url(server.url)
        try:
            q = AsyncRotator(client, queue_name)
            assert await q.push("low", priority=7) == 1
            assert await q.push_many(["high"], priority=0) == 1
            assert [job.id for job in await q.next(10)] == ["high", "low"]
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_the_cli_pushes_at_a_priority(server: ServerProcess, queue_name: str) -> None:
    assert ok(cli(server, "push", queue_name, "low", "--priority", "6")) == "1\n"
    assert ok(cli(server, "push", queue_name, "high")) == "1\n"
    assert ok_json(cli(server, "stats", queue_name, "--json"))["prioritized"] == 1
    result = cli(server, "push", queue_name, "x", "--priority", "10")
    assert result.exit_code == 2
    jobs = ok_json(cli(server, "next", queue_name, "--count", "5", "--json"))
    assert [job["id"] for job in jobs] == ["high", "low"]


@pytest.mark.cluster
def test_priorities_run_on_redis_cluster(cluster_client: RedisCluster, queue_name: str) -> None:
    q = Rotator(cluster_client, queue_name)
    q.push("low", priority=5)
    q.push("later", delay=0.1, priority=1)
    q.push("high")
    assert ids_of(q, 1) == ["high"]
    [job] = q.next(1, block=3)
    if job.id == "low":  # claimed before "later" fell due
        q.ack(job)
        [job] = q.next(1, block=3)
    assert job.id == "later"
