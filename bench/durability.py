"""What a durable call costs: the wall time of one durable push, side by side for each way
of waiting, on a server and its replica, both with AOF on (appendfsync always, then
everysec), in interleaved rounds.

    not durable            a plain push
    local AOF              Durability(): WAITAOF 1 0
    replica's ack          Durability(local_aof=False, replicas=1): WAIT 1
    replica's fsync        Durability(replicas=1), as rotator sends it: WAIT 1, then WAITAOF 1 1
    replica's fsync, alone the same with the WAITAOF alone, as rotator sent it before: the
                           replica reports its fsync once a second unless asked again after
                           it (see rotator.durability.wait_commands)

Each figure is the median of the rounds' medians, with their range. The servers are the
ones with WAITAOF (Valkey 8.1, Redis 8.2): on Redis 7.0 every durable wait is a WAIT.

    .venv/bin/python -m bench.durability [--quick | --smoke] [--servers valkey,redis8]

Writes ``bench/results/durability.{json,md}``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import redis

import rotator.durability
from bench.harness import machine_info, module_info, standard_main, write_results
from rotator import Durability, Rotator
from rotator.durability import wait_commands
from tests.servers import ServerProcess, replicated_pair

RESULTS = Path(__file__).resolve().parent / "results"
FSYNCS = ("always", "everysec")
TIMEOUT = 3.0  # seconds: a WAITAOF alone takes about 1 s for a replica here


@dataclass(frozen=True)
class Sizes:
    pushes: int  # durable pushes a way, a round
    rounds: int


SIZES = {"full": Sizes(10, 5), "quick": Sizes(5, 3), "smoke": Sizes(2, 1)}


def waitaof_alone(durability: Durability, waitaof: bool) -> list[tuple[Any, ...]]:
    """rotator.durability.wait_commands as it was: a WAITAOF for the replicas with no WAIT
    before it."""
    waits = wait_commands(durability, waitaof)
    if len(waits) == 2:
        return [("WAITAOF", 1, durability.replicas, int(durability.timeout * 1000))]
    return waits


@dataclass(frozen=True)
class Way:
    label: str
    durability: Durability | None
    patch: Callable[[], AbstractContextManager[Any]] = nullcontext


WAYS = {
    "plain": Way("not durable", None),
    "local": Way("local AOF (WAITAOF 1 0)", Durability(timeout=TIMEOUT)),
    "ack": Way("replica's ack (WAIT 1)", Durability(local_aof=False, replicas=1, timeout=TIMEOUT)),
    "fsync": Way(
        "replica's fsync (WAIT 1, WAITAOF 1 1: rotator)", Durability(replicas=1, timeout=TIMEOUT)
    ),
    "fsync-alone": Way(
        "replica's fsync, WAITAOF 1 1 alone (before)",
        Durability(replicas=1, timeout=TIMEOUT),
        lambda: mock.patch.object(rotator.durability, "wait_commands", waitaof_alone),
    ),
}


def measure(server: ServerProcess, sizes: Sizes) -> dict[str, Any]:
    """Each way's push wall times, ms: round by round, the ways in turn."""
    client = redis.Redis(host=server.host, port=server.port, socket_timeout=TIMEOUT + 2)
    queues = {
        name: Rotator(client, f"durable-{name}", durability=way.durability)
        for name, way in WAYS.items()
    }
    for queue in queues.values():  # (the first call asks whether the server has WAITAOF)
        queue.push("warm")
    medians: dict[str, list[float]] = {name: [] for name in WAYS}
    for round_ in range(sizes.rounds):
        for name, way in WAYS.items():
            times = []
            with way.patch():
                for n in range(sizes.pushes):
                    began = time.perf_counter()
                    queues[name].push(f"job-{round_}-{n}")
                    times.append((time.perf_counter() - began) * 1000)
            medians[name].append(statistics.median(times))
    client.close()
    return {
        name: {
            "ms": round(statistics.median(values), 3),
            "ms_range": [round(min(values), 3), round(max(values), 3)],
        }
        for name, values in medians.items()
    }


def run(servers: list[str], mode: str, workdir: Path, out: Path, log: Any) -> dict[str, Any]:
    sizes = SIZES[mode]
    results: dict[str, Any] = {}
    for kind in servers:
        for fsync in FSYNCS:
            aof = {"appendonly": "yes", "appendfsync": fsync}
            with replicated_pair(kind, workdir / f"{kind}-{fsync}", aof) as (server, _):  # type: ignore[arg-type]
                log(f"{kind} {server.version}, appendfsync {fsync}: {sizes.pushes} pushes a way")
                found = measure(server, sizes)
                results.setdefault(kind, {"version": server.version})[fsync] = found
    data = {
        "machine": machine_info(mode),
        "module": module_info("rotator/durability.py"),
        **vars(sizes),
        "results": results,
    }
    return write_results(out, "durability", data, markdown)


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# What a durable call costs (`python -m bench.durability`)",
        "",
        f"One push a call, {data['pushes']} pushes a way a round, {data['rounds']} interleaved "
        "rounds; ms of wall time per push, the median of the rounds' medians (range). A "
        "server and its replica, both with AOF on.",
        "",
    ]
    for kind, run_ in data["results"].items():
        lines += [
            f"| {kind} {run_['version']}, ms a push | appendfsync always | everysec |",
            "|---|---:|---:|",
        ]
        for name, way in WAYS.items():
            cells = []
            for fsync in FSYNCS:
                figure = run_[fsync][name]
                low, high = figure["ms_range"]
                cells.append(f"{figure['ms']:.2f} ({low:.2f}-{high:.2f})")
            lines.append(f"| {way.label} | {' | '.join(cells)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return standard_main(
        argv, __doc__, RESULTS, "durability", run=run, markdown=markdown, servers="valkey,redis8"
    )


if __name__ == "__main__":
    raise SystemExit(main())
