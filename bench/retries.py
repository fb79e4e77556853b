"""What ``retry_for`` costs a producer: a plain push as ``push_chunk`` under a marker, a
scheduled one as ``once ... push_later``, and a topic's publish as ``tpublish_chunk``.

    .venv/bin/python -m bench.retries [--smoke | --quick] [--servers redis,valkey]
        [--out DIR] [--table]

With ``retry_for``, a plain push goes as ``push_chunk`` under a marker of its own (a hash
under the queue's tag, kept a minute), so that a push sent again after its reply was lost
pushes nothing twice. On each server (one of our own, persistence off), through the public
API (``Rotator``, FCALL where the server allows it), one client, 16-byte ids, pushed one a
call (``push(id)``) and 100 a call (``push(*ids)``), without and with
``retry_for``: server µs per id (INFO commandstats of FCALL and EVALSHA, the module calls
only) and client wall µs per id. Interleaved rounds, each on fresh queues, the order
alternating from round to round; the ratio with over without is taken within each round,
and the median given. And the memory a push call's marker takes while it lives
(``MEMORY USAGE ... SAMPLES 0``), for a call of 1 and of 100 ids. The same for pushes for
a minute later (``push(..., delay=60)``: ``once`` before ``push_later``), and for a topic
with one group (``Topic.publish_many``, 16-byte payloads, one call a publish), whose marker
keeps the ids it published (their ms, first seq and count).

Results: ``bench/results/retries.json`` and ``retries.md`` (``--out``); ``--table`` prints
the table of an earlier run. Full sizes take about a minute on this 2-core VM.
"""

from __future__ import annotations

import sys
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
    standard_main,
    started,
    write_results,
)
from bench.unique import BATCHES, Runs, compared, ids, push_cell, round_line, timed
from rotator import Rotator, Topic

RESULTS = Path(__file__).resolve().parent / "results"
RETRY_FOR = 10.0
CASES = ("plain", "retry_for")
Log = Callable[[str], None]


@dataclass(frozen=True)
class Sizes:
    push_one: int  # ids a round, pushed one a call
    push_batch: int  # ids a round, pushed 100 a call
    rounds: int  # interleaved rounds


SIZES = {
    "full": Sizes(5000, 100_000, 5),
    "quick": Sizes(500, 10_000, 2),
    "smoke": Sizes(50, 500, 1),
}


def push_ids(q: Rotator, every: list[str], batch: int) -> int:
    """``every`` pushed ``batch`` a call, a ``push`` call each (so a marker each)."""
    return sum(q.push(*every[at : at + batch]) for at in range(0, len(every), batch))


def push_later_ids(q: Rotator, every: list[str], batch: int) -> int:
    """``every`` pushed for a minute later, ``batch`` a call (so a marker each)."""
    return sum(q.push(*every[at : at + batch], delay=60) for at in range(0, len(every), batch))


def publish_ids(topic: Topic, every: list[str], batch: int) -> int:
    """``every`` published ``batch`` a call, a ``publish_many`` each (so a marker each)."""
    return sum(
        len(topic.publish_many(every[at : at + batch])) for at in range(0, len(every), batch)
    )


@dataclass(frozen=True)
class Producer:
    """What a section measures: a push to a queue, or a publish to a topic of one group."""

    what: str  # "push" or "publish"
    make: Callable[[redis.Redis, str, float], Any]  # (client, name, retry_for) -> its object
    send: Callable[[Any, list[str], int], int]  # (object, ids, batch) -> how many went
    marker: Callable[[Any], str]  # the object's marker pattern
    delete: Callable[[Any], None]


def make_topic(client: redis.Redis, name: str, retry_for: float) -> Topic:
    topic = Topic(client, name, retry_for=retry_for)
    topic.subscribe("g")
    return topic


def queue_producer(what: str, send: Callable[[Rotator, list[str], int], int]) -> Producer:
    """A section that pushes to a queue, ``send`` its way."""
    return Producer(
        what,
        lambda client, name, retry_for: Rotator(client, name, retry_for=retry_for),
        send,
        lambda q: q.keys.push_marker("*"),
        lambda q: q.delete(),
    )


PUSH = queue_producer("push", push_ids)
LATER = queue_producer("push_later", push_later_ids)
PUBLISH = Producer(
    "publish",
    make_topic,
    publish_ids,
    lambda topic: topic.keys.publish_marker("*"),
    lambda topic: topic.delete(),
)


def markers(client: redis.Redis, pattern: str) -> list[bytes]:
    return list(client.scan_iter(match=pattern, count=10_000))


def marked_rows(client: redis.Redis, sizes: Sizes, log: Log, producer: Producer) -> dict[str, Any]:
    runs: Runs = {(b, c): [] for b in BATCHES for c in CASES}
    what = producer.what
    for rnd in range(sizes.rounds):
        for batch in BATCHES:
            n = sizes.push_one if batch == 1 else sizes.push_batch
            made = {
                case: producer.make(client, f"retries-{what}-{case}-{rnd}-{batch}", retry_for)
                for case, retry_for in zip(CASES, (0.0, RETRY_FOR), strict=True)
            }
            order = CASES if rnd % 2 == 0 else CASES[::-1]
            for case in order:
                every = ids(f"{case[0]}{rnd}", n)
                run = timed(client, n, partial(producer.send, made[case], every, batch))
                if run.result != n:
                    raise RuntimeError(f"{what} {case}: {run.result} ids taken, not {n}")
                runs[batch, case].append(run)
            pattern = producer.marker(made["retry_for"])
            left = len(markers(client, pattern))
            if left != n // batch:  # one marker a call
                raise RuntimeError(f"{left} markers after {n // batch} marked {what} calls")
            log(round_line(runs, rnd, batch, CASES, what))
            for made_one in made.values():
                producer.delete(made_one)
            client.delete(*markers(client, pattern))
            wait_lazyfree(client)
    return compared(runs, CASES, "retry_for")


