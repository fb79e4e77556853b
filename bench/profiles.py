"""Cost profiles: µs per job against queue length and in-flight count, bytes per job, and how
fast an idle blocked consumer sees a push."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import redis

from bench.harness import Loop, delete_run_keys, percentile, run_clients, server_usec
from bench.patterns import PATTERNS, PRELOAD_CHUNK, job_ids
from rotator import Rotator, Topic
from rotator.commands import decode_next_packed
from rotator.defaults import DEFAULT_BUDGET, DEFAULT_LEASE_TIMEOUT
from rotator.models import Job
from rotator.script import function_name, library_source

STEADY_BATCH = 100


def _steady_state_usec(client: redis.Redis, q: Rotator, jobs: int) -> dict[str, float]:
    """Server µs per job while a producer keeps the ring's length constant: push one batch,
    claim one batch with the previous batch's acks, and so on, laps included."""
    client.config_resetstat()
    began = time.perf_counter()
    finished: list[Job] = []
    fresh = iter(job_ids(jobs + 1000))
    done = 0
    while done < jobs:
        q.push_many([f"new-{next(fresh)}" for _ in range(STEADY_BATCH)])
        finished = q.next(STEADY_BATCH, ack=finished)
        done += len(finished)
    wall = time.perf_counter() - began
    return {
        "server_us_per_job": round(server_usec(client, ("evalsha", "fcall")) / done, 3),
        "wall_us_per_job": round(wall * 1e6 / done, 3),
    }


def queue_length_scaling(
    client: redis.Redis, lengths: list[int], jobs: int
) -> list[dict[str, Any]]:
    rows = []
    for length in lengths:
        q = Rotator(client, f"scale-len-{length}", timeout=600)
        q.delete()
        q.push_many(job_ids(length), chunk=PRELOAD_CHUNK)
        rows.append({"queue_length": length, **_steady_state_usec(client, q, jobs)})
        q.delete()
    return rows


def in_flight_scaling(client: redis.Redis, counts: list[int], jobs: int) -> list[dict[str, Any]]:
    rows = []
    for count in counts:
        q = Rotator(client, f"scale-inflight-{count}", timeout=600)
        q.delete()
        if count:
            q.push_many([f"held-{i:011d}" for i in range(count)], chunk=PRELOAD_CHUNK)
            taken = 0
            while taken < count:  # leased and never acked: young for the whole run
                taken += len(q.next(1000))
        q.push_many(job_ids(1000))
        rows.append({"in_flight": count, **_steady_state_usec(client, q, jobs)})
        q.delete()
    return rows


def memory_per_job(client: redis.Redis, jobs: int) -> dict[str, float]:
    """Bytes per job, 16-byte ids, measured with MEMORY USAGE (all samples)."""
    q = Rotator(client, "memory", timeout=600)
    q.delete()
    q.push_many(job_ids(jobs), chunk=PRELOAD_CHUNK)

    def usage(key: str) -> float:
        return float(client.memory_usage(key, samples=0) or 0) / jobs

    pending = usage(q.keys.ring)
    batches: list[list[Job]] = []
    while sum(map(len, batches)) < jobs:
        batches.append(q.next(1000))
    # Leased jobs live in the lease list, packed: one element per call's batch of up to 1000.
    in_flight = usage(q.keys.ring) + usage(q.keys.leases)
    # Each batch acked as next returned it (what Rotator sends as one batch ack): one mark
    # per batch.
    for batch in batches:
        q.ack(*batch)
    batch_acked = usage(q.keys.all[1]) + usage(q.keys.all[3])
    q.delete()
    # Acked one by one (a client that does not know the batches): a done-set entry per token.
    q.push_many(job_ids(jobs), chunk=PRELOAD_CHUNK)
    leased: list[Job] = []
    while len(leased) < jobs:
        leased.extend(q.next(1000))
    one_by_one = Rotator(client, "memory", timeout=600)
    for start in range(0, jobs, 1000):
        one_by_one.ack(*leased[start : start + 1000])
    done = usage(q.keys.all[1]) + usage(q.keys.all[3])
    q.delete()
    stream = "memory-stream"
    client.delete(stream)
    for start in range(0, jobs, PRELOAD_CHUNK):
        pipe = client.pipeline(transaction=False)
        for job_id in job_ids(jobs)[start : start + PRELOAD_CHUNK]:
            pipe.xadd(stream, {"id": job_id})
        pipe.execute()
    stream_entry = usage(stream)
    client.xgroup_create(stream, "g", id="0")
    while client.xreadgroup("g", "c", {stream: ">"}, count=1000):
        pass
    stream_pending = usage(stream)
    client.delete(stream)
    return {
        "rotator_pending": round(pending, 1),
        "rotator_in_flight": round(in_flight, 1),
        "rotator_acked_awaiting_cleanup": round(batch_acked, 1),
        "rotator_acked_one_by_one_awaiting_cleanup": round(done, 1),
        "stream_entry": round(stream_entry, 1),
        "stream_entry_delivered_pending_ack": round(stream_pending, 1),
    }


