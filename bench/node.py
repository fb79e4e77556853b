"""The Node client against BullMQ: a no-op worker at concurrency 1 and 16, and batch claims.

    .venv/bin/python -m bench.node [--smoke | --quick] [--servers redis,valkey] [--out DIR]
        [--table]

Every run is one process of its own draining N no-op jobs from a server of our own
(persistence off, loopback); enqueueing is not timed. Both Node sides are on ioredis.

Workers: ``bench/node_bench.js work`` times one ``Rotator.work()`` of the Node client
(``clients/node``, built: ``npm run build`` there; each claim asks for as many jobs as there
are free slots, by ``next_packed`` through ``FCALL``, the client's default, and acks ride on
the next claim) against ``bench/bullmq/bench.js``: jobs added by ``addBulk``
(``removeOnComplete``), one BullMQ ``Worker`` draining them, at concurrency 1 and 16.

Batch claims: ``bench/node_bench.js batch`` loops ``next({count: 100, ack: previous})``
(each claim acks the batch before it: one batch ack) until the queue is empty. The
open-source BullMQ Worker has no batch claim (batches are a BullMQ Pro feature), so it is
set against the two nearest things BullMQ offers: a ``Worker`` at concurrency 100 (100 jobs
in flight, each fetched and completed on its own), and its documented manual processing, one
job at a time (``worker.getNextJob(token, {block: false})`` then
``job.moveToCompleted(null, token, false)``, ``node_bench.js bullmq-manual``). The same batch
loop in the Python client (``Rotator.next(100, ack=previous)``, redis-py, ``FCALL`` as the
Node client calls) is a third row.

The runs of a round are interleaved, each round in the reverse order of the one before, over
``rounds`` rounds; each figure is the median jobs/s, with the range, and each ratio the
median of the per-round ratios, with their range.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import (
    load_now,
    machine_info,
    module_info,
    size_mode,
    sized_parser,
    started,
    write_results,
)
from bench.peers import BULLMQ_DIR, ensure_bullmq

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
NODE_BENCH = HERE / "node_bench.js"
CONCURRENCY = (1, 16)
BATCH = 100  # jobs a batch claim asks for; the BullMQ Worker set against it runs this many
SIZES = {"full": (20_000, 5), "quick": (5_000, 3), "smoke": (300, 1)}  # jobs, rounds
WATCHED = ("lua/rotator.lua", "clients/node/src", "bench/node_bench.js", "bench/node.py")

# The Python client's batch loop, as node_bench.js's: argv port, jobs, count.
PYTHON_BATCH = """
import json, os, sys, time
import redis
from rotator import Rotator

port, total, count = (int(arg) for arg in sys.argv[1:4])
client = redis.Redis(port=port)
q = Rotator(client, f"bench-py-{os.getpid()}-{time.time_ns()}")
ids = [f"j{i}" for i in range(total)]
for start in range(0, total, 1000):
    q.push(*ids[start : start + 1000])
q.stats()  # the module is loaded before the clock starts
claimed = 0
began = time.perf_counter()
held = q.next(count)
while held:
    claimed += len(held)
    held = q.next(count, ack=held)
seconds = time.perf_counter() - began
stats = q.stats()
q.delete()
client.close()
if claimed != total or stats.pending + stats.in_flight != 0:
    raise SystemExit(f"drained {claimed} of {total}: {stats}")
print(json.dumps({"jobs": claimed, "seconds": seconds}))
"""

# Each run: (command after the port, jobs and argument; its working directory; argument).
RUNS: dict[str, tuple[list[str], Path, int]] = {
    **{f"rotator-work-{c}": (["node", str(NODE_BENCH), "work"], ROOT, c) for c in CONCURRENCY},
    **{f"bullmq-worker-{c}": (["node", "bench.js"], BULLMQ_DIR, c) for c in CONCURRENCY},
    "rotator-batch": (["node", str(NODE_BENCH), "batch"], ROOT, BATCH),
    f"bullmq-worker-{BATCH}": (["node", "bench.js"], BULLMQ_DIR, BATCH),
    "bullmq-manual": (["node", str(NODE_BENCH), "bullmq-manual"], ROOT, 1),
    "python-batch": ([sys.executable, "-c", PYTHON_BATCH], ROOT, BATCH),
}

# The batch rows: the Node client's batch loop against each of these.
BATCH_PEERS = {
    f"bullmq-worker-{BATCH}": f"BullMQ `Worker`, concurrency {BATCH}",
    "bullmq-manual": "BullMQ manual `getNextJob` + `moveToCompleted`, one job at a time",
    "python-batch": f"rotator (Python, `next({BATCH}, ack=previous)`)",
}


def drain(run: str, port: int, jobs: int) -> float:
    """Seconds one run took to drain `jobs` no-op jobs."""
    command, cwd, arg = RUNS[run]
    done = subprocess.run(
        [*command, str(port), str(jobs), str(arg)],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{run} failed: {done.stderr[-2000:]}")
    data = json.loads(done.stdout.strip().splitlines()[-1])
    if int(data["jobs"]) != jobs:
        raise RuntimeError(f"{run} drained {data['jobs']} of {jobs}")
    return float(data["seconds"])


def compare(mine: list[float], theirs: list[float]) -> dict[str, Any]:
    """Medians, ranges and the per-round ratios of two runs' samples (jobs/s)."""
    ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
    return {
        "rotator_jobs_per_s": round(statistics.median(mine), 1),
        "rotator_range": [round(min(mine), 1), round(max(mine), 1)],
        "peer_jobs_per_s": round(statistics.median(theirs), 1),
        "peer_range": [round(min(theirs), 1), round(max(theirs), 1)],
        "ratio": round(statistics.median(ratios), 2),
        "ratio_range": [round(min(ratios), 2), round(max(ratios), 2)],
        "samples": {"rotator": mine, "peer": theirs},
    }


