"""Judges a chaos run from its event logs and the queue's keys, in the style of Jepsen's
``total-queue`` checker: what went in must come out.

From the logs (``eventlog.py``): ``attempted`` = ids in any PUSH_INVOKE, ``confirmed`` = ids of
batches with a PUSH_OK, ``uncertain`` = attempted - confirmed; ``processed[id]`` = its DONE
lines; ``reclaims[id]`` = its FETCH lines with reclaimed=1; ``copies[id]`` = how many times a
push of it may have reached the server (every PUSH_INVOKE of its batch plus every PUSH_RETRY,
redis-py's own replays): an upper bound, since a refused connection is counted as well.

* lost        = confirmed - processed - ids still in the ring: must be empty.
* unexpected  = processed - attempted: must be empty (catches a misparsed element).
* recovered   = uncertain & processed: informational.
* duplicates  = sum of processed[id] - 1; a duplicate is *explained* when
  ``processed[id] - 1 <= reclaims[id] + copies[id] - 1``: each extra run follows a re-lease
  of an expired lease, or a push that ran twice. Unexplained duplicates must be empty.
* false reclaims: a re-lease of a delivery whose ack the server had accepted: must be empty.
* structure, at every snapshot and at the end (packed batches read as the leases they stand
  for): exactly one ``*lap`` in a non-empty ring;
  every element is the sentinel, a valid id or a well-formed token; no id more often than
  its copies; acked tokens (done, done_old) are tokens in the ring. That last one has
  documented exceptions: an ack that arrives after its element left the ring (a replayed
  ack after a lost reply) stays as a leftover for up to two laps, so runs with network or
  server faults allow leftovers mid-run and count them.
* quiescence, after the final drain: the ring holds only the sentinel, done/done_old and the
  marks hashes are empty, no job waits in the scheduled set, and the dead letters hold what
  the test expects.

Scheduled pushes and recurring schedules (issue 15). A scheduled push logs the earliest time
it can be due as a third PUSH_INVOKE field (unix ms: ``at``, or the client's clock before the
call plus ``delay``; the server's clock is the same machine's). Ticks of a recurring schedule
have no PUSH_INVOKE: the server pushes ``<job id>@<tick ms>`` itself. The checker is told the
schedules (job id -> interval ms) and each source's lease (ms), from which a token's deadline
gives the server's time of the claim (deadline - lease).

* early       = deliveries of a scheduled job or a tick leased, by the server's clock, before
  it was due: must be empty.
* enqueues    = an id's distinct first-delivery tokens (deliveries 1, from FETCH and CLAIM
  lines and from every state read) plus its untaken copies at the end: a redelivery after a
  crash (deliveries > 1) is the same enqueue, not a second one. ``doubled`` = scheduled ids
  enqueued more often than pushed, and ticks enqueued more than once: must be empty. The one
  exception: with a server whose restarts may lose acknowledged writes (``lossy_restarts``:
  appendfsync everysec or no), a tick fired again after a restart carries the same id as the
  firing the server lost; two first deliveries of a tick with such a restart between them
  count as a refire (``tick_refires``), not as a doubled tick, and explain one duplicate each.
* ticks       = distinct tick ids; consecutive ticks of one schedule must be a whole multiple
  of its interval apart (``tick_spacing`` lists violations); ``tick_gaps`` counts the ticks
  collapsed into catch-ups. A tick seen (delivered or queued) and never done is lost.

Unique pushes and cancels (issue 16), on a queue that tracks its ids. ``check(unique=True)``
says every push was ``unique=True``: the queue then holds an id once, so a push that ran
again (a PUSH_RETRY, a PUSH_FAIL tried again) enqueues it again only if it ran after the id
was freed, and an id is freed only by an accepted ack, which comes after the id's DONE (or
its IDEM 1) line. An id's ``copies`` become 1 plus the runs of the attempts of its batch
that ended (PUSH_OK or PUSH_FAIL) after its first DONE or IDEM 1 line: an upper bound on its
enqueues, used for duplicates, reclaims and the structure as above, and ``doubled`` then
lists every id (not only scheduled ones) with more first deliveries than that.
A canceller logs ``CANCEL_INVOKE id state``, ``CANCEL_RETRY id kind`` (redis-py replayed
it), then ``CANCEL_OK id found`` or ``CANCEL_FAIL id kind``, one id a call, and cancels only
ids whose push was confirmed (so no push of it runs after the cancel). found 1: the id was
cancelled between the two lines; found 0 with no replay: it was not held, so it was done
already and must not be lost; an error or a replay (a replayed cancel finds nothing): either.
* after_cancel = for an id a cancel found: a delivery the server made after the cancel had
  returned (the claim's server time, deadline - lease, from a FETCH or CLAIM line or a token
  read from the queue), or an ack accepted for a delivery whose DONE line came after the
  cancel had returned (the ack was sent after it, so the module had to refuse it): must be
  empty. A delivery made before the cancel may still run to its DONE (a cancel does not stop
  a job running; ``cancelled_ran`` counts those). Cancelled ids and uncertain ones are not
  counted as lost.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from rotator import Rotator
from rotator.keys import KEY_ROLES
from rotator.protocol import text, unpack_element
from tests.chaos.eventlog import Event, read_logs

SENTINEL = "*lap"
TOKEN = re.compile(r"^[^*]{1,1024}\*(\d{1,15})\.(\d{1,9})\.\d+$")
PRIORITIZED = re.compile(r"^\*([1-9])\*(.+)$", re.DOTALL)  # *<level>*<id>
SHOWN = 10  # ids listed per category in a summary


@dataclass(slots=True)
class QueueState:
    """The queue's keys, read in one MULTI so the view is consistent."""

    ring: list[str]
    done: set[str]
    done_old: set[str]
    marks: int
    marks_old: int
    dead: list[str]
    # The scheduled set: member -> due ms (jobs pushed for later, and "*<name>" per schedule).
    scheduled: dict[str, int] = field(default_factory=dict)

    @property
    def scheduled_jobs(self) -> dict[str, int]:
        """The scheduled set less the schedules' own members (which are no jobs)."""
        return {m: due for m, due in self.scheduled.items() if not m.startswith("*")}

    @property
    def prioritized(self) -> dict[str, int]:
        """Ids waiting at a priority level (members ``*<level>*<id>`` of the scheduled set,
        scored below 0; see PRIORITIES in the module) -> their level."""
        found: dict[str, int] = {}
        for member, score in self.scheduled.items():
            match = PRIORITIZED.match(member)
            if match and score < 0:
                found[match.group(2)] = int(match.group(1))
        return found

    @property
    def quiet(self) -> bool:
        """Only the sentinel (or nothing) left, and no acks, marks, scheduled jobs or jobs
        waiting at a priority."""
        return (
            all(element == SENTINEL for element in self.ring)
            and len(self.ring) <= 1
            and not self.done
            and not self.done_old
            and self.marks == 0
            and self.marks_old == 0
            and not self.scheduled_jobs
            and not self.prioritized
        )


