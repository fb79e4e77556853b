"""Unique jobs and cancel (issue 16): what a queue that tracks its ids costs.

    .venv/bin/python -m bench.unique [--smoke | --quick] [--servers redis,valkey]
        [--out DIR] [--table]

Issue 16 asks for the cost of a unique push (bytes per job, server time per push). On each
server (one of our own, persistence off), through the public API (``Rotator``, FCALL where
the server allows it, as by default), one client, 16-byte ids:

1. Pushes. Server µs per pushed id (INFO commandstats of EVALSHA and FCALL, the module calls
   only, over the run / the ids sent) and client wall µs per id, one id a call
   (``push(id)``) and 100 a call (``push_many(ids, 100)``), three cases: a plain push onto a
   queue that does not track ids; a ``unique=True`` push of new ids onto a tracked one (every
   id taken); the same push again, every id already held (every id skipped: what a retried
   push costs). Interleaved rounds, each on fresh queues, the order alternating from round to
   round; the ratios to the plain push are taken within each round and their median given.
2. Memory. ``held`` ids pushed onto a tracked queue (5000 a call), then: waiting (index value
   ``p``), all claimed by ``next(1000)`` and left in flight (the value is the lease's stamp,
   about 35 bytes), and, on a fresh queue, scheduled an hour ahead (``s``). Bytes per job of
   the ids hash (``MEMORY USAGE ... SAMPLES 0`` / jobs), beside the bytes per job of the key
   that holds the jobs themselves (the ring, the lease list, the scheduled set).
3. Claims. ``claim`` ids pushed onto an untracked and a tracked queue (unique pushes there),
   then drained by one client, ``next(batch, ack=<the previous batch>)`` until it returns []
   (acks riding on the claims), batch 1 and 100; a sweep after each drain, not timed, must
   leave the tracked queue's index empty. Interleaved rounds as above; the ratio is tracked
   over untracked, within each round. A tracked queue's claims take the walk, never the short
   way of a busy queue (``M.fast_lease``), and pay one ``HMGET`` per slice of the ring and
   per lease visited: the ratio says what that costs.
4. Cancel. ``cancel`` ids on a fresh tracked queue, scheduled (an hour ahead), waiting, or in
   flight (claimed by ``next(100)``, not acked), cancelled one a call and 100 a call: server
   and wall µs per id, every id found. A waiting or in-flight job is only marked by the
   cancel and dropped by the next walk that reaches it: that walk (``sweep``, after the
   cancels) is measured too, in server µs per id dropped; the queue and its index must be
   empty after it.

Results: ``bench/results/unique.json`` and ``unique.md`` (``--out``); ``--table`` prints the
table of an earlier run. Full sizes take about 2 minutes on this 2-core VM for both servers.
"""

from __future__ import annotations

import statistics
import sys
import time
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
    server_usec,
    standard_main,
    started,
    write_results,
)
from bench.scheduled import via
from rotator import Job, Rotator
from rotator.protocol import text

RESULTS = Path(__file__).resolve().parent / "results"
SCRIPT_COMMANDS = ("evalsha", "fcall")
LOAD_CHUNK = 5000  # ids a call when loading (the module's most)
LEASE_S = 3600.0  # no lease runs out during a run
LATER_S = 3600.0  # scheduled jobs are due in an hour
PUSH_CASES = ("plain", "new", "held")
CANCEL_STATES = ("scheduled", "waiting", "in_flight")
BATCHES = (1, 100)
Log = Callable[[str], None]


@dataclass(frozen=True)
class Sizes:
    push_one: int  # ids a round, pushed one a call
    push_batch: int  # ids a round, pushed 100 a call
    rounds: int  # interleaved rounds (pushes, claims, cancels)
    held: tuple[int, ...]  # jobs held for the memory figures
    claim_one: int  # jobs drained by next(1) per run
    claim_batch: int  # jobs drained by next(100) per run
    cancel_one: int  # ids cancelled one a call, per state and round
    cancel_batch: int  # ids cancelled 100 a call, per state and round


