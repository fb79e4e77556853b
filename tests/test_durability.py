"""Waiting for persistence after writes, and warnings about settings that lose jobs."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from rotator import Durability, InvalidArgument, NotDurable, Rotator
from tests.servers import ServerProcess


@pytest.fixture(params=["redis", "valkey"], ids=["redis7", "valkey8"])
def aof_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    config = {"appendonly": "yes", "appendfsync": "everysec"}
    with ServerProcess(request.param, tmp_path, config) as server:
        yield server


def test_pushes_wait_for_the_local_aof(
    aof_server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    q = Rotator(aof_server.client(), "durable", durability=Durability(local_aof=True))
    with caplog.at_level(logging.WARNING, logger="rotator"):
        assert q.push("a", "b") == 2
        (job,) = q.next()
        assert q.ack(job) == 1
    if aof_server.kind == "redis" and aof_server.version < "7.2":
        # No WAITAOF before Redis 7.2: said once (not per call), and the writes went through.
        assert sum("no WAITAOF" in r.message for r in caplog.records) == 1
    else:
        assert not caplog.records
    assert q.stats().length == 2


def test_an_unconfirmed_write_raises_not_durable_after_it_was_applied(
    server: ServerProcess, queue_name: str
) -> None:
    # No replica will ever answer: the push is applied, then reported as not durable.
    q = Rotator(
        server.client(),
        queue_name,
        durability=Durability(local_aof=False, replicas=1, timeout=0.1),
    )
    with pytest.raises(NotDurable, match="asked for 0 and 1"):
        q.push("x")
    assert q.stats().pending == 1


def test_asking_for_local_aof_on_a_server_without_aof_is_not_durable(
    valkey_server: ServerProcess, queue_name: str
) -> None:
    q = Rotator(valkey_server.client(), queue_name, durability=Durability())
    with pytest.raises(NotDurable, match="appendonly"):
        q.push("x")


@pytest.mark.parametrize(
    "options",
    [{"replicas": -1}, {"local_aof": False, "replicas": 0}, {"timeout": 0}, {"replicas": True}],
    ids=repr,
)
def test_bad_durability_settings_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        Durability(**options)  # type: ignore[arg-type]


def test_settings_that_can_lose_jobs_are_reported(tmp_path: Path) -> None:
    config = {"maxmemory-policy": "allkeys-lru", "appendonly": "no"}
    with ServerProcess("valkey", tmp_path, config) as server:
        warnings = Rotator(server.client(), "w").server_warnings()
    assert any("maxmemory-policy is allkeys-lru" in w for w in warnings)
    assert any("appendonly is off" in w for w in warnings)


def test_a_safe_server_gives_no_warnings(aof_server: ServerProcess) -> None:
    assert Rotator(aof_server.client(), "w").server_warnings() == []