def read_state(client: redis.Redis, rotator: Rotator) -> QueueState:
    key = dict(zip(KEY_ROLES, rotator.keys.all, strict=True))
    with client.pipeline(transaction=True) as pipe:
        pipe.lrange(key["ring"], 0, -1)
        pipe.lrange(key["leases"], 0, -1)
        pipe.smembers(key["done"])
        pipe.smembers(key["done_old"])
        pipe.hlen(key["marks"])
        pipe.hlen(key["marks_old"])
        pipe.lrange(key["dead"], 0, -1)
        pipe.zrange(key["scheduled"], 0, -1, withscores=True)
        ring, leases, done, done_old, marks, marks_old, dead, scheduled = pipe.execute()
    return QueueState(
        # Every element of the queue: the ring's, then the lease list's.
        ring=[text(e) for e in unpacked(ring + leases)],
        done={text(t) for t in done},
        done_old={text(t) for t in done_old},
        marks=int(marks),
        marks_old=int(marks_old),
        dead=[text(d) for d in dead],
        scheduled={text(member): int(due) for member, due in scheduled},
    )


def unpacked(ring: list[bytes]) -> list[bytes]:
    """The ring with each packed batch written out as the leases it stands for."""
    out: list[bytes] = []
    for element in ring:
        batch = unpack_element(element)
        out += [element] if batch is None else batch[1]
    return out


def element_id(element: str) -> str:
    return element.split("*", 1)[0]


