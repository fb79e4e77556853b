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
  marks hashes are empty, and the dead letters hold what the test expects.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from rotator import Rotator
from rotator.keys import KEY_ROLES
from rotator.protocol import text, unpack_element
from tests.chaos.eventlog import read_logs

SENTINEL = "*lap"
TOKEN = re.compile(r"^[^*]{1,1024}\*(\d{1,15})\.(\d{1,9})\.\d+$")
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

    @property
    def quiet(self) -> bool:
        """Only the sentinel (or nothing) left, and no acks or marks waiting."""
        return (
            all(element == SENTINEL for element in self.ring)
            and len(self.ring) <= 1
            and not self.done
            and not self.done_old
            and self.marks == 0
            and self.marks_old == 0
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
        ring, leases, done, done_old, marks, marks_old, dead = pipe.execute()
    return QueueState(
        # Every element of the queue: the ring's, then the lease list's.
        ring=[text(e) for e in unpacked(ring + leases)],
        done={text(t) for t in done},
        done_old={text(t) for t in done_old},
        marks=int(marks),
        marks_old=int(marks_old),
        dead=[text(d) for d in dead],
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
            or not self.quiescent
        )

    def figures(self) -> dict[str, Any]:
        """The headline numbers: what the issue asks every run to report."""
        return {
            "server": f"{self.kind} {self.version}",
            "pushed": self.pushed,
            "worker_kills": int(self.faults.get("worker_kills", 0)),
            "server_restarts": int(self.faults.get("server_restarts", 0)),
            "stalls": int(self.faults.get("stalls", 0)),
            "lost": len(self.lost),
            "duplicates": self.duplicates,
            "unexplained": len(self.unexplained),
        }

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
) -> Report:
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

    for event in read.events:
        kind_, fields = event.kind, event.fields
        if kind_ == "PUSH_INVOKE":
            key = (event.source, fields[0])
            batches[key] = fields[1].split(",")
            invokes[key] += 1
        elif kind_ == "PUSH_OK":
            confirmed_batches.add((event.source, fields[0]))
        elif kind_ == "PUSH_FAIL":
            report.push_failures += 1
            errors[f"push:{fields[1]}"] += 1
        elif kind_ == "PUSH_RETRY":
            retried[(event.source, fields[0])] += 1
            report.push_retries += 1
        elif kind_ == "FETCH":
            if fields[2] == "1":
                reclaims[fields[0]] += 1
                reclaim_deliveries.append((fields[0], int(fields[3])))
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

    ring_ids = {element_id(e) for e in final.ring if e != SENTINEL}
    uncertain = attempted - confirmed
    report.attempted = len(attempted)
    report.pushed = len(confirmed)
    report.uncertain = len(uncertain)
    report.recovered = len(uncertain & set(processed))
    report.processed = len(processed)
    report.lost = sorted(confirmed - set(processed) - ring_ids)
    report.unexpected = sorted(set(processed) - attempted)
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

    states = [*(snapshots or []), final]
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
    }
    return report