SIZES = {
    "full": Sizes(5000, 100_000, 5, (10_000, 100_000), 5000, 200_000, 3000, 30_000),
    "quick": Sizes(300, 5000, 2, (2000, 10_000), 500, 10_000, 300, 3000),
    "smoke": Sizes(50, 500, 1, (500, 2000), 100, 1000, 50, 500),
}


def ids(prefix: str, n: int) -> list[str]:
    """``n`` ids of 16 bytes (a prefix of up to 5 characters)."""
    width = 16 - len(prefix) - 1
    return [f"{prefix}-{i:0{width}d}" for i in range(n)]


def tracked(client: redis.Redis, name: str) -> Rotator:
    q = Rotator(client, name, timeout=LEASE_S)
    if not q.configure(track_ids=True).track_ids:
        raise RuntimeError(f"{name}: track_ids did not take")
    return q


def per(total: float, n: int) -> float:
    return total / n if n else 0.0


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


@dataclass
class Timed:
    n: int  # ids or jobs
    seconds: float
    server_us: float
    result: int  # ids taken, jobs claimed, ids found
    via: str

    @property
    def server_us_each(self) -> float:
        return per(self.server_us, self.n)

    @property
    def wall_us_each(self) -> float:
        return per(self.seconds * 1e6, self.n)

    @property
    def per_s(self) -> float:
        return self.n / self.seconds if self.seconds > 0 else 0.0


def timed(client: redis.Redis, n: int, action: Callable[[], int]) -> Timed:
    """Runs ``action`` (it handles ``n`` ids or jobs) between a CONFIG RESETSTAT and a read
    of the module calls' server time."""
    client.config_resetstat()
    began = time.perf_counter()
    result = action()
    seconds = time.perf_counter() - began
    return Timed(n, seconds, server_usec(client, SCRIPT_COMMANDS), result, via(client))


def summary(runs: list[Timed]) -> dict[str, Any]:
    """Per-round figures and their medians."""
    return {
        "server_us_each": [round(r.server_us_each, 3) for r in runs],
        "wall_us_each": [round(r.wall_us_each, 2) for r in runs],
        "median_server_us_each": round(median([r.server_us_each for r in runs]), 3),
        "median_wall_us_each": round(median([r.wall_us_each for r in runs]), 2),
    }


def ratio_row(tests: list[Timed], bases: list[Timed]) -> dict[str, Any]:
    """Median of the per-round ratios, test over base (server time and wall time)."""
    pairs = list(zip(tests, bases, strict=True))
    server = [a.server_us / b.server_us for a, b in pairs if b.server_us > 0]
    wall = [a.seconds / b.seconds for a, b in pairs if b.seconds > 0]
    return {
        "server_ratio": round(median(server), 3),
        "wall_ratio": round(median(wall), 3),
        "server_ratio_by_round": [round(r, 3) for r in server],
        "wall_ratio_by_round": [round(r, 3) for r in wall],
    }


# A push section's runs: (batch, case) -> one Timed a round.
Runs = dict[tuple[int, str], list[Timed]]


def round_line(runs: Runs, rnd: int, batch: int, cases: Sequence[str], what: str = "push") -> str:
    """The log line of a push (or publish) round: each case's server / wall µs an id."""
    figures = ", ".join(
        f"{case} {runs[batch, case][-1].server_us_each:.2f} / "
        f"{runs[batch, case][-1].wall_us_each:.1f}"
        for case in cases
    )
    return f"  {what} round {rnd} batch {batch:>3}: {figures} (server / wall us an id)"


def case_rows(runs: Runs, cases: Sequence[str]) -> list[dict[str, Any]]:
    """Each case's figures, by batch (BATCHES)."""
    return [
        {"batch": batch, "case": case, "ids": runs[batch, case][0].n, **summary(runs[batch, case])}
        for batch in BATCHES
        for case in cases
    ]


def push_cell(batch: int, case: str, section: str = "push") -> Callable[[dict[str, Any]], str]:
    """A table cell of a push section's figures (case_rows'): server / wall µs an id."""

    def cell(r: dict[str, Any]) -> str:
        row = next(p for p in r[section]["rows"] if (p["batch"], p["case"]) == (batch, case))
        return f"{row['median_server_us_each']:.2f} / {row['median_wall_us_each']:.1f}"

    return cell


