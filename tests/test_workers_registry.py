"""The worker registry (rotator.registry) against real servers: running workers say what they
hold and what they did, a clean stop removes the entry, stale entries are hidden and pruned,
and ``rotator workers`` shows it all. Entries written by hand stand for other machines."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from redis.crc import key_slot

from rotator import Job, Rotator, Topic, WorkSummary
from rotator.aio import AsyncRotator
from rotator.keys import KEY_ROLES, discovered, queue_keys
from rotator.registry import PRUNE_AFTER, REPORT_EVERY, STALE_AFTER, HeldJob, WorkerInfo
from rotator.worker import AsyncWorker, Worker
from tests.helpers import wait_until
from tests.servers import ServerProcess
from tests.test_cli import ROTATOR, cli, ok, ok_json
from tests.test_security import acl_user, rule_for


@contextmanager
def running(worker: Worker) -> Iterator[list[WorkSummary]]:
    """Runs ``worker`` in a thread; stops it and waits for it when the block ends. The list
    gets its summary."""
    summaries: list[WorkSummary] = []
    thread = threading.Thread(
        target=lambda: summaries.append(worker.run(install_signal_handlers=False))
    )
    thread.start()
    try:
        yield summaries
    finally:
        worker.stop()
        thread.join(timeout=30)
        assert not thread.is_alive()


def entry(worker_id: str, seen: float, **changes: Any) -> WorkerInfo:
    """An entry as another machine's worker would write it."""
    host, pid, _ = worker_id.split(":")
    values: dict[str, Any] = {
        "id": worker_id,
        "host": host,
        "pid": int(pid),
        "queue": "orders",
        "started": round(seen - 125, 3),
        "seen": round(seen, 3),
        "holding": 0,
        "completed": 0,
        "retried": 0,
        "dead": 0,
    }
    return WorkerInfo(**(values | changes))


def columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


# -- keys ---------------------------------------------------------------------------------------


def test_the_registry_is_a_key_in_the_queue_slot_that_the_module_never_gets() -> None:
    keys = queue_keys("orders")

    assert keys.workers == "rotator:{orders}:workers"
    assert key_slot(keys.workers.encode()) == key_slot(keys.ring.encode())  # Redis Cluster
    assert "workers" not in KEY_ROLES
    assert keys.workers not in keys.with_items


# -- running workers ----------------------------------------------------------------------------


def test_a_running_worker_shows_its_queue_pid_and_the_job_it_holds(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name, timeout=2.0)
    queue.push("slow", "next")
    started, gate = threading.Event(), threading.Event()

    def handler(job: Job) -> None:
        started.set()
        gate.wait(20)

    worker = Worker(queue, handler)
    with running(worker):
        try:
            assert started.wait(10)
            wait_until(lambda: [w.holding for w in queue.workers()] == [1])
            (info,) = queue.workers()
        finally:
            gate.set()
    now = time.time()

    assert info.id == worker.worker_id
    assert info.id.startswith(f"{socket.gethostname()}:{os.getpid()}:")
    assert (info.host, info.pid, info.queue) == (socket.gethostname(), os.getpid(), queue_name)
    assert [job.id for job in info.held] == ["slow"]  # the first claim takes one job
    assert now - 1 < info.held[0].deadline < now + 3  # a 2 s lease, extended while it runs
    assert info.started <= info.seen <= now
    assert not info.stale
    assert (info.completed, info.retried, info.dead) == (0, 0, 0)


def test_two_workers_in_one_process_have_an_entry_each(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name, timeout=2.0)
    first, second = Worker(queue, lambda job: None, poll=0.1), Worker(queue, lambda job: None)

    with running(first), running(second):
        wait_until(lambda: len(queue.workers()) == 2)
        ids = [info.id for info in queue.workers()]

    assert sorted(ids) == sorted([first.worker_id, second.worker_id])
    assert first.worker_id != second.worker_id


def test_the_entry_counts_jobs_completed_retried_and_dead(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name, timeout=2.0, max_deliveries=2)
    queue.push("ok-1", "flaky", "doomed", "ok-2")

    def handler(job: Job) -> None:
        if job.id == "doomed" or (job.id == "flaky" and job.deliveries == 1):
            raise RuntimeError("not now")

    def counts() -> list[tuple[int, int, int, int]]:
        return [(w.completed, w.retried, w.dead, w.holding) for w in queue.workers()]

    with running(Worker(queue, handler, poll=0.2)) as summaries:
        wait_until(lambda: counts() == [(3, 2, 1, 0)], timeout=20)
        (info,) = queue.workers()

    (summary,) = summaries
    assert (summary.completed, summary.retried, summary.dead) == (3, 2, 1)
    assert info.held == ()


def test_a_clean_stop_removes_the_entry(client: redis.Redis, queue_name: str) -> None:
    queue = Rotator(client, queue_name, timeout=2.0)
    queue.push("a")

    with running(Worker(queue, lambda job: None, poll=0.1)):
        wait_until(lambda: [w.completed for w in queue.workers()] == [1])

    assert queue.workers(include_stale=True) == []
    assert client.exists(queue.keys.workers) == 0


