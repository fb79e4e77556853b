"""Fixtures for the chaos tests: a fresh server per test (faults kill it), and a seed.

Every test runs on Redis 7, Valkey 8 and Redis 8.2, the newest server we support (the ``kind``
fixture, ``CHAOS_KINDS``); the server faults' and the network faults' also on Redis 6.2, the
oldest, which has no functions, so every process there calls the module by EVALSHA
(``on_the_oldest_too``). The seed comes from
``CHAOS_SEED`` or is drawn at random; it is in every failure message and report.json, so a
failing schedule can be replayed with ``CHAOS_SEED=<seed> pytest -k <test>``. The session
summary of the runs' figures is printed by ``tests/conftest.py`` (see ``summary.py``).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.harness import ChaosRun
from tests.servers import Kind

MakeRun = Callable[..., ChaosRun]


# The servers every chaos test runs on, by the id its test carries.
CHAOS_KINDS: dict[str, Kind] = {"redis7": "redis", "valkey8": "valkey", "redis8": "redis8"}
_OLDEST_TOO: dict[str, Kind] = {**CHAOS_KINDS, "redis6": "redis6"}
# A test that runs on Redis 6.2 as well, whose restarts lose the script cache with no library
# to come back from the AOF (parametrizing ``kind`` overrides the fixture below).
on_the_oldest_too = pytest.mark.parametrize(
    "kind", list(_OLDEST_TOO.values()), ids=list(_OLDEST_TOO)
)


@pytest.fixture(params=list(CHAOS_KINDS.values()), ids=list(CHAOS_KINDS))
def kind(request: pytest.FixtureRequest) -> Kind:
    found: Kind = request.param
    return found


@pytest.fixture
def seed(record_property: Callable[[str, object], None]) -> int:
    value = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(2**32))
    record_property("chaos_seed", value)
    return value


@pytest.fixture
def chaos(
    kind: Kind, seed: int, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[MakeRun]:
    """``chaos(config)`` starts a server with ``config`` and returns its ChaosRun."""
    runs: list[ChaosRun] = []

    def make(config: Mapping[str, str] | None = None, **options: Any) -> ChaosRun:
        run = ChaosRun(
            kind,
            tmp_path / f"run{len(runs)}",
            seed=seed,
            test=request.node.name,
            config=config,
            **options,
        )
        runs.append(run)
        run.start()
        return run

    yield make
    for run in runs:
        run.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Every failed chaos test shows its seed, whatever assertion failed."""
    outcome: Any = yield
    report = outcome.get_result()
    seed = getattr(item, "funcargs", {}).get("seed")
    if report.failed and seed is not None:
        report.sections.append(("chaos seed", f"replay with CHAOS_SEED={seed}"))