def deliveries_of(token: str) -> int:
    match = TOKEN.match(token)
    return int(match.group(2)) if match else 0


def deadline_of(token: str) -> int:
    """The lease deadline (unix ms, server clock) a token carries; 0 if malformed."""
    match = TOKEN.match(token)
    return int(match.group(1)) if match else 0


def tick_of(job_id: str, schedules: Mapping[str, int]) -> tuple[str, int] | None:
    """``(schedule job id, tick ms)`` of a tick's job id ``<job id>@<ms>``, else None."""
    head, at, ms = job_id.rpartition("@")
    if not at or head not in schedules or not ms.isdigit():
        return None
    return head, int(ms)


def structure_errors(
    state: QueueState, copies: Counter[str], *, allow_leftovers: bool
) -> tuple[list[str], int]:
    """Broken invariants of one state, and how many acked tokens are not in the ring."""
    errors: list[str] = []
    ring = state.ring
    if ring and ring.count(SENTINEL) != 1:
        errors.append(f"{ring.count(SENTINEL)} sentinels in a ring of {len(ring)}")
    tokens: set[str] = set()
    ids: Counter[str] = Counter()
    for element in ring:
        if element == SENTINEL:
            continue
        if "*" in element:
            if not TOKEN.match(element):
                errors.append(f"malformed element {element[:80]!r}")
                continue
            tokens.add(element)
        elif not 0 < len(element.encode("utf-8", "surrogateescape")) <= 1024:
            errors.append(f"invalid id {element[:80]!r}")
        ids[element_id(element)] += 1
    for member in state.scheduled_jobs:
        if not 0 < len(member.encode("utf-8", "surrogateescape")) <= 1024:
            errors.append(f"invalid scheduled id {member[:80]!r}")
        ids[member] += 1  # an id waiting there and queued as well is two copies of it
    for job_id, count in ids.items():
        if count > max(1, copies[job_id]):
            errors.append(f"id {job_id!r} is {count} times in the ring, pushed {copies[job_id]}")
    leftovers = len((state.done | state.done_old) - tokens)
    if leftovers and not allow_leftovers:
        errors.append(f"{leftovers} acked tokens are not in the ring")
    return errors, leftovers