def compared(runs: Runs, cases: Sequence[str], test: str, base: str = "plain") -> dict[str, Any]:
    """A push section: each case's figures and ``test`` over ``base`` (within each round), by
    batch, and how the module was called."""
    ratios = [{"batch": b, **ratio_row(runs[b, test], runs[b, base])} for b in BATCHES]
    return {"via": runs[1, base][0].via, "rows": case_rows(runs, cases), "ratios": ratios}


# -- 1. pushes ------------------------------------------------------------------------------------


def push_ids(q: Rotator, every: list[str], batch: int, *, unique: bool) -> int:
    if batch == 1:
        return sum(q.push(job_id, unique=unique) for job_id in every)
    return q.push_many(every, batch, unique=unique)


def push_rows(client: redis.Redis, sizes: Sizes, log: Log) -> dict[str, Any]:
    runs: Runs = {(b, c): [] for b in BATCHES for c in PUSH_CASES}
    for rnd in range(sizes.rounds):
        for batch in BATCHES:
            n = sizes.push_one if batch == 1 else sizes.push_batch
            plain = Rotator(client, f"push-plain-{rnd}-{batch}")
            tracked_q = tracked(client, f"push-tracked-{rnd}-{batch}")
            fresh, again = ids(f"p{rnd}", n), ids(f"t{rnd}", n)
            steps: dict[str, tuple[Rotator, list[str], bool]] = {
                "plain": (plain, fresh, False),
                "new": (tracked_q, again, True),
                "held": (tracked_q, again, True),
            }
            order = list(PUSH_CASES) if rnd % 2 == 0 else ["new", "held", "plain"]
            for case in order:  # "held" always follows "new": it pushes the same ids again
                q, every, unique = steps[case]
                run = timed(client, n, partial(push_ids, q, every, batch, unique=unique))
                expected = 0 if case == "held" else n
                if run.result != expected:
                    raise RuntimeError(f"push {case}: {run.result} ids taken, not {expected}")
                runs[batch, case].append(run)
            log(round_line(runs, rnd, batch, PUSH_CASES))
            plain.delete()
            tracked_q.delete()
            wait_lazyfree(client)
    ratios = [
        {"batch": batch, "case": case, **ratio_row(runs[batch, case], runs[batch, "plain"])}
        for batch in BATCHES
        for case in ("new", "held")
    ]
    return {"via": runs[1, "plain"][0].via, "rows": case_rows(runs, PUSH_CASES), "ratios": ratios}


# -- 2. memory ------------------------------------------------------------------------------------


def memory(client: redis.Redis, key: str) -> int:
    return int(client.memory_usage(key, samples=0) or 0)


def memory_row(
    client: redis.Redis, q: Rotator, state: str, held: int, jobs_key: str
) -> dict[str, Any]:
    index = memory(client, q.keys.ids)
    own = memory(client, jobs_key)
    fields = int(client.hlen(q.keys.ids))
    if fields != held:
        raise RuntimeError(f"memory {state}: the index holds {fields} ids, not {held}")
    return {
        "state": state,
        "held": held,
        "ids_bytes_per_job": round(index / held, 1),
        "queue_bytes_per_job": round(own / held, 1),
        "queue_key": jobs_key.rsplit(":", 1)[-1],
        "ids_encoding": text(client.object("encoding", q.keys.ids)),
        "sample_value": text(client.hget(q.keys.ids, ids("m", held)[0]) or ""),
    }


def memory_rows(client: redis.Redis, sizes: Sizes, log: Log) -> list[dict[str, Any]]:
    rows = []
    for held in sizes.held:
        every = ids("m", held)
        q = tracked(client, f"memory-{held}")
        q.push_many(every, LOAD_CHUNK, unique=True)
        rows.append(memory_row(client, q, "waiting", held, q.keys.ring))
        claimed = 0
        while jobs := q.next(1000):
            claimed += len(jobs)
        if claimed != held:
            raise RuntimeError(f"memory: claimed {claimed} of {held}")
        rows.append(memory_row(client, q, "in_flight", held, q.keys.leases))
        q.delete()
        later = tracked(client, f"memory-later-{held}")
        later.push_many(every, LOAD_CHUNK, delay=LATER_S, unique=True)
        rows.append(memory_row(client, later, "scheduled", held, later.keys.scheduled))
        later.delete()
        wait_lazyfree(client)
        for row in rows[-3:]:
            log(
                f"  memory {row['state']:<9} {held:>7,} held: ids hash "
                f"{row['ids_bytes_per_job']} B a job ({row['ids_encoding']}), "
                f"{row['queue_key']} {row['queue_bytes_per_job']} B a job"
            )
    return rows


