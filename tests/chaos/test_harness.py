"""The harness's own bookkeeping: what it counts as a finding, what as its own stop, and the
session summary of the runs' figures.

A worker replaced just before the run's end may still be importing when ``stop_processes``
sends SIGTERM; it dies of the default action (-15) before its handler exists. That is our
stop, not a finding; the same exit once the process has logged an event (its handler was in
place) must still be reported.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.chaos import summary
from tests.chaos.eventlog import EventLog
from tests.chaos.harness import ChaosRun, Proc

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(60)]

# A process with no SIGTERM handler: it logs one event when told to, then sleeps.
SLEEPER = """
import sys, time
from pathlib import Path
from tests.chaos import summary
from tests.chaos.eventlog import EventLog
if sys.argv[2] == "log":
    EventLog(Path(sys.argv[1])).write("BOOT", "sleeper")
time.sleep(60)
"""


def sleeper(run: ChaosRun, name: str, *, logs_first: bool) -> Proc:
    log = run.logs / f"{name}.log"
    (run.errs / f"{name}.err").write_bytes(b"")
    popen = subprocess.Popen(
        [sys.executable, "-c", SLEEPER, str(log), "log" if logs_first else "quiet"],
        cwd=Path(__file__).resolve().parents[2],
    )
    proc = Proc(name, "worker", popen, log)
    run.procs.append(proc)
    if logs_first:
        give_up = time.monotonic() + 30
        while not (log.exists() and log.read_bytes()) and time.monotonic() < give_up:
            time.sleep(0.01)
        assert log.read_bytes(), "the sleeper never logged its event"
    return proc


def test_a_sigterm_before_the_first_event_is_our_stop_and_after_it_a_finding(
    tmp_path: Path,
) -> None:
    run = ChaosRun("redis", tmp_path, seed=1, test="harness")  # the server is never started
    starting = sleeper(run, "worker1", logs_first=False)
    booted = sleeper(run, "worker2", logs_first=True)
    run.stop_processes()

    assert starting.popen.returncode == -signal.SIGTERM
    assert booted.popen.returncode == -signal.SIGTERM
    assert -signal.SIGTERM in starting.expected_exits
    assert -signal.SIGTERM not in booted.expected_exits
    assert list(run.unexpected_exits()) == ["worker2"]


def test_an_event_log_opened_but_not_written_still_counts_as_starting(tmp_path: Path) -> None:
    run = ChaosRun("redis", tmp_path, seed=1, test="harness")
    proc = sleeper(run, "worker1", logs_first=False)
    EventLog(proc.log).close()  # the file exists, empty, as a worker's does before its BOOT
    run.stop_processes()
    assert run.unexpected_exits() == {}


def test_the_session_summary_sums_each_servers_runs_and_keeps_the_control_apart() -> None:
    # (rows as workers send them to the controller: plain numbers, the server a string)
    rows = [
        {"server": "redis 7", "pushed": 100, "lost": 0, "explained_dups": 2, "control": False},
        {"server": "redis 7", "pushed": 50, "lost": 0, "explained_dups": 1, "control": False},
        {"server": "valkey 8", "pushed": 10, "lost": 0, "explained_dups": 0, "control": False},
        {"server": "redis 7", "pushed": 1000, "lost": 940, "explained_dups": 0, "control": True},
    ]
    lines: list[str] = []
    summary.write_totals(rows, lines.append)
    assert lines == [
        "redis 7: pushed=150 lost=0 explained_dups=3 runs=2",
        "valkey 8: pushed=10 lost=0 explained_dups=0 runs=1",
        "negative control, redis 7 (loss expected): lost=940 of pushed=1000 over runs=1",
    ]


def test_a_sigkill_is_our_own_only_when_the_run_dealt_it(tmp_path: Path) -> None:
    run = ChaosRun("redis", tmp_path, seed=1, test="harness")
    dealt = sleeper(run, "worker1", logs_first=True)
    foreign = sleeper(run, "worker2", logs_first=True)
    run.kill9(dealt)
    os.kill(foreign.pid, signal.SIGKILL)  # (as the kernel's OOM killer would)
    foreign.popen.wait(timeout=10)
    assert list(run.unexpected_exits()) == ["worker2"]
