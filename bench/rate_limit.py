"""Rate limits (issue 16): how closely consumers on many processes keep to a queue's limit.

    .venv/bin/python -m bench.rate_limit [--smoke | --quick] [--servers redis,valkey]
        [--out DIR] [--table]

On each server (one of our own, persistence off), a queue holds more jobs than the run can
take, with ``set_rate_limit(jobs, per=1.0)``. ``consumers`` processes, each a ``Rotator`` of
its own (FCALL where the server allows it, as by default), claim with
``next(10, block=1, ack=<the previous claim>)`` for ``seconds`` seconds and note the time
every job came (the host's clock: one machine). The module enforces the limit inside the
claim as a generic cell rate: a burst of ``jobs`` at once, then one every ``per / jobs``.
Reported per limit:

- the steady rate: jobs that came after the first ``per`` (when the burst is spent) up to the
  end of the run, over that time, against ``jobs / per``: the error in percent (target:
  within 2%; claims of 10 make it coarse by 10 jobs over the run);
- the jobs of the first ``per`` (the burst and a period's worth) and the most in any window
  of ``per`` seconds, against the most the limit allows in one (``2 * jobs``).

Results: ``bench/results/rate_limit.json`` and ``rate_limit.md`` (``--out``); ``--table``
prints the table of an earlier run. Full sizes take about 70 s a server on this 2-core VM.
"""

from __future__ import annotations

import bisect
import json
import multiprocessing
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
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
from rotator import Rotator

RESULTS = Path(__file__).resolve().parent / "results"
CLAIM = 10  # next(count) of each consumer
TARGET_ERROR_PCT = 2.0

Log = Callable[[str], None]


@dataclass(frozen=True)
class Sizes:
    consumers: int
    seconds: float
    limits: tuple[int, ...]  # jobs per second


SIZES = {
    "full": Sizes(consumers=8, seconds=30.0, limits=(100, 1000)),
    "quick": Sizes(consumers=8, seconds=6.0, limits=(100, 1000)),
    "smoke": Sizes(consumers=2, seconds=2.0, limits=(50,)),
}


def consume(url: str, name: str, until: float, out: Any) -> None:
    """One consumer process: claims until `until` (host time) and sends the times its jobs
    came."""
    q = Rotator.from_url(url, name)
    times: list[float] = []
    jobs: list[Any] = []
    while time.time() < until:
        jobs = q.next(CLAIM, block=min(1.0, max(until - time.time(), 0.01)), ack=jobs)
        now = time.time()
        times.extend([now] * len(jobs))
    if jobs:
        q.ack(*jobs)
    out.put(times)


def most_in_window(times: list[float], window: float) -> int:
    """The most of the sorted `times` in any half-open window of `window` seconds."""
    most = 0
    for i, start in enumerate(times):
        most = max(most, bisect.bisect_left(times, start + window) - i)
    return most


def limit_row(url: str, name: str, jobs: int, sizes: Sizes) -> dict[str, Any]:
    q = Rotator.from_url(url, name)
    q.set_rate_limit(jobs, per=1.0)
    q.push_many([f"job-{i}" for i in range(int(jobs * (sizes.seconds + 2) * 1.2))], 5000)
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start = time.time() + 1.5  # the processes start before the run does
    until = start + sizes.seconds
    procs = [
        context.Process(target=_consume_from, args=(url, name, start, until, out))
        for _ in range(sizes.consumers)
    ]
    for proc in procs:
        proc.start()
    times = sorted(t for _ in procs for t in out.get(timeout=sizes.seconds + 60))
    for proc in procs:
        proc.join(timeout=30)
    # The steady rate: the jobs that came after the first period, over the rest of the run.
    first = times[0] if times else start
    first_period = bisect.bisect_left(times, first + 1.0)
    steady = bisect.bisect_left(times, until) - first_period
    span = until - (first + 1.0)
    rate = steady / span if span > 0 else 0.0
    q.delete(forget=True)
    return {
        "limit_jobs": jobs,
        "per_s": 1.0,
        "consumers": sizes.consumers,
        "seconds": sizes.seconds,
        "claimed": len(times),
        "first_period": first_period,
        "steady_rate": round(rate, 2),
        "error_pct": round((rate - jobs) / jobs * 100, 2),
        "within_target": abs(rate - jobs) / jobs * 100 <= TARGET_ERROR_PCT,
        "most_in_a_period": most_in_window(times, 1.0),
        "allowed_in_a_period": 2 * jobs,
    }


def _consume_from(url: str, name: str, start: float, until: float, out: Any) -> None:
    time.sleep(max(start - time.time(), 0.0))
    consume(url, name, until, out)


def run_server(kind: str, sizes: Sizes, workdir: Path, log: Log) -> dict[str, Any]:
    with started(kind, workdir) as server:
        client = server.client()
        info = client.info("server")
        version = str(info.get("valkey_version") or info["redis_version"])
        rows = []
        for jobs in sizes.limits:
            row = limit_row(server.url, f"rate-{jobs}", jobs, sizes)
            log(
                f"  {kind} {jobs}/s, {sizes.consumers} consumers: steady {row['steady_rate']}/s"
                f" ({row['error_pct']:+.2f}%), first second {row['first_period']},"
                f" most in a second {row['most_in_a_period']}"
            )
            rows.append(row)
        client.close()
        return {"version": version, "limits": rows}


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "| server | limit | consumers | steady rate (error) | first second |"
        " most in any second (allowed) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind, result in data["results"].items():
        for row in result["limits"]:
            lines.append(
                f"| {kind} {result['version']} | {row['limit_jobs']:,}/s | {row['consumers']}"
                f" | {row['steady_rate']:,.1f}/s ({row['error_pct']:+.2f}%)"
                f" | {row['first_period']:,} | {row['most_in_a_period']:,}"
                f" ({row['allowed_in_a_period']:,}) |"
            )
    return "\n".join(lines) + "\n"


def report(data: dict[str, Any]) -> str:
    machine = data["machine"]
    return (
        "# Rate limits (issue 16)\n\n"
        f"`python -m bench.rate_limit` (mode {machine['mode']}) on {machine['cpus']} CPUs,"
        f" {machine['platform']}, Python {machine['python']}, {machine['date']}."
        f" Each consumer a process, claiming 10 at a time with its acks riding on the next"
        f" claim, for {data['sizes']['seconds']:g} s; target: the steady rate within"
        f" {TARGET_ERROR_PCT:g}% of the limit.\n\n" + markdown(data)
    )


def run(mode: str, servers: list[str], out: Path, log: Log) -> dict[str, Any]:
    """Measures every limit on each server in ``servers``; writes ``out/rate_limit.json``
    (with the machine and the module measured) and ``out/rate_limit.md``."""
    sizes = SIZES[mode]
    module = module_info()
    machine = machine_info(mode)
    results = {}
    with tempfile.TemporaryDirectory(prefix="rotator-rate-") as tmp:
        for kind in servers:
            results[kind] = run_server(kind, sizes, Path(tmp) / kind, log)
    machine["load_after"] = load_now()
    data = {
        "machine": machine,
        "module": module,
        "sizes": asdict(sizes),
        "target_error_pct": TARGET_ERROR_PCT,
        "results": results,
    }
    return write_results(out, "rate_limit", data, report)


def main(argv: list[str] | None = None) -> int:
    parser = sized_parser(__doc__, RESULTS, "rate_limit.json")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown(json.loads((args.out / "rate_limit.json").read_text())))
        return 0

    def log(line: str) -> None:
        print(line, flush=True)

    data = run(size_mode(args), [s for s in args.servers.split(",") if s], args.out, log)
    print(markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
