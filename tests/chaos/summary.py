"""The chaos runs' figures for the session summary, summed per server.

A run's report becomes a row of plain numbers (``row``) in the process that ran it, so rows
can travel from pytest-xdist's workers to the controller, which prints the totals
(``write_totals``; the hooks are in ``tests/conftest.py``, the one conftest both load).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tests.chaos.checker import Report

Row = dict[str, Any]


def row(report: Report) -> Row:
    """``report``'s headline figures, its explained duplicates, and whether it was a
    negative control."""
    figures = report.figures()
    unexplained = sum(d["processed"] - 1 for d in report.unexplained.values())
    figures["explained_dups"] = report.duplicates - unexplained
    figures["control"] = "negative_control" in report.notes
    return figures


def totals(rows: Iterable[Row]) -> dict[str, dict[str, int]]:
    """Each server's figures summed over ``rows``, with the number of runs."""
    summed: dict[str, dict[str, int]] = {}
    for each in rows:
        figures = {k: v for k, v in each.items() if k not in ("server", "control")}
        total = summed.setdefault(str(each["server"]), {})
        for key, value in figures.items():
            total[key] = total.get(key, 0) + int(value)
        total["runs"] = total.get("runs", 0) + 1
    return summed


def write_totals(rows: list[Row], write: Callable[[str], None]) -> None:
    """The issue's figures per server (pushed, kills, restarts, stalls, lost, duplicates),
    then the negative control's loss, which shows the checker sees loss."""
    real = [each for each in rows if not each["control"]]
    controls = [each for each in rows if each["control"]]
    for server, total in sorted(totals(real).items()):
        write(f"{server}: " + " ".join(f"{k}={v}" for k, v in total.items()))
    # The control runs without persistence on purpose: its loss shows the checker sees loss.
    for server, total in sorted(totals(controls).items()):
        write(
            f"negative control, {server} (loss expected): lost={total.get('lost', 0)} "
            f"of pushed={total.get('pushed', 0)} over runs={total['runs']}"
        )
