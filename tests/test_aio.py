"""AsyncRotator on redis.asyncio against real servers.

Each test is a plain function that runs its scenario with ``asyncio.run``, on a client of its
own that the scenario closes.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio as aredis

from rotator import Durations, Job, Stats
from rotator.aio import AsyncRotator
from tests.servers import ServerProcess

Scenario = Callable[[aredis.Redis], Awaitable[None]]


def run_on(server: ServerProcess, scenario: Scenario) -> None:
    async def main() -> None:
        client = aredis.Redis.from_url(server.url)
        try:
            await scenario(client)
        finally:
            await client.aclose()

    asyncio.run(main())


def test_push_next_and_ack_round_trip(server: ServerProcess, queue_name: str) -> None:
    async def scenario(client: aredis.Redis) -> None:
        queue = AsyncRotator(client, queue_name, timeout=30)
        assert await queue.push("a", "b", "c") == 3
        jobs = await queue.next(2)
        assert [(job.id, job.deliveries, job.reclaimed) for job in jobs] == [
            ("a", 1, False),
            ("b", 1, False),
        ]
        (last,) = await queue.next(5, ack=jobs)
        assert last.id == "c"
        assert (await queue.stats()).in_flight == 1
        assert await queue.ack(last) == 1
        assert await queue.next(5) == []
        assert await queue.stats() == Stats(
            0,
            0,
            0,
            0,
            0,
            0,
            None,
            pushed=3,
            delivered=3,
            completed=3,
            retried=0,
            reclaimed=0,
            dead_lettered=0,
            cancelled=0,
            durations=Durations((0,) * 26),
        )

    run_on(server, scenario)


def test_whole_batches_are_acked_as_one_batch_ack_and_refusals_token_by_token(
    server: ServerProcess, queue_name: str
) -> None:
    async def scenario(client: aredis.Redis) -> None:
        queue = AsyncRotator(client, queue_name, timeout=30)
        marks, done = queue.keys.all[3], queue.keys.all[1]
        await queue.push("a", "b", "c", "d")
        first = await queue.next(2)
        leases = queue.keys.leases
        second = await queue.next(2, ack=first)  # carried by next: one batch ack
        # The batch ack marked the batch acked whole (no token in `done`), and the same call's
        # walk of the lease list took the batch away, mark and all.
        assert await client.scard(done) == 0
        assert await client.hgetall(marks) == {}
        assert await client.llen(leases) == 1  # the second batch, not the first
        assert [job.id for job in second] == ["c", "d"]
        assert await queue.nack(second[0], delay=60) == 1  # revokes the second batch
        assert await queue.ack(*second) == 1  # refused as a batch, then d alone
        assert await client.smembers(done) == {second[1].token.encode()}

    run_on(server, scenario)


def test_a_next_woken_after_a_script_flush_still_gets_the_job(
    server: ServerProcess, queue_name: str
) -> None:
    async def scenario(client: aredis.Redis) -> None:
        queue = AsyncRotator(client, queue_name, timeout=30)
        assert await queue.next() == []  # the script is loaded

        async def flush_then_push() -> None:
            await asyncio.sleep(0.2)
            async with aredis.Redis.from_url(server.url) as other:
                await other.script_flush()
            await queue.push("after")

        pusher = asyncio.create_task(flush_then_push())
        (job,) = await queue.next(block=10)
        await pusher
        assert (job.id, job.deliveries) == ("after", 1)
        assert await queue.ack(job) == 1

    run_on(server, scenario)


def test_a_blocked_next_is_woken_by_a_push_from_another_task(
    server: ServerProcess, queue_name: str
) -> None:
    async def scenario(client: aredis.Redis) -> None:
        queue = AsyncRotator(client, queue_name, timeout=30)
        began = time.monotonic()
        waiting = asyncio.create_task(queue.next(block=10))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # nothing to take yet: it is blocked
        await AsyncRotator(client, queue_name).push("wake-up")
        jobs = await asyncio.wait_for(waiting, timeout=10)
        assert [job.id for job in jobs] == ["wake-up"]
        assert time.monotonic() - began < 5  # woken by the push, not by the 10 s block

    run_on(server, scenario)


def test_an_async_idempotency_callback_acks_a_reclaimed_job_instead_of_returning_it(
    server: ServerProcess, queue_name: str
) -> None:
    asked: list[str] = []

    async def already_done(job_id: str) -> bool:
        await asyncio.sleep(0)
        asked.append(job_id)
        return True

    async def scenario(client: aredis.Redis) -> None:
        queue = AsyncRotator(client, queue_name, timeout=0.15, idempotency=already_done)
        await queue.push("paid")
        (first,) = await queue.next()
        assert asked == []  # a first delivery is not screened
        await asyncio.sleep(0.25)  # the lease runs out; the next lease is a reclaim
        assert await queue.next() == []
        assert asked == ["paid"]
        assert await queue.ack(first) == 0  # its lease was re-issued, then acked by next
        await asyncio.sleep(0.25)
        assert await queue.next() == []  # acked, so it never comes back
        stats = await queue.stats()
        assert (stats.length, stats.in_flight, stats.dead) == (0, 0, 0)

    run_on(server, scenario)


def test_work_with_three_tasks_runs_three_handlers_at_once_and_each_job_once(
    server: ServerProcess, queue_name: str
) -> None:
    ids = [f"job-{i}" for i in range(30)]
    seen: list[str] = []

    async def scenario(client: aredis.Redis) -> None:
        queue = AsyncRotator(client, queue_name, timeout=30)
        await queue.push(*ids)
        first_three = asyncio.Barrier(3)  # times out (and the job fails) unless 3 run together

        async def handler(job: Job) -> None:
            seen.append(job.id)
            if len(seen) <= 3:
                await asyncio.wait_for(first_three.wait(), timeout=10)
            await asyncio.sleep(0.001)

        summary = await queue.work(handler, concurrency=3, stop_when_empty=True, poll=0.2)
        assert summary.processed == 30
        assert await queue.next() == []
        assert (await queue.stats()).length == 0

    run_on(server, scenario)
    assert Counter(seen) == Counter(ids)


def test_claim_acks_when_the_block_ends_and_nacks_when_it_raises(
    server: ServerProcess, queue_name: str
) -> None:
    async def scenario(client: aredis.Redis) -> None:
        queue = AsyncRotator(client, queue_name, timeout=30)
        await queue.push("good")
        async with queue.claim() as job:
            assert job is not None
            assert job.id == "good"
        assert await queue.next() == []  # acked: the lap removes it
        assert (await queue.stats()).length == 0

        await queue.push("bad")
        claimed: list[Job] = []

        async def fail_inside_claim() -> None:
            async with queue.claim() as job:
                assert job is not None
                claimed.append(job)
                raise RuntimeError("handler failed")

        with pytest.raises(RuntimeError, match="handler failed"):
            await fail_inside_claim()
        (again,) = await queue.next()  # given back at once, as a new delivery
        assert (again.id, again.deliveries, again.reclaimed) == ("bad", 2, False)
        assert [job.id for job in claimed] == ["bad"]
        assert await queue.ack(claimed[0]) == 0  # the nack revoked the claimed delivery

        async with queue.claim(block=0.1) as nothing:
            assert nothing is None

    run_on(server, scenario)


def test_the_async_worker_counts_jobs_retried_and_dead_and_dead_letters_at_the_last_delivery(
    server: ServerProcess, queue_name: str
) -> None:
    async def scenario(client: aredis.Redis) -> None:
        queue = AsyncRotator(client, queue_name, timeout=30, max_deliveries=2)
        await queue.push("doomed", "fine")

        async def handler(job: Job) -> None:
            if job.id == "doomed":
                raise ValueError("always")

        summary = await queue.work(handler, stop_when_empty=True, poll=0.2)
        assert (summary.completed, summary.retried, summary.dead, summary.failed) == (1, 1, 1, 2)
        assert [letter.id for letter in await queue.dead()] == ["doomed"]

    run_on(server, scenario)