# -- 3. claims ------------------------------------------------------------------------------------


def drain(q: Rotator, batch: int) -> int:
    """Claims until ``next`` returns [], each call acking the previous batch."""
    finished: list[Job] = []
    got = 0
    while jobs := q.next(batch, ack=finished):
        got += len(jobs)
        finished = jobs
    return got


def claim_rows(client: redis.Redis, sizes: Sizes, log: Log) -> dict[str, Any]:
    queues = {
        "untracked": Rotator(client, "claim-untracked", timeout=LEASE_S),
        "tracked": tracked(client, "claim-tracked"),
    }
    runs: dict[tuple[int, str], list[Timed]] = {(b, k): [] for b in BATCHES for k in queues}
    ids_left = 0
    for rnd in range(sizes.rounds):
        for batch in BATCHES:
            n = sizes.claim_one if batch == 1 else sizes.claim_batch
            order = list(queues) if rnd % 2 == 0 else list(queues)[::-1]
            for kind in order:
                q = queues[kind]
                q.push_many(ids(f"c{rnd}b{batch}", n), LOAD_CHUNK, unique=kind == "tracked")
                run = timed(client, n, partial(drain, q, batch))
                if run.result != n:
                    raise RuntimeError(f"claim {kind}: drained {run.result} of {n}")
                runs[batch, kind].append(run)
                q.sweep()
                if kind == "tracked":
                    ids_left = max(ids_left, int(client.hlen(q.keys.ids)))
            log(
                f"  claim round {rnd} next({batch:>3}): "
                + ", ".join(
                    f"{kind} {runs[batch, kind][-1].per_s:,.0f} jobs/s "
                    f"{runs[batch, kind][-1].server_us_each:.2f} server us a job"
                    for kind in queues
                )
            )
    rows = []
    for (batch, kind), done in runs.items():
        rows.append(
            {
                "batch": batch,
                "queue": kind,
                "jobs": done[0].n,
                "jobs_per_s": [round(r.per_s, 1) for r in done],
                "median_jobs_per_s": round(median([r.per_s for r in done]), 1),
                **summary(done),
            }
        )
    ratios = []
    for batch in BATCHES:
        ratio = ratio_row(runs[batch, "tracked"], runs[batch, "untracked"])
        # Throughput, tracked over untracked: the inverse of the wall-time ratio.
        ratio["throughput_ratio"] = round(1 / ratio["wall_ratio"], 3) if ratio["wall_ratio"] else 0
        ratios.append({"batch": batch, **ratio})
    for q in queues.values():
        q.delete()
    wait_lazyfree(client)
    return {
        "via": runs[1, "untracked"][0].via,
        "rows": rows,
        "ratios": ratios,
        "ids_left": ids_left,
    }


# -- 4. cancel ------------------------------------------------------------------------------------


def cancel_ids(q: Rotator, every: list[str], batch: int) -> int:
    if batch == 1:
        return sum(q.cancel(job_id) for job_id in every)
    return sum(q.cancel(*every[i : i + batch]) for i in range(0, len(every), batch))


