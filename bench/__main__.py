"""The benchmark suite: ``python -m bench [--quick | --smoke] [--servers redis,valkey]``.

Each run starts its own servers (persistence off) and measures, per server, every queue
pattern side by side, the cost profiles and the peers, then writes
``bench/results/<server>.json``, ``bench/results/README.md`` and PNG plots; then the bounds
of issue 22, the module before and after side by side (``bench/bounds.py``), into
``bench/results/bounds.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench import bounds, peers, profiles
from bench.harness import Result, delete_run_keys, percentile, run_clients, started
from bench.patterns import PATTERNS
from bench.report import write_report

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Plan:
    jobs_by_batch: dict[int, int]
    clients: tuple[int, ...]
    lengths: list[int]
    in_flight: list[int]
    steady_jobs: int
    memory_jobs: int
    wake_samples: int
    peer_jobs: int
    # The target comparisons, run again in interleaved rounds: (batch, clients, jobs) cells.
    rounds: int
    cells: tuple[tuple[int, int, int], ...]
    # Where one consumer's time goes (client, script, sub-commands): batch sizes, jobs each.
    profile_batches: tuple[int, ...]
    profile_jobs: int


PLANS = {
    "full": Plan({1: 10_000, 10: 50_000, 100: 100_000}, (1, 4), [1_000, 100_000, 1_000_000],
                 [0, 1_000, 10_000, 100_000], 20_000, 100_000, 200, 20_000,
                 5, ((1, 1, 5_000), (100, 4, 300_000)), (1, 100), 10_000),
    "quick": Plan({1: 2_000, 100: 20_000}, (1, 4), [1_000, 100_000], [0, 1_000, 10_000],
                  5_000, 20_000, 50, 2_000, 3, ((1, 1, 2_000), (100, 4, 50_000)), (1, 100),
                  2_000),
    "smoke": Plan({1: 100, 10: 200}, (1, 2), [1_000], [0, 100], 300, 1_000, 5, 100,
                  2, ((1, 1, 100), (10, 2, 200)), (1, 10), 100),
}  # fmt: skip

# Measured head to head: the module both ways, and what it must beat.
HEAD_TO_HEAD = ("rotator", "rotator-fcall", "streams")


def run_pattern(
    client: redis.Redis, url: str, pattern: str, *, batch: int, clients: int, jobs: int
) -> Result:
    preload, loop = PATTERNS[pattern]
    name = f"bench-{pattern}-{batch}-{clients}-{time.time_ns()}"
    preload(client, name, jobs)
    seconds, latencies = run_clients(loop, url, name, batch=batch, clients=clients)
    delete_run_keys(client, name)
    return Result(
        pattern, batch, clients, jobs, seconds,
        percentile(latencies, 50), percentile(latencies, 99),
    )  # fmt: skip


def measure_patterns(client: redis.Redis, url: str, plan: Plan, log: Any) -> list[Result]:
    results = []
    for pattern in PATTERNS:
        for batch, jobs in plan.jobs_by_batch.items():
            for clients in plan.clients:
                result = run_pattern(client, url, pattern, batch=batch, clients=clients, jobs=jobs)
                log(
                    f"  {pattern:<16} batch {batch:>3} x{clients}: {result.jobs_per_s:>9.0f} jobs/s"
                )
                results.append(result)
    return results


def measure_head_to_head(
    client: redis.Redis, url: str, plan: Plan, log: Any
) -> list[dict[str, Any]]:
    """The target comparisons in interleaved rounds (rotator, FCALL, Streams, again...), so
    that a machine whose speed drifts during the run shifts all of them alike. Ratios are
    taken within each round; the report gives their median."""
    rows = []
    for batch, clients, jobs in plan.cells:
        samples: dict[str, list[float]] = {pattern: [] for pattern in HEAD_TO_HEAD}
        for _ in range(plan.rounds):
            for pattern in HEAD_TO_HEAD:
                result = run_pattern(client, url, pattern, batch=batch, clients=clients, jobs=jobs)
                samples[pattern].append(round(result.jobs_per_s, 1))
        for pattern, values in samples.items():
            row = {
                "pattern": pattern, "batch": batch, "clients": clients, "jobs": jobs,
                "jobs_per_s": values, "median_jobs_per_s": statistics.median(values),
                "vs_streams_by_round": [
                    round(a / b, 3) for a, b in zip(values, samples["streams"], strict=True)
                ],
            }  # fmt: skip
            log(
                f"  head to head {pattern:<14} batch {batch:>3} x{clients}: "
                f"median {row['median_jobs_per_s']:>9.0f} jobs/s"
            )
            rows.append(row)
    return rows


def measure_peers(server: Any, plan: Plan, log: Any) -> list[Result]:
    results = [
        peers.dramatiq_peer(server.url, plan.peer_jobs),
        peers.rq_peer(server.url, plan.peer_jobs),
    ]
    if peers.ensure_bullmq():
        for concurrency in (1, 16):
            results.append(peers.bullmq_peer(server.port, plan.peer_jobs, concurrency))
    else:
        log("  bullmq: node/npm not found; skipped")
    for result in results:
        log(f"  {result.pattern:<16} {result.extra}: {result.jobs_per_s:>9.0f} jobs/s")
    return results


def run_server(kind: str, plan: Plan, workdir: Path, log: Any) -> dict[str, Any]:
    with started(kind, workdir / kind) as server:
        client = server.client()
        log(f"{kind} {server.version} on port {server.port}")
        patterns = measure_patterns(client, server.url, plan, log)
        log("  head to head")
        head_to_head = measure_head_to_head(client, server.url, plan, log)
        log("  profiles")
        lengths = profiles.queue_length_scaling(client, plan.lengths, plan.steady_jobs)
        in_flight = profiles.in_flight_scaling(client, plan.in_flight, plan.steady_jobs)
        memory = profiles.memory_per_job(client, plan.memory_jobs)
        wake = profiles.wake_latency(server.url, plan.wake_samples)
        calls = profiles.call_profile(
            client, server.url, plan.profile_batches, plan.profile_jobs, plan.rounds
        )
        log("  peers")
        peer_results = measure_peers(server, plan, log)
        return {
            "server": kind,
            "version": server.version,
            "patterns": [r.as_dict() for r in patterns],
            "head_to_head": head_to_head,
            "peers": [r.as_dict() for r in peer_results],
            "queue_length_scaling": lengths,
            "in_flight_scaling": in_flight,
            "memory_bytes_per_job": memory,
            "wake_latency": wake,
            "call_profile": calls,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="the 2-minute version (Redis only)")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, to check the suite runs")
    parser.add_argument("--servers", default=None, help="comma-separated: redis,valkey")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    args = parser.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    kinds = (args.servers or ("redis" if mode == "quick" else "redis,valkey")).split(",")
    plan = PLANS[mode]

    def log(line: str) -> None:
        print(line, flush=True)

    machine = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": __import__("os").cpu_count(),
        "mode": mode,
        "date": time.strftime("%Y-%m-%d"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory(prefix="rotator-bench-") as tmp:
        for kind in kinds:
            data = {"machine": machine, **run_server(kind, plan, Path(tmp), log)}
            (args.out / f"{kind}.json").write_text(json.dumps(data, indent=2) + "\n")
            runs.append(data)
        write_report(runs, args.out)
        bounds.run(kinds, mode, Path(tmp) / "bounds", args.out, log)
    log(f"done in {time.perf_counter() - began:.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
