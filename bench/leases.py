"""Leases (issue 21): what jobs in flight cost a claim of new work, before and after.

    .venv/bin/python -m bench.leases [--smoke | --quick] [--servers redis,valkey]
        [--modules old,new] [--leases N] [--big-leases N] [--out DIR] [--table]

On each server (persistence off) both modules are loaded at once, as ``bench.bounds`` does:
OLD is ``bench/baseline/rotator-5b7616c.lua`` (ten queue KEYS: leases sit in the ring), NEW
the working tree's ``lua/rotator.lua`` (thirteen: ``rotator.keys.queue_keys(name).all``). Both
are driven with the same raw calls, by EVALSHA and (the claims) by FCALL too. SLOWLOG is on
with ``slowlog-log-slower-than 0`` in every phase, set-ups included, and read (and reset)
every few dozen calls, since Valkey also logs the commands a script issues; each phase starts
with a full collection of the scripts' Lua heap, so it pays for its own garbage only. A call
is the EVALSHA or FCALL entry: the server time of one module call.

1. The claim of one freshly pushed job: ``push`` of one 16-byte id, then ``next_packed 1
   3600000 1000 0`` until the job comes back (as the Python client's ``next`` goes on while
   a reply is neither a job nor idle), then ``ack`` of it in a call of its own. The figure of
   one claim is the server time of its ``next_packed`` calls, summed (NEW: one call; OLD:
   as many as it takes to rotate past every lease at BUDGET 1000 a call). In three states:

   a. nothing in flight;
   b. ``leases`` leases of 16-byte ids, each its own element, made through the module:
      push them, claim them all by ``next_packed 1000 LEASE 1000 0`` (one packed batch per
      call; short leases that all end together just after the last batch is made, as NEW
      re-leases due leases before it takes pending work), let them expire, claim them all
      again by ``next_packed 1000 3600000 1000 0`` (each expired batch is broken up and
      every job re-leased as its own element);
   c. ``big_leases`` leases of 1,000-byte ids in packed batches of 1,000 (pushed, then
      claimed by ``next_packed 1000 3600000 1000 0``).

   Before the claims are measured, ``stats`` must say ``in_flight`` is the number made, and
   the ring and NEW's leases list (LLEN) must hold them as one element each (b) or in
   batches of 1,000 (c; 263 for the new module, which stops a batch at 256 KB of ids):
   ``in_flight_ok`` and ``shape_ok``, with a warning if not.
   Ratios b/a and c/a are of the medians (the issue's target for NEW: within 2x).
2. The worst single module call of every phase, set-ups included (target for NEW: 10 ms).
3. Reclaim latency: a worker that crashed holding a 500 ms lease, and a consumer blocked in
   ``next(1, block=...)``: when the consumer receives the job, less the lease's deadline
   (server TIME; same host clock). ``idle_before``: the consumer blocked on the empty queue
   before the lease existed. Two consumers are blocked, the worker first; the push's wake-up
   goes to the longest blocked (BLPOP serves clients in order), the worker, whose pipelined
   call claims the job for 500 ms; the worker then never acks. ``idle_after``: a producer
   pushes and claims the job for 500 ms, then the consumer calls ``next(1, block=...)``.
   NEW consumers are ``rotator.Rotator`` (EVALSHA); OLD ones a raw mirror of its ``next``
   flow (the call; BLPOP on the wake list for the reply's ``wait_ms`` or the rest of the
   block, pipelined with the next call). Each is on its own client, ``redis.Redis(host=...,
   port=...)`` (redis-py 8's default socket timeout of 5 s: a BLPOP lasts at most 4.9 s, as
   ``rotator.sending.wake_wait`` says; a client from ``redis.Redis.from_url`` does not show
   its timeout in ``connection_kwargs``, so the cap is missed and ``next(block=10)`` fails
   with TimeoutError after 5 s). A BLPOP's timeout fires at the server's next cron tick,
   every 1000 / hz ms (100 ms at the default hz 10; ``config`` in the results): a consumer
   woken by it is 0-100 ms later than asked, so each round starts at a random phase of the
   ticks. Target for NEW: within 100 ms of the deadline.

Full sizes: 10^6 and 10^5 leases, 50 claims per state (OLD: 3 in b and c, each a whole lap),
5 reclaim rounds per case (OLD: 3), block 10 s; about 3 minutes on this 2-core VM.

Results: ``bench/results/leases.json`` (``--out``); ``--table`` prints its table again.
"""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import redis

