"""The tracked ratios (issue 21), before and after, in one run: the whole product as it was
before the lease list and as it is now, each beside Redis Streams.

    .venv/bin/python -m bench.tracked [--smoke | --quick] [--servers redis,valkey] [--table]

Issue 21 asks that every ratio to Streams the bench tracked when it was filed stays at or
above what it was. Those ratios were measured on another day, and on this 2-core VM the
batch-100, 4-client cell moves by ±0.1 from run to run, so this puts both in one run. BEFORE
is commit 5b7616c (the last before the lease list) whole: its ``rotator`` package (kept in
``bench/baseline/rotator-5b7616c-package.tar.gz``, as ``git archive`` made it) and its module
(``bench/baseline/rotator-5b7616c.lua``, which ``bench.bounds`` uses too), so no git history
is needed. NOW is the working tree. Each cell is the head-to-head preload and loop of
``python -m bench`` (``bench.patterns``: ``Rotator.next(batch, ack=previous)`` until the
queue is empty, then ``sweep``; Streams: ``XREADGROUP COUNT`` and ``XACK``), in processes of
their own started together, each product's processes importing its own package. Rounds
interleave BEFORE, NOW and Streams, so a drift of the machine's speed shifts all three
alike; a ratio is taken within its round, and the table gives the median of the rounds with
their range. Both ways of calling the module are measured: ``functions=False`` (EVALSHA)
and ``functions=True`` (FCALL). Results: ``bench/results/tracked.json`` and ``tracked.md``.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from bench.bounds import OLD_COMMIT, OLD_MODULE
from bench.harness import (
    ROOT,
    delete_run_keys,
    machine_info,
    module_info,
    sized_parser,
    started,
)

RESULTS = Path(__file__).resolve().parent / "results"
# The last commit before the lease list (issue 21), whose module bench.bounds keeps too, and
# its package beside it.
BEFORE_COMMIT = OLD_COMMIT
BEFORE_PACKAGE = OLD_MODULE.parent / f"rotator-{OLD_COMMIT}-package.tar.gz"
PRODUCTS = ("before", "now", "streams")
MODES = ("evalsha", "fcall")


@dataclass(frozen=True)
class Sizes:
    rounds: int
    cells: tuple[tuple[int, int, int], ...]  # (batch, clients, jobs), as bench's head to head


SIZES = {
    "full": Sizes(15, ((1, 1, 5_000), (100, 4, 300_000))),
    "quick": Sizes(3, ((1, 1, 2_000), (100, 4, 50_000))),
    "smoke": Sizes(1, ((1, 1, 100), (10, 2, 200))),
}

# One process of a cell: `python -c CHILD <tree> <root> <role> <pattern> <url> <name> <batch>
# <jobs>`, with <tree> first on sys.path (so that `rotator` is that tree's package) and <root>
# next (bench's own patterns, the very preload and loop of the head to head). A preload fills
# the queue (or Stream) and exits; a loop says "ready" and the module file its package loads,
# starts on a line from its parent, and prints its seconds.
CHILD = """
import sys, time
tree, root, role, pattern, url, name, batch, jobs = sys.argv[1:9]
sys.path[:0] = [tree, root]
import redis
from bench.patterns import PATTERNS
from rotator.script import module_path
preload, loop = PATTERNS[pattern]
if role == "preload":
    preload(redis.Redis.from_url(url), name, int(jobs))
    sys.exit(0)
print("ready", module_path(), flush=True)
sys.stdin.readline()
began = time.perf_counter()
loop(url, name, int(batch), None)
print(time.perf_counter() - began, flush=True)
"""


def before_tree(directory: Path) -> Path:
    """Commit BEFORE_COMMIT's ``rotator`` package and ``lua/rotator.lua``, laid out as its
    source tree (the package finds its module at ``../lua/rotator.lua``)."""
    tree = directory / f"rotator-{BEFORE_COMMIT}"
    if not (tree / "rotator").is_dir():
        (tree / "lua").mkdir(parents=True)
        with tarfile.open(BEFORE_PACKAGE) as tar:
            tar.extractall(tree, filter="data")
        shutil.copy(OLD_MODULE, tree / "lua" / "rotator.lua")
    return tree


@dataclass(frozen=True)
class Cell:
    """One product's run of one cell."""

    product: str  # one of PRODUCTS
    mode: str  # one of MODES
    batch: int
    clients: int
    jobs: int

    @property
    def pattern(self) -> str:
        """Its pattern in bench.patterns."""
        if self.product == "streams":
            return "streams"
        return "rotator-fcall" if self.mode == "fcall" else "rotator"


