"""Producer and consumer buffering (issue 16): what ``q.producer()`` and ``q.consumer()`` give
over one call per job.

    .venv/bin/python -m bench.buffering [--smoke | --quick] [--servers redis,valkey]
        [--out DIR] [--table]

On each server (one of our own, persistence off), one client, through the public API (FCALL
where the server allows it, as by default), in interleaved rounds (the order of the cases
alternating, so a machine whose speed drifts shifts them alike; each case's median over the
rounds is reported):

1. Producing single ids. ``q.push(id)``, one call per id (the baseline), against
   ``p.push(id)`` into ``with q.producer() as p`` (its defaults: ``max_batch`` 500,
   ``max_delay`` 0.05 s); the clock stops once the producer's exit has flushed everything.
   The same through ``AsyncRotator`` (``await aq.push(id)`` against ``await p.push(id)``),
   and ``p.push`` from 4 threads sharing one producer. Target: ``p.push`` 20x ``q.push``.
2. Consuming one job at a time. ``next(1, ack=<the previous job>)``, one call per job with
   the acks riding on it (the best one-at-a-time loop; the baseline), and ``next(1)`` then
   ``ack(job)`` (two calls per job), against ``for job in q.consumer(): c.ack(job)`` (its
   defaults: ``prefetch`` 100) and its asyncio twin. The queue is loaded beforehand
   (``push_many``, not timed); the consumers run until a claim finds it empty.

Each case also gives the server's µs per job (INFO commandstats: EVALSHA and FCALL, the module
calls only) and the module calls per job. Results: ``bench/results/buffering.json``
(``--out``); the table is printed, and ``--table`` prints that of an earlier run.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aredis

from bench.harness import (
    delete_run_keys,
    load_now,
    machine_info,
    module_info,
    server_usec,
    size_mode,
    sized_parser,
    started,
)
from rotator import Job, Rotator
from rotator.aio import AsyncRotator

RESULTS = Path(__file__).resolve().parent / "results"
SCRIPT_COMMANDS = ("evalsha", "fcall")
LOAD_CHUNK = 5000  # ids a call when loading a queue to drain (the module's most)
THREADS = 4  # threads pushing through one producer
THREADED = f"p.push(id), {THREADS} threads"
TARGETS = {"producer_ratio_min": 20.0}
Log = Callable[[str], None]


@dataclass(frozen=True)
class Sizes:
    one_by_one: int  # jobs of the baselines: one call (or two) per job
    buffered: int  # jobs through a producer or a consumer
    rounds: int


SIZES = {
    "full": Sizes(20_000, 400_000, 3),
    "quick": Sizes(4000, 100_000, 2),
    "smoke": Sizes(300, 3000, 1),
}


@dataclass
class Measured:
    """One case of one round."""

    case: str
    jobs: int
    seconds: float
    server_us: float
    calls: int

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0


def ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i:010d}" for i in range(n)]


def module_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in SCRIPT_COMMANDS)


def measure(
    client: redis.Redis, case: str, jobs: int, body: Callable[[], Any], after: Callable[[], Any]
) -> Measured:
    """Times ``body`` (server time and module calls counted from a CONFIG RESETSTAT before
    it); ``after`` cleans up, not counted."""
    client.config_resetstat()
    began = time.perf_counter()
    body()
    seconds = time.perf_counter() - began
    measured = Measured(case, jobs, seconds, server_usec(client, SCRIPT_COMMANDS), 0)
    measured.calls = module_calls(client)
    after()
    return measured


# -- 1. producing -------------------------------------------------------------------------------


def push_cases(
    client: redis.Redis, url: str, sizes: Sizes, rnd: int
) -> dict[str, Callable[[], Measured]]:
    n, many = sizes.one_by_one, sizes.buffered
    q = Rotator(client, f"bbuf-push-{rnd}")

    def done() -> None:
        q.delete(forget=True)

    def q_push() -> None:
        for job_id in ids("q", n):
            q.push(job_id)

    def p_push() -> None:
        with q.producer() as p:
            for job_id in ids("p", many):
                p.push(job_id)

    def p_push_threads() -> None:
        each = many // THREADS
        with q.producer() as p:

            def pusher(t: int) -> None:
                for job_id in ids(f"t{t}", each):
                    p.push(job_id)

            threads = [threading.Thread(target=pusher, args=(t,)) for t in range(THREADS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

    def aq_push() -> None:
        async def main() -> None:
            async with aredis.Redis.from_url(url) as conn:
                aq = AsyncRotator(conn, q.name)
                for job_id in ids("aq", n):
                    await aq.push(job_id)

        asyncio.run(main())

    def ap_push() -> None:
        async def main() -> None:
            async with aredis.Redis.from_url(url) as conn:
                aq = AsyncRotator(conn, q.name)
                async with aq.producer() as p:
                    for job_id in ids("ap", many):
                        await p.push(job_id)

        asyncio.run(main())

    def case(name: str, jobs: int, body: Callable[[], None]) -> Callable[[], Measured]:
        return lambda: measure(client, name, jobs, body, done)

    return {
        "q.push(id)": case("q.push(id)", n, q_push),
        "p.push(id)": case("p.push(id)", many, p_push),
        THREADED: case(THREADED, many // THREADS * THREADS, p_push_threads),
        "await aq.push(id)": case("await aq.push(id)", n, aq_push),
        "await p.push(id)": case("await p.push(id)", many, ap_push),
    }


# -- 2. consuming -------------------------------------------------------------------------------


def consume_cases(
    client: redis.Redis, url: str, sizes: Sizes, rnd: int
) -> dict[str, Callable[[], Measured]]:
    n, many = sizes.one_by_one, sizes.buffered
    q = Rotator(client, f"bbuf-take-{rnd}")

    def load(count: int) -> Callable[[], None]:
        def run() -> None:
            q.delete(forget=True)
            q.push_many(ids("job", count), LOAD_CHUNK)

        return run

    def checked(got: int, count: int) -> None:
        if got != count or not q.drained():
            raise RuntimeError(f"drained {got} of {count} jobs")

    def next_one_ack_on_next() -> None:
        finished: list[Job] = []
        got = 0
        while jobs := q.next(1, ack=finished):
            got += 1
            finished = jobs
        checked(got, n)

    def next_one_then_ack() -> None:
        got = 0
        while jobs := q.next(1):
            q.ack(*jobs)
            got += 1
        checked(got, n)

    def consumer() -> None:
        got = 0
        with q.consumer(block=0.01, stop_when_empty=True) as c:
            for job in c:
                c.ack(job)
                got += 1
        checked(got, many)

    def async_consumer() -> None:
        async def main() -> int:
            got = 0
            async with aredis.Redis.from_url(url) as conn:
                aq = AsyncRotator(conn, q.name)
                async with aq.consumer(block=0.01, stop_when_empty=True) as c:
                    async for job in c:
                        await c.ack(job)
                        got += 1
            return got

        checked(asyncio.run(main()), many)

    def case(name: str, count: int, body: Callable[[], None]) -> Callable[[], Measured]:
        def run() -> Measured:
            load(count)()
            return measure(client, name, count, body, lambda: q.delete(forget=True))

        return run

    return {
        "next(1, ack=previous)": case("next(1, ack=previous)", n, next_one_ack_on_next),
        "next(1) + ack(job)": case("next(1) + ack(job)", n, next_one_then_ack),
        "consumer, c.ack(job)": case("consumer, c.ack(job)", many, consumer),
        "async consumer, await c.ack(job)": case(
            "async consumer, await c.ack(job)", many, async_consumer
        ),
    }


# -- a server's run ---------------------------------------------------------------------------


BASELINES = {
    "p.push(id)": "q.push(id)",
    THREADED: "q.push(id)",
    "await p.push(id)": "await aq.push(id)",
    "consumer, c.ack(job)": "next(1, ack=previous)",
    "async consumer, await c.ack(job)": "next(1, ack=previous)",
    "next(1) + ack(job)": "next(1, ack=previous)",
}
PART = {"push": push_cases, "consume": consume_cases}


def summarize(part: str, rounds: list[Measured]) -> dict[str, Any]:
    first = rounds[0]
    return {
        "part": part,
        "case": first.case,
        "jobs": first.jobs,
        "jobs_per_s": round(statistics.median(m.jobs_per_s for m in rounds), 1),
        "seconds": [round(m.seconds, 4) for m in rounds],
        "server_us_per_job": round(statistics.median(m.server_us / m.jobs for m in rounds), 3),
        "calls_per_job": round(statistics.median(m.calls / m.jobs for m in rounds), 4),
    }


def run_server(kind: str, sizes: Sizes, workdir: Path, log: Log) -> dict[str, Any]:
    with started(kind, workdir / f"buffering-{kind}") as server:
        client = server.client()
        log(f"buffering on {kind} {server.version}")
        rows: list[dict[str, Any]] = []
        for part, cases_of in PART.items():
            measured: dict[str, list[Measured]] = {}
            for rnd in range(sizes.rounds):
                cases = cases_of(client, server.url, sizes, rnd)
                order = list(cases) if rnd % 2 == 0 else list(reversed(cases))
                for name in order:
                    m = cases[name]()
                    measured.setdefault(name, []).append(m)
                    log(f"  round {rnd + 1}: {name:<34} {m.jobs_per_s:>12,.0f} jobs/s")
            rows += [summarize(part, runs) for runs in measured.values()]
        by_case = {row["case"]: row for row in rows}
        for row in rows:
            base = BASELINES.get(row["case"])
            row["vs"] = base
            row["ratio"] = (
                round(row["jobs_per_s"] / by_case[base]["jobs_per_s"], 2) if base else None
            )
        delete_run_keys(client, "bbuf-")
        client.close()
        return {"version": server.version, "rows": rows}


def table(data: dict[str, Any]) -> str:
    machine = data["machine"]
    lines = [
        f"Mode {machine['mode']}, {machine['date']}, {machine['cpus']} CPUs, "
        f"Python {machine['python']}, load {machine['load_before']} -> {machine['load_after']}; "
        f"one client, loopback, persistence off; median of {data['sizes']['rounds']} rounds.",
        "",
        "| server | case | jobs | jobs/s | vs | x | server µs/job | calls/job |",
        "|---|---|---:|---:|---|---:|---:|---:|",
    ]
    for kind, result in data["results"].items():
        for row in result["rows"]:
            ratio = "-" if row["ratio"] is None else f"{row['ratio']:,.1f}"
            lines.append(
                f"| {kind} {result['version']} | {row['case']} | {row['jobs']:,} "
                f"| {row['jobs_per_s']:,.0f} | {row['vs'] or ''} | {ratio} "
                f"| {row['server_us_per_job']:.2f} | {row['calls_per_job']:.3f} |"
            )
    target = data["targets"]["producer_ratio_min"]
    lines += ["", f"Target: p.push(id) {target:g}x q.push(id)."]
    return "\n".join(lines)


def run(kinds: Sequence[str], mode: str, workdir: Path, out: Path, log: Log) -> dict[str, Any]:
    """Measures every case on each server in ``kinds``; writes ``out/buffering.json``."""
    sizes = SIZES[mode]
    machine = machine_info(mode)
    module = module_info("lua/rotator.lua", "rotator/buffering.py")
    results = {kind: run_server(kind, sizes, workdir, log) for kind in kinds}
    machine["load_after"] = load_now()
    data: dict[str, Any] = {
        "machine": machine,
        "module": module,
        "sizes": asdict(sizes),
        "targets": TARGETS,
        "results": results,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "buffering.json").write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    return data


def main(argv: list[str] | None = None) -> int:
    parser = sized_parser(__doc__, RESULTS, "buffering.json")
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads((args.out / "buffering.json").read_text())))
        return 0

    def log(line: str) -> None:
        print(line, flush=True)

    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rotator-buffering-") as tmp:
        data = run(args.servers.split(","), size_mode(args), Path(tmp), args.out, log)
    log(table(data))
    log(f"done in {time.perf_counter() - began:.0f} s; results in {args.out / 'buffering.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
