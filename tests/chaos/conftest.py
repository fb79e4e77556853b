"""Fixtures for the chaos tests: a fresh server per test (faults kill it), a seed, a summary.

Every test runs on Redis 7 and on Valkey 8 (the ``kind`` fixture). The seed comes from
``CHAOS_SEED`` or is drawn at random; it is in every failure message and report.json, so a
failing schedule can be replayed with ``CHAOS_SEED=<seed> pytest -k <test>``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.checker import Report
from tests.chaos.harness import REPORTS, ChaosRun
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


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The issue's figures per server: pushed, kills, restarts, stalls, lost, duplicates."""
    if not REPORTS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("chaos: checker figures per server")
    real = [report for report in REPORTS if "negative_control" not in report.notes]
    controls = [report for report in REPORTS if "negative_control" in report.notes]
    for server, total in sorted(_totals(real).items()):
        write(f"{server}: " + " ".join(f"{k}={v}" for k, v in total.items()))
    # The control runs without persistence on purpose: its loss shows the checker sees loss.
    for server, total in sorted(_totals(controls).items()):
        write(
            f"negative control, {server} (loss expected): lost={total.get('lost', 0)} "
            f"of pushed={total.get('pushed', 0)} over runs={total['runs']}"
        )


def _totals(reports: list[Report]) -> dict[str, dict[str, int]]:
    """Each server's figures summed over ``reports``."""
    totals: dict[str, dict[str, int]] = {}
    for report in reports:
        figures = report.figures()
        total = totals.setdefault(str(figures.pop("server")), {})
        for key, value in figures.items():
            total[key] = total.get(key, 0) + int(value)
        total["runs"] = total.get("runs", 0) + 1
        total["explained_dups"] = total.get("explained_dups", 0) + (
            report.duplicates - sum(d["processed"] - 1 for d in report.unexplained.values())
        )
    return totals
