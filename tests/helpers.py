"""Small test helpers shared by the integration tests."""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from rotator import Rotator, Stats, TopicStats
from rotator.protocol import text

# A test (or a file's pytestmark) marked so runs on each kind of replicated cluster that
# conftest's `replicated_cluster` gives: the session's Redis 7.0 one (WAIT alone), and the
# file's Redis 8.2 and Valkey 8.1 ones with AOF on (WAIT, then WAITAOF).
ON_EACH_CLUSTER = pytest.mark.parametrize(
    "replicated_cluster", ["redis7", "redis8-aof", "valkey8-aof"], indirect=True
)

# A test file that sets ``CLUSTER_KINDS = EACH_PLAIN_CLUSTER`` runs each of its tests that use
# conftest's `cluster` (3 masters, no replicas) on Redis 7.0 and on Valkey 8.1.
EACH_PLAIN_CLUSTER = ("redis7", "valkey8")


NODE_PACKAGE = Path(__file__).resolve().parent.parent / "clients" / "node"
# A small command line over the built Node package (push, work, publish, consume).
NODE_SCRIPT = NODE_PACKAGE / "scripts" / "interop.js"
NODE_TIMEOUT = 60.0  # seconds any node process may take


def built_node() -> str:
    """The node binary, with the package built; fails with how to get either."""
    found = shutil.which("node")
    if found is None:
        pytest.fail(
            "node not found: install it with `apt-get install -y nodejs npm`", pytrace=False
        )
    if (
        not (NODE_PACKAGE / "dist" / "index.js").exists()
        or not (NODE_PACKAGE / "node_modules").exists()
    ):
        pytest.fail(
            "the Node package is not built: run `npm ci && npm run build` in clients/node"
            " (python3 tasks.py test does)",
            pytrace=False,
        )
    return found


def worker_notes(path: Path) -> list[tuple[str, float]]:
    """(job id, time) of each line of a worker process's notes, "<id> <time>" or "<id>"
    (time 0); [] while the file is not there."""
    found = []
    for line in path.read_text().splitlines() if path.exists() else []:
        job_id, _, at = line.partition(" ")
        found.append((job_id, float(at or 0)))
    return found


def confirmed_acks(outs: list[Path]) -> dict[str, tuple[float, float]]:
    """By worker notes (each OUT lists a worker's runs, "<id> <time>", and OUT.acked its
    confirmed acks): each acked job's first confirmed ack, and when the run it completed
    began (that worker's last run of the job before the ack)."""
    acked: dict[str, tuple[float, float]] = {}
    for out in outs:
        runs: dict[str, list[float]] = {}
        for job_id, at in worker_notes(out):
            runs.setdefault(job_id, []).append(at)
        for job_id, at in worker_notes(out.with_name(out.name + ".acked")):
            if at < acked.get(job_id, (at + 1, 0.0))[0]:
                acked[job_id] = (at, max(t for t in runs[job_id] if t <= at))
    return acked


def runs_after_confirmed_ack(
    outs: list[Path], acked: dict[str, tuple[float, float]]
) -> list[tuple[str, float]]:
    """The runs of a job after its confirmed ack (``confirmed_acks``), each as the job id and
    when the run that ack completed began."""
    return sorted(
        {(job_id, acked[job_id][1]) for out in outs for job_id, at in worker_notes(out)
         if job_id in acked and at > acked[job_id][0]}
    )  # fmt: skip


def snapshot(client: redis.Redis, rotator: Rotator) -> dict[str, Any]:
    """Every key of a queue, by value, so a test can assert that nothing changed."""
    state: dict[str, Any] = {}
    for key in rotator.keys.all:
        kind = text(client.type(key))
        if kind == "list":
            state[key] = client.lrange(key, 0, -1)
        elif kind == "set":
            state[key] = sorted(client.smembers(key))
        elif kind == "hash":
            state[key] = client.hgetall(key)
        elif kind == "zset":
            state[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == "string":
            state[key] = client.get(key)
        else:
            state[key] = kind
    return state


def drain(rotator: Rotator, count: int = 100) -> list[str]:
    """Leases and acks everything available now; returns the job ids, in order."""
    seen: list[str] = []
    while jobs := rotator.next(count):
        seen.extend(job.id for job in jobs)
        rotator.ack(*jobs)
    return seen


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    give_up = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < give_up, "condition not reached in time"
        time.sleep(0.01)


@contextmanager
def later(delay: float, action: Callable[[], object]) -> Iterator[None]:
    """Runs ``action`` in a thread of its own ``delay`` seconds into the block. Leaving the
    block joins the thread and raises what the action raised: the test's teardown (a client
    closed, a queue deleted) never races the action, and a failed action fails the test,
    where ``threading.Timer`` would only print it."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as error:  # (raised in the test's own thread below)
            failures.append(error)

    timer = threading.Timer(delay, run)
    timer.start()
    try:
        yield
    finally:
        timer.join()
    if failures:
        raise failures[0]


@contextmanager
def monitored(client: redis.Redis) -> Iterator[list[str]]:
    """The commands clients send the server while the block runs, as MONITOR shows them
    (each its arguments joined by spaces; the commands scripts run left out). On a shared
    server this sees other clients' commands too: filter by a key of the test's own."""
    seen: list[str] = []
    marker = f"monitored-{uuid.uuid4().hex}"
    where = client.connection_pool.connection_kwargs
    watcher = redis.Redis(host=where["host"], port=where["port"])
    with watcher.monitor() as monitor:  # type: ignore[no-untyped-call]

        def read() -> None:
            while marker not in (command := monitor.next_command())["command"]:
                if command["client_type"] != "lua":
                    seen.append(command["command"])

        reader = threading.Thread(target=read, name="monitored", daemon=True)
        reader.start()
        yield seen
        client.echo(marker)  # the last command the reader sees
        reader.join(10)
    watcher.close()
    assert not reader.is_alive(), "MONITOR never showed the end marker"


def without_age(value: Any) -> Any:
    """A read's result with the oldest pending job's age (it grows as the test runs) left out."""
    if isinstance(value, Stats):
        return dataclasses.replace(value, oldest_pending_age=None)
    if isinstance(value, TopicStats):
        groups = {name: without_age(stats) for name, stats in value.groups.items()}
        return dataclasses.replace(value, groups=groups)
    return value