def cancel_round(
    client: redis.Redis, state: str, batch: int, n: int, rnd: int
) -> tuple[Timed, Timed, dict[str, int]]:
    """One fresh tracked queue holding ``n`` jobs in ``state``, every one cancelled; then the
    sweep that drops what the cancels marked. Returns both timings and what was left."""
    q = tracked(client, f"cancel-{state}-{batch}-{rnd}")
    every = ids(f"x{rnd}", n)
    q.push_many(every, LOAD_CHUNK, delay=LATER_S if state == "scheduled" else None, unique=True)
    if state == "in_flight":
        claimed = 0
        while jobs := q.next(100):
            claimed += len(jobs)
        if claimed != n:
            raise RuntimeError(f"cancel: claimed {claimed} of {n}")
    cancel = timed(client, n, partial(cancel_ids, q, every, batch))
    if cancel.result != n:
        raise RuntimeError(f"cancel {state}: found {cancel.result} of {n}")
    drop = timed(client, n, q.sweep)
    stats = q.stats()
    left = {
        "length": stats.length,
        "scheduled": stats.scheduled,
        "index": int(client.hlen(q.keys.ids)),
        "cancelled": stats.cancelled or 0,
        "dropped": drop.result,
    }
    q.delete()
    return cancel, drop, left


def cancel_rows(client: redis.Redis, sizes: Sizes, log: Log) -> list[dict[str, Any]]:
    cancels: dict[tuple[str, int], list[Timed]] = {}
    drops: dict[tuple[str, int], list[Timed]] = {}
    lefts: dict[tuple[str, int], list[dict[str, int]]] = {}
    for rnd in range(sizes.rounds):
        states = CANCEL_STATES[rnd % 3 :] + CANCEL_STATES[: rnd % 3]
        for batch in BATCHES:
            n = sizes.cancel_one if batch == 1 else sizes.cancel_batch
            for state in states:
                cancel, drop, left = cancel_round(client, state, batch, n, rnd)
                cancels.setdefault((state, batch), []).append(cancel)
                drops.setdefault((state, batch), []).append(drop)
                lefts.setdefault((state, batch), []).append(left)
                log(
                    f"  cancel round {rnd} {state:<9} {batch:>3} a call: "
                    f"{cancel.server_us_each:.2f} / {cancel.wall_us_each:.1f} server / wall us "
                    f"an id; the sweep after: {drop.server_us_each:.2f} server us an id, "
                    f"left {left}"
                )
        wait_lazyfree(client)
    rows = []
    for state in CANCEL_STATES:
        for batch in BATCHES:
            done, swept = cancels[state, batch], drops[state, batch]
            rows.append(
                {
                    "state": state,
                    "batch": batch,
                    "ids": done[0].n,
                    **summary(done),
                    "sweep_server_us_each": [round(r.server_us_each, 3) for r in swept],
                    "median_sweep_server_us_each": round(
                        median([r.server_us_each for r in swept]), 3
                    ),
                    "left": lefts[state, batch],
                    "clean": all(
                        left["length"] == left["scheduled"] == left["index"] == 0
                        and left["cancelled"] == done[0].n
                        for left in lefts[state, batch]
                    ),
                }
            )
    return rows


# -- one server -----------------------------------------------------------------------------------


def run_server(kind: str, sizes: Sizes, workdir: Path, log: Log) -> dict[str, Any]:
    with started(kind, workdir / f"unique-{kind}") as server:
        client = server.client()
        log(f"unique on {kind} {server.version}")
        pushes = push_rows(client, sizes, log)
        memories = memory_rows(client, sizes, log)
        claims = claim_rows(client, sizes, log)
        for r in claims["ratios"]:
            log(
                f"  claim next({r['batch']}): tracked / untracked throughput "
                f"{r['throughput_ratio']}x, server time {r['server_ratio']}x"
            )
        cancels = cancel_rows(client, sizes, log)
        config = {
            **client.config_get("hash-max-*"),
            **client.config_get("list-max-listpack-size"),
        }
        client.close()
        return {
            "version": server.version,
            "config": config,
            "push": pushes,
            "memory": memories,
            "claims": claims,
            "cancel": cancels,
        }


# -- the table ------------------------------------------------------------------------------------

CASE_LABELS = {
    "plain": "plain push, untracked queue",
    "new": "`unique=True` push, tracked queue, new ids",
    "held": "`unique=True` push, tracked queue, every id held (all skipped)",
}
STATE_LABELS = {"scheduled": "scheduled", "waiting": "waiting", "in_flight": "in flight"}