@dataclass(slots=True)
class Report:
    test: str
    kind: str
    version: str
    seed: int
    attempted: int = 0
    pushed: int = 0  # confirmed ids
    uncertain: int = 0
    recovered: int = 0
    processed: int = 0  # distinct ids with a DONE line
    done_lines: int = 0
    drain_processed: int = 0
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    duplicates: int = 0
    duplicate_detail: dict[str, dict[str, int]] = field(default_factory=dict)
    unexplained: dict[str, dict[str, int]] = field(default_factory=dict)
    reclaims: int = 0
    idempotent_skips: int = 0
    fenced_acks: int = 0
    ack_errors: int = 0
    false_reclaims: list[str] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    client_retries: int = 0
    push_failures: int = 0
    push_retries: int = 0
    crashes: dict[str, int] = field(default_factory=dict)
    torn_lines: int = 0
    snapshots: int = 0
    leftovers_max: int = 0
    structure: list[str] = field(default_factory=list)
    scheduled: int = 0  # confirmed ids among the scheduled pushes
    early: list[str] = field(default_factory=list)
    doubled: dict[str, list[str]] = field(default_factory=dict)
    ticks: int = 0  # distinct ticks seen
    tick_enqueues: int = 0
    tick_refires: int = 0
    tick_gaps: int = 0
    tick_spacing: list[str] = field(default_factory=list)
    unique: bool = False  # every push was unique=True (see the module docstring)
    push_reruns: int = 0  # ids whose push may have run more than once
    late_reruns: int = 0  # of those, ids with a run that ended after the id was first done
    reenqueued: int = 0  # ids with more than one first delivery (each within its copies)
    cancelled: int = 0  # ids a cancel found (and cancelled)
    cancel_misses: int = 0  # ids a cancel did not find (done before it)
    cancel_uncertain: int = 0  # cancels whose outcome is unknown (an error, a replay)
    cancel_states: dict[str, int] = field(default_factory=dict)  # found, by the state aimed at
    cancelled_ran: int = 0  # cancelled ids whose delivery before the cancel still ran to DONE
    after_cancel: list[str] = field(default_factory=list)
    payload_run: bool = False  # every job carried its own body (see chaos_body)
    bad_payloads: list[str] = field(default_factory=list)  # deliveries with another body
    payloads_left: int = 0  # payload hash fields left once every job was acked
    quiescent: bool = False
    final: dict[str, int] = field(default_factory=dict)
    faults: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.unexpected
            or self.unexplained
            or self.false_reclaims
            or self.structure
            or self.early
            or self.doubled
            or self.tick_spacing
            or self.after_cancel
            or self.bad_payloads
            or self.payloads_left
            or not self.quiescent
        )

    def figures(self) -> dict[str, Any]:
        """The headline numbers: what the issue asks every run to report."""
        figures: dict[str, Any] = {
            "server": f"{self.kind} {self.version}",
            "pushed": self.pushed,
            "worker_kills": int(self.faults.get("worker_kills", 0)),
            "server_restarts": int(self.faults.get("server_restarts", 0)),
            "stalls": int(self.faults.get("stalls", 0)),
            "lost": len(self.lost),
            "duplicates": self.duplicates,
            "unexplained": len(self.unexplained),
        }
        if self.scheduled or self.ticks:
            figures.update(
                scheduled=self.scheduled,
                early=len(self.early),
                ticks=self.ticks,
                doubled=len(self.doubled),
                tick_refires=self.tick_refires,
            )
        if self.unique or self.cancelled or self.cancel_misses or self.cancel_uncertain:
            figures.update(
                push_reruns=self.push_reruns,
                doubled=len(self.doubled),
                cancelled=self.cancelled,
                after_cancel=len(self.after_cancel),
            )
        if self.payload_run:
            figures.update(bad_payloads=len(self.bad_payloads), payloads_left=self.payloads_left)
        return figures

    def summary(self) -> str:
        def some(items: Any) -> str:
            listed = list(items)
            more = f" (+{len(listed) - SHOWN})" if len(listed) > SHOWN else ""
            return f"{listed[:SHOWN]}{more}"

        lines = [
            f"{self.test} on {self.kind} {self.version}, seed={self.seed} "
            f"(replay with CHAOS_SEED={self.seed})",
            f"  pushed={self.pushed} attempted={self.attempted} uncertain={self.uncertain} "
            f"recovered={self.recovered} processed={self.processed} "
            f"drain_processed={self.drain_processed}",
            f"  lost={len(self.lost)} {some(self.lost) if self.lost else ''}".rstrip(),
            f"  unexpected={len(self.unexpected)} stuck={len(self.stuck)}",
            f"  duplicates={self.duplicates} unexplained={some(self.unexplained.items())} "
            f"reclaims={self.reclaims} idempotent_skips={self.idempotent_skips} "
            f"fenced_acks={self.fenced_acks} false_reclaims={len(self.false_reclaims)}",
            f"  errors={self.errors} client_retries={self.client_retries} "
            f"push_failures={self.push_failures} push_retries={self.push_retries} "
            f"crashes={self.crashes} torn_lines={self.torn_lines}",
            f"  structure={self.structure[:SHOWN]} leftovers_max={self.leftovers_max} "
            f"snapshots={self.snapshots} quiescent={self.quiescent} final={self.final}",
            f"  faults={self.faults}",
        ]
        if self.scheduled or self.ticks:
            lines.append(
                f"  scheduled={self.scheduled} early={some(self.early)} ticks={self.ticks} "
                f"tick_enqueues={self.tick_enqueues} doubled={some(self.doubled.items())} "
                f"tick_refires={self.tick_refires} tick_gaps={self.tick_gaps} "
                f"tick_spacing={some(self.tick_spacing)}"
            )
        if self.unique or self.cancelled or self.cancel_misses or self.cancel_uncertain:
            lines.append(
                f"  unique={self.unique} push_reruns={self.push_reruns} "
                f"late_reruns={self.late_reruns} reenqueued={self.reenqueued} "
                f"doubled={some(self.doubled.items())} cancelled={self.cancelled} "
                f"cancel_misses={self.cancel_misses} cancel_uncertain={self.cancel_uncertain} "
                f"cancel_states={self.cancel_states} cancelled_ran={self.cancelled_ran} "
                f"after_cancel={some(self.after_cancel)}"
            )
        if self.payload_run:
            lines.append(
                f"  bad_payloads={some(self.bad_payloads)} payloads_left={self.payloads_left}"
            )
        if self.notes:
            lines.append(f"  notes={self.notes}")
        return "\n".join(lines)

    def write(self, path: Path) -> None:
        data = asdict(self)
        data["figures"] = self.figures()
        data["ok"] = self.ok
        path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def check(
    logs_dir: Path,
    final: QueueState,
    *,
    test: str,
    kind: str,
    version: str,
    seed: int,
    snapshots: list[QueueState] | None = None,
    faults: dict[str, Any] | None = None,
    expect_dead: int = 0,
    allow_leftovers: bool = False,
    schedules: Mapping[str, int] | None = None,
    leases: Mapping[str, int] | None = None,
    lossy_restarts: Sequence[float] = (),
    unique: bool = False,
) -> Report:
    """The report on one run. ``schedules``: the recurring schedules' job id -> interval ms;
    ``leases``: each log source's lease ms (to read the server's claim time off a token);
    ``lossy_restarts``: unix times of server kills that may have lost acknowledged writes;
    ``unique``: every push was ``unique=True`` (see the module docstring)."""
    read = read_logs(logs_dir)
    report = Report(test=test, kind=kind, version=version, seed=seed, torn_lines=read.torn)
    report.faults = dict(faults or {})

    batches: dict[tuple[str, str], list[str]] = {}
    invokes: Counter[tuple[str, str]] = Counter()
    retried: Counter[tuple[str, str]] = Counter()
    confirmed_batches: set[tuple[str, str]] = set()
    processed: Counter[str] = Counter()
    reclaims: Counter[str] = Counter()
    reclaim_deliveries: list[tuple[str, int]] = []
    accepted: set[tuple[str, int]] = set()
    errors: Counter[str] = Counter()
    crashes: Counter[str] = Counter()
    due_min: dict[str, int] = {}  # scheduled id -> the earliest it can be due (unix ms)
    fetches: list[Fetch] = []

    for event in read.events:
        kind_, fields = event.kind, event.fields
        if kind_ == "PUSH_INVOKE":
            key = (event.source, fields[0])
            batches[key] = fields[1].split(",")
            invokes[key] += 1
            if len(fields) > 2:  # a scheduled push: due no earlier than this
                for job_id in batches[key]:
                    due_min[job_id] = min(due_min.get(job_id, int(fields[2])), int(fields[2]))
        elif kind_ == "PUSH_OK":
            confirmed_batches.add((event.source, fields[0]))
        elif kind_ == "PUSH_FAIL":
            report.push_failures += 1
            errors[f"push:{fields[1]}"] += 1
        elif kind_ == "PUSH_RETRY":
            retried[(event.source, fields[0])] += 1
            report.push_retries += 1
        elif kind_ == "CLAIM":  # a delivery seen by the claim itself (work mode)
            fetches.append(Fetch(event.source, fields[0], fields[1], event.at))
        elif kind_ == "FETCH":
            fetches.append(Fetch(event.source, fields[0], fields[1], event.at))
            if fields[2] == "1":
                reclaims[fields[0]] += 1
                reclaim_deliveries.append((fields[0], int(fields[3])))
        elif kind_ == "PAYLOAD_BAD":
            report.bad_payloads.append(f"{fields[0]}: {fields[2]}")
        elif kind_ == "DONE":
            processed[fields[0]] += 1
            report.done_lines += 1
            if event.source == "drain":
                report.drain_processed += 1
        elif kind_ == "ACK_OK":
            if fields[2] == "0":
                report.fenced_acks += 1
            else:
                accepted.add((fields[0], deliveries_of(fields[1])))
        elif kind_ == "ACK_ERR":
            report.ack_errors += 1
            errors[f"ack:{fields[2]}"] += 1
        elif kind_ == "IDEM":
            report.idempotent_skips += fields[1] == "1"
        elif kind_ == "ERR":
            errors[f"{fields[0]}:{fields[1]}"] += 1
        elif kind_ == "WORK_DIED":
            errors[f"work_died:{fields[0]}"] += 1
        elif kind_ == "RETRY":
            report.client_retries += 1
        elif kind_ == "CRASH":
            crashes[fields[0]] += 1

    copies: Counter[str] = Counter()
    attempted: set[str] = set()
    confirmed: set[str] = set()
    for key, ids in batches.items():
        attempted.update(ids)
        if key in confirmed_batches:
            confirmed.update(ids)
        for job_id in ids:
            copies[job_id] += invokes[key] + retried[key]

    states = [*(snapshots or []), final]
    report.unique = unique
    if unique:
        copies = unique_copies(report, read.events, batches, copies)
    ticks = judge_scheduled(
        report,
        fetches,
        states,
        processed=set(processed),
        copies=copies,
        due_min=due_min,
        confirmed=confirmed,
        schedules=schedules or {},
        leases=leases or {},
        lossy_restarts=lossy_restarts,
    )

    if unique:
        judge_unique(report, fetches, states, attempted=attempted, copies=copies)
    spared = judge_cancels(
        report, read.events, fetches, states, processed=set(processed), leases=leases or {}
    )
    ring_ids = {element_id(e) for e in final.ring if e != SENTINEL} | set(final.scheduled_jobs)
    ring_ids |= set(final.prioritized)
    uncertain = attempted - confirmed
    report.attempted = len(attempted)
    report.pushed = len(confirmed)
    report.uncertain = len(uncertain)
    report.recovered = len(uncertain & set(processed))
    report.processed = len(processed)
    report.lost = sorted((confirmed | ticks) - set(processed) - ring_ids - spared)
    report.unexpected = sorted(set(processed) - attempted - ticks)
    report.stuck = sorted(ring_ids)
    report.reclaims = sum(reclaims.values())
    report.errors = dict(sorted(errors.items()))
    report.crashes = dict(crashes)

    for job_id, count in processed.items():
        if count < 2:
            continue
        report.duplicates += count - 1
        detail = {"processed": count, "reclaims": reclaims[job_id], "copies": copies[job_id]}
        report.duplicate_detail[job_id] = detail
        if count - 1 > reclaims[job_id] + max(0, copies[job_id] - 1):
            report.unexplained[job_id] = detail

    for job_id, deliveries in reclaim_deliveries:
        if copies[job_id] <= 1 and (job_id, deliveries - 1) in accepted:
            report.false_reclaims.append(f"{job_id} delivery {deliveries}")

    report.snapshots = len(states) - 1
    for number, state in enumerate(states):
        found, leftovers = structure_errors(state, copies, allow_leftovers=allow_leftovers)
        report.leftovers_max = max(report.leftovers_max, leftovers)
        where = "final" if number == len(states) - 1 else f"snapshot {number}"
        report.structure.extend(f"{where}: {error}" for error in found)

    report.quiescent = final.quiet and len(final.dead) == expect_dead
    report.final = {
        "ring": len(final.ring),
        "done": len(final.done),
        "done_old": len(final.done_old),
        "marks": final.marks + final.marks_old,
        "dead": len(final.dead),
        "scheduled": len(final.scheduled_jobs),
    }
    return report