def marker_memory(client: redis.Redis, producer: Producer) -> list[dict[str, Any]]:
    """The bytes one call's marker takes, for a call of 1 and of 100 ids."""
    found = []
    for batch in BATCHES:
        made = producer.make(client, f"retries-memory-{producer.what}-{batch}", RETRY_FOR)
        producer.send(made, ids("m", batch), batch)
        (marker,) = markers(client, producer.marker(made))
        found.append(
            {
                "batch": batch,
                "marker_bytes": int(client.memory_usage(marker, samples=0) or 0),
                "ttl_ms": int(client.pttl(marker)),
            }
        )
        producer.delete(made)
        client.delete(marker)
    return found


def run_server(kind: str, sizes: Sizes, workdir: Path, log: Log) -> dict[str, Any]:
    with started(kind, workdir / f"retries-{kind}") as server:
        client = server.client()
        log(f"retries on {kind} {server.version}")
        pushes = marked_rows(client, sizes, log, PUSH)
        later = marked_rows(client, sizes, log, LATER)
        publishes = marked_rows(client, sizes, log, PUBLISH)
        memory = marker_memory(client, PUSH)
        publish_memory = marker_memory(client, PUBLISH)
        client.close()
        return {
            "version": server.version,
            "push": pushes,
            "memory": memory,
            "push_later": later,
            "publish": publishes,
            "publish_memory": publish_memory,
        }


# -- the table ------------------------------------------------------------------------------------

CASE_LABELS = {
    ("push", "plain"): "plain push (`push`)",
    ("push", "retry_for"): "with `retry_for` (`push_chunk`)",
    ("push_later", "plain"): "scheduled push (`push_later`)",
    ("push_later", "retry_for"): "with `retry_for` (`once ... push_later`)",
    ("publish", "plain"): "plain publish (`tpublish`)",
    ("publish", "retry_for"): "with `retry_for` (`tpublish_chunk`)",
}


def markdown(data: dict[str, Any]) -> str:
    table = ServerTable(data["results"])
    add = table.add

    def ratio(batch: int, section: str) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            row = next(p for p in r[section]["ratios"] if p["batch"] == batch)
            server, wall = row["server_ratio_by_round"], row["wall_ratio_by_round"]
            return (
                f"{row['server_ratio']:.2f}x ({min(server):.2f}-{max(server):.2f}) / "
                f"{row['wall_ratio']:.2f}x ({min(wall):.2f}-{max(wall):.2f})"
            )

        return cell

    def memory(batch: int, section: str) -> Callable[[dict[str, Any]], str]:
        def cell(r: dict[str, Any]) -> str:
            row = next(m for m in r[section] if m["batch"] == batch)
            return f"{row['marker_bytes']} B, {row['ttl_ms'] / 1000:.0f} s"

        return cell

    # (a run from before scheduled pushes and publishes were measured has pushes alone; a
    # scheduled push's marker is a push's)
    first = next(iter(data["results"].values()))
    sections: list[tuple[str, str | None]] = [
        ("push", "memory"),
        ("push_later", None),
        ("publish", "publish_memory"),
    ]
    for what, kept in sections:
        if what not in first:
            continue
        for batch in BATCHES:
            for case in CASES:
                add(
                    f"{CASE_LABELS[what, case]}, {batch} a call (server / wall µs an id)",
                    push_cell(batch, case, what),
                )
            add(f"`retry_for` over plain, {batch} a call (server / wall time)", ratio(batch, what))
        if kept is None:
            continue
        for batch in BATCHES:
            add(f"a {what} call's marker, {batch} id(s) a call (memory, kept)", memory(batch, kept))
    return table.text()


def report(data: dict[str, Any]) -> str:
    machine = data["machine"]
    return (
        "# The cost of `retry_for` to a producer\n\n"
        f"`python -m bench.retries` (mode {machine['mode']}) on {machine['cpus']} CPUs, "
        f"{machine['platform']}, Python {machine['python']}, {machine['date']}; module "
        f"{data['module']['sha1'][:12]} at {data['module']['commit']}. Loopback, persistence "
        f"off, one client, 16-byte ids, the module called by "
        f"{'/'.join(sorted({r['push']['via'] for r in data['results'].values()}))}; medians of "
        f"{data['sizes']['rounds']} interleaved rounds (ratios: the median of the per-round "
        "ratios, their range in brackets). 1-minute load average "
        f"{machine['load_before']} before and {machine['load_after']} after.\n\n"
        f"{markdown(data)}\n"
    )


def run(
    kinds: Sequence[str], mode: str, workdir: Path, out: Path, log: Log, **resize: Any
) -> dict[str, Any]:
    """Measures each server in ``kinds``; writes ``out/retries.json`` and ``.md``."""
    sizes = replace(SIZES[mode], **resize)
    module = module_info()
    machine = machine_info(mode)
    results = {kind: run_server(kind, sizes, workdir, log) for kind in kinds}
    machine["load_after"] = load_now()
    data = {"machine": machine, "module": module, "sizes": asdict(sizes), "results": results}
    return write_results(out, "retries", data, report)


def main(argv: list[str] | None = None) -> int:
    return standard_main(argv, __doc__, RESULTS, "retries", run=run, markdown=markdown)


if __name__ == "__main__":
    sys.exit(main())