from bench.bounds import (
    BUDGET,
    CHUNK,
    COLLECT_SCRIPT,
    COUNT,
    OLD_COMMIT,
    SLOWLOG_LEN,
    Module,
    fresh,
    modules,
    server_ms,
)
from bench.harness import size_mode, sized_parser, started
from rotator import Rotator
from rotator.defaults import DEFAULT_PUSH_CHUNK
from rotator.keys import queue_keys
from rotator.sending import socket_timeout, wake_wait

RESULTS = Path(__file__).resolve().parent / "results"
HOUR_MS = 3_600_000
BIG_ID_BYTES = 1000  # state c's ids
BATCH_BYTES = 256 * 1024  # the new module's bound on one call's batch of first deliveries
RECLAIM_LEASE_MS = 500  # the crashed worker's lease
PIPELINE = 20  # module calls per pipeline in set-up loops
DRAIN_EVERY = 50  # module calls between SLOWLOG reads in claim loops
TARGETS = {"claim_ratio_max": 2.0, "worst_call_ms_max": 10.0, "reclaim_ms_max": 100.0}


@dataclass(frozen=True)
class Sizes:
    leases: int  # state b: single leases of 16-byte ids in flight
    big_leases: int  # state c: leases of 1,000-byte ids in flight, packed 1,000 a batch
    claims: int  # fresh-job claims measured per state, module and via
    old_claims: int  # the same for OLD in states b and c (each rotates past every lease)
    reclaims: int  # reclaim rounds per case (NEW)
    old_reclaims: int  # the same for OLD (idle_before waits out the whole block)
    block_s: float  # the blocked consumer's next(block=...)


SIZES = {
    "full": Sizes(1_000_000, 100_000, 50, 3, 5, 3, 10.0),
    "quick": Sizes(100_000, 20_000, 20, 2, 3, 2, 5.0),
    "smoke": Sizes(5000, 2000, 3, 1, 1, 1, 2.0),
}


Connect = Callable[[], redis.Redis]  # a new client of the server


def keys_for(m: Module, name: str) -> tuple[str, ...]:
    """A queue's KEYS for module ``m``: OLD takes the first ten (it has no leases list)."""
    every = queue_keys(name).all
    return every[:10] if m.label == "old" else every


def call(m: Module, client: redis.Redis, via: str, keys: Sequence[str], *args: Any) -> Any:
    return m.call(client, keys, *args) if via == "evalsha" else m.fcall(client, keys, *args)


# -- SLOWLOG --------------------------------------------------------------------------------------


@dataclass
class Phase:
    """The module calls of one phase, as SLOWLOG saw them: (sub-command, us), oldest first."""

    name: str
    calls: list[tuple[str, int]] = field(default_factory=list)
    began: float = field(default_factory=time.perf_counter)
    seconds: float = 0.0

    def row(self, module: str) -> dict[str, Any]:
        durations = [us for _, us in self.calls]
        worst = max(self.calls, key=lambda c: c[1]) if self.calls else ("", 0)
        return {
            "module": module,
            "phase": self.name,
            "calls": len(durations),
            "worst_ms": round(worst[1] / 1000, 2),
            "worst_command": worst[0],
            "median_ms": round(statistics.median(durations) / 1000, 3) if durations else None,
            # the five longest: [sub-command, ms, its place among the phase's calls]
            "longest": [
                [sub, round(us / 1000, 2), place]
                for place, (sub, us) in sorted(
                    enumerate(self.calls), key=lambda c: c[1][1], reverse=True
                )[:5]
            ],
            "seconds": round(self.seconds, 1),
        }


def _sub_command(text: str) -> str:
    """``EVALSHA sha N k1..kN sub ...`` or ``FCALL f N k1..kN sub ...``: the sub-command."""
    parts = text.split(" ")
    try:
        return parts[3 + int(parts[2])]
    except (IndexError, ValueError):
        return "?"


