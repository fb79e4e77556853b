"""The checker on hand-written histories: it must flag what it is there to flag.

(The negative control in ``test_server_faults.py`` shows the same on a real server.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from tests.chaos.checker import SENTINEL, QueueState, Report, check
from tests.chaos.eventlog import DoneIndex, EventLog, read_logs

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(60)]

TOKEN_A1 = "a*1700000000000.1.1"
TOKEN_A2 = "a*1700000001500.2.7"


def state(ring: list[str] | None = None, done: set[str] | None = None) -> QueueState:
    return QueueState(
        ring=[SENTINEL] if ring is None else ring,
        done=done or set(),
        done_old=set(),
        marks=0,
        marks_old=0,
        dead=[],
    )


def history(tmp_path: Path, lines: Mapping[str, Sequence[tuple[str, ...]]]) -> Path:
    logs = tmp_path / "logs"
    for source, events in lines.items():
        log = EventLog(logs / f"{source}.log")
        for event, *fields in events:
            log.write(event, *fields)
        log.close()
    return logs


def judge(logs: Path, final: QueueState | None = None, *, allow_leftovers: bool = False) -> Report:
    return check(
        logs,
        final or state(),
        test="t",
        kind="redis",
        version="7",
        seed=1,
        allow_leftovers=allow_leftovers,
    )


PUSH_AB: list[tuple[str, ...]] = [("PUSH_INVOKE", "1", "a,b"), ("PUSH_OK", "1")]


def test_a_confirmed_job_never_processed_and_not_in_the_ring_is_lost(tmp_path: Path) -> None:
    logs = history(tmp_path, {"p": PUSH_AB, "w": [("DONE", "a", TOKEN_A1)]})
    report = judge(logs)
    assert report.lost == ["b"]
    assert not report.ok


def test_a_job_still_in_the_ring_is_not_lost_but_stuck_and_not_quiescent(tmp_path: Path) -> None:
    logs = history(tmp_path, {"p": PUSH_AB, "w": [("DONE", "a", TOKEN_A1)]})
    report = judge(logs, state([SENTINEL, "b"]))
    assert (report.lost, report.stuck, report.quiescent) == ([], ["b"], False)


def test_an_unconfirmed_push_that_never_ran_is_not_lost(tmp_path: Path) -> None:
    logs = history(tmp_path, {"p": [("PUSH_INVOKE", "1", "a"), ("PUSH_FAIL", "1", "conn")]})
    report = judge(logs)
    assert (report.lost, report.uncertain, report.ok) == ([], 1, True)


def test_a_processed_id_that_was_never_pushed_is_unexpected(tmp_path: Path) -> None:
    logs = history(tmp_path, {"p": PUSH_AB, "w": [("DONE", "a", "x"), ("DONE", "z", "x")]})
    report = judge(logs)
    assert report.unexpected == ["z"]
    assert report.lost == ["b"]


def test_a_duplicate_without_a_reclaim_or_a_second_push_is_unexplained(tmp_path: Path) -> None:
    logs = history(tmp_path, {"p": PUSH_AB, "w": [("DONE", "a", TOKEN_A1)] * 2})
    report = judge(logs)
    assert report.unexplained == {"a": {"processed": 2, "reclaims": 0, "copies": 1}}


def test_a_duplicate_after_a_reclaim_is_explained(tmp_path: Path) -> None:
    worker = [
        ("FETCH", "a", TOKEN_A1, "0", "1"),
        ("DONE", "a", TOKEN_A1),
        ("FETCH", "a", TOKEN_A2, "1", "2"),
        ("DONE", "a", TOKEN_A2),
        ("ACK_OK", "a", TOKEN_A2, "1"),
    ]
    report = judge(history(tmp_path, {"p": PUSH_AB, "w": worker}))
    assert (report.duplicates, report.unexplained, report.reclaims) == (1, {}, 1)


def test_a_duplicate_after_a_replayed_push_is_explained(tmp_path: Path) -> None:
    producer = [*PUSH_AB[:1], ("PUSH_RETRY", "1", "conn"), PUSH_AB[1]]
    worker = [("DONE", "a", "t1"), ("DONE", "a", "t2"), ("DONE", "b", "t3")]
    report = judge(history(tmp_path, {"p": producer, "w": worker}))
    assert (report.duplicates, report.unexplained) == (1, {})
    assert report.duplicate_detail["a"]["copies"] == 2


def test_a_reclaim_of_a_delivery_whose_ack_was_accepted_is_a_false_reclaim(
    tmp_path: Path,
) -> None:
    worker = [
        ("ACK_OK", "a", TOKEN_A1, "1"),
        ("FETCH", "a", TOKEN_A2, "1", "2"),
        ("DONE", "a", TOKEN_A2),
        ("DONE", "b", "b*1.1.1"),
    ]
    report = judge(history(tmp_path, {"p": PUSH_AB, "w": worker}))
    assert report.false_reclaims == ["a delivery 2"]


def test_broken_ring_structure_is_reported(tmp_path: Path) -> None:
    logs = history(tmp_path, {"p": PUSH_AB, "w": [("DONE", "a", "t"), ("DONE", "b", "t")]})
    final = state([SENTINEL, "a", "a", "x*nan", SENTINEL], done={"gone*1.1.1"})
    report = judge(logs, final)
    assert report.structure == [
        "final: 2 sentinels in a ring of 5",
        "final: malformed element 'x*nan'",
        "final: id 'a' is 2 times in the ring, pushed 1",
        "final: 1 acked tokens are not in the ring",
    ]
    assert judge(logs, final, allow_leftovers=True).leftovers_max == 1


def test_a_line_torn_by_a_sigkill_is_skipped(tmp_path: Path) -> None:
    logs = history(tmp_path, {"p": PUSH_AB, "w": [("DONE", "a", "t"), ("DONE", "b", "t")]})
    with (logs / "w.log").open("ab") as log:
        log.write(b"1.0 DONE b")  # no newline: the writer died here
    read = read_logs(logs)
    assert read.torn == 1
    assert sum(e.kind == "DONE" for e in read.events) == 2
    index = DoneIndex(logs)
    assert "a" in index
    assert "c" not in index
    assert judge(logs).ok
