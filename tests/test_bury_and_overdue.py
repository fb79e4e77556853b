"""Dead letters that say why (``bury``) and stats that tell overdue leases from held ones,
through the Python API, the worker loop and the CLI, on real servers."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from rotator import Rotator
from rotator.aio import AsyncRotator
from rotator.errors import InvalidArgument
from rotator.models import Job
from tests.servers import ServerProcess
from tests.test_cli import cli, ok, ok_json


def state(client: redis.Redis, queue: Rotator) -> dict[str, object]:
    """Every key of the queue, as it stands."""
    found: dict[str, object] = {}
    for key in queue.keys.all:
        kind = client.type(key)
        found[key] = (kind, client.dump(key))
    return found


def test_bury_dead_letters_a_held_job_with_its_error_and_fences_its_token(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name)
    queue.push("a", "b")
    a, b = queue.next(2)
    assert queue.bury(a, error="card declined: * no funds") == 1
    stats = queue.stats()
    assert (stats.done, stats.in_flight, stats.dead) == (1, 1, 0)  # until a walk reaches it
    queue.sweep()
    [letter] = queue.dead()
    assert (letter.id, letter.reason, letter.deliveries) == ("a", "failed", 1)
    assert letter.error == "card declined: * no funds"
    assert queue.ack(a) == 0  # its lease is gone
    assert queue.bury(a, error="again") == 0
    assert queue.ack(b) == 1
    queue.sweep()
    stats = queue.stats()
    assert (stats.length, stats.dead, stats.in_flight, stats.done) == (0, 1, 0, 0)
    assert queue.requeue_dead("a") == 1
    assert [job.id for job in queue.next(5)] == ["a"]


def test_bury_with_too_long_an_error_is_refused_and_writes_nothing(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name)
    queue.push("a")
    [job] = queue.next()
    before = state(client, queue)
    with pytest.raises(InvalidArgument, match="4096 bytes"):
        queue.bury(job, error="x" * 4097)
    assert state(client, queue) == before
    assert queue.bury(job, error="x" * 4096) == 1
    queue.sweep()
    assert queue.dead()[0].error == "x" * 4096


def test_bury_of_a_job_acked_and_gone_writes_no_letter(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name)
    queue.push("a")
    [job] = queue.next()
    assert queue.ack(job) == 1
    queue.sweep()  # its element is gone: the token is no longer known to be acked
    queue.bury(job, error="too late")
    queue.sweep()
    assert queue.dead() == []
    assert queue.stats().length == 0


def test_bury_with_item_stats_records_the_error_too(client: redis.Redis, queue_name: str) -> None:
    queue = Rotator(client, queue_name, item_stats=True)
    queue.push("a")
    [job] = queue.next()
    assert queue.bury(job, error="disk full") == 1
    (stats,) = queue.item_stats("a")
    assert stats is not None
    assert stats.last_error == "disk full"


def test_the_async_client_buries_alike(server: ServerProcess, queue_name: str) -> None:
    async def scenario() -> tuple[int, str | None]:
        client = redis.asyncio.Redis.from_url(server.url)
        try:
            queue = AsyncRotator(client, queue_name)
            await queue.push("a")
            [job] = await queue.next()
            buried = await queue.bury(job, error="boom")
            await queue.sweep()
            return buried, (await queue.dead())[0].error
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == (1, "boom")


def test_a_worker_buries_a_job_that_fails_its_last_delivery_with_the_error(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name, max_deliveries=2)
    queue.push("bad")

    def handler(job: Job) -> None:
        raise ValueError(f"no such order {job.id} (delivery {job.deliveries})")

    summary = queue.work(handler, stop_when_empty=True, install_signal_handlers=False)
    assert (summary.completed, summary.retried, summary.dead) == (0, 1, 1)
    [letter] = queue.dead()
    assert (letter.id, letter.reason, letter.deliveries) == ("bad", "failed", 2)
    assert letter.error == "ValueError: no such order bad (delivery 2)"


def test_cli_bury_and_dead_show_the_error_on_the_letters_line(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name, max_deliveries=1)
    queue.push("a", "b")
    a, b = queue.next(2)
    error = "card\tdeclined\nretry no"
    assert ok(cli(server, "bury", queue_name, a.token, "--error", error)) == "1\n"
    refused = cli(server, "bury", queue_name, a.token)
    assert (refused.exit_code, refused.stdout) == (1, "0\n")
    assert "1 of 1 tokens refused" in refused.stderr
    queue.nack(b)
    assert queue.next() == []  # a's letter; b had its one delivery: a letter without an error
    assert ok(cli(server, "dead", queue_name)).splitlines() == [
        "a\tfailed\t1\tcard declined retry no",  # the error's whitespace folded to one line
        "b\tmax_deliveries\t1",
    ]
    letters = ok_json(cli(server, "dead", queue_name, "--json"))
    assert [(d["id"], d["reason"], d["error"]) for d in letters] == [
        ("a", "failed", error),
        ("b", "max_deliveries", None),
    ]


def test_stats_tell_overdue_leases_from_held_ones(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name, timeout=1.0)
    queue.push("a", "b", "c")
    held = Rotator(client, queue_name, timeout=60)
    queue.next(2)  # a and b: their leases run out, and nobody claims them again
    held.next(1)  # c: held
    time.sleep(1.15)
    stats = queue.stats()
    assert (stats.overdue, stats.overdue_capped, stats.in_flight, stats.length) == (2, False, 1, 3)
    assert not queue.drained()
    shown = ok(cli(server, "stats", queue_name))
    assert "overdue              2" in shown
    assert "overdue_capped" not in shown
    assert ok_json(cli(server, "stats", queue_name, "--json"))["overdue"] == 2
    assert sorted(job.id for job in held.next(5)) == ["a", "b"]
    stats = queue.stats()
    assert (stats.overdue, stats.in_flight) == (0, 3)


def test_stats_say_when_the_overdue_count_is_a_lower_bound(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name, timeout=1.0)
    queue.push(*[f"j{i}" for i in range(150)])
    for _ in range(150):
        assert len(queue.next(1)) == 1  # 150 leases of their own
    time.sleep(1.15)
    stats = queue.stats()
    assert (stats.overdue, stats.overdue_capped) == (100, True)
    assert "overdue              100+" in ok(cli(server, "stats", queue_name))