class Recorder:
    """SLOWLOG at threshold 0 while a phase runs, read and reset often."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.phase: Phase | None = None

    def drain(self) -> list[tuple[str, int]]:
        """The module calls logged since the last drain (added to the phase's), oldest first."""
        entries = self.client.slowlog_get(-1)
        self.client.slowlog_reset()
        if len(entries) >= SLOWLOG_LEN:
            raise RuntimeError("SLOWLOG filled up between reads: drain more often")
        got: list[tuple[str, int]] = []
        for entry in reversed(entries):
            command = entry["command"]
            text = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
            if text.split(" ", 1)[0].upper() in ("EVALSHA", "FCALL"):
                got.append((_sub_command(text), int(entry["duration"])))
        if self.phase is not None:
            self.phase.calls.extend(got)
        return got

    @contextmanager
    def phase_of(self, name: str, rows: list[dict[str, Any]], module: str) -> Iterator[Phase]:
        """Records one phase; its row (worst call and all) goes to ``rows`` at the end."""
        self.client.eval(COLLECT_SCRIPT, 0)
        self.client.slowlog_reset()
        self.client.config_set("slowlog-log-slower-than", 0)
        phase = self.phase = Phase(name)
        try:
            yield phase
            self.drain()
        finally:
            self.client.config_set("slowlog-log-slower-than", -1)
            self.phase = None
        phase.seconds = time.perf_counter() - phase.began
        rows.append(phase.row(module))


# -- building the states through the module -------------------------------------------------------


def pipelined(
    m: Module, client: redis.Redis, keys: Sequence[str], calls: Sequence[Sequence[Any]]
) -> list[Any]:
    """Module calls (ARGV each) in one pipeline; their replies."""
    pipe = client.pipeline(transaction=False)
    for args in calls:
        m.call(pipe, keys, *args)
    return list(pipe.execute())


def push_ids(
    m: Module,
    client: redis.Redis,
    rec: Recorder,
    keys: Sequence[str],
    ids: Sequence[str],
    *,
    chunk: int = CHUNK,
) -> None:
    """Pushes ``ids`` in calls of ``chunk``, pipelined (fewer a pipeline for long ids)."""
    per_pipe = max(1, min(PIPELINE, 20_000_000 // max(1, chunk * len(ids[0]))))
    batches = [ids[i : i + chunk] for i in range(0, len(ids), chunk)]
    for start in range(0, len(batches), per_pipe):
        part = batches[start : start + per_pipe]
        replies = pipelined(m, client, keys, [("push", *batch) for batch in part])
        if [int(r) for r in replies] != [len(batch) for batch in part]:
            raise RuntimeError(f"{m.label}: push replied {replies}")
        rec.drain()


def first_deliveries(reply: Sequence[Any]) -> int:
    """Jobs a next_packed reply leased for the first time: its packed batch's."""
    packed = reply[3]
    return packed.count(b"*") - 1 if packed else 0


def leased(reply: Sequence[Any]) -> int:
    """Jobs a next_packed reply leased: its packed batch's and its tokens (jobs leased again,
    such as a broken-up batch's)."""
    return first_deliveries(reply) + len(reply[4::2])


def claim_all(
    m: Module,
    client: redis.Redis,
    rec: Recorder,
    keys: Sequence[str],
    n: int,
    *,
    lease_ms: Callable[[], int],
    counted: Callable[[Sequence[Any]], int],
) -> int:
    """``next_packed 1000 LEASE_MS 1000 0`` in pipelines (``lease_ms()`` for each) until
    ``counted`` adds up to ``n`` over the replies or a whole pipeline counts none; the sum."""
    got = 0
    while got < n:
        calls = max(1, min(PIPELINE, -(-(n - got) // COUNT)))
        args = ("next_packed", COUNT, lease_ms(), BUDGET, 0)
        replies = pipelined(m, client, keys, [args] * calls)
        rec.drain()
        leased = sum(counted(reply) for reply in replies)
        got += leased
        if leased == 0:
            break
    return got


def in_flight(m: Module, client: redis.Redis, keys: Sequence[str]) -> dict[str, int]:
    """The module's stats, and the elements of the ring (and NEW's leases list): LLEN."""
    reply = m.call(client, keys, "stats")
    stats = {k.decode(): int(v) for k, v in zip(reply[::2], reply[1::2], strict=True)}
    stats["ring_elements"] = int(client.llen(keys[0]))
    if len(keys) > 10:
        stats["leases_elements"] = int(client.llen(keys[10]))
    return stats


def build_single_leases(
    m: Module, client: redis.Redis, rec: Recorder, keys: Sequence[str], n: int
) -> dict[str, Any]:
    """State b: ``n`` single leases of 16-byte ids, one hour each, made by the module: pushed,
    claimed in packed batches with short leases, and once those expired claimed again (each
    expired batch broken up, its jobs re-leased one element each).

    The short leases all end at one moment, ``expire_at``, after the last batch is made (each
    pipeline's calls lease until then): a module that re-leases due leases before it takes
    pending work (NEW) would otherwise keep re-leasing the first batches and never reach the
    rest."""
    push_ids(m, client, rec, keys, [f"job-{i:012d}" for i in range(n)])
    expire_at = server_ms(client) + max(500, 5 * n // 1000)  # 5 s for a million

    def until_expiry() -> int:
        return max(1, expire_at - server_ms(client))

    first = claim_all(m, client, rec, keys, n, lease_ms=until_expiry, counted=first_deliveries)
    late = server_ms(client) - expire_at  # > 0: the batches began to expire before the last
    time.sleep(max(0, -late) / 1000 + 0.05)
    again = claim_all(m, client, rec, keys, n, lease_ms=lambda: HOUR_MS, counted=leased)
    return {
        "claimed_first": first,
        "first_leases_expired_early_ms": max(0, late),
        "released_1h": again,
        **in_flight(m, client, keys),
    }


def build_big_batches(
    m: Module, client: redis.Redis, rec: Recorder, keys: Sequence[str], n: int
) -> dict[str, Any]:
    """State c: ``n`` leases of 1,000-byte ids in packed batches of 1,000, one hour each.
    Pushed 1,000 ids a call (the Python client's default chunk): a push of 5,000 such ids
    (5 MB) is a call of 7-21 ms on its own."""
    ids = [f"big-{i:012d}-".ljust(BIG_ID_BYTES, "x") for i in range(n)]
    push_ids(m, client, rec, keys, ids, chunk=DEFAULT_PUSH_CHUNK)
    claimed = claim_all(m, client, rec, keys, n, lease_ms=lambda: HOUR_MS, counted=first_deliveries)
    return {"claimed_first": claimed, **in_flight(m, client, keys)}


# -- 1. the claim of a fresh job ------------------------------------------------------------------


@dataclass(frozen=True)
class Claimed:
    ack: bytes  # the token, or the batch ack of a packed batch
    deadline_ms: int


def first_job(reply: Sequence[Any]) -> Claimed | None:
    """The first job of a next_packed reply, if any."""
    packed = reply[3]
    if packed:
        batch = packed[: packed.index(b"*", 1)]  # "*<deadline>.1.<seq>"
        jobs = packed.count(b"*") - 1
        return Claimed(batch + b"/%d" % jobs, int(batch[1 : batch.index(b".")]))
    tokens = reply[4::2]
    if tokens:
        stamp = tokens[0].rsplit(b"*", 1)[1]
        return Claimed(tokens[0], int(stamp[: stamp.index(b".")]))
    return None


def claim_fresh(
    m: Module,
    client: redis.Redis,
    rec: Recorder,
    keys: Sequence[str],
    *,
    via: str,
    state: str,
    claims: int,
    elements: int,
) -> dict[str, Any]:
    """``claims`` times: push one 16-byte id, ``next_packed 1`` until it comes back, ack it.
    Each claim's figure is the sum of its next_packed calls' server time."""
    per_claim: list[int] = []  # us
    calls_per_claim: list[int] = []
    call_us: list[int] = []
    most_calls = 3 * (elements // BUDGET) + 20
    for i in range(claims):
        call(m, client, via, keys, "push", f"f{via[0]}{state}{i:013d}")
        rec.drain()
        job = None
        mine: list[int] = []
        made = 0
        while job is None:
            if made >= most_calls:
                raise RuntimeError(f"{m.label}: no job after {made} calls of next_packed 1")
            job = first_job(call(m, client, via, keys, "next_packed", 1, HOUR_MS, BUDGET, 0))
            made += 1
            if made % DRAIN_EVERY == 0 or job is not None:
                mine += [us for sub, us in rec.drain() if sub == "next_packed"]
        if len(mine) != made:
            raise RuntimeError(f"{m.label}: SLOWLOG has {len(mine)} of {made} calls")
        call(m, client, via, keys, "ack", job.ack)
        per_claim.append(sum(mine))
        calls_per_claim.append(made)
        call_us += mine
    return {
        "state": state,
        "module": m.label,
        "via": via,
        "claims": claims,
        "median_ms": round(statistics.median(per_claim) / 1000, 3),
        "max_ms": round(max(per_claim) / 1000, 3),
        "calls_per_claim": round(statistics.median(calls_per_claim), 1),
        "call_median_ms": round(statistics.median(call_us) / 1000, 3),
        "call_max_ms": round(max(call_us) / 1000, 3),
        "claims_ms": [round(us / 1000, 3) for us in per_claim[:50]],
    }


# -- 3. reclaim latency ---------------------------------------------------------------------------


def now_ms() -> float:
    return time.time() * 1000


class Consumer:
    """One consumer on its own connection: ``next(1, block=...)`` with a lease of
    ``lease_ms``. NEW: ``rotator.Rotator``; OLD: a raw mirror of its ``next`` flow."""

    def __init__(self, m: Module, connect: Connect, name: str, lease_ms: int) -> None:
        self.m = m
        self.client = connect()
        self.keys = keys_for(m, name)
        self.lease_ms = lease_ms
        self.rotator = (
            Rotator(self.client, name, timeout=lease_ms / 1000) if m.label == "new" else None
        )
        self.job: Claimed | None = None
        self.received_ms: float | None = None
        self.error: BaseException | None = None

    def next(self, block_s: float) -> None:
        try:
            if self.rotator is not None:
                jobs = self.rotator.next(1, block=block_s)
                job = Claimed(jobs[0].token.encode(), jobs[0].deadline_ms) if jobs else None
            else:
                job = self._raw_next(block_s)
            self.received_ms = now_ms()
            self.job = job
        except BaseException as exc:  # reported by the caller
            self.error = exc
        finally:
            self.client.close()

    def _raw_next(self, block_s: float) -> Claimed | None:
        args = ("next_packed", 1, self.lease_ms, BUDGET, 0)
        give_up = time.monotonic() + block_s
        wait: float | None = None
        while True:
            if wait is None:
                reply = self.m.call(self.client, self.keys, *args)
            else:
                pipe = self.client.pipeline(transaction=False)
                pipe.blpop([self.keys[7]], timeout=wait)
                self.m.call(pipe, self.keys, *args)
                reply = pipe.execute()[1]
            wait = None
            job = first_job(reply)
            if job is not None:
                return job
            if not int(reply[0]):
                continue  # not idle: the rest of the lap
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                return None
            wait_ms = int(reply[1])
            wait = remaining if wait_ms < 0 else min(remaining, wait_ms / 1000)
            wait = wake_wait(wait, socket_timeout(self.client))  # as rotator.sending does

    def start(self, block_s: float) -> threading.Thread:
        thread = threading.Thread(target=self.next, args=(block_s,), daemon=True)
        thread.start()
        return thread


def wait_blocked(client: redis.Redis, count: int) -> None:
    """Until ``count`` clients are blocked (on the wake list's BLPOP)."""
    deadline = time.monotonic() + 10
    while int(client.info("clients")["blocked_clients"]) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} blocked clients expected")
        time.sleep(0.002)


def reclaim_round(
    m: Module, client: redis.Redis, connect: Connect, *, case: str, rnd: int, block_s: float
) -> dict[str, Any]:
    name = f"leases-reclaim-{m.label}-{case}-{rnd}"
    keys = keys_for(m, name)
    consumer = Consumer(m, connect, name, 30_000)
    if case == "idle_before":
        worker = Consumer(m, connect, name, RECLAIM_LEASE_MS)  # blocked first: the wake is its
        worker_thread = worker.start(block_s)
        wait_blocked(client, 1)
        thread = consumer.start(block_s)
        wait_blocked(client, 2)
        m.call(client, keys, "push", f"reclaim-{rnd:08d}")
        worker_thread.join(block_s + 10)
        if worker.error is not None:
            raise worker.error
        lease = worker.job
    else:
        m.call(client, keys, "push", f"reclaim-{rnd:08d}")
        lease = first_job(m.call(client, keys, "next_packed", 1, RECLAIM_LEASE_MS, BUDGET, 0))
        thread = consumer.start(block_s)
    thread.join(block_s + 10)
    if consumer.error is not None:
        raise consumer.error
    if lease is None:  # the crashed worker did not get the job: the round says nothing
        return {"late_ms": None, "note": "the worker got no job"}
    if consumer.job is None or consumer.received_ms is None:
        return {"late_ms": None, "note": f"not received within block={block_s} s"}
    return {"late_ms": round(consumer.received_ms - lease.deadline_ms, 1)}


def reclaim_rows(
    m: Module, client: redis.Redis, connect: Connect, sizes: Sizes, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    rows = []
    rounds = sizes.reclaims if m.label == "new" else sizes.old_reclaims
    probe = connect()
    limit = socket_timeout(probe)  # the consumers' BLPOP lasts at most this less 0.1 s
    probe.close()
    jitter = random.Random(21)
    for case in ("idle_before", "idle_after"):
        results = []
        for rnd in range(rounds):
            # Rounds at random phases of the server's cron ticks (see the docstring): each
            # would otherwise start just after the tick that ended the last one.
            time.sleep(jitter.uniform(0, 0.1))
            results.append(
                reclaim_round(m, client, connect, case=case, rnd=rnd, block_s=sizes.block_s)
            )
        late = [r["late_ms"] for r in results if r["late_ms"] is not None]
        row = {
            "case": case,
            "module": m.label,
            "client": "Rotator (EVALSHA)" if m.label == "new" else "raw mirror (EVALSHA)",
            "rounds": rounds,
            "block_s": sizes.block_s,
            "lease_ms": RECLAIM_LEASE_MS,
            "socket_timeout_s": limit,
            "median_ms": round(statistics.median(late), 1) if late else None,
            "max_ms": max(late) if late else None,
            "late_ms": late,
            "notes": sorted({r["note"] for r in results if "note" in r}),
        }
        log(f"  reclaim {case:<11} {m.label}: median {row['median_ms']} ms, max {row['max_ms']}")
        rows.append(row)
    return rows


# -- one server -----------------------------------------------------------------------------------


VIAS = ("evalsha", "fcall")


def run_module(
    client: redis.Redis,
    connect: Connect,
    m: Module,
    *,
    pair: tuple[Module, Module],
    sizes: Sizes,
    log: Callable[[str], None],
    out: dict[str, list[dict[str, Any]]],
) -> None:
    rec = Recorder(client)
    phases = out["phases"]

    def measure(state: str, keys: Sequence[str], claims: int, elements: int) -> None:
        for via in VIAS:
            with rec.phase_of(f"{state}_claims_{via}", phases, m.label):
                r = claim_fresh(
                    m, client, rec, keys, via=via, state=state, claims=claims, elements=elements
                )
            log(
                f"  claim {state} {m.label} {via:<7}: median {r['median_ms']} ms, max "
                f"{r['max_ms']} ms, {r['calls_per_claim']} calls a claim"
            )
            out["claims"].append(r)

    def fresh_loaded() -> None:
        fresh(client)
        for each in pair:
            each.load(client)

    fresh_loaded()
    measure("a", keys_for(m, f"leases-a-{m.label}"), sizes.claims, 0)

    for state, size, build in (
        ("b", sizes.leases, build_single_leases),
        ("c", sizes.big_leases, build_big_batches),
    ):
        fresh_loaded()
        keys = keys_for(m, f"leases-{state}-{m.label}")
        with rec.phase_of(f"{state}_setup", phases, m.label) as phase:
            made = build(m, client, rec, keys, size)
        made = {"state": state, "module": m.label, "size": size, **made}
        made["seconds"] = round(phase.seconds, 1)
        out["setup"].append(made)
        log(
            f"  setup {state} {m.label}: in_flight {made['in_flight']:,} of {size:,} "
            f"in {made['seconds']} s, worst call {phases[-1]['worst_ms']} ms "
            f"({phases[-1]['worst_command']})"
        )
        # The state is what it says: every job in flight, and (b) each its own element or
        # (c) in batches of 1,000 (the new module stops a batch once its ids reach 256 KB):
        # the ring's and the leases list's elements.
        made["in_flight_ok"] = made["in_flight"] == size
        elements = made["ring_elements"] + made.get("leases_elements", 0)
        per_batch = COUNT if m.label == "old" else min(COUNT, -(-BATCH_BYTES // BIG_ID_BYTES))
        wanted = size if state == "b" else -(-size // per_batch)
        made["shape_ok"] = wanted <= elements <= wanted + 2  # the sentinel, maybe a fresh id
        if not (made["in_flight_ok"] and made["shape_ok"]):
            log(
                f"  WARNING: {m.label} {state}: in_flight {made['in_flight']:,} in "
                f"{elements:,} elements (wanted {size:,} in {wanted:,})"
            )
        claims = sizes.claims if m.label == "new" else sizes.old_claims
        measure(state, keys, claims, made["length"] + size)

    fresh_loaded()
    with rec.phase_of("reclaim", phases, m.label):
        out["reclaim"] += reclaim_rows(m, client, connect, sizes, log)


def ratios(claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {(r["module"], r["via"], r["state"]): r["median_ms"] for r in claims}
    rows = []
    for module, via in sorted({(r["module"], r["via"]) for r in claims}):
        a = by.get((module, via, "a"))
        row: dict[str, Any] = {"module": module, "via": via}
        for state in ("b", "c"):
            value = by.get((module, via, state))
            row[f"{state}_over_a"] = round(value / a, 2) if a and value is not None else None
        rows.append(row)
    return rows


def worst_calls(phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for module in ("old", "new"):
        mine = [p for p in phases if p["module"] == module and p["calls"]]
        if not mine:
            continue
        worst = max(mine, key=lambda p: p["worst_ms"])
        rows.append(
            {
                "module": module,
                "worst_ms": worst["worst_ms"],
                "phase": worst["phase"],
                "command": worst["worst_command"],
                "calls": sum(p["calls"] for p in mine),
            }
        )
    return rows


def run_server(
    kind: str,
    pair: tuple[Module, Module],
    sizes: Sizes,
    workdir: Path,
    log: Callable[[str], None],
    *,
    labels: Sequence[str] = ("old", "new"),
) -> dict[str, Any]:
    with started(kind, workdir / f"leases-{kind}") as server:
        client = server.client()
        client.config_set("slowlog-log-slower-than", -1)  # on only in phases
        client.config_set("slowlog-max-len", SLOWLOG_LEN)
        log(f"leases on {kind} {server.version}")
        out: dict[str, list[dict[str, Any]]] = {
            "claims": [],
            "setup": [],
            "phases": [],
            "reclaim": [],
        }
        for m in (m for m in pair if m.label in labels):
            run_module(client, server.client, m, pair=pair, sizes=sizes, log=log, out=out)
        # A blocked client's timeout fires at the server's next cron tick (every 1000 / hz
        # ms): a consumer woken by its BLPOP timeout is up to that late.
        config = {**client.config_get("hz"), **client.config_get("dynamic-hz")}
        fresh(client)
        client.close()
        return {
            "version": server.version,
            "config": config,
            "claims": out["claims"],
            "ratios": ratios(out["claims"]),
            "worst_calls": worst_calls(out["phases"]),
            "reclaim": out["reclaim"],
            "setup": out["setup"],
            "phases": out["phases"],
        }


# -- the table ------------------------------------------------------------------------------------


def _claim(result: dict[str, Any], module: str, state: str, via: str) -> str:
    r = next(
        (
            r
            for r in result["claims"]
            if (r["module"], r["state"], r["via"]) == (module, state, via)
        ),
        None,
    )
    if r is None:
        return "-"
    calls = f", {r['calls_per_claim']:g} calls" if r["calls_per_claim"] != 1 else ""
    return f"{r['median_ms']:.2f} / {r['max_ms']:.2f}{calls}"


def _ratio(result: dict[str, Any], module: str, via: str) -> str:
    r = next((r for r in result["ratios"] if (r["module"], r["via"]) == (module, via)), None)
    if r is None:
        return "-"
    return " / ".join("-" if r[k] is None else f"{r[k]:,.1f}x" for k in ("b_over_a", "c_over_a"))


def _worst(result: dict[str, Any], module: str) -> str:
    r = next((r for r in result["worst_calls"] if r["module"] == module), None)
    return "-" if r is None else f"{r['worst_ms']:.1f} ({r['command']}, {r['phase']})"


def _reclaim(result: dict[str, Any], module: str, case: str) -> str:
    r = next((r for r in result["reclaim"] if (r["module"], r["case"]) == (module, case)), None)
    if r is None or r["median_ms"] is None:
        return "-"
    return f"{r['median_ms']:.0f} / {r['max_ms']:.0f}"


def markdown(data: dict[str, Any]) -> str:
    sizes = data["sizes"]
    kinds = list(data["results"])
    cols = [(kind, m) for kind in kinds for m in ("old", "new")]
    head = "| | " + " | ".join(f"{k} {data['results'][k]['version']} {m}" for k, m in cols)
    lines = [head + " |", "|---|" + "---:|" * len(cols)]

    def add(label: str, cell: Callable[..., str], *extra: Any) -> None:
        cells = [cell(data["results"][k], m, *extra) for k, m in cols]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    states = {
        "a": "nothing in flight",
        "b": f"{sizes['leases']:,} leases (16 B ids)",
        "c": f"{sizes['big_leases']:,} leases of 1,000 B in batches of 1,000",
    }
    for via in VIAS:
        for state, what in states.items():
            add(f"claim, {what}, {via.upper()} (median / max ms)", _claim, state, via)
        add(f"ratio b/a / c/a, {via.upper()}", _ratio, via)
    add("worst call, every phase (ms)", _worst)
    block = sizes["block_s"]
    add(
        f"reclaim, idle before the lease (ms after the deadline, median / max; block {block:g} s)",
        _reclaim,
        "idle_before",
    )
    add("reclaim, idle after the lease", _reclaim, "idle_after")
    return "\n".join(lines)


# -- the run --------------------------------------------------------------------------------------


def run(
    kinds: Sequence[str],
    mode: str,
    workdir: Path,
    out: Path,
    log: Callable[[str], None],
    *,
    labels: Sequence[str] = ("old", "new"),
    **resize: int,
) -> dict[str, Any]:
    """Measures every scenario on each server in ``kinds`` and writes ``out/leases.json``;
    ``labels`` picks the modules, ``resize`` overrides sizes of the mode (``leases=...``)."""
    sizes = replace(SIZES[mode], **resize)
    pair = modules()
    data: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "mode": mode,
            "date": time.strftime("%Y-%m-%d"),
        },
        "modules": {
            "old": f"bench/baseline: {OLD_COMMIT}'s lua/rotator.lua (sha1 {pair[0].sha})",
            "new": f"lua/rotator.lua (sha1 {pair[1].sha})",
        },
        "sizes": asdict(sizes),
        "targets": TARGETS,
        "results": {
            kind: run_server(kind, pair, sizes, workdir, log, labels=labels) for kind in kinds
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "leases.json").write_text(json.dumps(data, indent=2) + "\n")
    return data


def main(argv: list[str] | None = None) -> int:
    parser = sized_parser(__doc__, RESULTS, "leases.json")
    parser.add_argument("--modules", default="old,new", help="comma-separated: old, new")
    parser.add_argument("--leases", type=int, help="state b's leases (default: the mode's)")
    parser.add_argument("--big-leases", type=int, help="state c's leases (default: the mode's)")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown(json.loads((args.out / "leases.json").read_text())))
        return 0
    mode = size_mode(args)

    def log(line: str) -> None:
        print(line, flush=True)

    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rotator-leases-") as tmp:
        resize = {
            key: value
            for key, value in (("leases", args.leases), ("big_leases", args.big_leases))
            if value is not None
        }
        labels = args.modules.split(",")
        data = run(args.servers.split(","), mode, Path(tmp), args.out, log, labels=labels, **resize)
    log(markdown(data))
    log(f"done in {time.perf_counter() - began:.0f} s; results in {args.out / 'leases.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
