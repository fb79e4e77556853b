"""The fast lane (rotator.lane) against redis-py's own execute_command, side by side:
``python -m bench.lane [--servers redis,valkey] [--rounds 5] [--smoke]``.

Per server, in interleaved rounds: the two target cells of issue 14 (batch 1 with one
client, batch 100 with four) for rotator by FCALL through the lane, the same through redis-py's
``execute_command`` (the client before the lane), and Redis Streams; then one consumer's
one-job call profile (wall, client CPU, server command time) for both, the pattern's floor and
Streams. Writes ``bench/results/lane.json`` and ``lane.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

import rotator.lane
from bench.harness import delete_run_keys, run_clients, started
from bench.patterns import PATTERNS, rotator_loop
from bench.profiles import consumer_costs

RESULTS = Path(__file__).resolve().parent / "results"


def rotator_redispy_loop(url: str, name: str, batch: int, _: Any) -> list[float]:
    """rotator-fcall's loop with every call sent through redis-py's execute_command."""
    rotator.lane.ENABLED = False
    return rotator_loop(url, name, batch, True)


# name -> (preload, loop); the loops run in processes of their own
SIDES: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "rotator-fcall": PATTERNS["rotator-fcall"],
    "rotator-fcall-redispy": (PATTERNS["rotator-fcall"][0], rotator_redispy_loop),
    "streams": PATTERNS["streams"],
}
PROFILED = ("rotator-fcall", "rotator-fcall-redispy", "floor", "streams")

# (batch, clients, jobs) cells, and the one-job profile's jobs
SIZES = {
    "full": (((1, 1, 5_000), (100, 4, 300_000)), 10_000),
    "smoke": (((1, 1, 100), (10, 2, 200)), 100),
}


def jobs_per_s(client: redis.Redis, url: str, side: str, cell: tuple[int, int, int]) -> float:
    batch, clients, jobs = cell
    preload, loop = SIDES[side]
    name = f"bench-lane-{side}-{batch}-{clients}-{time.time_ns()}"
    preload(client, name, jobs)
    seconds, _ = run_clients(loop, url, name, batch=batch, clients=clients)
    delete_run_keys(client, name)
    return round(jobs / seconds, 1)


def head_to_head(
    client: redis.Redis, url: str, cells: Any, rounds: int, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    rows = []
    for batch, clients, jobs in cells:
        samples: dict[str, list[float]] = {side: [] for side in SIDES}
        for _ in range(rounds):
            for side in SIDES:
                samples[side].append(jobs_per_s(client, url, side, (batch, clients, jobs)))
        for side, values in samples.items():
            ratios = [round(a / b, 3) for a, b in zip(values, samples["streams"], strict=True)]
            rows.append({
                "side": side, "batch": batch, "clients": clients, "jobs": jobs,
                "jobs_per_s": values, "median_jobs_per_s": statistics.median(values),
                "vs_streams_by_round": ratios, "vs_streams": statistics.median(ratios),
            })  # fmt: skip
            ratio = statistics.median(ratios)
            log(f"  {side:<22} batch {batch:>3} x{clients}: {ratio:.3f}x Streams")
    return rows


def one_job_profile(
    client: redis.Redis, url: str, jobs: int, rounds: int, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """µs per one-job call, one consumer in a process of its own (profiles.consumer_costs),
    the sides in turn over interleaved rounds; medians."""
    samples: dict[str, list[dict[str, float]]] = {side: [] for side in PROFILED}
    for _ in range(rounds):
        for side in PROFILED:
            pattern = SIDES[side] if side in SIDES else PATTERNS[side]
            samples[side].append(consumer_costs(client, url, pattern, 1, jobs))
    rows = []
    for side, runs in samples.items():
        row: dict[str, Any] = {"side": side, "jobs": jobs, "rounds": rounds}
        for field in ("wall_us", "client_cpu_us", "server_cpu_us", "commands_us"):
            row[field] = round(statistics.median(run[field] for run in runs), 2)
        rows.append(row)
        log(
            f"  {side:<22} one job: wall {row['wall_us']:7.1f} us, client CPU "
            f"{row['client_cpu_us']:6.1f}, server commands {row['commands_us']:6.1f}"
        )
    return rows


def report(runs: list[dict[str, Any]]) -> str:
    lines = [
        "# The fast lane against redis-py's execute_command (`python -m bench.lane`)",
        "",
        f"{runs[0]['date']}, {runs[0]['rounds']} interleaved rounds; ratios are the medians of",
        "the per-round ratios to Streams, with their range.",
        "",
        "| server | cell | lane | redis-py's path |",
        "|---|---|---:|---:|",
    ]
    for run in runs:
        by = {(r["side"], r["batch"], r["clients"]): r for r in run["head_to_head"]}
        for batch, clients, _ in run["cells"]:
            cells = []
            for side in ("rotator-fcall", "rotator-fcall-redispy"):
                r = by[(side, batch, clients)]
                low, high = min(r["vs_streams_by_round"]), max(r["vs_streams_by_round"])
                cells.append(f"{r['vs_streams']:.2f}x ({low:.2f}-{high:.2f})")
            who = "1 client" if clients == 1 else f"{clients} clients"
            lines.append(f"| {run['server']} | batch {batch}, {who} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "One-job call, one consumer (µs per call, medians):",
        "",
        "| server | side | wall | client CPU | server command time |",
        "|---|---|---:|---:|---:|",
    ]
    for run in runs:
        for r in run["one_job"]:
            lines.append(
                f"| {run['server']} | {r['side']} | {r['wall_us']:.1f} | "
                f"{r['client_cpu_us']:.1f} | {r['commands_us']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lane", description=__doc__)
    parser.add_argument("--servers", default="redis,valkey")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check it runs")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    cells, profile_jobs = SIZES["smoke" if args.smoke else "full"]
    runs = []
    rounds = args.rounds
    with tempfile.TemporaryDirectory(prefix="rotator-bench-lane-") as tmp:
        for kind in args.servers.split(","):
            with started(kind, Path(tmp) / kind) as server:
                client, url = server.client(), server.url
                print(f"{kind} {server.version}", flush=True)
                runs.append({
                    "server": kind, "version": server.version, "date": time.strftime("%Y-%m-%d"),
                    "rounds": rounds, "cells": cells,
                    "head_to_head": head_to_head(client, url, cells, rounds, print),
                    "one_job": one_job_profile(client, url, profile_jobs, rounds, print),
                })  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lane.json").write_text(json.dumps(runs, indent=2) + "\n")
    (args.out / "lane.md").write_text(report(runs))
    print(report(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
