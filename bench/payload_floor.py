"""What a payload queue's layout costs at least: its floors beside the payload queue and Streams.

Issue 23 asks a queue with payloads to consume at 1.2x a Stream carrying the same bodies,
with 1 and 4 consumers. ``bench/payload_floor.lua`` is the least a claim (batch 100, with
the batch ack of the one before) can do in each of three layouts: ``hash``, the payload
queue's (ids in the ring, bodies in a hash: read at the claim, deleted with the acked
batch), ``moved`` (the same, but the claim moves the batch's bodies into one field, which
the ack deletes whole), and ``inline`` (bodies in the ring's elements, kept in the lease's
element until the ack). None fences, counts or checks anything, so each is a bound: no
module on that layout can be faster. Side by side, in one run, with the payload queue as it
is and a Stream read by one group: consumer processes drain the same preloaded jobs (bodies
of 64 bytes), and each figure is the median of interleaved rounds, with the ratio to Streams
per round.

    .venv/bin/python -m bench.payload_floor [--messages 20000] [--rounds 3]
        [--servers redis,valkey] [--smoke]
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from bench.harness import machine_info, module_info, started
from bench.topics import (
    BATCH,
    CLIENTS,
    MANY,
    PAYLOAD,
    Preload,
    many_clients_run,
    median_row,
    parse_sizes,
)

FLOOR_SCRIPT = (Path(__file__).parent / "payload_floor.lua").read_text(encoding="utf-8")
PATTERNS = ("streams", "rotator-payload-queue", "floor-hash", "floor-moved", "floor-inline")
CONSUMERS = (1, CLIENTS)
RESULTS = Path(__file__).parent / "results"
# The figures of a row that are medians of the rounds (each with its range).
CONSUMED = (
    "consume_deliveries_per_s",
    "consume_server_us_per_delivery",
    "consume_server_cpu_us_per_delivery",
    "consume_client_us_per_delivery",
    "vs_streams",
)


def floor_keys(name: str) -> list[str]:
    """The floor script's KEYS for a queue ``name`` (one hash tag: it may run on a cluster)."""
    return [f"{{{name}}}:{role}" for role in ("ring", "leases", "acked", "bodies", "counter")]


def preload_floor(layout: str) -> Preload:
    def preload(client: redis.Redis, name: str, ids: list[str]) -> None:
        ring, _, _, bodies, _ = floor_keys(name)
        for start in range(0, len(ids), 1000):
            part = ids[start : start + 1000]
            if layout == "inline":
                client.lpush(ring, *[job_id.encode() + b"*" + PAYLOAD for job_id in part])
            else:
                client.hset(bodies, mapping=dict.fromkeys(part, PAYLOAD))
                client.lpush(ring, *part)

    return preload


def floor_loop(url: str, name: str, batch: int, layout: Any) -> list[float]:
    """One consumer of a floor: each call claims ``batch`` and acks the batch before it, and
    the consumer splits the reply into (id, body) pairs, as a client must. Returns its CPU
    seconds in the loop."""
    client = redis.Redis.from_url(url)
    script = client.register_script(FLOOR_SCRIPT)
    keys = floor_keys(name)
    previous: list[bytes] = []
    cpu = time.process_time()
    while True:
        reply = script(keys=keys, args=[layout, batch, *previous])
        if not reply:
            break
        if layout == "inline":
            jobs = [element.partition(b"*")[::2] for element in reply[1:]]
        else:
            jobs = list(zip(reply[1::2], reply[2::2], strict=True))
        if len(jobs) > batch or any(body != PAYLOAD for _, body in jobs):
            raise RuntimeError(f"the {layout} floor returned a wrong batch: {reply[:3]!r}")
        previous = [reply[0]]
    script(keys=keys, args=[layout, 1, *previous])  # the last ack
    used = time.process_time() - cpu
    client.close()
    return [used]


def floor_hash_loop(url: str, name: str, batch: int, _: Any) -> list[float]:
    return floor_loop(url, name, batch, "hash")


def floor_inline_loop(url: str, name: str, batch: int, _: Any) -> list[float]:
    return floor_loop(url, name, batch, "inline")


def floor_moved_loop(url: str, name: str, batch: int, _: Any) -> list[float]:
    return floor_loop(url, name, batch, "moved")


# (module-level loops: spawned consumer processes import them by name)
MANY["floor-hash"] = (preload_floor("hash"), floor_hash_loop)
MANY["floor-inline"] = (preload_floor("inline"), floor_inline_loop)
MANY["floor-moved"] = (preload_floor("moved"), floor_moved_loop)


def run(kind: str, messages: int, rounds: int) -> list[dict[str, Any]]:
    """Every pattern with 1 and CLIENTS consumers, ``rounds`` interleaved rounds: each row is
    the median, with the ratio to the Stream of the same round."""
    measured: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as workdir, started(kind, Path(workdir)) as server:
        client = server.client()
        for _ in range(rounds):
            for consumers in CONSUMERS:
                streams = many_clients_run(client, server.url, "streams", messages, consumers)
                base = streams["consume_deliveries_per_s"]
                for pattern in PATTERNS:
                    result = streams
                    if pattern != "streams":
                        result = many_clients_run(client, server.url, pattern, messages, consumers)
                    result["vs_streams"] = round(result["consume_deliveries_per_s"] / base, 3)
                    measured.setdefault((pattern, consumers), []).append(result)
        client.close()
    return [median_row(results, CONSUMED) for results in measured.values()]


def markdown(results: dict[str, list[dict[str, Any]]], rounds: int) -> str:
    lines = [
        "# The payload layouts' floors (`python -m bench.payload_floor`)",
        "",
        f"Batch {BATCH}, bodies of {len(PAYLOAD)} bytes, {rounds} interleaved rounds; medians, "
        "ranges in brackets. Server: top-level command time per delivery (INFO commandstats), "
        "and the server process's CPU time per delivery (INFO cpu: also reading the commands "
        "and writing the replies); client: the consumers' own CPU per delivery.",
        "",
    ]
    for kind, rows in results.items():
        lines += [
            f"| {kind} | consumers | deliveries/s | vs Streams | server µs | server CPU µs "
            "| client µs |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            low, high = r["vs_streams_range"]
            cpu = r.get("consume_server_cpu_us_per_delivery")  # (not in runs of before it)
            lines.append(
                f"| {r['pattern']} | {r['clients']} | {r['consume_deliveries_per_s']:,.0f} | "
                f"{r['vs_streams']:.2f}x ({low:.2f} to {high:.2f}) | "
                f"{r['consume_server_us_per_delivery']:.2f} | "
                f"{'-' if cpu is None else f'{cpu:.2f}'} | "
                f"{r['consume_client_us_per_delivery']:.2f} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args, messages, rounds = parse_sizes(__doc__, RESULTS / "payload_floor.json", argv)
    results = {kind: run(kind, messages, rounds) for kind in args.servers.split(",")}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    info = {"machine": machine_info("smoke" if args.smoke else "full"), "module": module_info()}
    payload = {"batch": BATCH, "messages": messages, "rounds": rounds, **info, "results": results}
    out.write_text(json.dumps(payload, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(results, rounds) + "\n")
    print(markdown(results, rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