def child(tree: Path, role: str, url: str, name: str, cell: Cell) -> subprocess.Popen[str]:
    argv = [str(tree), str(ROOT), role, cell.pattern, url, name, str(cell.batch), str(cell.jobs)]
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def run_cell(client: redis.Redis, url: str, tree: Path, cell: Cell) -> float:
    """Jobs per second of one product's cell: preload, then ``clients`` loops started together."""
    product = cell.product
    name = f"tracked-{product}-{cell.mode}-{cell.batch}-{cell.clients}-{time.time_ns()}"
    preload = child(tree, "preload", url, name, cell)
    if preload.wait(timeout=600) != 0:
        raise RuntimeError(f"{product}: preload failed")
    loops = [child(tree, "loop", url, name, cell) for _ in range(cell.clients)]
    for proc in loops:
        assert proc.stdout is not None
        said = proc.stdout.readline().split()
        if said[:1] != ["ready"] or Path(said[1]) != tree / "lua" / "rotator.lua":
            raise RuntimeError(f"{product}: a loop did not start with {tree}'s module: {said}")
    began = time.perf_counter()
    for proc in loops:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in loops:
        assert proc.stdout is not None
        float(proc.stdout.readline())
        if proc.wait(timeout=600) != 0:
            raise RuntimeError(f"{product}: a loop failed")
    seconds = time.perf_counter() - began
    ring = client.lrange(f"rotator:{{{name}}}:ring", 0, -1) if product != "streams" else []
    left = [element for element in ring if element != b"*lap"]  # (the sentinel stays)
    delete_run_keys(client, name)
    if left:
        raise RuntimeError(f"{product}: {len(left)} elements left in the ring after the loops")
    return cell.jobs / seconds


def measure(kind: str, sizes: Sizes, workdir: Path, log: Any) -> dict[str, Any]:
    trees = {"before": before_tree(workdir), "now": ROOT, "streams": ROOT}
    rows = []
    with started(kind, workdir / kind) as server:
        client = server.client()
        log(f"{kind} {server.version} on port {server.port}")
        for batch, clients, jobs in sizes.cells:
            for mode in MODES:
                rates: dict[str, list[float]] = {product: [] for product in PRODUCTS}
                for _ in range(sizes.rounds):
                    for product in PRODUCTS:
                        cell = Cell(product, mode, batch, clients, jobs)
                        rate = run_cell(client, server.url, trees[product], cell)
                        rates[product].append(round(rate, 1))
                row = cell_row(mode, batch, clients, jobs, rates)
                log(describe(row))
                rows.append(row)
        return {"server": kind, "version": server.version, "rows": rows}


def cell_row(
    mode: str, batch: int, clients: int, jobs: int, rates: dict[str, list[float]]
) -> dict[str, Any]:
    streams = rates["streams"]
    ratios = {
        product: [round(a / b, 3) for a, b in zip(rates[product], streams, strict=True)]
        for product in ("before", "now")
    }
    gains = [round(a / b, 3) for a, b in zip(rates["now"], rates["before"], strict=True)]
    return {
        "mode": mode, "batch": batch, "clients": clients, "jobs": jobs,
        "jobs_per_s": rates,
        "vs_streams_by_round": ratios,
        "vs_streams": {product: statistics.median(r) for product, r in ratios.items()},
        "now_vs_before_by_round": gains,
        "now_vs_before": statistics.median(gains),
    }  # fmt: skip


def describe(row: dict[str, Any]) -> str:
    ratios = row["vs_streams"]
    return (
        f"  {row['mode']:<7} batch {row['batch']:>3} x{row['clients']}: "
        f"before {ratios['before']:.2f}x Streams, now {ratios['now']:.2f}x "
        f"(now / before {row['now_vs_before']:.2f})"
    )


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def table(data: dict[str, Any]) -> str:
    lines = [
        "| server | call | batch, clients | before: x Streams (range) | now: x Streams (range) "
        "| now / before (range) |",
        "|---|---|---|---:|---:|---:|",
    ]
    for run in data["runs"]:
        for row in run["rows"]:
            by_round = row["vs_streams_by_round"]
            lines.append(
                f"| {run['server']} {run['version']} | `{row['mode'].upper()}` "
                f"| {row['batch']}, {row['clients']} "
                f"| {row['vs_streams']['before']:.2f}x ({spread(by_round['before'])}) "
                f"| {row['vs_streams']['now']:.2f}x ({spread(by_round['now'])}) "
                f"| {row['now_vs_before']:.2f} ({spread(row['now_vs_before_by_round'])}) |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = sized_parser(__doc__, RESULTS, "tracked.json")
    args = parser.parse_args(argv)
    out: Path = args.out
    if args.table:
        print(table(json.loads((out / "tracked.json").read_text())))
        return 0
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    sizes = SIZES[mode]

    def log(line: str) -> None:
        print(line, flush=True)

    data: dict[str, Any] = {
        "machine": machine_info(mode),
        "module": module_info(),
        "before": BEFORE_COMMIT,
        "sizes": asdict(sizes),
    }
    with tempfile.TemporaryDirectory(prefix="rotator-tracked-") as tmp:
        data["runs"] = [measure(kind, sizes, Path(tmp), log) for kind in args.servers.split(",")]
    out.mkdir(parents=True, exist_ok=True)
    (out / "tracked.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "tracked.md").write_text(
        f"# The tracked ratios, before the lease list ({BEFORE_COMMIT}) and now, in one run\n\n"
        f"`python -m bench.tracked` ({mode}), {data['machine']['date']}, module "
        f"{data['module']['commit']}.\n\n{table(data)}\n"
    )
    log(table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