def test_reports_ride_on_the_heartbeat_at_most_once_a_second_not_per_job(
    client: redis.Redis, queue_name: str
) -> None:
    reports: list[WorkerInfo] = []

    class Counting(Rotator):
        def report_worker(self, info: WorkerInfo) -> None:
            reports.append(info)
            super().report_worker(info)

    queue = Counting(client, queue_name, timeout=0.4)  # a heartbeat every 0.1 s
    queue.push_many(str(n) for n in range(300))
    began = time.monotonic()

    summary = Worker(queue, lambda job: time.sleep(0.006), poll=0.05).run(
        stop_when_empty=True, install_signal_handlers=False
    )
    elapsed = time.monotonic() - began

    assert summary.completed == 300
    assert elapsed > 1.5
    assert 2 <= len(reports) <= elapsed / REPORT_EVERY + 2
    assert [r.completed for r in reports] == sorted(r.completed for r in reports)
    assert queue.workers(include_stale=True) == []


def test_an_async_worker_reports_what_it_holds_and_removes_its_entry(
    server: ServerProcess, queue_name: str
) -> None:
    async def scenario() -> None:
        client = aredis.Redis.from_url(server.url)
        try:
            queue = AsyncRotator(client, queue_name, timeout=2.0)
            await queue.push("a")
            gate = asyncio.Event()

            async def handler(job: Job) -> None:
                await gate.wait()

            worker = AsyncWorker(queue, handler, poll=0.1)
            task = asyncio.create_task(worker.run(install_signal_handlers=False))
            give_up = time.monotonic() + 10
            while [w.holding for w in await queue.workers()] != [1]:
                assert time.monotonic() < give_up, "the worker never reported its job"
                await asyncio.sleep(0.02)
            (info,) = await queue.workers()
            gate.set()
            worker.stop()
            summary = await asyncio.wait_for(task, 10)

            assert summary.completed == 1
            assert (info.id, info.pid) == (worker.worker_id, os.getpid())
            assert [job.id for job in info.held] == ["a"]
            assert await queue.workers(include_stale=True) == []
        finally:
            await client.aclose()

    asyncio.run(scenario())


