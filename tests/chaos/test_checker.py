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


# -- scheduled pushes and recurring schedules ---------------------------------------------

EVERY_MS = 200
LEASE_MS = 1500


def judge_scheduled(
    logs: Path,
    final: QueueState | None = None,
    *,
    snapshots: list[QueueState] | None = None,
    lossy_restarts: Sequence[float] = (),
) -> Report:
    """``judge`` for a run with the schedule ``tick`` every 200 ms and 1.5 s leases."""
    return check(
        logs,
        final or state(),
        test="t",
        kind="redis",
        version="7",
        seed=1,
        snapshots=snapshots,
        schedules={"tick": EVERY_MS},
        leases={"w": LEASE_MS, "v": LEASE_MS},
        lossy_restarts=lossy_restarts,
    )


def claim(job_id: str, claimed_ms: int, deliveries: int = 1, seq: int = 1) -> tuple[str, ...]:
    """A FETCH of ``job_id`` claimed at ``claimed_ms`` by the server's clock."""
    token = f"{job_id}*{claimed_ms + LEASE_MS}.{deliveries}.{seq}00001"
    return ("FETCH", job_id, token, "1" if deliveries > 1 else "0", str(deliveries))


def done(job_id: str) -> tuple[str, ...]:
    return ("DONE", job_id, "t")


def test_a_tick_enqueued_twice_is_doubled_and_its_second_run_unexplained(tmp_path: Path) -> None:
    worker = [claim("tick@1000", 1000), done("tick@1000")]
    other = [claim("tick@1000", 1100, seq=2), done("tick@1000")]
    report = judge_scheduled(history(tmp_path, {"w": worker, "v": other}))
    assert list(report.doubled) == ["tick@1000"]
    assert (report.ticks, report.tick_enqueues, report.tick_refires) == (1, 2, 0)
    assert report.unexplained == {"tick@1000": {"processed": 2, "reclaims": 0, "copies": 1}}
    assert report.unexpected == []  # a tick is no push, yet expected
    assert not report.ok


def test_a_tick_redelivered_after_a_crash_is_one_enqueue(tmp_path: Path) -> None:
    worker = [claim("tick@1000", 1000)]  # killed mid-job
    other = [claim("tick@1000", 2600, deliveries=2, seq=3), done("tick@1000")]
    report = judge_scheduled(history(tmp_path, {"w": worker, "v": other}))
    assert (report.doubled, report.tick_enqueues, report.unexplained) == ({}, 1, {})
    assert report.ok


def test_a_tick_fired_again_after_a_lossy_restart_is_a_refire_not_a_doubled_tick(
    tmp_path: Path,
) -> None:
    # Claimed at t=1.0 s, the server killed at 1.2 s (appendfsync everysec: the firing is
    # lost), the same tick fired again after the restart and claimed at 1.5 s.
    worker = [claim("tick@1000", 1000), done("tick@1000")]
    other = [claim("tick@1000", 1500, seq=2), done("tick@1000")]
    logs = history(tmp_path, {"w": worker, "v": other})
    report = judge_scheduled(logs, lossy_restarts=[1.2])
    assert (report.doubled, report.tick_refires, report.tick_enqueues) == ({}, 1, 2)
    assert report.duplicate_detail == {
        "tick@1000": {"processed": 2, "reclaims": 0, "copies": 2}
    }  # explained by the refire
    assert report.ok
    # A restart that loses nothing (appendfsync always) explains nothing, and neither does a
    # lossy one outside the two claims.
    assert list(judge_scheduled(logs).doubled) == ["tick@1000"]
    assert list(judge_scheduled(logs, lossy_restarts=[1.6]).doubled) == ["tick@1000"]


def test_a_second_first_delivery_seen_only_in_the_queue_counts_as_an_enqueue(
    tmp_path: Path,
) -> None:
    worker = [claim("tick@1000", 1000), done("tick@1000")]
    lost_reply = state([SENTINEL, f"tick@1000*{1100 + LEASE_MS}.1.900001"])
    queued = state([SENTINEL, "tick@1000"])
    logs = history(tmp_path, {"w": worker})
    assert list(judge_scheduled(logs, snapshots=[lost_reply]).doubled) == ["tick@1000"]
    assert list(judge_scheduled(logs, queued).doubled) == ["tick@1000"]


def test_ticks_must_be_whole_intervals_apart(tmp_path: Path) -> None:
    worker = [
        *(
            step
            for ms in (1000, 1200, 1800, 1900)
            for step in (claim(f"tick@{ms}", ms), done(f"tick@{ms}"))
        ),
    ]
    report = judge_scheduled(history(tmp_path, {"w": worker}))
    assert report.tick_spacing == ["tick@1800 -> @1900: not k * 200 ms"]
    assert report.tick_gaps == 2  # 1400 and 1600 collapsed into the catch-up at 1800
    assert report.ticks == 4
    assert not report.ok


def test_a_tick_or_a_scheduled_job_claimed_before_it_was_due_is_early(tmp_path: Path) -> None:
    producer = [("PUSH_INVOKE", "1", "s", "5000"), ("PUSH_OK", "1")]
    worker = [claim("s", 4999), done("s"), claim("tick@1000", 999), done("tick@1000")]
    report = judge_scheduled(history(tmp_path, {"p": producer, "w": worker}))
    assert [line.split(" ", 1)[0] for line in report.early] == [
        f"s*{4999 + LEASE_MS}.1.100001",
        f"tick@1000*{999 + LEASE_MS}.1.100001",
    ]
    assert report.scheduled == 1
    assert not report.ok
    on_time = [claim("s", 5000), done("s"), claim("tick@1000", 1000), done("tick@1000")]
    assert judge_scheduled(history(tmp_path / "b", {"p": producer, "w": on_time})).ok


def test_a_scheduled_job_never_delivered_is_lost_and_one_still_waiting_is_stuck(
    tmp_path: Path,
) -> None:
    producer = [("PUSH_INVOKE", "1", "s,r", "5000"), ("PUSH_OK", "1")]
    logs = history(tmp_path, {"p": producer, "w": [claim("s", 5000), done("s")]})
    report = judge_scheduled(logs)
    assert report.lost == ["r"]
    waiting = judge_scheduled(logs, QueueState([SENTINEL], set(), set(), 0, 0, [], {"r": 5000}))
    assert (waiting.lost, waiting.stuck, waiting.quiescent) == ([], ["r"], False)
    # A schedule's own member is no job: it keeps nothing from falling quiet.
    member = QueueState([SENTINEL], set(), set(), 0, 0, [], {"*beat": 9000})
    assert member.quiet


def test_a_tick_seen_and_never_done_is_lost(tmp_path: Path) -> None:
    report = judge_scheduled(history(tmp_path, {"w": [claim("tick@1000", 1000)]}))
    assert report.lost == ["tick@1000"]


def test_a_scheduled_id_both_waiting_and_queued_is_two_copies(tmp_path: Path) -> None:
    producer = [("PUSH_INVOKE", "1", "s", "5000"), ("PUSH_OK", "1")]
    logs = history(tmp_path, {"p": producer, "w": [claim("s", 5000), done("s")]})
    both = QueueState([SENTINEL, "s"], set(), set(), 0, 0, [], {"s": 5000})
    report = judge_scheduled(logs, snapshots=[both])
    assert report.structure == ["snapshot 0: id 's' is 2 times in the ring, pushed 1"]