def run_server(kind: str, jobs: int, rounds: int, workdir: Path, log: Any) -> dict[str, Any]:
    samples: dict[str, list[float]] = {run: [] for run in RUNS}
    with started(kind, workdir / kind) as server:
        log(f"node vs bullmq on {kind} {server.version}")
        for r in range(rounds):
            order = list(RUNS) if r % 2 == 0 else list(reversed(RUNS))
            for run in order:
                rate = jobs / drain(run, server.port, jobs)
                samples[run].append(rate)
                log(f"  round {r + 1} {run}: {rate:,.0f} jobs/s")
        rows = [
            {
                "concurrency": c,
                **compare(samples[f"rotator-work-{c}"], samples[f"bullmq-worker-{c}"]),
            }
            for c in CONCURRENCY
        ]
        batch_rows = [
            {
                "count": BATCH,
                "peer": peer,
                "peer_label": label,
                **compare(samples["rotator-batch"], samples[peer]),
            }
            for peer, label in BATCH_PEERS.items()
        ]
        return {"version": server.version, "rows": rows, "batch_rows": batch_rows}


def _cell(rate: float, low: float, high: float) -> str:
    return f"{rate:,.0f} ({low:,.0f}..{high:,.0f})"


def _ratio(row: dict[str, Any]) -> str:
    low, high = row["ratio_range"]
    return f"{row['ratio']:.2f}x ({low:.2f}..{high:.2f})"


def markdown(data: dict[str, Any]) -> str:
    machine = data["machine"]
    out = [
        "# The Node client vs BullMQ",
        "",
        f"`python -m bench.node` (mode {machine['mode']}) on {machine['cpus']} CPUs, "
        f"{machine['platform']}, Node {machine['node']}, BullMQ {machine['bullmq']}, "
        f"{machine['date']}, module {data['module']['commit']}. "
        f"{data['sizes']['jobs']:,} no-op jobs per run, one process a run, "
        f"{data['sizes']['rounds']} interleaved rounds; median jobs/s (range), and the median "
        f"of the per-round ratios (range). Loopback, persistence off; 1-minute load average "
        f"{machine['load_before']} before and {machine['load_after']} after (the machine is "
        f"shared: read the ranges).",
        "",
        "## Workers",
        "",
        "| server | concurrency | rotator (Node, `work()`) | BullMQ `Worker` | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind, result in data["servers"].items():
        for row in result["rows"]:
            out.append(
                f"| {kind} {result['version']} | {row['concurrency']} "
                f"| {_cell(row['rotator_jobs_per_s'], *row['rotator_range'])} "
                f"| {_cell(row['peer_jobs_per_s'], *row['peer_range'])} | {_ratio(row)} |"
            )
    out += [
        "",
        "## Batch claims",
        "",
        f"The Node client claiming {BATCH} jobs a call, each claim acking the batch before it "
        f"(`next({{count: {BATCH}, ack: previous}})` until empty). The open-source BullMQ "
        "`Worker` has no batch claim (batches are BullMQ Pro's), so it is set against what "
        f"BullMQ offers nearest: a `Worker` at concurrency {BATCH} ({BATCH} jobs in flight, "
        "each fetched and completed by calls of its own), and its manual processing "
        "(`worker.getNextJob(token, {block: false})`, then `job.moveToCompleted(null, token, "
        "false)`, one job at a time: two round trips a job). The last row is the same batch "
        "loop in the Python client (redis-py, `FCALL` like the Node client).",
        "",
        f"| server | rotator (Node, batches of {BATCH}) | against | its jobs/s | ratio |",
        "|---|---:|---|---:|---:|",
    ]
    for kind, result in data["servers"].items():
        for row in result["batch_rows"]:
            out.append(
                f"| {kind} {result['version']} "
                f"| {_cell(row['rotator_jobs_per_s'], *row['rotator_range'])} "
                f"| {row['peer_label']} | {_cell(row['peer_jobs_per_s'], *row['peer_range'])} "
                f"| {_ratio(row)} |"
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
    if not (ROOT / "clients" / "node" / "dist" / "index.js").exists():
        parser.error("build the Node client first: cd clients/node && npm ci && npm run build")
    mode = size_mode(args)
    jobs, rounds = SIZES[mode]
    node = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True)
    machine = machine_info(mode, node=node.stdout.strip().lstrip("v"), bullmq=bullmq_version())
    module = module_info(*WATCHED)

    def log(line: str) -> None:
        print(line, flush=True)

    began = time.perf_counter()
    servers: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rotator-node-bench-") as tmp:
        for kind in args.servers.split(","):
            servers[kind] = run_server(kind, jobs, rounds, Path(tmp), log)
    machine["load_after"] = load_now()
    data = {
        "machine": machine,
        "module": module,
        "sizes": {"jobs": jobs, "rounds": rounds, "batch": BATCH},
        "servers": servers,
    }
    write_results(args.out, "node", data, markdown)
    log(markdown(data))
    log(f"done in {time.perf_counter() - began:.0f} s; results in {args.out / 'node.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
