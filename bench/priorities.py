"""Priorities (issue 16): what a claim, a push and a waiting job cost at a priority level.

    .venv/bin/python -m bench.priorities [--smoke | --quick] [--servers redis,valkey]
        [--out DIR] [--table]

Issue 16 asks for the priority claim cost with 1 and 3 levels in use, and says a queue that
never uses priorities pays nothing. On each server (one of our own, persistence off), through
the public API (``Rotator``, FCALL where the server allows it, as by default), one client,
16-byte ids:

1. Claims. ``claim`` jobs pushed onto a queue (5000 ids a call), then drained by one client,
   ``next(batch, ack=<the previous batch>)`` until it returns [] (acks riding on the claims),
   batch 1 and 100, three cases: (a) a queue that never used priorities (plain pushes);
   (b) every job at one level (``priority=5``); (c) three levels in use, 0 (plain), 3 and 7,
   a third each, pushed mixed (each chunk of ids split by level). The order each drain
   delivered is checked after it (not timed): FIFO in (a) and (b), in (c) every level-0 job
   first, then level 3, then level 7, each in push order; the queue must be empty after.
   Interleaved rounds on the same three queues, the order rotating from round to round;
   ratios to (a) are taken within each round and their median given. Jobs waiting at a level
   are not in the ring: a claim takes them after its walk (``M.lease_prioritized``: one
   ``ZRANGEBYSCORE`` and one ``ZREM`` a call), and while any wait, a claim takes the walk,
   never the short way of a busy queue (``M.fast_lease``).
2. The control for "pays nothing": (a) again, by EVALSHA, on two modules from git: the
   priorities commit (1a29141) and its parent (7f359a6). The two differ by priorities alone;
   a queue with no job at a level reads one more meta field a claim (``prio``).
3. Pushes. Server µs per pushed id (INFO commandstats of EVALSHA and FCALL, the module calls
   only, over the run / the ids sent) and client wall µs per id, one id a call (``push(id)``)
   and 100 a call (``push_many(ids, 100)``), plain (``push``) and at level 5
   (``push_priority 5 IN 0``); fresh queues each round, the order alternating.
4. Memory. ``held`` jobs pushed plain (the ring's bytes a job, ``MEMORY USAGE ... SAMPLES 0``
   / jobs) beside ``held`` jobs waiting at level 5 (the scheduled set's bytes a job: members
   ``*5*<id>`` scored by level and push order).

Results: ``bench/results/priorities.json`` and ``priorities.md`` (``--out``); ``--table`` prints
the table of an earlier run. Full sizes take about 4 minutes on this 2-core VM for both
servers.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import redis

from bench.bounds import wait_lazyfree
from bench.harness import (
    ServerTable,
    load_now,
    machine_info,
    module_info,
    standard_main,
    started,
    write_results,
)
from bench.unique import (
    Timed,
    compared,
    ids,
    median,
    memory,
    push_cell,
    ratio_row,
    round_line,
    summary,
    timed,
)
from rotator import Job, Rotator
from rotator.protocol import text

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
LOAD_CHUNK = 5000  # ids a call when loading (the module's most)
LEASE_S = 3600.0  # no lease runs out during a run
LEVEL = 5  # the level of the one-level case and of the priority pushes
LEVELS = (0, 3, 7)  # the three-level case
CLAIM_CASES = ("none", "one", "three")
PUSH_CASES = ("plain", "priority")
BATCHES = (1, 100)
# The control: the module at the priorities commit and at its parent, read with git show.
CONTROL = {"before": "7f359a6", "after": "1a29141"}
Log = Callable[[str], None]


@dataclass(frozen=True)
class Sizes:
    rounds: int  # interleaved rounds (claims, the control, pushes)
    claim_one: int  # jobs drained by next(1) per run
    claim_batch: int  # jobs drained by next(100) per run
    push_one: int  # ids a round, pushed one a call
    push_batch: int  # ids a round, pushed 100 a call
    held: tuple[int, ...]  # jobs held for the memory figures


SIZES = {
    "full": Sizes(5, 3000, 150_000, 3000, 60_000, (10_000, 100_000)),
    "quick": Sizes(2, 300, 6000, 300, 3000, (2000, 10_000)),
    "smoke": Sizes(1, 60, 600, 30, 300, (300,)),
}


def level_of(case: str, i: int) -> int:
    """The level of the ``i``-th job pushed in a claim case."""
    if case == "none":
        return 0
    if case == "one":
        return LEVEL
    return LEVELS[i % len(LEVELS)]


def load(q: Rotator, case: str, every: list[str]) -> int:
    """Pushes ``every`` for a claim case, 5000 ids a call, the levels mixed chunk by chunk."""
    pushed = 0
    for start in range(0, len(every), LOAD_CHUNK):
        chunk = range(start, min(start + LOAD_CHUNK, len(every)))
        for level in sorted({level_of(case, i) for i in chunk}):
            part = [every[i] for i in chunk if level_of(case, i) == level]
            pushed += q.push_many(part, LOAD_CHUNK, priority=level)
    return pushed


def expected_order(case: str, every: list[str]) -> list[str]:
    """The order a drain must deliver: the most urgent level first, FIFO within one."""
    order = sorted(range(len(every)), key=lambda i: (level_of(case, i), i))
    return [every[i] for i in order]


def drain(q: Rotator, batch: int, got: list[str]) -> int:
    """Claims until ``next`` returns [], each call acking the previous batch; the ids
    delivered go to ``got``, in order."""
    finished: list[Job] = []
    n = 0
    while jobs := q.next(batch, ack=finished):
        n += len(jobs)
        got.extend(job.id for job in jobs)
        finished = jobs
    return n


def check_drained(q: Rotator, case: str, every: list[str], got: list[str]) -> None:
    want = expected_order(case, every)
    if got != want:
        wrong = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
        raise RuntimeError(f"claim {case}: delivered out of order at {wrong} of {len(got)}")
    s = q.stats()
    if (s.length, s.pending, s.prioritized) != (0, 0, 0):
        raise RuntimeError(f"claim {case}: left {s}")


def claim_runs(
    client: redis.Redis,
    queues: dict[str, Rotator],
    sizes: Sizes,
    log: Log,
    label: str,
) -> dict[tuple[int, str], list[Timed]]:
    """Interleaved rounds of drains, one per queue and batch, each queue loaded as its case
    (the queue's name in ``queues``; the control's queues are all "none")."""
    runs: dict[tuple[int, str], list[Timed]] = {(b, k): [] for b in BATCHES for k in queues}
    kinds = list(queues)
    for rnd in range(sizes.rounds):
        for batch in BATCHES:
            n = sizes.claim_one if batch == 1 else sizes.claim_batch
            order = kinds[rnd % len(kinds) :] + kinds[: rnd % len(kinds)]
            for kind in order:
                q = queues[kind]
                case = kind if kind in CLAIM_CASES else "none"
                every = ids(f"c{rnd}b{batch}", n)
                if load(q, case, every) != n:
                    raise RuntimeError(f"{label} {kind}: not every id was pushed")
                got: list[str] = []
                run = timed(client, n, partial(drain, q, batch, got))
                if run.result != n:
                    raise RuntimeError(f"{label} {kind}: drained {run.result} of {n}")
                check_drained(q, case, every, got)
                runs[batch, kind].append(run)
            log(
                f"  {label} round {rnd} next({batch:>3}): "
                + ", ".join(
                    f"{kind} {runs[batch, kind][-1].per_s:,.0f} jobs/s "
                    f"{runs[batch, kind][-1].server_us_each:.2f} us"
                    for kind in kinds
                )
                + " (server us a job)"
            )
    return runs


def claim_table(
    runs: dict[tuple[int, str], list[Timed]], base: str, tests: Sequence[str]
) -> dict[str, Any]:
    rows = [
        {
            "batch": batch,
            "queue": kind,
            "jobs": done[0].n,
            "jobs_per_s": [round(r.per_s, 1) for r in done],
            "median_jobs_per_s": round(median([r.per_s for r in done]), 1),
            **summary(done),
        }
        for (batch, kind), done in runs.items()
    ]
    ratios = []
    for batch in BATCHES:
        for kind in tests:
            ratio = ratio_row(runs[batch, kind], runs[batch, base])
            wall = ratio["wall_ratio"]
            ratio["throughput_ratio"] = round(1 / wall, 3) if wall else 0
            ratios.append({"batch": batch, "queue": kind, **ratio})
    return {"via": runs[1, base][0].via, "rows": rows, "ratios": ratios}


# -- 1. claims ------------------------------------------------------------------------------------


def claim_rows(client: redis.Redis, sizes: Sizes, log: Log) -> dict[str, Any]:
    queues = {case: Rotator(client, f"claim-{case}", timeout=LEASE_S) for case in CLAIM_CASES}
    runs = claim_runs(client, queues, sizes, log, "claim")
    table = claim_table(runs, "none", ("one", "three"))
    for q in queues.values():
        q.delete()
    wait_lazyfree(client)
    return table


# -- 2. the control -------------------------------------------------------------------------------


def module_at(commit: str) -> str:
    return subprocess.run(
        ["git", "show", f"{commit}:lua/rotator.lua"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def control_rows(client: redis.Redis, sizes: Sizes, log: Log) -> dict[str, Any]:
    """A queue that never used priorities, on the module before and after them (EVALSHA)."""
    queues = {}
    for side, commit in CONTROL.items():
        q = Rotator(client, f"control-{side}", timeout=LEASE_S, functions=False)
        q._sender.script = client.register_script(module_at(commit))
        queues[side] = q
    runs = claim_runs(client, queues, sizes, log, "control")
    table = claim_table(runs, "before", ("after",))
    for q in queues.values():
        q.delete()
    wait_lazyfree(client)
    table["commits"] = CONTROL
    return table


# -- 3. pushes ------------------------------------------------------------------------------------


def push_ids(q: Rotator, every: list[str], batch: int, level: int) -> int:
    if batch == 1:
        return sum(q.push(job_id, priority=level) for job_id in every)
    return q.push_many(every, batch, priority=level)


def push_rows(client: redis.Redis, sizes: Sizes, log: Log) -> dict[str, Any]:
    runs: dict[tuple[int, str], list[Timed]] = {(b, c): [] for b in BATCHES for c in PUSH_CASES}
    for rnd in range(sizes.rounds):
        for batch in BATCHES:
            n = sizes.push_one if batch == 1 else sizes.push_batch
            order = PUSH_CASES if rnd % 2 == 0 else PUSH_CASES[::-1]
            for case in order:
                q = Rotator(client, f"push-{case}-{rnd}-{batch}")
                level = LEVEL if case == "priority" else 0
                run = timed(client, n, partial(push_ids, q, ids(f"p{rnd}", n), batch, level))
                if run.result != n or q.stats().pending != n:
                    raise RuntimeError(f"push {case}: {run.result} ids taken, not {n}")
                runs[batch, case].append(run)
                q.delete()
            log(round_line(runs, rnd, batch, PUSH_CASES))
            wait_lazyfree(client)
    return compared(runs, PUSH_CASES, "priority")


# -- 4. memory ------------------------------------------------------------------------------------


def memory_rows(client: redis.Redis, sizes: Sizes, log: Log) -> list[dict[str, Any]]:
    rows = []
    for held in sizes.held:
        every = ids("m", held)
        plain = Rotator(client, f"memory-plain-{held}")
        plain.push_many(every, LOAD_CHUNK)
        ranked = Rotator(client, f"memory-priority-{held}")
        ranked.push_many(every, LOAD_CHUNK, priority=LEVEL)
        s = ranked.stats()
        if (s.prioritized, s.pending, s.scheduled) != (held, held, 0):
            raise RuntimeError(f"memory: {s}")
        ring = memory(client, plain.keys.ring)
        zset = memory(client, ranked.keys.scheduled)
        row = {
            "held": held,
            "ring_bytes_per_job": round(ring / held, 1),
            "prioritized_bytes_per_job": round(zset / held, 1),
            "zset_encoding": text(client.object("encoding", ranked.keys.scheduled)),
            "sample_member": text(client.zrange(ranked.keys.scheduled, 0, 0)[0]),
        }
        rows.append(row)
        plain.delete()
        ranked.delete()
        wait_lazyfree(client)
        log(
            f"  memory {held:>7,} jobs: waiting at level {LEVEL} {row['prioritized_bytes_per_job']}"
            f" B a job ({row['zset_encoding']}), in the ring {row['ring_bytes_per_job']} B a job"
        )
    return rows


# -- one server -----------------------------------------------------------------------------------


def run_server(kind: str, sizes: Sizes, workdir: Path, log: Log) -> dict[str, Any]:
    with started(kind, workdir / f"priorities-{kind}") as server:
        client = server.client()
        log(f"priorities on {kind} {server.version}")
        claims = claim_rows(client, sizes, log)
        for r in claims["ratios"]:
            log(
                f"  claim next({r['batch']}): {r['queue']} / none throughput "
                f"{r['throughput_ratio']}x, server time {r['server_ratio']}x"
            )
        control = control_rows(client, sizes, log)
        for r in control["ratios"]:
            log(
                f"  control next({r['batch']}): after / before priorities, server time "
                f"{r['server_ratio']}x, throughput {r['throughput_ratio']}x"
            )
        pushes = push_rows(client, sizes, log)
        memories = memory_rows(client, sizes, log)
        client.close()
        return {
            "version": server.version,
            "claims": claims,
            "control": control,
            "push": pushes,
            "memory": memories,
        }


# -- the table ------------------------------------------------------------------------------------

QUEUE_LABELS = {
    "none": "a queue that never used priorities",
    "one": f"every job at one level ({LEVEL})",
    "three": "three levels in use (0, 3, 7)",
}


def markdown(data: dict[str, Any]) -> str:
    table = ServerTable(data["results"])
    add = table.add

    def claim(section: str, batch: int, kind: str) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            rows = r[section]["rows"]
            row = next(c for c in rows if (c["batch"], c["queue"]) == (batch, kind))
            return f"{row['median_jobs_per_s']:,.0f} / {row['median_server_us_each']:.2f}"

        return cell

    def ratio(section: str, batch: int, kind: str) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            rows = r[section]["ratios"]
            row = next(c for c in rows if (c["batch"], c["queue"]) == (batch, kind))
            return f"{row['throughput_ratio']:.2f}x / {row['server_ratio']:.2f}x"

        return cell

    for batch in sorted(BATCHES, reverse=True):
        what = f"`next({batch}, ack=<previous>)`"
        for kind in CLAIM_CASES:
            label = f"claim+ack {what}, {QUEUE_LABELS[kind]} (jobs/s / server µs a job)"
            add(label, claim("claims", batch, kind))
        for kind in ("one", "three"):
            add(
                f"{QUEUE_LABELS[kind]} over never used, {what} (throughput / server time)",
                ratio("claims", batch, kind),
            )
    before, after = CONTROL["before"], CONTROL["after"]
    for batch in sorted(BATCHES, reverse=True):
        what = f"`next({batch}, ack=<previous>)`"
        add(
            f"control, never used, {what}, EVALSHA: module {after} (priorities) over {before} "
            "(throughput / server time)",
            ratio("control", batch, "after"),
        )

    def push_ratio(batch: int) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            row = next(p for p in r["push"]["ratios"] if p["batch"] == batch)
            return f"{row['server_ratio']:.2f}x"

        return cell

    for batch in BATCHES:
        for case in PUSH_CASES:
            label = "plain push" if case == "plain" else f"push at priority {LEVEL}"
            add(f"{label}, {batch} a call (server / wall µs an id)", push_cell(batch, case))
        add(f"server time, priority over plain, {batch} a call", push_ratio(batch))

    def mem(held: int) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            row = next(m for m in r["memory"] if m["held"] == held)
            return f"{row['prioritized_bytes_per_job']:.1f} / {row['ring_bytes_per_job']:.1f}"

        return cell

    for held in data["sizes"]["held"]:
        add(
            f"memory, {held:,} jobs (B a job: waiting at a level, the scheduled set / "
            "pending in the ring)",
            mem(held),
        )
    return table.text()


def report(data: dict[str, Any]) -> str:
    machine = data["machine"]
    return (
        "# Priorities benchmark (issue 16)\n\n"
        f"`python -m bench.priorities` (mode {machine['mode']}) on {machine['cpus']} CPUs, "
        f"{machine['platform']}, Python {machine['python']}, {machine['date']}; module "
        f"{data['module']['sha1'][:12]} at {data['module']['commit']}. Loopback, persistence "
        f"off, one client, 16-byte ids, the module called by "
        f"{'/'.join(sorted({r['claims']['via'] for r in data['results'].values()}))} (the "
        f"control: EVALSHA of the modules at {CONTROL['after']} and {CONTROL['before']}); "
        f"medians of {data['sizes']['rounds']} interleaved rounds (ratios: the median of the "
        f"per-round ratios). 1-minute load average {machine['load_before']} before and "
        f"{machine['load_after']} after (other work shared the machine).\n\n"
        f"{markdown(data)}\n"
    )


# -- the run --------------------------------------------------------------------------------------


def run(
    kinds: Sequence[str], mode: str, workdir: Path, out: Path, log: Log, **resize: Any
) -> dict[str, Any]:
    """Measures every section on each server in ``kinds`` and writes
    ``out/priorities.json`` and ``out/priorities.md``; ``resize`` overrides sizes."""
    sizes = replace(SIZES[mode], **resize)
    module = module_info()
    machine = machine_info(mode)
    results = {kind: run_server(kind, sizes, workdir, log) for kind in kinds}
    machine["load_after"] = load_now()
    data: dict[str, Any] = {
        "machine": machine,
        "module": module,
        "sizes": asdict(sizes),
        "results": results,
    }
    return write_results(out, "priorities", data, report)


def main(argv: list[str] | None = None) -> int:
    return standard_main(argv, __doc__, RESULTS, "priorities", run=run, markdown=markdown)


if __name__ == "__main__":
    sys.exit(main())
