"""What every benchmark shares: servers, worker processes, timing and percentiles."""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from rotator.script import module_source
from tests.servers import ServerProcess

ROOT = Path(__file__).resolve().parent.parent


def sized_parser(
    doc: str | None, out: Path, results: str, servers: str = "redis,valkey"
) -> argparse.ArgumentParser:
    """The options of a benchmark with full, --quick and --smoke sizes: which servers (by
    default `servers`), where its `results` file goes (default `out`), and --table to print
    that file's table."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller sizes")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, to check it runs")
    parser.add_argument("--servers", default=servers, help="comma-separated")
    parser.add_argument("--out", type=Path, default=out, help=f"where {results} goes")
    parser.add_argument(
        "--table", action="store_true", help=f"print the table of --out's {results}, run nothing"
    )
    return parser


# -- what a result file records -----------------------------------------------------------


def git_commit(*watched: str) -> str:
    """The commit measured, ``+changes`` when one of the ``watched`` files (by default the
    module) differs from it."""
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = _git("status", "--porcelain", *(watched or ("lua/rotator.lua",)))
    return commit + ("+changes" if dirty else "")


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def module_info(*watched: str) -> dict[str, str]:
    """The module the servers will load (read before the run); ``watched``: as git_commit."""
    return {
        "path": "lua/rotator.lua",
        "sha1": hashlib.sha1(module_source().encode()).hexdigest(),
        "commit": git_commit(*watched),
    }


def machine_info(mode: str, **extra: Any) -> dict[str, Any]:
    """The machine, the size mode and the load before the run (add ``load_after`` with
    :func:`load_now` when it ends)."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "mode": mode,
        "date": time.strftime("%Y-%m-%d"),
        **extra,
        "load_before": load_now(),
    }


def load_now() -> float:
    return round(os.getloadavg()[0], 2)


def write_results(
    out: Path, name: str, data: dict[str, Any], report: Callable[[dict[str, Any]], str]
) -> dict[str, Any]:
    """``out/<name>.json`` and ``out/<name>.md`` (the report); returns ``data``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / f"{name}.md").write_text(report(data))
    return data


class ServerTable:
    """A markdown table of a run's figures: a column per server (``results``: kind -> its
    figures, with the server's ``version``), a row per :meth:`add`."""

    def __init__(self, results: dict[str, dict[str, Any]]) -> None:
        self.results = list(results.values())
        head = " | ".join(f"{kind} {found['version']}" for kind, found in results.items())
        self.lines = [f"| | {head} |", "|---|" + "---:|" * len(results)]

    def add(self, label: str, cell: Callable[[dict[str, Any]], str]) -> None:
        """A row: ``label``, then ``cell`` of each server's figures."""
        self.lines.append(f"| {label} | " + " | ".join(cell(r) for r in self.results) + " |")

    def text(self) -> str:
        return "\n".join(self.lines)


# run(servers, mode, workdir, out, log): measures, writes out/<name>.json, returns its data.
BenchRun = Callable[..., dict[str, Any]]


def run_on_each_server(
    servers: list[str],
    mode: str,
    workdir: Path,
    measure: Callable[[ServerProcess], dict[str, Any]],
    **sizes: Any,
) -> dict[str, Any]:
    """A bench's data: ``measure`` run on a server of its own of each kind in ``servers``
    (its figures beside the server's version, under ``results``), with the machine, the
    module and the run's ``sizes``; for write_results."""
    results: dict[str, Any] = {}
    for kind in servers:
        with started(kind, workdir / kind) as server:
            results[kind] = {"version": server.version, **measure(server)}
    return {"machine": machine_info(mode), "module": module_info(), **sizes, "results": results}


def standard_main(
    argv: list[str] | None,
    doc: str | None,
    out: Path,
    name: str,
    *,
    run: BenchRun,
    markdown: Callable[[dict[str, Any]], str],
    servers: str = "redis,valkey",
) -> int:
    """The ``main`` of a bench with no options of its own: ``--table`` prints the table of
    the run recorded in ``<out>/<name>.json``; otherwise runs the bench in a temporary
    directory, logging as it goes, and prints its table."""
    args = sized_parser(doc, out, f"{name}.json", servers).parse_args(argv)
    if args.table:
        print(markdown(json.loads((args.out / f"{name}.json").read_text())))
        return 0
    mode = size_mode(args)

    def log(line: str) -> None:
        print(line, flush=True)

    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"rotator-{name}-") as tmp:
        data = run(args.servers.split(","), mode, Path(tmp), args.out, log)
    log(markdown(data))
    log(f"done in {time.perf_counter() - began:.0f} s; results in {args.out / f'{name}.json'}")
    return 0


def size_mode(args: argparse.Namespace) -> str:
    return "smoke" if args.smoke else "quick" if args.quick else "full"


# One no-op job is claimed once and acked once; every pattern is measured the same way.
Loop = Callable[[str, str, int, "Any"], list[float]]


@dataclass
class Result:
    """One measured scenario."""

    pattern: str
    batch: int
    clients: int
    jobs: int
    seconds: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["jobs_per_s"] = round(self.jobs_per_s, 1)
        return data


def percentile(samples: list[float], q: float) -> float | None:
    if not samples:
        return None
    if len(samples) == 1:
        return samples[0]
    return statistics.quantiles(samples, n=100, method="inclusive")[int(q) - 1]


@contextmanager
def started(kind: str, workdir: Path) -> Iterator[ServerProcess]:
    """A server of our own, persistence off, as every run starts its own."""
    workdir.mkdir(parents=True, exist_ok=True)
    with ServerProcess(kind, workdir, {"appendonly": "no", "save": ""}) as server:  # type: ignore[arg-type]
        yield server


def _child(loop: Loop, url: str, name: str, batch: int, extra: tuple[Any, Any, Any]) -> None:
    args, start, out = extra
    start.wait()
    out.put(loop(url, name, batch, args))


def run_clients(
    loop: Loop, url: str, name: str, *, batch: int, clients: int, args: Any = None
) -> tuple[float, list[float]]:
    """Runs ``loop`` in ``clients`` processes started together; returns (seconds, latencies)."""
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    out: Any = context.Queue()
    procs = [
        context.Process(target=_child, args=(loop, url, name, batch, (args, start, out)))
        for _ in range(clients)
    ]
    for proc in procs:
        proc.start()
    time.sleep(0.5 + 0.2 * clients)  # let every child import and connect before the clock
    began = time.perf_counter()
    start.set()
    latencies: list[float] = []
    for _ in procs:
        latencies.extend(out.get(timeout=600))
    seconds = time.perf_counter() - began
    for proc in procs:
        proc.join()
    return seconds, latencies


def server_usec(client: redis.Redis, names: tuple[str, ...]) -> float:
    """Server CPU time (µs) spent in the given commands since the last CONFIG RESETSTAT."""
    stats = client.info("commandstats")
    return float(sum(stats.get(f"cmdstat_{name}", {}).get("usec", 0) for name in names))


def server_cpu_seconds(client: redis.Redis) -> float:
    """The server process's CPU time so far, user and system (INFO cpu: its getrusage). It
    counts everything the server does, reading commands and writing replies included, where
    INFO commandstats counts only the commands' own time: a command given many arguments (an
    XACK of 100 ids) or sending a long reply pays much of its cost outside that."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def delete_run_keys(client: redis.Redis, name: str) -> None:
    """Deletes every key a measured run left behind (all of them contain its unique name)."""
    keys = client.keys(f"*{name}*")
    if keys:
        client.delete(*keys)
