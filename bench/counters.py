"""Counters (issue 17): what the module's exact counters cost on the hot path.

    .venv/bin/python -m bench.counters [--smoke | --quick] [--servers redis,valkey]
        [--via fcall,evalsha] [--phases a,b,...] [--before FILE] [--after FILE]
        [--isolate] [--out DIR] [--table]

Issue 17 asks that the counters (completed, redelivered, reclaimed, lettered in the meta
hash, written in the walk's ``write_meta``, the short way ``M.fast_lease`` and ``nack``, which
adds ``retried``) cost no extra round trip and a few hundred nanoseconds per call at most.
On each server (one of our own, persistence off) two modules are loaded at once, each as a
script and as a function library under its own name: BEFORE is ``lua/rotator.lua`` at commit
8b6ec41, just before the counters (kept in ``bench/baseline/rotator-before-counters.lua``, so
no git history is needed), AFTER the working tree's. Both take a queue's KEYS
(``rotator.keys.queue_keys(name).all``; BEFORE less the id index) and are driven with the same
raw calls, one client,
a fresh queue for every loop. Phases:

0. a control: phase a with BEFORE on both sides (the same function, two queues), so the
   noise floor is measured in the same conditions as the differences;
a. ``next_packed 1``, each call acking the previous call's batch (the short way);
b. ``next_packed 100``, the same;
c. ``next 100`` acking the previous call's 100 tokens one by one (the long way: the walk);
d. nack-heavy: one job, ``next 1`` then ``nack 0`` of its token, again and again (each
   ``next`` re-leases the nacked job: ``redelivered``; each ``nack``: ``retried``);
e. AFTER alone, the processing times riding on the acks of a and b (the last argument
   ``#<total ms>,<bucket>:<count>,...``: one bucket for one job, three for 100) vs without.

The figure is server µs per module call: INFO commandstats of FCALL (or EVALSHA), reset
between phases, after the set-up (both sides' pushes) and a full collection of the Lua heap.
The two sides of a phase run on their own queues at once, alternating in chunks of about a
twentieth of a loop (commandstats read before and after each chunk), so a machine whose speed
drifts shifts both alike; which side starts alternates from round to round, over ``rounds``
rounds. A phase reports each side's median and spread (max - min over the rounds), the
difference AFTER - BEFORE (with times - without) per call in ns, the median of the per-round
differences and their range ("within noise" when they do not all have the same sign), and
the median and quartiles of the chunk-by-chunk differences. Also each side's commands issued
per call (the counters add none but nack's ``HINCRBY``), and AFTER's counters as ``stats``
reads them after the loop (so the measured path did count). ``--before`` / ``--after``
compare other module files (e.g. one ``git show`` wrote, to split a difference between
commits). ``--isolate`` sets BEFORE to AFTER with its counters neither read nor written, so
the difference is what the counters themselves cost now, apart from everything else the
module gained since the baseline.

Results: ``bench/results/counters.json`` and ``counters.md`` (``--out``); ``--table`` prints
the table of an earlier run. This machine (2 vCPUs) is shared with other work: the spread
says how much to trust a difference.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from bench.bounds import BUDGET, CHUNK, Module, job_ids, wait_lazyfree
from bench.harness import (
    git_commit,
    load_now,
    machine_info,
    size_mode,
    sized_parser,
    started,
    write_results,
)
from rotator.keys import queue_keys
from rotator.script import module_source

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
BEFORE_COMMIT = "8b6ec41"  # bench.scheduled, the commit before 01252f8 (the counters)
BEFORE_MODULE = ROOT / "bench" / "baseline" / "rotator-before-counters.lua"
LEASE_MS = 30_000
VIAS = ("fcall", "evalsha")
# The processing times a worker sends with its acks (rotator.protocol.encode_durations):
# one job of 12 ms (bucket 4: 8-16 ms); 100 jobs over three buckets, 1,350 ms in all.
TIMES_ONE = b"#12,4:1"
TIMES_BATCH = b"#1350,3:25,4:50,5:25"
Log = Callable[[str], None]
TARGET = "no extra round trip, a few hundred ns per call at most (issue 17)"


@dataclass(frozen=True)
class Sizes:
    one: int  # jobs (= calls) of the next_packed 1 loops
    parts: int  # iterations of each server-side loop of PARTS
    batch: int  # jobs of the next_packed 100 loops
    long: int  # jobs of the next 100 + token acks loop
    nacks: int  # next + nack cycles of the nack-heavy loop
    rounds: int


SIZES = {
    "full": Sizes(one=5000, parts=200_000, batch=200_000, long=100_000, nacks=3000, rounds=5),
    "quick": Sizes(one=1500, parts=100_000, batch=50_000, long=30_000, nacks=1000, rounds=3),
    "smoke": Sizes(one=60, parts=1000, batch=600, long=400, nacks=40, rounds=2),
}


# -- the two modules ----------------------------------------------------------------------------


def call(m: Module, client: redis.Redis, via: str, keys: Sequence[str], *args: Any) -> Any:
    """One raw call of module ``m`` by ``via`` ("fcall" or "evalsha")."""
    if via == "fcall":
        return m.fcall(client, keys, *args)
    return m.call(client, keys, *args)


def modules(before: Path | None = None, after: Path | None = None) -> tuple[Module, Module]:
    """BEFORE (default: the baseline) and AFTER (default: the working tree's module)."""
    old = (before or BEFORE_MODULE).read_text(encoding="utf-8")
    new = after.read_text(encoding="utf-8") if after else module_source()
    return Module("before", old), Module("after", new)


# The module's counts of what happened to its jobs (completed, redelivered, reclaimed,
# lettered): added to by M.write_meta's call of M.add_counts, with an HINCRBY of each that
# the call changed, and never read, but by one worker's loop (M.loop_lease), which reads
# `completed` among its LOOP_FIELDS and writes the sum in the HSET of its other numbers.
# ``without_counters`` takes out that call, and the loop's read and write.
_ADD_COUNTS = "    M.add_counts(s)\n"  # (in write_meta, inside define_module)
_LOOP_READ = ("'prio', 'completed' }", "'prio' }")  # (LOOP_FIELDS' last: l[12] is then nil)
_LOOP_WRITE = (", 'completed', completed + jobs)", ")")  # (the end of the loop's HSET)
ISOLATED_NAME = "rotator-without-counters.lua"  # --isolate's BEFORE


def without_counters(source: str) -> str:
    """``source`` with its counters not written (``--isolate``: BEFORE, against the same
    module with them, so the difference is what the counters themselves cost now). The edit
    must apply exactly once, or the module changed and this must follow it."""
    for old, new in ((_ADD_COUNTS, ""), _LOOP_READ, _LOOP_WRITE):
        if source.count(old) != 1:
            raise SystemExit(f"without_counters: {old.strip()!r} is not in the module once")
        source = source.replace(old, new)
    return source


def describe_modules(
    pair: tuple[Module, Module], before: Path | None, after: Path | None
) -> dict[str, str]:
    isolated = before is not None and before.name == ISOLATED_NAME
    return {
        "before": (
            f"{ISOLATED_NAME} (`--isolate`: AFTER less its counters, by "
            f"bench.counters.without_counters; sha1 {pair[0].sha})"
            if isolated
            else f"{before} (sha1 {pair[0].sha})"
            if before
            else f"bench/baseline/rotator-before-counters.lua ({BEFORE_COMMIT}'s "
            f"lua/rotator.lua; sha1 {pair[0].sha})"
        ),
        "after": (
            f"{after} (sha1 {pair[1].sha})"
            if after
            else f"lua/rotator.lua at {git_commit()} (sha1 {pair[1].sha})"
        ),
    }


# A full collection of the Lua heap a loop's calls run in, so none pays for the set-up's
# garbage: EVAL's for EVALSHA, the functions' (a library of its own) for FCALL.
GC_LIBRARY = "rotator_counters_gc"
GC_SOURCE = (
    f"#!lua name={GC_LIBRARY}\n"
    f"redis.register_function('{GC_LIBRARY}', function() collectgarbage('collect') return 0 end)"
)


def collect(client: redis.Redis, via: str) -> None:
    if via == "fcall":
        client.fcall(GC_LIBRARY, 0)
    else:
        client.eval("collectgarbage('collect') return 0", 0)


# -- the loops ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    key: str  # "a" .. "e1"
    what: str  # as the table says it
    loop: str  # "packed", "long" or "nack"
    batch: int  # jobs leased per call
    base: str  # the side the difference is taken from: "before" or "after, no times"
    test: str
    times: bytes = b""  # e: the times the test side sends with its acks


PHASES = (
    Phase("0", "control: a., BEFORE against itself", "packed", 1, "before", "before"),
    Phase("a", "`next_packed 1` + batch ack", "packed", 1, "before", "after"),
    Phase("b", "`next_packed 100` + batch ack", "packed", 100, "before", "after"),
    Phase("c", "`next 100` + 100 token acks (the long way)", "long", 100, "before", "after"),
    Phase("d", "`next 1` + `nack 0` (re-lease)", "nack", 1, "before", "after"),
    Phase(
        "e1", "`next_packed 1` + batch ack, times on the ack", "packed", 1,
        "after", "after", TIMES_ONE,
    ),
    Phase(
        "e100", "`next_packed 100` + batch ack, times on the ack", "packed", 100,
        "after", "after", TIMES_BATCH,
    ),
)  # fmt: skip


def push_all(m: Module, client: redis.Redis, via: str, keys: Sequence[str], n: int) -> None:
    ids = job_ids(n)
    for start in range(0, n, CHUNK):
        call(m, client, via, keys, "push", *ids[start : start + CHUNK])


class Loop:
    """One side's loop over its own queue, a step at a time (so two can alternate):

    - ``packed``: next_packed(``batch``), each call acking the previous call's batch whole
      (with ``times`` after the ack, if any), until the queue is drained;
    - ``long``: next(``batch``), each call acking the previous call's tokens one by one,
      until the queue is drained;
    - ``nack``: one job, next(1) then nack 0 of its token, ``cycles`` times.
    """

    def __init__(
        self, m: Module, client: redis.Redis, via: str, keys: Sequence[str], *, phase: Phase,
        times: bytes, cycles: int,
    ) -> None:  # fmt: skip
        self.m, self.client, self.via, self.keys = m, client, via, keys
        self.kind, self.batch, self.times, self.cycles = phase.loop, phase.batch, times, cycles
        self.ack: list[bytes] = []
        self.leased = 0
        self.steps = 0
        self.done = False

    def call(self, *args: Any) -> Any:
        return call(self.m, self.client, self.via, self.keys, *args)

    def step(self) -> None:
        self.steps += 1
        if self.kind == "packed":
            reply = self.call("next_packed", self.batch, LEASE_MS, BUDGET, 0, *self.ack)
            packed = reply[3]
            if not packed:
                self.done = True
                return
            jobs = packed.count(b"*") - 1
            self.leased += jobs
            self.ack = [packed[: packed.index(b"*", 1)] + b"/%d" % jobs]
            if self.times:
                self.ack.append(self.times)
        elif self.kind == "long":
            reply = self.call("next", self.batch, LEASE_MS, BUDGET, 0, *self.ack)
            self.ack = reply[3::2]
            self.leased += len(self.ack)
            self.done = not self.ack
        else:
            reply = self.call("next", 1, LEASE_MS, BUDGET, 0)
            for token in reply[3::2]:
                self.call("nack", 0, token)
                self.leased += 1
            self.done = self.steps >= self.cycles


def stats_of(m: Module, client: redis.Redis, via: str, keys: Sequence[str]) -> dict[str, int]:
    """The counters AFTER's ``stats`` answers ({} for BEFORE, or a module without them)."""
    if m.label != "after":
        return {}
    reply = call(m, client, via, keys, "stats")
    found = dict(zip(reply[::2], reply[1::2], strict=True))
    names = ("delivered", "completed", "retried", "reclaimed", "dead_lettered")
    return {name: int(found[name.encode()]) for name in names if name.encode() in found}


CHUNKS = 20  # each side's loop runs in about this many chunks, the two sides alternating


def command_stats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """(calls, usec) of every command since the last CONFIG RESETSTAT, ours left out."""
    stats = client.info("commandstats")
    return {
        key.removeprefix("cmdstat_"): (int(value["calls"]), int(value["usec"]))
        for key, value in stats.items()
        if key not in ("cmdstat_info", "cmdstat_config")
    }


@dataclass
class Tally:
    """What one side's chunks added up to."""

    calls: int = 0
    usec: int = 0
    issued: dict[str, int] | None = None
    chunks: list[float] | None = None  # us per call of each chunk

    def add(
        self, via: str, was: dict[str, tuple[int, int]], now: dict[str, tuple[int, int]]
    ) -> None:
        calls = now.get(via, (0, 0))[0] - was.get(via, (0, 0))[0]
        usec = now.get(via, (0, 0))[1] - was.get(via, (0, 0))[1]
        self.calls += calls
        self.usec += usec
        issued = self.issued if self.issued is not None else {}
        for name, (n, _) in now.items():
            if name != via:
                issued[name] = issued.get(name, 0) + n - was.get(name, (0, 0))[0]
        self.issued = issued
        if calls:
            self.chunks = [*(self.chunks or []), usec / calls]


def run_pair(
    client: redis.Redis, sides: list[tuple[Module, bool]], via: str, *, phase: Phase,
    sizes: Sizes, names: list[str],
) -> list[dict[str, Any]]:  # fmt: skip
    """Both sides of a phase, each on a fresh queue, alternating in chunks of steps (server
    time read from INFO commandstats before and after each chunk): per side, µs per call,
    the commands the module issued per call, its chunks' µs per call, AFTER's counters."""
    jobs = {"packed": sizes.one if phase.batch == 1 else sizes.batch, "long": sizes.long}
    loops, keys_of = [], []
    for (m, test), name in zip(sides, names, strict=True):
        keys = queue_keys(name).all
        push_all(m, client, via, keys, jobs.get(phase.loop, 1))
        times = phase.times if test else b""
        loops.append(Loop(m, client, via, keys, phase=phase, times=times, cycles=sizes.nacks))
        keys_of.append(keys)
    expected = sizes.nacks if phase.loop == "nack" else jobs[phase.loop] // phase.batch + 1
    chunk = max(1, -(-expected // CHUNKS))
    wait_lazyfree(client)
    collect(client, via)
    client.config_resetstat()
    tallies = [Tally() for _ in loops]
    was = command_stats(client)
    while not all(loop.done for loop in loops):
        for loop, tally in zip(loops, tallies, strict=True):
            if loop.done:
                continue
            for _ in range(chunk):
                loop.step()
                if loop.done:
                    break
            now = command_stats(client)
            tally.add(via, was, now)
            was = now
    rows = []
    for (m, _), loop, tally, keys in zip(sides, loops, tallies, keys_of, strict=True):
        issued = tally.issued or {}
        rows.append(
            {
                "calls": tally.calls,
                "us_per_call": tally.usec / tally.calls if tally.calls else 0.0,
                "leased": loop.leased,
                "issued": {
                    name: round(n / tally.calls, 2)
                    for name, n in sorted(issued.items())
                    if n and tally.calls
                },
                "chunks": tally.chunks or [],
                "counted": stats_of(m, client, via, keys),
            }
        )
        client.delete(*keys)
    return rows


# -- the rounds -----------------------------------------------------------------------------------


def _side(values: list[float], loop: dict[str, Any], label: str) -> dict[str, Any]:
    return {
        "label": label,
        "us_per_call": round(statistics.median(values), 2),
        "us_per_call_by_round": [round(v, 2) for v in values],
        "spread_us": round(max(values) - min(values), 2),
        "calls": loop["calls"],
        "leased": loop["leased"],
        "chunks": len(loop["chunks"]),
        "commands_per_call": round(sum(loop["issued"].values()), 2),
        "issued_per_call": loop["issued"],
        "counted": loop["counted"],
    }


def verdict(diffs: list[float]) -> str:
    if len(diffs) < 2 or min(diffs) <= 0 <= max(diffs):
        return "within noise"
    return "higher every round" if min(diffs) > 0 else "lower every round"


def run_phases(
    client: redis.Redis, pair: tuple[Module, Module], sizes: Sizes, *, vias: Sequence[str],
    phases: Sequence[Phase], log: Log,
) -> list[dict[str, Any]]:  # fmt: skip
    """Each phase by every via, its two sides alternating, in interleaved rounds (which
    side starts alternates from round to round)."""
    by_label = {m.label: m for m in pair}
    samples: dict[tuple[str, str, str], list[float]] = {}
    pairs: dict[tuple[str, str], list[float]] = {}  # test - base, chunk by chunk (ns)
    last: dict[tuple[str, str, str], dict[str, Any]] = {}
    for round_ in range(sizes.rounds):
        for via in vias:
            for phase in phases:
                sides = [("base", phase.base, False), ("test", phase.test, True)]
                if round_ % 2:
                    sides.reverse()
                names = [f"counters-{phase.key}-{side}-{via}-{round_}" for side, _, _ in sides]
                loops = run_pair(
                    client, [(by_label[label], test) for _, label, test in sides], via,
                    phase=phase, sizes=sizes, names=names,
                )  # fmt: skip
                of = {side: loop for (side, _, _), loop in zip(sides, loops, strict=True)}
                for side, loop in of.items():
                    samples.setdefault((via, phase.key, side), []).append(loop["us_per_call"])
                    last[via, phase.key, side] = loop
                pairs.setdefault((via, phase.key), []).extend(
                    1000 * (t - b)
                    for b, t in zip(of["base"]["chunks"], of["test"]["chunks"], strict=False)
                )
            log(f"  round {round_ + 1}/{sizes.rounds} {via} done")
    rows = []
    for via in vias:
        for phase in phases:
            base = samples[via, phase.key, "base"]
            test = samples[via, phase.key, "test"]
            diffs = [1000 * (t - b) for b, t in zip(base, test, strict=True)]
            median = statistics.median(diffs)
            chunked = pairs[via, phase.key]
            quartiles = (
                statistics.quantiles(chunked, n=4, method="inclusive")
                if len(chunked) > 1
                else [chunked[0]] * 3
            )
            rows.append(
                {
                    "phase": phase.key, "what": phase.what, "via": via, "batch": phase.batch,
                    "base": _side(base, last[via, phase.key, "base"], side_label(phase, False)),
                    "test": _side(test, last[via, phase.key, "test"], side_label(phase, True)),
                    "diff_ns_per_call": round(median),
                    "diff_ns_per_job": round(median / phase.batch, 1),
                    "diff_ns_by_round": [round(d) for d in diffs],
                    "diff_ns_range": [round(min(diffs)), round(max(diffs))],
                    "verdict": verdict(diffs),
                    "chunk_pairs": len(chunked),
                    "diff_ns_chunk_median": round(quartiles[1]),
                    "diff_ns_chunk_iqr": [round(quartiles[0]), round(quartiles[2])],
                }
            )  # fmt: skip
    return rows


def side_label(phase: Phase, test: bool) -> str:
    if phase.times:
        return "with times" if test else "without times"
    return phase.test if test else phase.base


def describe(r: dict[str, Any]) -> str:
    return (
        f"  {r['via']:<7} {r['phase']:<4} {r['what']}: {r['base']['label']} "
        f"{r['base']['us_per_call']:.1f} us, {r['test']['label']} "
        f"{r['test']['us_per_call']:.1f} us per call; {r['diff_ns_per_call']:+,} ns "
        f"({r['diff_ns_range'][0]:+,} .. {r['diff_ns_range'][1]:+,}), {r['verdict']}"
    )


def run_server(
    kind: str, pair: tuple[Module, Module], sizes: Sizes, *, vias: Sequence[str],
    phases: Sequence[Phase], workdir: Path, log: Log,
) -> dict[str, Any]:  # fmt: skip
    with started(kind, workdir / f"counters-{kind}") as server:
        client = server.client()
        log(f"counters on {kind} {server.version}")
        for m in pair:
            m.load(client)
        client.function_load(GC_SOURCE, replace=True)
        rows = run_phases(client, pair, sizes, vias=vias, phases=phases, log=log)
        for r in rows:
            log(describe(r))
        parts = measure_parts(client, pair[1], sizes)
        log(
            f"  parts: a call that changes a counter {parts['call_now_changed']} ns now, "
            f"{parts['call_before_changed']} ns before; one that changes none "
            f"{parts['call_now_unchanged']} ns now, {parts['call_before_unchanged']} ns before"
        )
        client.close()
        return {"version": server.version, "rows": rows, "parts": parts}


# -- the parts, alone -----------------------------------------------------------------------

# What the counters' own commands cost, each run in a loop inside one script on a real
# queue's meta hash: precise to a few ns, where a whole call's time moves by a microsecond from
# round to round. Lua for one iteration of each; KEYS[1] is the meta hash.
PARTS = (
    ("loop", "an empty iteration (subtracted from the others)", "local x = i"),
    (
        "add",
        "now, a call that changes a counter: one HINCRBY (by pcall, its reply checked)",
        "local r = redis.pcall('HINCRBY', KEYS[1], 'completed', 1) "
        "if type(r) == 'table' and r.err then x = 1 end",
    ),
    (
        "add_none",
        "now, a call that changes none: four comparisons",
        "local c, d, r, l = 1, 0, 0, 0 "
        "if c ~= 0 and d ~= 0 then x = 1 end if r ~= 0 then x = 2 end if l ~= 0 then x = 3 end",
    ),
    (
        "read_before",
        "before, every call: the four counters read with the meta hash, as numbers",
        "local m = redis.call('HMGET', KEYS[1], 'completed', 'redelivered', 'reclaimed', "
        "'lettered') local c, d, r, l = tonumber(m[1]) or 0, tonumber(m[2]) or 0, "
        "tonumber(m[3]) or 0, tonumber(m[4]) or 0",
    ),
    (
        "read_before_base",
        "(the same HMGET with no field: its call, not the counters)",
        "local m = redis.call('HMGET', KEYS[1], 'seq')",
    ),
    (
        "write_before",
        "before, a call that changed one: its field and sum in the meta HSET",
        "redis.call('HSET', KEYS[1], 'seq', 'x', 'completed', i)",
    ),
    (
        "write_before_base",
        "(the same HSET without it)",
        "redis.call('HSET', KEYS[1], 'seq', 'x')",
    ),
)


def measure_parts(client: redis.Redis, m: Module, sizes: Sizes) -> dict[str, Any]:
    """ns per iteration of each of PARTS (median of the rounds' loops, the empty loop taken
    off) on the meta hash of a queue ``m`` used, and from them what the counters cost a call
    now and before."""
    keys = queue_keys("counters-parts")
    push_all(m, client, "fcall", keys.all, 100)
    busy = Loop(m, client, "fcall", keys.all, phase=PHASES[1], times=b"", cycles=0)
    for _ in range(10):  # the meta hash as a busy queue's: every field the calls write
        busy.step()
    n, meta = sizes.parts, keys.meta
    samples: dict[str, list[float]] = {key: [] for key, _, _ in PARTS}
    for _ in range(sizes.rounds):
        for key, _, body in PARTS:
            script = f"local x for i = 1, {n} do {body} end return 0"
            began = time.perf_counter_ns()
            client.eval(script, 1, meta)
            samples[key].append((time.perf_counter_ns() - began) / n)
    ns = {key: statistics.median(values) for key, values in samples.items()}
    loop = ns["loop"]
    each = {key: round(value - loop) for key, value in ns.items() if key != "loop"}
    return {
        "iterations": n,
        "encoding": client.object("encoding", meta).decode(),
        "ns": each,
        "what": {key: what for key, what, _ in PARTS},
        "call_now_changed": each["add"] + each["add_none"],
        "call_now_unchanged": each["add_none"],
        "call_before_changed": each["read_before"]
        - each["read_before_base"]
        + each["write_before"]
        - each["write_before_base"],
        "call_before_unchanged": each["read_before"] - each["read_before_base"],
    }


# -- the table ------------------------------------------------------------------------------------


def _ns(value: int) -> str:
    return f"{value:+,}"


def markdown(data: dict[str, Any]) -> str:
    """Per server and via: each phase's two sides (median µs per call, spread over the
    rounds) and the difference per call in ns (median and range over the rounds; median and
    quartiles over the chunk pairs)."""
    rounds = data["sizes"]["rounds"]
    lines = []
    for kind, result in data["results"].items():
        vias = list(dict.fromkeys(r["via"] for r in result["rows"]))
        for via in vias:
            lines += [
                "",
                f"{kind} {result['version']}, {via.upper()}: server µs per call, median of "
                f"{rounds} rounds (spread: max - min); the difference per call in ns, median "
                "of the rounds' (range), and of the chunk pairs' (quartiles)",
                "",
                "| phase | base µs (spread) | test µs (spread) | difference a call, rounds "
                "| chunks | per job | commands a call | |",
                "|---|---:|---:|---:|---:|---:|---:|---|",
            ]
            for r in (r for r in result["rows"] if r["via"] == via):
                base, test = r["base"], r["test"]
                lo, hi = r["diff_ns_range"]
                q1, q3 = r["diff_ns_chunk_iqr"]
                per_job = f"{r['diff_ns_per_job']:+,.1f} ns" if r["batch"] > 1 else "-"
                lines.append(
                    f"| {r['phase']}. {r['what']} "
                    f"| {base['label']} {base['us_per_call']:.1f} ({base['spread_us']:.1f}) "
                    f"| {test['label']} {test['us_per_call']:.1f} ({test['spread_us']:.1f}) "
                    f"| {_ns(r['diff_ns_per_call'])} ns ({_ns(lo)} .. {_ns(hi)}) "
                    f"| {_ns(r['diff_ns_chunk_median'])} ({_ns(q1)} .. {_ns(q3)}) "
                    f"| {per_job} "
                    f"| {base['commands_per_call']:g} / {test['commands_per_call']:g} "
                    f"| {r['verdict']} |"
                )
        if "parts" in result:
            lines += ["", *parts_table(kind, result["version"], result["parts"])]
    return "\n".join(lines).lstrip("\n")


def parts_table(kind: str, version: str, parts: dict[str, Any]) -> list[str]:
    """The counters' own commands, each alone (measure_parts)."""
    ns = parts["ns"]
    lines = [
        f"{kind} {version}: the counters' own work, each in a server-side loop of "
        f"{parts['iterations']:,} on a busy queue's meta hash ({parts['encoding']}), ns an "
        "iteration, median of the rounds",
        "",
        "| | ns |",
        "|---|---:|",
    ]
    lines += [f"| {parts['what'][key]} | {value:,} |" for key, value in ns.items()]
    lines += [
        f"| **a call that changes one counter: now (HINCRBY) / before (read, sum, HSET)** "
        f"| **{parts['call_now_changed']:,} / {parts['call_before_changed']:,}** |",
        f"| **a call that changes none: now / before (read)** "
        f"| **{parts['call_now_unchanged']:,} / {parts['call_before_unchanged']:,}** |",
    ]
    return lines


def report(data: dict[str, Any]) -> str:
    machine = data["machine"]
    modules = data["modules"]
    return (
        "# Counters benchmark (issue 17)\n\n"
        f"`python -m bench.counters` (mode {machine['mode']}) on {machine['cpus']} CPUs, "
        f"{machine['platform']}, Python {machine['python']}, {machine['date']}. Before: "
        f"{modules['before']}; after: {modules['after']}. Loopback, persistence off, one "
        f"client, {data['sizes']['rounds']} interleaved rounds. 1-minute load average "
        f"{machine['load_before']} before and {machine['load_after']} after: the machine was "
        "shared with other work, so read each difference against its range.\n\n"
        f"{markdown(data)}\n"
    )


# -- the run --------------------------------------------------------------------------------------


def run(
    kinds: Sequence[str], mode: str, vias: Sequence[str], workdir: Path, out: Path, *, log: Log,
    phases: Sequence[str] = (), before: Path | None = None, after: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Measures the ``phases`` (default: all) on each server in ``kinds``, BEFORE and AFTER
    (default: the baseline and the working tree's module); writes ``out/counters.json`` and
    ``out/counters.md``."""
    sizes = SIZES[mode]
    pair = modules(before, after)
    chosen = tuple(p for p in PHASES if not phases or p.key in phases)
    machine = machine_info(mode, shared=True)  # (other work ran on this machine meanwhile)
    results = {
        kind: run_server(kind, pair, sizes, vias=vias, phases=chosen, workdir=workdir, log=log)
        for kind in kinds
    }
    machine["load_after"] = load_now()
    data: dict[str, Any] = {
        "machine": machine,
        "modules": describe_modules(pair, before, after),
        "sizes": asdict(sizes),
        "times": {"one": TIMES_ONE.decode(), "batch": TIMES_BATCH.decode()},
        "target": TARGET,
        "results": results,
    }
    return write_results(out, "counters", data, report)


def main(argv: list[str] | None = None) -> int:
    parser = sized_parser(__doc__, RESULTS, "counters.json")
    parser.add_argument("--via", default=",".join(VIAS), help="fcall, evalsha or both")
    parser.add_argument(
        "--phases", default="", help=f"comma-separated, of {','.join(p.key for p in PHASES)}"
    )
    parser.add_argument("--before", type=Path, help="BEFORE's module (default: the baseline)")
    parser.add_argument("--after", type=Path, help="AFTER's module (default: lua/rotator.lua)")
    parser.add_argument(
        "--isolate",
        action="store_true",
        help="BEFORE is AFTER without its counters: what the counters alone cost",
    )
    args = parser.parse_args(argv)
    if args.table:
        print(markdown(json.loads((args.out / "counters.json").read_text())))
        return 0
    vias = [via for via in args.via.split(",") if via]
    if not vias or any(via not in VIAS for via in vias):
        parser.error(f"--via takes {' or '.join(VIAS)}, comma-separated")
    phases = [key for key in args.phases.split(",") if key]
    if any(key not in {p.key for p in PHASES} for key in phases):
        parser.error(f"--phases takes {', '.join(p.key for p in PHASES)}")
    mode = size_mode(args)

    def log(line: str) -> None:
        print(line, flush=True)

    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rotator-counters-") as tmp:
        if args.isolate:
            source = args.after.read_text(encoding="utf-8") if args.after else module_source()
            args.before = Path(tmp) / ISOLATED_NAME
            args.before.write_text(without_counters(source), encoding="utf-8")
        data = run(
            args.servers.split(","), mode, vias, Path(tmp), args.out, log=log, phases=phases,
            before=args.before, after=args.after,
        )  # fmt: skip
    log(markdown(data))
    log(f"done in {time.perf_counter() - began:.0f} s; results in {args.out / 'counters.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
