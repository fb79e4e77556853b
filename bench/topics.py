"""Topics and payload queues beside Redis Streams consumer groups: publish and consume rates.

Batches of 100 on both sides, on a server of our own (persistence off). Publishing runs in
the bench's process; every consume phase runs in a consumer process of its own, started
fresh, as the many-consumer rows do (drained in the bench's own process, the Stream's
consumer ran some 20% slower than in a process of its own, and rotator's did not, which
flattered rotator). Publish: rotator ``Topic.publish_many`` (one Lua call per 100
messages, every group's ring included) vs pipelined XADDs (100 per round trip), and again
with 1000 a call (a pipeline of 1000 XADDs) into a fresh topic and Stream read by the same
groups. Consume: each group drains everything, leasing 100 and acking the previous batch in
the same call (rotator ``next(ack=...)``, which includes the acked elements' cleanup lap) vs
XREADGROUP COUNT 100 + XACK. Server time per message is from INFO commandstats (top-level
commands only, so script sub-commands are not counted twice). A queue with payloads
(``push_payloads`` of 100, then ``next(100, ack=...)``, whose batch acks name their jobs so
that their payloads go) is set beside the Stream read by one group, whose entries carry the
same bodies. Memory once published (MEMORY USAGE, every element): bytes per retained
message, and per entry a group has still to deliver. Each figure is the median of
interleaved rounds, with its range.

    .venv/bin/python -m bench.topics [--messages 20000] [--rounds 3] [--servers redis,valkey]
        [--smoke]
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

from bench.harness import Loop, run_clients, server_cpu_seconds, started
from rotator import Job, Retention, Rotator, Topic

BATCH = 100
PUBLISH_LARGE = 1_000  # the publish rows' second batch size: one call (or pipeline) per 1000
PAYLOAD = b"x" * 64
GROUP_COUNTS = (1, 3, 10)
CLIENTS = 4  # the consumers of the many-client rows, each a process of its own
TOP_LEVEL = ("evalsha", "fcall", "hkeys", "xadd", "xreadgroup", "xack", "xgroup|create", "xgroup")


def server_usec(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in TOP_LEVEL)


# (wall seconds, server usec, client CPU seconds) of a phase
Timing = tuple[float, int, float]


def timed(client: redis.Redis, work: Any) -> Timing:
    """(wall seconds, server usec, this process's CPU seconds) of ``work()``."""
    client.config_resetstat()
    began, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - began, server_usec(client), time.process_time() - cpu


def drained(client: redis.Redis, url: str, loop: Loop, name: str, args: Any = None) -> Timing:
    """(wall seconds, server usec, the consumer's CPU seconds) of one consumer process of its
    own running ``loop`` on ``name`` (see the module's docstring)."""
    client.config_resetstat()
    seconds, cpus = run_clients(loop, url, name, batch=BATCH, clients=1, args=args)
    return seconds, server_usec(client), sum(cpus)


def topic_loop(url: str, name: str, batch: int, groups: int) -> list[float]:
    """One consumer process of topic ``name``: drains its groups g0.. one after another, each
    by next(batch, ack=previous). Returns its CPU seconds in the loop."""
    client = redis.Redis.from_url(url)
    topic = Topic(client, name)
    cpu = time.process_time()
    for group in range(groups):
        drain(topic.group(f"g{group}"))
    used = time.process_time() - cpu
    client.close()
    return [used]


def stream_groups_loop(url: str, name: str, batch: int, groups: int) -> list[float]:
    """One consumer process of Stream ``name``: drains its groups g0.. one after another, each
    by XREADGROUP COUNT batch + XACK. Returns its CPU seconds in the loop."""
    client = redis.Redis.from_url(url)
    cpu = time.process_time()
    for group in range(groups):
        drain_stream_group(client, name, f"g{group}", "c1", batch)
    used = time.process_time() - cpu
    client.close()
    return [used]


def rotator_run(client: redis.Redis, url: str, groups: int, messages: int) -> dict[str, Any]:
    topic = Topic(client, f"bench-topic-{groups}", retention=Retention(count=messages))
    names = [f"g{i}" for i in range(groups)]
    for name in names:
        topic.subscribe(name)

    def publish() -> None:
        for _ in range(0, messages, BATCH):
            topic.publish_many([PAYLOAD] * BATCH)

    published = timed(client, publish)
    # Memory once published, nothing consumed: what each message keeps (its body and log
    # entry) and what each group holds per message it has still to deliver (its ring's id).
    retained = memory_of(client, [topic.keys.bodies, topic.keys.log]) / messages
    waiting = memory_of(client, [topic.keys.group(name).ring for name in names])
    consumed = drained(client, url, topic_loop, topic.name, groups)
    topic.delete()
    large = Topic(client, f"bench-topic-large-{groups}", retention=Retention(count=messages))
    for name in names:
        large.subscribe(name)

    def publish_large() -> None:
        for _ in range(0, messages, PUBLISH_LARGE):
            large.publish_many([PAYLOAD] * PUBLISH_LARGE)

    published_large = timed(client, publish_large)
    large.delete()
    return row(
        "rotator-topic",
        groups,
        messages,
        publish=published,
        consume=consumed,
        memory=(retained, waiting / (messages * groups)),
        publish_large=published_large,
    )


def drain(queue: Rotator) -> None:
    """Leases BATCH, acking the previous batch in the same call, until nothing is left; then
    the last ack and the lap that removes its batch."""
    previous: list[Job] = []
    while jobs := queue.next(BATCH, ack=previous):
        previous = jobs
    queue.ack(*previous)
    queue.next(1)


def memory_of(client: redis.Redis, keys: list[str]) -> int:
    """Bytes the server holds for ``keys`` (``MEMORY USAGE ... SAMPLES 0``: every element)."""
    return sum(int(client.memory_usage(key, samples=0) or 0) for key in keys)


def payload_queue_run(client: redis.Redis, url: str, messages: int) -> dict[str, Any]:
    queue = Rotator(client, "bench-payload-queue", payloads=True)

    def push() -> None:
        for start in range(0, messages, BATCH):
            queue.push_payloads({f"m-{start + i:012d}": PAYLOAD for i in range(BATCH)})

    pushed = timed(client, push)
    # Each pending job: its id in the ring and its payload in the payloads hash.
    kept = memory_of(client, [queue.keys.all[0], queue.keys.payloads]) / messages
    consumed = drained(client, url, payload_queue_loop, queue.name)
    queue.delete()
    return row(
        "rotator-payload-queue",
        1,
        messages,
        publish=pushed,
        consume=consumed,
        memory=(kept, 0.0),
    )


def streams_run(client: redis.Redis, url: str, groups: int, messages: int) -> dict[str, Any]:
    stream = f"bench-stream-{groups}"
    client.delete(stream)
    names = [f"g{i}" for i in range(groups)]
    for name in names:
        client.xgroup_create(stream, name, id="0", mkstream=True)

    def publish(batch: int = BATCH) -> None:
        for _ in range(0, messages, batch):
            pipe = client.pipeline(transaction=False)
            for _ in range(batch):
                pipe.xadd(stream, {"p": PAYLOAD}, maxlen=messages, approximate=True)
            pipe.execute()

    published = timed(client, publish)
    # A Stream keeps each entry once; a group's undelivered entries are only its last id.
    retained = memory_of(client, [stream]) / messages
    consumed = drained(client, url, stream_groups_loop, stream, groups)
    client.delete(stream)
    for name in names:
        client.xgroup_create(stream, name, id="0", mkstream=True)
    published_large = timed(client, lambda: publish(PUBLISH_LARGE))
    client.delete(stream)
    return row(
        "streams",
        groups,
        messages,
        publish=published,
        consume=consumed,
        memory=(retained, 0.0),
        publish_large=published_large,
    )


# -- many consumers: a queue with payloads, and a Stream with bodies read by one group --------


def payload_queue_loop(url: str, name: str, batch: int, _: Any) -> list[float]:
    """One consumer process of a queue with payloads: next(batch, ack=previous) until empty.
    Returns its CPU seconds in the loop."""
    queue = Rotator.from_url(url, name, timeout=300, payloads=True)
    previous: list[Job] = []
    cpu = time.process_time()
    while jobs := queue.next(batch, ack=previous):
        previous = jobs
    queue.ack(*previous)
    used = time.process_time() - cpu
    queue.client.close()
    return [used]


def drain_stream_group(
    client: redis.Redis, stream: str, group: str, consumer: str, batch: int
) -> None:
    """Reads ``stream`` as ``consumer`` of ``group``, XREADGROUP COUNT batch then XACK of
    what it read, until nothing is left."""
    while True:
        reply: Any = client.xreadgroup(group, consumer, {stream: ">"}, count=batch)
        entries = reply[0][1] if reply else []
        if not entries:
            return
        client.xack(stream, group, *[entry_id for entry_id, _ in entries])


def stream_bodies_loop(url: str, name: str, batch: int, _: Any) -> list[float]:
    """One consumer of the Stream's group: XREADGROUP COUNT batch, then XACK, until empty.
    Returns its CPU seconds in the loop."""
    client = redis.Redis.from_url(url)
    cpu = time.process_time()
    drain_stream_group(client, name, "workers", f"c{time.perf_counter_ns()}", batch)
    used = time.process_time() - cpu
    client.close()
    return [used]


def preload_stream(client: redis.Redis, name: str, ids: list[str]) -> None:
    """A Stream of ``ids`` with bodies of PAYLOAD, read by one group, "workers"."""
    for start in range(0, len(ids), 1000):
        pipe = client.pipeline(transaction=False)
        for job_id in ids[start : start + 1000]:
            pipe.xadd(name, {"id": job_id, "p": PAYLOAD})
        pipe.execute()
    client.xgroup_create(name, "workers", id="0")


def preload_payload_queue(client: redis.Redis, name: str, ids: list[str]) -> None:
    queue = Rotator(client, name, payloads=True)
    for start in range(0, len(ids), 1000):
        queue.push_payloads(dict.fromkeys(ids[start : start + 1000], PAYLOAD))


Preload = Callable[[redis.Redis, str, list[str]], None]

# The many-consumer patterns: how each is preloaded, and its consumer loop. bench.payload_floor
# adds the layouts' floors.
MANY: dict[str, tuple[Preload, Loop]] = {
    "rotator-payload-queue": (preload_payload_queue, payload_queue_loop),
    "streams": (preload_stream, stream_bodies_loop),
}


def many_clients_run(
    client: redis.Redis, url: str, pattern: str, messages: int, clients: int = CLIENTS
) -> dict[str, Any]:
    """``clients`` consumer processes of ``pattern`` (one of MANY) drain ``messages``
    preloaded jobs or Stream entries, bodies of PAYLOAD."""
    name = f"bench-many-{pattern}-{time.time_ns()}"
    preload, loop = MANY[pattern]
    preload(client, name, [f"m-{i:012d}" for i in range(messages)])
    client.config_resetstat()
    server_cpu = server_cpu_seconds(client)
    seconds, cpus = run_clients(loop, url, name, batch=BATCH, clients=clients)
    usec = server_usec(client)  # (only the consumers ran since the reset)
    server_cpu = server_cpu_seconds(client) - server_cpu
    client.delete(*client.keys(f"*{name}*"))
    return {
        "pattern": pattern,
        "groups": 1,
        "clients": clients,
        "messages": messages,
        "consume_deliveries_per_s": round(messages / seconds, 1),
        "consume_server_us_per_delivery": round(usec / messages, 2),
        "consume_server_cpu_us_per_delivery": round(server_cpu * 1e6 / messages, 2),
        "consume_client_us_per_delivery": round(sum(cpus) * 1e6 / messages, 2),
    }


FIGURES = (
    "retained_bytes_per_msg",
    "undelivered_bytes_per_entry",
    "publish_msgs_per_s",
    "publish_server_us_per_msg",
    "publish_1000_msgs_per_s",
    "publish_1000_server_us_per_msg",
    "consume_deliveries_per_s",
    "consume_server_us_per_delivery",
    "consume_client_us_per_delivery",
)


def row(
    pattern: str,
    groups: int,
    messages: int,
    *,
    publish: Timing,
    consume: Timing,
    memory: tuple[float, float] | None = None,
    publish_large: Timing | None = None,
) -> dict[str, Any]:
    """One result: ``publish`` and ``consume`` are Timings (of the consume phase, the
    client's CPU per delivery is reported too); ``memory`` (bytes per retained message, per
    undelivered group entry) where measured; ``publish_large`` the publish by PUBLISH_LARGE
    a call, where measured."""
    (publish_s, publish_us, _), (consume_s, consume_us, consume_cpu) = publish, consume
    deliveries = messages * groups
    extra: dict[str, Any] = {}
    if memory is not None:
        extra = {
            "retained_bytes_per_msg": round(memory[0], 1),
            "undelivered_bytes_per_entry": round(memory[1], 1),
        }
    if publish_large is not None:
        large_s, large_us, _ = publish_large
        extra["publish_1000_msgs_per_s"] = round(messages / large_s, 1)
        extra["publish_1000_server_us_per_msg"] = round(large_us / messages, 2)
    return extra | {
        "pattern": pattern,
        "groups": groups,
        "clients": 1,
        "messages": messages,
        "publish_msgs_per_s": round(messages / publish_s, 1),
        "publish_server_us_per_msg": round(publish_us / messages, 2),
        "consume_deliveries_per_s": round(deliveries / consume_s, 1),
        "consume_server_us_per_delivery": round(consume_us / deliveries, 2),
        "consume_client_us_per_delivery": round(consume_cpu * 1e6 / deliveries, 2),
    }


def run(kind: str, messages: int, rounds: int) -> list[dict[str, Any]]:
    """The median of ``rounds`` interleaved rounds of every row, with each round's figures."""
    measured: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as workdir, started(kind, Path(workdir)) as server:
        client = server.client()
        for _ in range(rounds):
            for result in (
                payload_queue_run(client, server.url, messages),
                *(
                    each
                    for groups in GROUP_COUNTS
                    for each in (
                        rotator_run(client, server.url, groups, messages),
                        streams_run(client, server.url, groups, messages),
                    )
                ),
                many_clients_run(client, server.url, "rotator-payload-queue", messages),
                many_clients_run(client, server.url, "streams", messages),
            ):
                key = (result["pattern"], result["groups"], result["clients"])
                measured.setdefault(key, []).append(result)
        client.close()
    return [median_row(results) for results in measured.values()]


def median_row(results: list[dict[str, Any]], fields: tuple[str, ...] = FIGURES) -> dict[str, Any]:
    """The first round's row with each of ``fields`` the median of the rounds', and their
    ranges."""
    merged = dict(results[0], rounds=len(results))
    for field in fields:
        if field not in merged:
            continue
        values = [r[field] for r in results]
        merged[field] = round(statistics.median(values), 2)
        merged[f"{field}_range"] = [min(values), max(values)]
    return merged


def parse_sizes(doc: str | None, out: Path, argv: list[str] | None) -> tuple[Any, int, int]:
    """The options of a consumer benchmark (this one, bench.payload_floor): the parsed
    arguments, the messages and the rounds (--smoke: tiny, one round)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--servers", default="redis,valkey")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check it runs")
    parser.add_argument("--out", default=str(out))
    args = parser.parse_args(argv)
    return args, 500 if args.smoke else args.messages, 1 if args.smoke else args.rounds


def main(argv: list[str] | None = None) -> int:
    out_default = Path(__file__).parent / "results" / "topics.json"
    args, messages, rounds = parse_sizes(__doc__, out_default, argv)
    results = {kind: run(kind, messages, rounds) for kind in args.servers.split(",")}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"batch": BATCH, "results": results}, indent=2) + "\n")
    for kind, rows in results.items():
        for r in rows:
            print(kind, json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