# Where one consumer's time goes, per job: the client (redis-py and rotator's Python, and
# the loopback round trip), the script's own Lua time, and the commands it issues. Each run
# is one consumer process of its own (in the bench's own process a loop can run some 20%
# slower or faster than in a fresh one, and not alike for every pattern), and the patterns
# take turns over interleaved rounds, their order turning each round.
CALL_PROFILE_PATTERNS = ("floor", "rotator", "rotator-fcall", "streams")
SCRIPT_COMMANDS = ("evalsha", "fcall")
# Setup and loading, and what the consumer process asks around its loop (connecting, INFO)
NOT_THE_LOOP = (
    "cmdstat_config", "cmdstat_function", "cmdstat_script", "cmdstat_info", "cmdstat_client",
    "cmdstat_hello",
)  # fmt: skip
COST_FIELDS = ("wall_us", "client_cpu_us", "server_cpu_us", "commands_us", "script_own_us",
               "subcommand_us")  # fmt: skip


def _server_cpu(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def profiled_loop(url: str, name: str, batch: int, loop: Loop) -> list[float]:
    """In the consumer's process: runs ``loop`` on ``name``; returns what it cost, [wall s,
    this process's CPU s, the server's CPU s]."""
    client = redis.Redis.from_url(url)
    server_before = _server_cpu(client)
    wall, cpu = time.perf_counter(), time.process_time()
    loop(url, name, batch, None)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    server = _server_cpu(client) - server_before
    client.close()
    return [wall, cpu, server]


def preload_pings(client: redis.Redis, name: str, n: int) -> None:
    client.set(name, n)


def ping_loop(url: str, name: str, batch: int, _: Any) -> list[float]:
    """As many PINGs as ``name`` holds: what any round trip costs before any work (the GET
    that reads the count is one command among them)."""
    client = redis.Redis.from_url(url)
    for _ in range(int(client.get(name) or 0)):
        client.ping()
    client.close()
    return []


def consumer_costs(
    client: redis.Redis,
    url: str,
    pattern: tuple[Callable[[redis.Redis, str, int], None], Loop],
    batch: int,
    jobs: int,
) -> dict[str, float]:
    """µs per job of one consumer process of its own draining ``jobs`` jobs preloaded by
    ``pattern`` (preload, loop) at ``batch``: wall and CPU in that process, the server's CPU,
    and from INFO commandstats the server's command time, split for a script into its own
    Lua time and its sub-commands' (a script's usec includes the commands it calls)."""
    preload, loop = pattern
    name = f"profile-{batch}-{time.time_ns()}"
    preload(client, name, jobs)
    client.config_resetstat()
    _, (wall, cpu, server) = run_clients(profiled_loop, url, name, batch=batch, clients=1,
                                         args=loop)  # fmt: skip
    stats = client.info("commandstats")
    delete_run_keys(client, name)
    usec = {
        key.removeprefix("cmdstat_"): v["usec"] / jobs
        for key, v in stats.items()
        if not key.startswith(NOT_THE_LOOP)
    }
    scripts = sum(usec.get(command, 0.0) for command in SCRIPT_COMMANDS)
    # The loop sends nothing but script calls, whose usec holds their sub-commands'.
    sub = sum(v for k, v in usec.items() if k not in SCRIPT_COMMANDS) if scripts else 0.0
    return {
        "wall_us": round(wall / jobs * 1e6, 2),
        "client_cpu_us": round(cpu / jobs * 1e6, 2),
        "server_cpu_us": round(server / jobs * 1e6, 2),
        "commands_us": round(scripts or sum(usec.values()), 2),
        "script_own_us": round(scripts - sub, 2),
        "subcommand_us": round(sub, 2),
    }


def _ratios(values: list[float], floors: list[float]) -> dict[str, Any]:
    ratios = [round(v / f, 3) for v, f in zip(values, floors, strict=True) if f]
    if not ratios:
        return {"median": None, "range": None}
    return {"median": statistics.median(ratios), "range": [min(ratios), max(ratios)]}


def call_profile(
    client: redis.Redis, url: str, batches: tuple[int, ...], jobs: int, rounds: int
) -> list[dict[str, Any]]:
    """Per job, one consumer in a process of its own (consumer_costs), each pattern in turn
    over ``rounds`` interleaved rounds: the medians of wall µs, client and server CPU µs and
    command time, and each pattern's wall and command time against the floor's, taken within
    each round (median and range). The PING row is what any round trip costs."""
    rows: list[dict[str, Any]] = []
    pings = [consumer_costs(client, url, (preload_pings, ping_loop), 1, jobs)
             for _ in range(rounds)]  # fmt: skip
    rows.append({"pattern": "ping", "batch": 1, "rounds": rounds, **_medians(pings)})
    for batch in batches:
        runs: dict[str, list[dict[str, float]]] = {p: [] for p in CALL_PROFILE_PATTERNS}
        for round_ in range(rounds):
            turn = round_ % len(CALL_PROFILE_PATTERNS)
            for pattern in CALL_PROFILE_PATTERNS[turn:] + CALL_PROFILE_PATTERNS[:turn]:
                runs[pattern].append(consumer_costs(client, url, PATTERNS[pattern], batch, jobs))
        floor = runs["floor"]
        for pattern, costs in runs.items():
            row: dict[str, Any] = {"pattern": pattern, "batch": batch, "rounds": rounds,
                                   **_medians(costs)}  # fmt: skip
            for field in ("wall_us", "commands_us"):
                row[f"{field}_by_round"] = [c[field] for c in costs]
                if pattern != "floor":
                    vs = _ratios(row[f"{field}_by_round"], [c[field] for c in floor])
                    key = field.removesuffix("_us")
                    row[f"{key}_vs_floor"], row[f"{key}_vs_floor_range"] = vs["median"], vs["range"]
            rows.append(row)
    return rows


def _medians(costs: list[dict[str, float]]) -> dict[str, float]:
    return {field: round(statistics.median(c[field] for c in costs), 2) for field in COST_FIELDS}


# Wake latency, side by side: rotator both ways, what any blocking consumer costs on this
# machine (a bare BLPOP), and Streams. Each consumer returns ms from the push (whose payload
# is the producer's CLOCK_MONOTONIC, shared by all processes) to holding the job.


def _rotator_consumer(url: str, name: str, samples: int, out: Any, functions: bool = False) -> None:
    q = Rotator.from_url(url, name, functions=functions)
    latencies: list[float] = []
    out.put("ready")
    while len(latencies) < samples:
        for job in q.next(1, block=5.0):
            latencies.append((time.monotonic_ns() - int(job.id)) / 1e6)
            q.ack(job)
    out.put(latencies)


def _topic_consumer(url: str, name: str, samples: int, out: Any) -> None:
    """A topic's group, woken by a publish (the stamp is the message's body: its id is the
    server's)."""
    topic = Topic(redis.Redis.from_url(url), name, functions=True)
    topic.subscribe("g")
    group = topic.group("g")
    latencies: list[float] = []
    out.put("ready")
    while len(latencies) < samples:
        for job in group.next(1, block=5.0):
            latencies.append((time.monotonic_ns() - int(job.payload or b"0")) / 1e6)
            group.ack(job)
    out.put(latencies)


def _blpop_consumer(url: str, name: str, samples: int, out: Any) -> None:
    client = redis.Redis.from_url(url)
    latencies: list[float] = []
    out.put("ready")
    while len(latencies) < samples:
        popped: Any = client.blpop([name], timeout=5)
        if popped:
            latencies.append((time.monotonic_ns() - int(popped[1])) / 1e6)
    out.put(latencies)


def _streams_consumer(url: str, name: str, samples: int, out: Any) -> None:
    client = redis.Redis.from_url(url)
    client.xgroup_create(name, "workers", id="$", mkstream=True)
    latencies: list[float] = []
    out.put("ready")
    while len(latencies) < samples:
        reply: Any = client.xreadgroup("workers", "c", {name: ">"}, count=1, block=5000)
        for entry_id, fields in reply[0][1] if reply else []:
            latencies.append((time.monotonic_ns() - int(fields[b"id"])) / 1e6)
            client.xack(name, "workers", entry_id)
    out.put(latencies)


# A prototype of a hand-off wake-up (bench/handoff_push.lua, appended to the module's
# library): the push claims its job by the module's own next_packed in the same call and
# hands the packed element to the blocked consumer through a list it BLPOPs.
HANDOFF_FUNCTION = "rotator_handoff_push"
HANDOFF_SOURCE = (Path(__file__).parent / "handoff_push.lua").read_text(encoding="utf-8")
# The bench's own claims' LEASE_MS BUDGET MAX_DELIVERIES, as a Rotator with the defaults sends
# them to next_packed.
CLAIM_HEAD = (round(DEFAULT_LEASE_TIMEOUT * 1000), DEFAULT_BUDGET, 0)


def handoff_library() -> str:
    """The module's library source with the hand-off prototype registered beside it, under
    a library name of its own (so it never replaces the module's)."""
    registered = "redis.register_function(FUNCTION_NAME, main)"
    name = function_name()
    source = library_source().replace(name, f"handoff_{name}")  # (its shebang, FUNCTION_NAME)
    if registered not in source:
        raise RuntimeError("the module no longer registers its function as handoff_library expects")
    return source.replace(registered, f"{registered}\n{HANDOFF_SOURCE}", 1)


def _handoff_list(name: str) -> str:
    return f"rotator:{{{name}}}:handoff"


def _handoff_consumer(url: str, name: str, samples: int, out: Any) -> None:
    q = Rotator.from_url(url, name)
    client = redis.Redis.from_url(url)
    latencies: list[float] = []
    out.put("ready")
    while len(latencies) < samples:
        popped: Any = client.blpop([_handoff_list(name)], timeout=5)
        if popped:
            for job in decode_next_packed([0, -1, 0, popped[1]]).jobs:
                latencies.append((time.monotonic_ns() - int(job.id)) / 1e6)
                q.ack(job)
            # The claim that finds nothing before blocking (where the protocol would register
            # the consumer as a waiter): it takes the acked lease away, as rotator's consumer
            # does before it blocks, so that the next hand-off's claim does not.
            for job in q.next(1):
                raise RuntimeError(f"the hand-off queue held {job.id} after its hand-off")
    out.put(latencies)


def _handoff_push(client: redis.Redis, name: str) -> Callable[[str], Any]:
    client.function_load(handoff_library(), replace=True)
    q = Rotator(client, name)
    keys = [*q.keys.all, _handoff_list(name)]
    return lambda stamp: client.fcall(HANDOFF_FUNCTION, len(keys), *keys, stamp, *CLAIM_HEAD)


# The module's contract, bare (bench/contract_floor.lua), woken as next(block=...) is: the
# push's nine commands, and the one-job loop's eight pipelined behind the consumer's BLPOP
# of the wake list; no logic. What any module keeping this state could do, on this protocol.
CONTRACT_SOURCE = (Path(__file__).parent / "contract_floor.lua").read_text(encoding="utf-8")
CONTRACT_PUSH, CONTRACT_CLAIM = "rotator_contract_push", "rotator_contract_claim"


def _contract_consumer(url: str, name: str, samples: int, out: Any) -> None:
    client = redis.Redis.from_url(url)
    client.function_load(CONTRACT_SOURCE, replace=True)
    keys = Rotator(client, name).keys
    client.rpush(keys.leases, "*0.1.0*seed")  # (the one element the loop's LSET replaces)
    claim = [CONTRACT_CLAIM, len(keys.all), *keys.all, "next_packed", 1, *CLAIM_HEAD]
    latencies: list[float] = []
    out.put("ready")
    while len(latencies) < samples:
        pipe: Any = client.pipeline(transaction=False)
        pipe.blpop([keys.wake], timeout=5)
        pipe.fcall(*claim)
        _, reply = pipe.execute()
        if reply[3]:  # (its stamp is not a real one: the id is read after the last "*")
            latencies.append((time.monotonic_ns() - int(reply[3].rsplit(b"*", 1)[1])) / 1e6)
    out.put(latencies)


def _contract_push(client: redis.Redis, name: str) -> Callable[[str], Any]:
    keys = Rotator(client, name).keys.all
    return lambda stamp: client.fcall(CONTRACT_PUSH, len(keys), *keys, "push", stamp)


# Kinds whose queue (or consumer group) IDLE_CONSUMERS consumers block on at once, as a
# worker pool's do: a push wakes one of them. Each reports (stamp, ms) a job as it gets it,
# and leaves when it gets a STOP job, which the producer pushes once the samples are in.
IDLE_CONSUMERS = 4
STOP = "stop"


def _rotator_pool_consumer(url: str, name: str, out: Any) -> None:
    q = Rotator.from_url(url, name, functions=True)
    out.put("ready")
    while True:
        for job in q.next(1, block=5.0):
            q.ack(job)
            if job.id == STOP:
                return
            out.put((int(job.id), (time.monotonic_ns() - int(job.id)) / 1e6))


def _streams_pool_consumer(url: str, name: str, out: Any) -> None:
    client = redis.Redis.from_url(url)
    with contextlib.suppress(redis.ResponseError):  # (made by the first of the pool)
        client.xgroup_create(name, "workers", id="$", mkstream=True)
    consumer = f"c{os.getpid()}"
    out.put("ready")
    while True:
        reply: Any = client.xreadgroup("workers", consumer, {name: ">"}, count=1, block=5000)
        for entry_id, fields in reply[0][1] if reply else []:
            client.xack(name, "workers", entry_id)
            if fields[b"id"] == STOP.encode():
                return
            stamp = int(fields[b"id"])
            out.put((stamp, (time.monotonic_ns() - stamp) / 1e6))


# Beside rotator-fcall, two kinds that say how far its figure can be read: the same kind again
# with a consumer of its own (an A/A control: two identical kinds land apart by the bench's
# own noise, which the rounds' range does not show), and the same consumer woken by the
# module's push sent as a bare FCALL by redis-py (what the push's Python client adds).
WAKE_CONSUMERS: dict[str, Callable[..., None]] = {
    "rotator": _rotator_consumer,
    "rotator-fcall": partial(_rotator_consumer, functions=True),
    "rotator-fcall-again": partial(_rotator_consumer, functions=True),
    "rotator-fcall-bare-push": partial(_rotator_consumer, functions=True),
    "rotator-fcall-pool": _rotator_pool_consumer,
    "topic-fcall": _topic_consumer,
    "handoff": _handoff_consumer,
    "contract": _contract_consumer,
    "blpop": _blpop_consumer,
    "streams": _streams_consumer,
    "streams-pool": _streams_pool_consumer,
}
POOL_KINDS = frozenset(("rotator-fcall-pool", "streams-pool"))


def _push_for(kind: str, client: redis.Redis, name: str) -> Callable[[str], Any]:
    if kind == "handoff":
        return _handoff_push(client, name)
    if kind == "contract":
        return _contract_push(client, name)
    if kind == "rotator-fcall-bare-push":
        return _bare_push(client, name)
    if kind.startswith("rotator"):
        return Rotator(client, name, functions=kind.startswith("rotator-fcall")).push
    if kind == "topic-fcall":
        return Topic(client, name, functions=True).publish
    if kind == "blpop":
        return lambda stamp: client.lpush(name, stamp)
    return lambda stamp: client.xadd(name, {"id": stamp})


def _bare_push(client: redis.Redis, name: str) -> Callable[[str], Any]:
    """The module's push of one id as a bare FCALL, none of the Python client's code (its
    consumer, a Rotator's, has loaded the library by then)."""
    keys = Rotator(client, name).keys.all
    function = function_name()
    return lambda stamp: client.fcall(function, len(keys), *keys, "push", stamp)


def wake_latency(url: str, samples: int, rounds: int = 5) -> dict[str, dict[str, Any]]:
    """Push -> claim for an idle blocked consumer in its own process: rotator's
    next(block=...) by EVALSHA and by FCALL, a topic's group woken by a publish (by FCALL),
    the hand-off prototype (HANDOFF_FUNCTION), the module's contract, bare (CONTRACT_PUSH,
    CONTRACT_CLAIM), a bare BLPOP (the floor for any blocking consumer on this machine and
    server) and a Streams XREADGROUP BLOCK.

    Two kinds (POOL_KINDS) have IDLE_CONSUMERS consumers, each in its own process, blocked on
    one queue, or in one consumer group, as a worker pool's are: a push wakes one of them.

    All the consumers block at once, and the producer takes them in turn, each push 20 ms
    after the one before (so the server idles 20 ms before each push, and a consumer 20 ms a
    kind), the order turning every cycle: every kind's samples meet the same machine, minute by
    minute, where one kind after another met its own (on this VM the figures moved by 2x
    from one minute to the next). ``samples`` per kind, cut into ``rounds`` consecutive
    rounds; each kind's p50 is also given against the Stream's, round by round: the median
    of the rounds' ratios, with their range.

    Then a shorter pass of the same (WAKE_TIMED wake-ups a kind) with the server's slow log
    taking every command: the server's own time of the push and of the claim that follows the
    wake-up (wake_server_us), apart from the latencies, which logging every command would
    slow."""
    latencies = _wake_cycle(url, samples)
    size = max(1, samples // rounds)
    cuts = [(lo, lo + size) for lo in range(0, samples - size + 1, size)]
    timed = _wake_cycle(url, min(samples, WAKE_TIMED), timed=True)
    results: dict[str, dict[str, Any]] = {}
    for kind in WAKE_CONSUMERS:
        ratios = [
            statistics.median(latencies[kind][lo:hi])
            / statistics.median(latencies["streams"][lo:hi])
            for lo, hi in cuts
        ]
        results[kind] = {
            "p50_ms": percentile(latencies[kind], 50),
            "p99_ms": percentile(latencies[kind], 99),
            "p50_vs_streams": round(statistics.median(ratios), 2),
            "p50_vs_streams_range": [round(min(ratios), 2), round(max(ratios), 2)],
            **timed[kind],
        }
    return results


WAKE_TIMED = 100  # wake-ups a kind in wake_latency's pass with the slow log on
# What a kind's push and claim are called in the slow log: its top-level command, for
# rotator the module's command after the keys (the claim: the first after a push), and for
# the bench's own functions (FCALL) their names.
WAKE_PUSH = {
    "rotator": "push",
    "topic": "tpublish",
    "handoff": HANDOFF_FUNCTION,
    "contract": CONTRACT_PUSH,
    "blpop": "lpush",
    "streams": "xadd",
}
WAKE_CLAIM = {
    "rotator": "next_packed",
    "topic": "nextp_packed",
    "handoff": "blpop",
    "contract": CONTRACT_CLAIM,
    "blpop": "blpop",
    "streams": "xreadgroup",
}
SLOWLOG_SETTINGS = ("slowlog-log-slower-than", "slowlog-max-len")


def _wake_cycle(url: str, samples: int, timed: bool = False) -> dict[str, Any]:
    """wake_latency's cycle: each kind's latencies in ms, or with ``timed``, each kind's
    wake_server_us: the median server µs (the slow log's) of its pushes and of the claims
    that followed them."""
    context = multiprocessing.get_context("spawn")
    client = redis.Redis.from_url(url)
    kinds = list(WAKE_CONSUMERS)
    names = {kind: f"wake-{kind}-{time.time_ns()}" for kind in kinds}
    outs: dict[str, Any] = {kind: context.Queue() for kind in kinds}
    consumers = [
        context.Process(target=consume, args=(url, names[kind], samples, outs[kind]))
        for kind, consume in WAKE_CONSUMERS.items()
        if kind not in POOL_KINDS
    ]
    for kind in POOL_KINDS:
        consumers += [
            context.Process(target=WAKE_CONSUMERS[kind], args=(url, names[kind], outs[kind]))
            for _ in range(IDLE_CONSUMERS)
        ]
    for consumer in consumers:
        consumer.start()
    for kind in kinds:
        for _ in range(IDLE_CONSUMERS if kind in POOL_KINDS else 1):
            outs[kind].get(timeout=60)
    pushes = {kind: _push_for(kind, client, names[kind]) for kind in kinds}
    time.sleep(0.1)  # (every consumer is blocked by now)
    saved = {name: str(client.config_get(name)[name]) for name in SLOWLOG_SETTINGS} if timed else {}
    if timed:
        client.config_set("slowlog-max-len", 100 * samples * len(kinds))
        client.config_set("slowlog-log-slower-than", 0)
        client.slowlog_reset()
    try:
        for i in range(samples):
            for k in range(len(kinds)):
                time.sleep(0.02)
                pushes[kinds[(i + k) % len(kinds)]](str(time.monotonic_ns()))
        latencies = {kind: _wake_samples(kind, outs[kind], samples) for kind in kinds}
        logged = client.slowlog_get(100 * samples * len(kinds)) if timed else []
        for kind in POOL_KINDS:
            for _ in range(IDLE_CONSUMERS):
                pushes[kind](STOP)
    finally:
        for name, value in saved.items():
            client.config_set(name, value)
    for consumer in consumers:
        consumer.join()
    for name in names.values():
        delete_run_keys(client, name)
    if not timed:
        return latencies
    return {kind: {"wake_server_us": _wake_server_us(logged, names[kind], kind)} for kind in kinds}


def _wake_samples(kind: str, out: Any, samples: int) -> list[float]:
    """A kind's latencies in push order: its consumer's list, or a pool's jobs as they came."""
    if kind not in POOL_KINDS:
        latencies: list[float] = out.get(timeout=60)
        return latencies
    stamped = sorted(out.get(timeout=60) for _ in range(samples))
    return [ms for _, ms in stamped]


def _wake_server_us(logged: list[Any], name: str, kind: str) -> dict[str, float | None]:
    """From the slow log's entries (``logged``, newest first), the median µs of a kind's
    pushes and of the claims that followed them, on the keys whose name holds ``name``."""
    family = kind.split("-", maxsplit=1)[0]
    push, claim = WAKE_PUSH[family], WAKE_CLAIM[family]
    pushes: list[int] = []
    claims: list[int] = []
    pushed = False
    for entry in sorted(logged, key=lambda e: e["id"]):
        args = entry["command"].split()
        if not any(name.encode() in arg for arg in args[1:]):
            continue
        command = args[0].decode().lower()
        if family in ("handoff", "contract") and command == "fcall":
            command = args[1].decode()  # (the bench's own function, or the consumer's ack)
        if family in ("rotator", "topic"):
            if command not in ("fcall", "evalsha"):
                continue  # (a command the module called: inside its script's time)
            command = args[3 + int(args[2])].decode().lower()
        if command == push:
            pushes.append(entry["duration"])
            pushed = True
        elif command == claim and pushed:
            claims.append(entry["duration"])
            pushed = False
    return {
        "push": statistics.median(pushes) if pushes else None,
        "claim": statistics.median(claims) if claims else None,
    }