@dataclass(frozen=True, slots=True)
class Fetch:
    source: str
    job_id: str
    token: str
    at: float  # the client's clock when the claim's reply was in


def judge_scheduled(
    report: Report,
    fetches: list[Fetch],
    states: list[QueueState],
    *,
    processed: set[str],
    copies: Counter[str],
    due_min: Mapping[str, int],
    confirmed: set[str],
    schedules: Mapping[str, int],
    leases: Mapping[str, int],
    lossy_restarts: Sequence[float],
) -> set[str]:
    """Early deliveries, doubled enqueues and tick spacing (see the module docstring); sets
    each tick's ``copies`` to its enqueues, refires included. Returns every tick id seen."""
    report.scheduled = len(confirmed & set(due_min))
    seen = processed | {f.job_id for f in fetches}
    for state in states:
        seen.update(element_id(e) for e in state.ring if e != SENTINEL)
    tick_at = {job_id: at for job_id in seen if (at := tick_of(job_id, schedules))}
    ticks = set(tick_at)
    due = dict(due_min)
    due.update((job_id, ms) for job_id, (_, ms) in tick_at.items())

    # Every first delivery (deliveries 1) of a scheduled id or a tick, with the server's time
    # of its claim: exact from a FETCH (deadline - that worker's lease), a lower bound from a
    # token only read from the queue (a claim whose reply was lost).
    longest = max(leases.values(), default=0)
    firsts: dict[str, dict[str, int]] = defaultdict(dict)
    for fetch in fetches:
        if fetch.job_id not in due:
            continue
        lease = leases.get(fetch.source)
        claimed = deadline_of(fetch.token) - lease if lease is not None else None
        if (claimed is not None and claimed < due[fetch.job_id]) or (
            fetch.at * 1000 < due[fetch.job_id]
        ):
            report.early.append(
                f"{fetch.token} claimed at {claimed} (client {fetch.at * 1000:.0f}), "
                f"due {due[fetch.job_id]}"
            )
        if deliveries_of(fetch.token) == 1:
            firsts[fetch.job_id][fetch.token] = (
                claimed if claimed is not None else deadline_of(fetch.token) - longest
            )
    for state in states:
        for element in state.ring:
            job_id = element_id(element)
            if job_id in due and "*" in element and deliveries_of(element) == 1:
                firsts[job_id].setdefault(element, deadline_of(element) - longest)
    untaken = Counter(e for e in states[-1].ring if e in due)  # queued, never claimed

    for job_id in sorted(due):
        tokens = sorted(firsts[job_id].items(), key=lambda item: item[1])
        enqueues = len(tokens) + untaken[job_id]
        if job_id not in ticks:
            if enqueues > max(1, copies[job_id]):
                report.doubled[job_id] = [token for token, _ in tokens]
            continue
        report.tick_enqueues += enqueues
        refires = 0
        for (_, claimed), (_, again) in itertools.pairwise(tokens):
            # The first firing was lost with a restart between the two claims: the same tick.
            if any(claimed < kill * 1000 < again for kill in lossy_restarts):
                refires += 1
        report.tick_refires += refires
        copies[job_id] = 1 + refires
        if enqueues > 1 + refires:
            report.doubled[job_id] = [token for token, _ in tokens]

    by_schedule: dict[str, list[int]] = defaultdict(list)
    for head, ms in tick_at.values():
        by_schedule[head].append(ms)
    report.ticks = len(ticks)
    for head, times in sorted(by_schedule.items()):
        every = schedules[head]
        times.sort()
        for before, after in itertools.pairwise(times):
            if (after - before) % every:
                report.tick_spacing.append(f"{head}@{before} -> @{after}: not k * {every} ms")
            else:
                report.tick_gaps += (after - before) // every - 1
    return ticks