def markdown(data: dict[str, Any]) -> str:
    table = ServerTable(data["results"])
    add = table.add

    def push_ratio(batch: int) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            got = {p["case"]: p for p in r["push"]["ratios"] if p["batch"] == batch}
            return f"{got['new']['server_ratio']:.2f}x / {got['held']['server_ratio']:.2f}x"

        return cell

    for batch in BATCHES:
        for case in PUSH_CASES:
            add(
                f"{CASE_LABELS[case]}, {batch} a call (server / wall µs an id)",
                push_cell(batch, case),
            )
        add(f"server time over the plain push, {batch} a call (new / held)", push_ratio(batch))

    def mem(state: str, held: int) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            row = next(m for m in r["memory"] if (m["state"], m["held"]) == (state, held))
            return f"{row['ids_bytes_per_job']:.1f} / {row['queue_bytes_per_job']:.1f}"

        return cell

    where = {"waiting": "the ring", "in_flight": "the lease list", "scheduled": "the ZSET"}
    for state in ("waiting", "in_flight", "scheduled"):
        for held in data["sizes"]["held"]:
            add(
                f"memory, {held:,} jobs {STATE_LABELS[state]} (B a job: ids hash / {where[state]})",
                mem(state, held),
            )

    def claim(batch: int, kind: str) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            row = next(c for c in r["claims"]["rows"] if (c["batch"], c["queue"]) == (batch, kind))
            return f"{row['median_jobs_per_s']:,.0f} / {row['median_server_us_each']:.2f}"

        return cell

    def claim_ratio(batch: int) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            row = next(c for c in r["claims"]["ratios"] if c["batch"] == batch)
            return f"{row['throughput_ratio']:.2f}x / {row['server_ratio']:.2f}x"

        return cell

    for batch in BATCHES:
        what = f"`next({batch}, ack=<previous>)`"
        for kind in ("untracked", "tracked"):
            add(f"claim+ack {what}, {kind} (jobs/s / server µs a job)", claim(batch, kind))
        add(f"tracked / untracked, {what} (throughput / server time a job)", claim_ratio(batch))

    def cancel(state: str, batch: int) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            row = next(c for c in r["cancel"] if (c["state"], c["batch"]) == (state, batch))
            sweep = row["median_sweep_server_us_each"]
            return (
                f"{row['median_server_us_each']:.2f} / {row['median_wall_us_each']:.1f} / "
                f"{sweep:.2f}"
            )

        return cell

    for batch in BATCHES:
        for state in CANCEL_STATES:
            add(
                f"cancel, {STATE_LABELS[state]}, {batch} a call (server / wall µs an id / "
                "the sweep that drops it, server µs an id)",
                cancel(state, batch),
            )
    return table.text()


def report(data: dict[str, Any]) -> str:
    machine = data["machine"]
    return (
        "# Unique jobs and cancel benchmark (issue 16)\n\n"
        f"`python -m bench.unique` (mode {machine['mode']}) on {machine['cpus']} CPUs, "
        f"{machine['platform']}, Python {machine['python']}, {machine['date']}; module "
        f"{data['module']['sha1'][:12]} at {data['module']['commit']}. Loopback, persistence "
        f"off, one client, 16-byte ids, the module called by "
        f"{'/'.join(sorted({r['push']['via'] for r in data['results'].values()}))}; medians of "
        f"{data['sizes']['rounds']} interleaved rounds (ratios: the median of the per-round "
        f"ratios). 1-minute load average {machine['load_before']} before and "
        f"{machine['load_after']} after (other work shared the machine).\n\n"
        f"{markdown(data)}\n"
    )


# -- the run --------------------------------------------------------------------------------------


def run(
    kinds: Sequence[str], mode: str, workdir: Path, out: Path, log: Log, **resize: Any
) -> dict[str, Any]:
    """Measures every section on each server in ``kinds`` and writes ``out/unique.json`` and
    ``out/unique.md``; ``resize`` overrides sizes of the mode."""
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
    return write_results(out, "unique", data, report)


def main(argv: list[str] | None = None) -> int:
    return standard_main(argv, __doc__, RESULTS, "unique", run=run, markdown=markdown)


if __name__ == "__main__":
    sys.exit(main())
