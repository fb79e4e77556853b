"""Fixtures for the chaos tests: a fresh server per test (faults kill it), and a seed.

Every test runs on Redis 7 and on Valkey 8 (the ``kind`` fixture). The seed comes from
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


@pytest.fixture(params=["redis", "valkey"], ids=["redis7", "valkey8"])
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
