"""Flushing the server's script cache (``SCRIPT FLUSH``) or function libraries (``FUNCTION
FLUSH``) while jobs flow. Neither is persisted across a flush, so every client must load the
module again and carry on. A NOSCRIPT / "Function not found" reply means nothing ran, so a
flush can never make a job run twice; the README also promises no user-visible error
(scripts are "reloaded after SCRIPT FLUSH") and that every error is a RotatorError.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from rotator import Rotator
from tests.chaos.faultproxy import FaultProxy
from tests.chaos.harness import ChaosRun

AOF_EVERYSEC = {"appendonly": "yes", "appendfsync": "everysec"}

MakeRun = Callable[..., ChaosRun]

# (how the module is called, what is flushed); SCRIPT FLUSH must not even touch FCALL.
STORMS = [("evalsha", "SCRIPT"), ("fcall", "SCRIPT"), ("fcall", "FUNCTION")]


@pytest.mark.chaos
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("calls", "flushed"), STORMS, ids=[f"{c}-{f.lower()}_flush" for c, f in STORMS]
)
def test_a_flush_storm_loses_nothing_and_runs_nothing_twice(
    chaos: MakeRun, calls: str, flushed: str
) -> None:
    run = chaos(AOF_EVERYSEC)
    functions = calls == "fcall"
    producer = run.spawn_producer(count=1500, batch=30, rate=400, functions=functions)
    workers = [
        run.spawn_worker(lease=1.5, functions=functions, mode=mode)
        for mode in ("loop", "loop", "work")
    ]
    run.wait_booted(workers)
    flushes = 0
    storm_ends = time.monotonic() + 3.0
    while time.monotonic() < storm_ends:
        run.admin_call(flushed, "FLUSH")
        flushes += 1
        time.sleep(run.rng.uniform(0.002, 0.02))
    run.faults[f"{flushed.lower()}_flushes"] = flushes
    assert run.wait_exit(producer, 30) == 0, run.stderr(producer)
    run.notes["settled"] = run.settle(timeout=15)

    report = run.check()

    assert not report.lost, report.summary()
    assert not report.unexpected, report.summary()
    assert report.reclaims == 0, report.summary()  # a "not loaded" reply means nothing ran
    assert report.duplicates == 0, report.summary()
    assert not report.structure, report.summary()
    assert report.quiescent, report.summary()
    assert report.pushed == 1500, report.summary()
    # No user-visible error: every call loads the module again as often as it takes.
    assert report.errors == {}, report.summary()


RACES = [
    ("evalsha", "SCRIPT LOAD", "EVALSHA", "SCRIPT"),
    ("fcall", "FUNCTION LOAD", "FCALL", "FUNCTION"),
]


@pytest.mark.chaos
@pytest.mark.timeout(60)
@pytest.mark.parametrize(("calls", "load", "call", "flushed"), RACES, ids=[r[0] for r in RACES])
def test_a_flush_between_reload_and_retry_is_not_user_visible(
    chaos: MakeRun, calls: str, load: str, call: str, flushed: str
) -> None:
    # The storm above, made deterministic: the proxy flushes at the worst moment, after the
    # client loaded the module again and before the call it then retries.
    run = chaos()
    flusher: Any = run.server.client()  # execute_command is untyped in redis-py
    reloaded: set[int] = set()

    def flush_after_reload(name: str, connection: int) -> None:
        if name == load:
            reloaded.add(connection)
        elif name == call and connection in reloaded:
            reloaded.discard(connection)
            flusher.execute_command(flushed, "FLUSH")

    proxy = FaultProxy(run.server.port, seed=run.seed, on_request=flush_after_reload)
    proxy.start()
    try:
        functions = calls == "fcall"
        queue = Rotator(redis.Redis.from_url(proxy.url), "flush-race", functions=functions)
        flusher.execute_command(flushed, "FLUSH")  # the first call finds nothing loaded
        pushed = queue.push("a")
        assert pushed == 1
        assert Rotator(flusher, "flush-race").stats().pending == 1
    finally:
        proxy.stop()
        flusher.close()