def unique_copies(
    report: Report,
    events: Sequence[Event],
    batches: Mapping[tuple[str, str], list[str]],
    copies: Counter[str],
) -> Counter[str]:
    """Each id's most enqueues when every push was unique: 1, plus the runs (an attempt and
    redis-py's replays of it) of its batch's attempts that ended after the id was first done
    (its first DONE, or IDEM 1, line: an accepted ack, which alone frees an id, comes after
    it). Counts the ids pushed more than once, and those with such a late run."""
    first_done: dict[str, float] = {}
    attempts: dict[tuple[str, str], list[list[float]]] = defaultdict(list)  # [runs, ended]
    for event in events:
        kind, fields = event.kind, event.fields
        if kind == "DONE" or (kind == "IDEM" and fields[1] == "1"):
            first_done[fields[0]] = min(first_done.get(fields[0], event.at), event.at)
        elif kind == "PUSH_INVOKE":
            attempts[(event.source, fields[0])].append([1, float("inf")])
        elif kind == "PUSH_RETRY" and attempts[(event.source, fields[0])]:
            attempts[(event.source, fields[0])][-1][0] += 1
        elif kind in ("PUSH_OK", "PUSH_FAIL") and attempts[(event.source, fields[0])]:
            attempts[(event.source, fields[0])][-1][1] = event.at
    most: Counter[str] = Counter()
    for key, ids in batches.items():
        for job_id in ids:
            done_at = first_done.get(job_id, float("inf"))
            late = sum(int(runs) for runs, ended in attempts[key] if ended > done_at)
            most[job_id] = max(most[job_id], 1 + late)
    report.push_reruns = sum(1 for job_id in most if copies[job_id] > 1)
    report.late_reruns = sum(1 for count in most.values() if count > 1)
    return most