def test_a_worker_the_acl_keeps_out_of_the_registry_works_all_the_same_and_says_so_once(
    server: ServerProcess, client: redis.Redis, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    keys = queue_keys(queue_name)
    # The README's rule with the module's keys named one by one: no registry key.
    rule = [w for w in rule_for(queue_name, "w") if not w.startswith("~")]
    rule += [f"~{key}" for key in keys.all]
    with acl_user(server, client, rule) as user:
        queue = Rotator(user.client, queue_name, timeout=0.4)
        queue.push("a", "b", "c")
        with caplog.at_level(logging.WARNING, logger="rotator.worker"):
            summary = Worker(queue, lambda job: time.sleep(0.8), poll=0.05).run(
                stop_when_empty=True, install_signal_handlers=False
            )

    assert summary.completed == 3
    said = [r.getMessage() for r in caplog.records if "worker registry" in r.getMessage()]
    assert len(said) == 1, said  # three heartbeats had a report due: asked once
    assert said[0].startswith("not reporting to the worker registry")
    assert client.exists(keys.workers) == 0


# -- reading: stale and pruned entries ----------------------------------------------------------


def test_an_entry_reads_back_as_written_and_forget_removes_it(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name)
    now = time.time()
    held = (HeldJob("a", round(now + 20, 3)), HeldJob("b*c", round(now + 21, 3)))
    info = entry("box:7:ab", now, holding=3, completed=5, retried=1, dead=2, held=held)

    queue.report_worker(info)

    assert queue.workers() == [info]
    assert queue.forget_worker("box:7:ab") is True
    assert queue.forget_worker("box:7:ab") is False
    assert queue.workers() == []


def test_stale_entries_are_hidden_unless_asked_for_and_old_ones_are_pruned(
    client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name)
    now = time.time()
    queue.report_worker(entry("live:1:a", now))
    queue.report_worker(entry("gone:2:b", now - STALE_AFTER - 5))
    queue.report_worker(entry("old:3:c", now - PRUNE_AFTER - 5))
    client.hset(queue.keys.workers, "junk", "not json")  # reads as never seen: pruned too

    assert [w.id for w in queue.workers()] == ["live:1:a"]
    assert sorted(client.hkeys(queue.keys.workers)) == [b"gone:2:b", b"live:1:a"]
    everyone = queue.workers(include_stale=True)
    assert [(w.id, w.stale) for w in everyone] == [("gone:2:b", True), ("live:1:a", False)]


# -- rotator workers ----------------------------------------------------------------------------


def test_rotator_workers_shows_a_table_of_live_workers_and_all_of_them_with_all(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name)
    now = time.time()
    held = (HeldJob("order-1", now + 20), HeldJob("order-2", now + 25))
    queue.report_worker(entry("web1:41:aa", now, holding=3, completed=7, retried=2, held=held))
    queue.report_worker(entry("web2:42:bb", now - 600, dead=1))

    header, row = ok(cli(server, "workers", queue_name)).splitlines()

    assert columns(header) == [
        "WORKER", "HOST", "PID", "UP", "SEEN", "HOLDING", "COMPLETED", "RETRIED", "DEAD", "JOBS",
    ]  # fmt: skip
    cells = columns(row)
    assert cells[:3] == ["web1:41:aa", "web1", "41"]
    assert cells[3].startswith("2 min")  # started 125 s ago
    assert re.fullmatch(r"[01] s ago", cells[4])
    assert cells[5:] == ["3", "7", "2", "0", "order-1 order-2 +1 more"]

    shown = ok(cli(server, "workers", queue_name, "--all")).splitlines()
    assert len(shown) == 3
    stale = columns(shown[2])
    assert stale[0] == "web2:42:bb"
    assert re.fullmatch(r"10 min [01] s ago \(stale\)", stale[4])
    assert stale[5:9] == ["0", "0", "0", "1"]


def test_rotator_workers_json_gives_every_field_and_the_lease_deadlines(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name)
    now = round(time.time(), 3)
    queue.report_worker(entry("web1:41:aa", now, holding=1, held=(HeldJob("a", now + 20),)))
    queue.report_worker(entry("web2:42:bb", now - 600))

    (live,) = ok_json(cli(server, "workers", queue_name, "--json"))
    everyone = ok_json(cli(server, "workers", queue_name, "--json", "--all"))

    assert live == {
        "id": "web1:41:aa",
        "host": "web1",
        "pid": 41,
        "queue": "orders",
        "started": round(now - 125, 3),
        "seen": now,
        "holding": 1,
        "completed": 0,
        "retried": 0,
        "dead": 0,
        "held": [{"id": "a", "deadline": round(now + 20, 3)}],
        "stale": False,
    }
    assert [(w["id"], w["stale"]) for w in everyone] == [
        ("web1:41:aa", False),
        ("web2:42:bb", True),
    ]


def test_rotator_workers_says_when_there_are_none(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    assert ok(cli(server, "workers", queue_name)) == f"no workers on queue {queue_name}\n"
    assert ok_json(cli(server, "workers", queue_name, "--json")) == []

    Rotator(client, queue_name).report_worker(entry("web2:42:bb", time.time() - 60))

    assert ok(cli(server, "workers", queue_name)) == (
        f"no workers on queue {queue_name} (1 stale: --all shows them)\n"
    )
    assert ok_json(cli(server, "workers", queue_name, "--json")) == []


def test_rotator_work_shows_up_in_rotator_workers_while_its_command_runs(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    Rotator(client, queue_name).push("job-1")
    env = {k: v for k, v in os.environ.items() if k != "ROTATOR_URL"}

    def listed() -> Any:
        return ok_json(cli(server, "workers", queue_name, "--json"))

    command = [ROTATOR, "--url", server.url, "work", queue_name, "--timeout", "2"]
    with subprocess.Popen(
        [*command, "--until-empty", "--", "sh", "-c", "sleep 3"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as proc:
        try:
            wait_until(lambda: [w["holding"] for w in listed()] == [1], timeout=20)
            (info,) = listed()
        finally:
            code = proc.wait(timeout=30)

    assert code == 0
    assert (info["pid"], info["queue"]) == (proc.pid, queue_name)
    assert [job["id"] for job in info["held"]] == ["job-1"]
    assert ok_json(cli(server, "workers", queue_name, "--json", "--all")) == []


def test_topic_workers_lists_the_workers_of_a_group(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    topic = Topic(client, queue_name)
    topic.subscribe("mail")
    group = topic.group("mail")
    group.report_worker(entry("web1:41:aa", time.time(), queue=f"{queue_name}.mail"))

    (info,) = ok_json(cli(server, "topic", "workers", queue_name, "mail", "--json"))

    assert info["id"] == "web1:41:aa"
    assert group.keys.workers == f"rotator:{{{queue_name}}}:group:mail:workers"
    assert queue_keys(queue_name).workers != group.keys.workers
    assert topic.unsubscribe("mail")
    assert client.exists(group.keys.workers) == 0


def test_delete_removes_the_worker_registry(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    queue = Rotator(client, queue_name)
    queue.push("a")
    queue.report_worker(entry("web1:41:aa", time.time()))

    assert ok(cli(server, "delete", queue_name, "--yes")) == f"deleted {queue_name}\n"

    assert client.exists(queue.keys.workers) == 0


def test_queues_lists_no_registry_as_a_queue(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    Rotator(client, queue_name).push("a")
    Rotator(client, queue_name).report_worker(entry("web1:41:aa", time.time()))
    idle = f"{queue_name}-idle"  # a worker waits on it, nobody pushed yet: no queue
    Rotator(client, idle).report_worker(entry("web1:41:bb", time.time()))

    found = ok_json(cli(server, "queues", "--json"))["queues"]

    assert queue_name in found
    assert idle not in found  # its registry is no queue
    assert discovered(queue_keys(idle).workers) is None
