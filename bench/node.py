"""The Node client against BullMQ: one no-op worker, concurrency 1 and 16.

    .venv/bin/python -m bench.node [--smoke | --quick] [--servers redis,valkey] [--out DIR]
        [--table]

Both sides are Node on ioredis, each in a process of its own on a server of our own
(persistence off, loopback): ``bench/node_bench.js`` pushes N ids with the Node client
(``clients/node``, built: ``npm run build`` there) and times one ``Rotator.work()`` draining
them (each claim asks for as many jobs as there are free slots, by ``next_packed``
through ``EVALSHA``; acks ride on the next claim); ``bench/bullmq/bench.js`` adds N jobs
(``addBulk``, ``removeOnComplete``) and times one BullMQ ``Worker`` draining them. Enqueueing
is not timed on either side. The four runs of a round are interleaved, and each round starts
with the other side, over ``rounds`` rounds; the figure is the median jobs/s, with the range,
and the ratio is the median of the per-round ratios.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

from bench.harness import size_mode, sized_parser, started
from bench.peers import BULLMQ_DIR, ensure_bullmq

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
NODE_BENCH = HERE / "node_bench.js"
CONCURRENCY = (1, 16)
SIZES = {"full": (20_000, 5), "quick": (5_000, 3), "smoke": (300, 1)}  # jobs, rounds


def drain(side: str, port: int, jobs: int, concurrency: int) -> float:
    """Seconds one worker took to drain `jobs` no-op jobs."""
    if side == "rotator":
        command, cwd = ["node", str(NODE_BENCH)], HERE.parent
    else:
        command, cwd = ["node", "bench.js"], BULLMQ_DIR
    done = subprocess.run(
        [*command, str(port), str(jobs), str(concurrency)],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    data = json.loads(done.stdout.strip().splitlines()[-1])
    if int(data["jobs"]) != jobs:
        raise RuntimeError(f"{side} drained {data['jobs']} of {jobs}")
    return float(data["seconds"])


def run_server(kind: str, jobs: int, rounds: int, workdir: Path, log: Any) -> dict[str, Any]:
    samples: dict[str, list[float]] = {}
    with started(kind, workdir / kind) as server:
        log(f"node vs bullmq on {kind} {server.version}")
        for r in range(rounds):
            sides = ("rotator", "bullmq") if r % 2 == 0 else ("bullmq", "rotator")
            for concurrency in CONCURRENCY:
                for side in sides:
                    rate = jobs / drain(side, server.port, jobs, concurrency)
                    samples.setdefault(f"{side}{concurrency}", []).append(rate)
                    log(f"  round {r + 1} {side} concurrency {concurrency}: {rate:,.0f} jobs/s")
        rows = []
        for concurrency in CONCURRENCY:
            mine, theirs = samples[f"rotator{concurrency}"], samples[f"bullmq{concurrency}"]
            ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
            rows.append(
                {
                    "concurrency": concurrency,
                    "rotator_jobs_per_s": round(statistics.median(mine), 1),
                    "rotator_range": [round(min(mine), 1), round(max(mine), 1)],
                    "bullmq_jobs_per_s": round(statistics.median(theirs), 1),
                    "bullmq_range": [round(min(theirs), 1), round(max(theirs), 1)],
                    "ratio": round(statistics.median(ratios), 2),
                    "ratio_range": [round(min(ratios), 2), round(max(ratios), 2)],
                    "samples": {"rotator": mine, "bullmq": theirs},
                }
            )
        return {"version": server.version, "rows": rows}


def markdown(data: dict[str, Any]) -> str:
    machine = data["machine"]
    out = [
        "# The Node client vs BullMQ",
        "",
        f"`python -m bench.node` (mode {machine['mode']}) on {machine['cpus']} CPUs, "
        f"{machine['platform']}, Node {machine['node']}, BullMQ {machine['bullmq']}, "
        f"{machine['date']}. {data['sizes']['jobs']:,} no-op jobs per run, one worker process "
        f"a side, {data['sizes']['rounds']} interleaved rounds; median jobs/s (range). Loopback, "
        f"persistence off; 1-minute load average {machine['load_before']} before and "
        f"{machine['load_after']} after (the machine is shared: read the ranges).",
        "",
        "| server | concurrency | rotator (Node, `work()`) | BullMQ `Worker` | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind, result in data["servers"].items():
        for row in result["rows"]:
            low, high = row["ratio_range"]
            out.append(
                f"| {kind} {result['version']} | {row['concurrency']} "
                f"| {row['rotator_jobs_per_s']:,.0f} ({row['rotator_range'][0]:,.0f}"
                f"..{row['rotator_range'][1]:,.0f}) "
                f"| {row['bullmq_jobs_per_s']:,.0f} ({row['bullmq_range'][0]:,.0f}"
                f"..{row['bullmq_range'][1]:,.0f}) "
                f"| {row['ratio']:.2f}x ({low:.2f}..{high:.2f}) |"
            )
    return "\n".join(out) + "\n"


def bullmq_version() -> str:
    package = BULLMQ_DIR / "node_modules" / "bullmq" / "package.json"
    return str(json.loads(package.read_text())["version"])


def main(argv: list[str] | None = None) -> int:
    parser = sized_parser(__doc__, RESULTS, "node.json")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown(json.loads((args.out / "node.json").read_text())), end="")
        return 0
    if not ensure_bullmq():
        parser.error("node and npm are needed (apt-get install -y nodejs npm)")
    if not (HERE.parent / "clients" / "node" / "dist" / "index.js").exists():
        parser.error("build the Node client first: cd clients/node && npm ci && npm run build")
    mode = size_mode(args)
    jobs, rounds = SIZES[mode]
    node = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True)
    machine = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "node": node.stdout.strip().lstrip("v"),
        "bullmq": bullmq_version(),
        "mode": mode,
        "date": date.today().isoformat(),
        "load_before": round(os.getloadavg()[0], 2),
    }

    def log(line: str) -> None:
        print(line, flush=True)

    began = time.perf_counter()
    servers: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rotator-node-bench-") as tmp:
        for kind in args.servers.split(","):
            servers[kind] = run_server(kind, jobs, rounds, Path(tmp), log)
    machine["load_after"] = round(os.getloadavg()[0], 2)
    data = {"machine": machine, "sizes": {"jobs": jobs, "rounds": rounds}, "servers": servers}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "node.json").write_text(json.dumps(data, indent=2) + "\n")
    (args.out / "node.md").write_text(markdown(data))
    log(markdown(data))
    log(f"done in {time.perf_counter() - began:.0f} s; results in {args.out / 'node.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