def judge_unique(
    report: Report,
    fetches: list[Fetch],
    states: list[QueueState],
    *,
    attempted: set[str],
    copies: Counter[str],
) -> None:
    """Every pushed id enqueued (distinct first deliveries, plus copies never taken) at most
    its ``copies`` times; more goes in ``doubled``."""
    firsts: dict[str, set[str]] = defaultdict(set)
    for fetch in fetches:
        if deliveries_of(fetch.token) == 1:
            firsts[fetch.job_id].add(fetch.token)
    for state in states:
        for element in state.ring:
            if "*" in element and element != SENTINEL and deliveries_of(element) == 1:
                firsts[element_id(element)].add(element)
    untaken = Counter(e for e in states[-1].ring if "*" not in e)
    untaken.update(states[-1].scheduled_jobs)
    untaken.update(list(states[-1].prioritized))
    for job_id in sorted(attempted):
        enqueues = len(firsts[job_id]) + untaken[job_id]
        report.reenqueued += enqueues > 1
        if enqueues > max(1, copies[job_id]):
            report.doubled[job_id] = sorted(firsts[job_id])


def judge_cancels(
    report: Report,
    events: Sequence[Event],
    fetches: list[Fetch],
    states: list[QueueState],
    *,
    processed: set[str],
    leases: Mapping[str, int],
) -> set[str]:
    """The cancels' outcomes and ``after_cancel`` (see the module docstring). Returns the ids
    that need not complete: those a cancel found, and those whose cancel's outcome is
    unknown."""
    aimed: dict[str, str] = {}
    replays: Counter[str] = Counter()
    found: dict[str, int | None] = {}
    ended: dict[str, float] = {}
    done_at: dict[tuple[str, str], float] = {}
    accepted: list[Event] = []
    for event in events:
        kind, fields = event.kind, event.fields
        if kind == "CANCEL_INVOKE":
            aimed[fields[0]] = fields[1]
            found[fields[0]] = None
        elif kind == "CANCEL_RETRY":
            replays[fields[0]] += 1
        elif kind == "CANCEL_OK":
            found[fields[0]] = int(fields[1])
            ended[fields[0]] = event.at
        elif kind == "CANCEL_FAIL":
            ended[fields[0]] = event.at
        elif kind == "DONE":
            done_at[(fields[0], fields[1])] = event.at
        elif kind == "ACK_OK" and fields[2] != "0":
            accepted.append(event)
    if not aimed:
        return set()
    cancelled = {job_id: ended[job_id] * 1000 for job_id, n in found.items() if n}
    misses = {job_id for job_id, n in found.items() if n == 0 and not replays[job_id]}
    uncertain = set(found) - set(cancelled) - misses
    report.cancelled = len(cancelled)
    report.cancel_misses = len(misses)
    report.cancel_uncertain = len(uncertain)
    report.cancel_states = dict(sorted(Counter(aimed[job_id] for job_id in cancelled).items()))
    report.cancelled_ran = len(set(cancelled) & processed)

    longest = max(leases.values(), default=0)
    for fetch in fetches:
        if fetch.job_id not in cancelled:
            continue
        lease = leases.get(fetch.source, longest)
        claimed = deadline_of(fetch.token) - lease
        if claimed > cancelled[fetch.job_id] + 1:
            report.after_cancel.append(
                f"{fetch.token} claimed at {claimed} ({fetch.source}), cancelled by "
                f"{cancelled[fetch.job_id]:.0f}"
            )
    for state in states:
        for element in state.ring:
            job_id = element_id(element)
            if job_id in cancelled and "*" in element:
                claimed = deadline_of(element) - longest  # at the earliest
                if claimed > cancelled[job_id] + 1:
                    report.after_cancel.append(
                        f"{element} in the queue, claimed at {claimed} or later, cancelled "
                        f"by {cancelled[job_id]:.0f}"
                    )
    for event in accepted:
        job_id, token = event.fields[0], event.fields[1]
        done = done_at.get((job_id, token), 0.0) * 1000
        if job_id in cancelled and done > cancelled[job_id]:
            report.after_cancel.append(
                f"{token} acked ({event.source}) after its DONE at {done:.0f}, cancelled by "
                f"{cancelled[job_id]:.0f}"
            )
    report.after_cancel = sorted(set(report.after_cancel))  # a FETCH and a CLAIM of one token
    return set(cancelled) | uncertain
