"""Bounds (issue 22): the slow calls and unbounded structures, before and after, side by side.

    .venv/bin/python -m bench.bounds [--smoke | --quick] [--servers redis,valkey]

``python -m bench`` runs it too, after the other scenarios. On each server (persistence off)
both modules are loaded at once: OLD is ``lua/rotator.lua`` at commit 5b7616c (read with
``git show``), NEW the working tree's. Both are driven with raw EVALSHA calls on the same
KEYS and ARGV (keys from ``rotator.keys``, which the old module accepts too), except where
the new one's client loop is the thing measured (``requeue_dead``). Each step:

- a full collection of the scripts' Lua heap (so no call pays for the set-up's garbage),
  ``SLOWLOG RESET``, ``slowlog-log-slower-than 0`` (off during set-ups), then the measured
  call(s); the figure is the longest EVALSHA in SLOWLOG (server time of one call, in ms);
- ``MEMORY USAGE <key> SAMPLES 0`` of the structure the issue names, where it names memory.

Steps: ``stats`` over deferred jobs; ``tstats`` over groups of deferred jobs; ``next`` with
the largest BUDGET each module accepts over deferred jobs; ``requeue_dead ID`` among 1 KB
dead letters with the wanted one last (and at the old reach, the 10,000th); the revoked
set's memory and the worst call of its trim once every entry is past the fencing window
(scores rewritten, as both modules read them as the ms of revocation); ``tunsubscribe`` of a
group holding a million revoked entries; and the hot path, server us per call of a one-job
``next_packed`` + batch ack loop and of ``next_packed`` 100, by EVALSHA and by FCALL (INFO
commandstats), to show what the new checks cost. Results: ``bench/results/bounds.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from bench.harness import standard_main, started
from rotator import Rotator
from rotator.keys import queue_keys, topic_keys
from rotator.script import module_source

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
OLD_COMMIT = "5b7616c"  # before issue 22's bounds
OLD_MODULE = ROOT / "bench" / "baseline" / f"rotator-{OLD_COMMIT}.lua"  # its lua/rotator.lua
CHUNK = 5000  # ids or tokens per call: both modules' limit
COUNT = 1000  # jobs leased per call: both modules' limit
BUDGET = 1000  # elements visited per call in set-up loops (the new module's most)
OLD_MAX_BUDGET = 10_000
NEW_MAX_BUDGET = 1000
DAY_MS = 86_400_000
GONE_MS = 3 * DAY_MS  # how old the revoked entries are made: past both modules' windows


@dataclass(frozen=True)
class Sizes:
    stats_deferred: int  # deferred jobs under one `stats`
    topic_groups: int  # groups under one `tstats`
    topic_deferred: int  # deferred jobs per group
    next_deferred: int  # deferred jobs the big-BUDGET `next` walks over
    dead_letters: int  # 1 KB dead letters for `requeue_dead ID`
    revoked: int  # revoked entries made by lease and nack rounds
    revoked_jobs: int  # jobs per round
    unsubscribe_revoked: int  # revoked entries in the group `tunsubscribe` deletes
    hot_one: int  # jobs of the one-job loop, per round
    hot_batch: int  # jobs of the next_packed(100) loop, per round
    hot_rounds: int


SIZES = {
    "full": Sizes(300_000, 100, 10_000, 12_000, 25_000, 500_000, 1000, 1_000_000,
                  3000, 100_000, 5),
    "quick": Sizes(50_000, 20, 5000, 12_000, 12_000, 100_000, 1000, 200_000, 1000, 20_000, 2),
    "smoke": Sizes(2000, 3, 300, 1500, 1200, 3000, 200, 5000, 100, 1000, 1),
}  # fmt: skip


# -- the two modules ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Module:
    label: str  # "old" or "new"
    source: str

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode("utf-8")).hexdigest()

    @property
    def function(self) -> str:
        return f"rotator_bounds_{self.label}_{self.sha[:12]}"

    def load(self, client: redis.Redis) -> None:
        client.script_load(self.source)
        name = self.function
        client.function_load(
            f"#!lua name={name}\nlocal FUNCTION_NAME = '{name}'\n{self.source}", replace=True
        )

    def call(self, client: redis.Redis, keys: Sequence[str], *args: Any) -> Any:
        keys = self.own_keys(keys)
        return client.evalsha(self.sha, len(keys), *keys, *args)

    def fcall(self, client: redis.Redis, keys: Sequence[str], *args: Any) -> Any:
        keys = self.own_keys(keys)
        return client.fcall(self.function, len(keys), *keys, *args)

    def own_keys(self, keys: Sequence[str]) -> Sequence[str]:
        """A queue's keys as this module takes them: those of the roles it knows (an older
        module predates the lease list, the schedule or the id index). A topic's own keys pass:
        their number never changed, nor a payload queue's fourteenth (its payloads)."""
        roles = {*self.roles, "payloads"}
        return [key for key in keys if ":topic:" in key or key.rsplit(":", 1)[1] in roles]

    @property
    def roles(self) -> frozenset[str]:
        """The queue key roles the module takes, read from its header's redis-cli example
        (``Q="rotator:{orders}:ring rotator:{orders}:done ..."``), which every version has."""
        found = re.search(r'^\s*Q="([^"]+)"', self.source, re.MULTILINE)
        assert found, f"{self.label}: no Q=... key list in the module's header"
        return frozenset(key.rsplit(":", 1)[1] for key in found[1].split())


def old_source() -> str:
    """The module before the bounds work, kept in bench/baseline (no git history needed)."""
    return OLD_MODULE.read_text(encoding="utf-8")


def modules() -> tuple[Module, Module]:
    return Module("old", old_source()), Module("new", module_source())


# -- measuring ------------------------------------------------------------------------------------


SLOWLOG_LEN = 20_000  # Valkey logs the commands a script issues too


def script_calls_us(client: redis.Redis) -> list[int]:
    """Durations (us) of the module calls in SLOWLOG since the last reset, oldest first."""
    entries = client.slowlog_get(-1)
    if len(entries) >= SLOWLOG_LEN:
        raise RuntimeError("SLOWLOG filled up: raise SLOWLOG_LEN")
    durations = []
    for entry in reversed(entries):
        command = entry["command"]
        text = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
        if text.split(" ", 1)[0].upper() in ("EVALSHA", "FCALL"):
            durations.append(int(entry["duration"]))
    return durations


# A full collection of the scripts' Lua heap. EVAL and EVALSHA share one Lua state, whose
# collector runs in steps inside script calls: after a set-up that made much garbage (the
# helper scripts below make a million strings) the next call would pay for some of it, a few
# ms to tens of ms that belong to no command.
COLLECT_SCRIPT = "collectgarbage('collect') return 0"


def measured(
    client: redis.Redis, work: Callable[..., Any], *args: Any
) -> tuple[Any, dict[str, Any]]:
    """Runs ``work(*args)`` with SLOWLOG on: (its value, the module calls' figures). The Lua
    heap is collected first, so the set-up's garbage is not counted, and SLOWLOG is off
    outside (a log full of the set-up's calls made the first call after SLOWLOG RESET take
    up to 17 ms on Valkey 8, whatever the call)."""
    client.eval(COLLECT_SCRIPT, 0)
    client.slowlog_reset()
    client.config_set("slowlog-log-slower-than", 0)
    try:
        value = work(*args)
    finally:
        client.config_set("slowlog-log-slower-than", -1)
    durations = script_calls_us(client)
    return value, {
        "worst_ms": round(max(durations) / 1000, 2) if durations else None,
        "median_ms": round(statistics.median(durations) / 1000, 2) if durations else None,
        "calls": len(durations),
        "calls_ms": [round(d / 1000, 2) for d in durations[:30]],
    }


def repeated(
    times: int, m: Module, client: redis.Redis, keys: Sequence[str], *args: Any
) -> list[Any]:
    return [m.call(client, keys, *args) for _ in range(times)]


def thrice(m: Module, client: redis.Redis, keys: Sequence[str], *args: Any) -> list[Any]:
    """The same module call three times (the worst of three is less at the mercy of noise)."""
    return repeated(3, m, client, keys, *args)


def memory(client: redis.Redis, key: str) -> int:
    return int(client.memory_usage(key, samples=0) or 0)


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def wait_lazyfree(client: redis.Redis) -> None:
    """Until the background frees (UNLINK, FLUSHALL ASYNC) are done, so no step pays for them."""
    for _ in range(600):
        if int(client.info("memory").get("lazyfree_pending_objects", 0)) == 0:
            return
        time.sleep(0.05)


def fresh(client: redis.Redis) -> None:
    client.flushall()
    wait_lazyfree(client)


# -- set-up through the module ------------------------------------------------------------------


def job_ids(n: int, prefix: str = "job") -> list[str]:
    return [f"{prefix}-{i:012d}" for i in range(n)]


def push_all(m: Module, client: redis.Redis, keys: Sequence[str], ids: list[str]) -> None:
    for start in range(0, len(ids), CHUNK):
        m.call(client, keys, "push", *ids[start : start + CHUNK])


def lease_all(
    m: Module, client: redis.Redis, keys: Sequence[str], n: int, lease_ms: int = 3_600_000
) -> list[bytes]:
    """Leases ``n`` jobs (pending or due) by `next` calls of COUNT 1000; their tokens."""
    tokens: list[bytes] = []
    stalled = 0
    while len(tokens) < n:
        reply = m.call(client, keys, "next", min(COUNT, n - len(tokens)), lease_ms, BUDGET, 0)
        got = reply[3::2]
        tokens.extend(got)
        stalled = 0 if got else stalled + 1
        if stalled > 3:
            raise RuntimeError(f"{m.label}: leased {len(tokens)} of {n}, then nothing")
    return tokens


def nack_all(
    m: Module, client: redis.Redis, keys: Sequence[str], tokens: list[bytes], delay_ms: int
) -> None:
    for start in range(0, len(tokens), CHUNK):
        m.call(client, keys, "nack", delay_ms, *tokens[start : start + CHUNK])


def deferred_queue(
    m: Module, client: redis.Redis, keys: Sequence[str], n: int, delay_ms: int
) -> None:
    """``n`` jobs pushed, leased and nacked with ``delay_ms``: deferred, each with its mark."""
    push_all(m, client, keys, job_ids(n))
    nack_all(m, client, keys, lease_all(m, client, keys, n), delay_ms)


# Rewrites the scores of a sorted set's members ARGV[1]..ARGV[2] (by rank) to ARGV[3]. Scores
# made lower than all the others keep the rest at the ranks that follow, so the caller can go
# on chunk by chunk.
AGE_SCRIPT = """
local members = redis.call('ZRANGE', KEYS[1], ARGV[1], ARGV[2])
for i = 1, #members, 2000 do
  local args = {}
  for j = i, math.min(i + 1999, #members) do
    args[#args + 1] = ARGV[3]
    args[#args + 1] = members[j]
  end
  redis.call('ZADD', KEYS[1], 'XX', unpack(args))
end
return #members
"""

# Adds members ARGV[2] + 1 .. ARGV[2] + ARGV[1] shaped like tokens, scored ARGV[3].
FILL_SCRIPT = """
local n, from, score = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
for i = 1, n, 2000 do
  local args = {}
  for j = i, math.min(i + 1999, n) do
    args[#args + 1] = score
    args[#args + 1] = string.format('job-%012d*%s.2.%s%05d', from + j, score, score, j % 1000)
  end
  redis.call('ZADD', KEYS[1], unpack(args))
end
return n
"""


def age_all(client: redis.Redis, key: str, score: int) -> None:
    total = int(client.zcard(key))
    for start in range(0, total, 50_000):
        client.eval(AGE_SCRIPT, 1, key, start, start + 49_999, score)


def fill_zset(client: redis.Redis, key: str, n: int, score: int) -> None:
    for start in range(0, n, 100_000):
        client.eval(FILL_SCRIPT, 1, key, min(100_000, n - start), start, score)


# -- the steps ------------------------------------------------------------------------------------


def row(step: str, m: Module, figures: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"step": step, "module": m.label, **figures, **extra}


def stats_step(client: redis.Redis, m: Module, sizes: Sizes) -> list[dict[str, Any]]:
    """One queue of deferred jobs; `stats` three times (old: HVALS of the marks hashes)."""
    keys = queue_keys(f"bounds-stats-{m.label}").all
    deferred_queue(m, client, keys, sizes.stats_deferred, 60_000)
    replies, figures = measured(client, thrice, m, client, keys, "stats")
    stats = dict(zip(replies[0][::2], replies[0][1::2], strict=True))
    return [row("stats", m, figures, deferred=int(stats[b"deferred"]))]


def tstats_step(client: redis.Redis, m: Module, sizes: Sizes) -> list[dict[str, Any]]:
    """A topic whose every group holds deferred jobs; `tstats` three times."""
    topic = topic_keys(f"bounds-topic-{m.label}")
    names = [f"g{i:03d}" for i in range(sizes.topic_groups)]
    groups = [topic.group(name).all for name in names]
    for name, keys in zip(names, groups, strict=True):
        m.call(client, (*topic.all, *keys), "tsubscribe", name)
    every = (*topic.all, *(key for keys in groups for key in keys))
    for start in range(0, sizes.topic_deferred, COUNT):
        payloads = [b"m"] * min(COUNT, sizes.topic_deferred - start)
        m.call(client, every, "tpublish", sizes.topic_deferred, 0, *payloads)
    for keys in groups:
        tokens = lease_all(m, client, keys, sizes.topic_deferred)
        nack_all(m, client, keys, tokens, 600_000)
    _, figures = measured(client, thrice, m, client, every, "tstats")
    return [
        row(
            "tstats", m, figures,
            groups=sizes.topic_groups, deferred_per_group=sizes.topic_deferred,
        )
    ]  # fmt: skip


def next_step(client: redis.Redis, m: Module, sizes: Sizes) -> list[dict[str, Any]]:
    """`next` over deferred jobs (broken up into a lease each by sweeps first), at each BUDGET
    (the module's most, and 1,000) as many calls as visit the ring twice (at least three),
    so that lap ends are among them; the new module is also asked for 10,000."""
    keys = queue_keys(f"bounds-next-{m.label}").all
    deferred_queue(m, client, keys, sizes.next_deferred, 3_600_000)
    visited = 0
    while visited < 2 * (sizes.next_deferred + 1):  # every packed batch broken up
        visited += int(m.call(client, keys, "sweep", BUDGET)[0])
    rows = []
    most = OLD_MAX_BUDGET if m.label == "old" else NEW_MAX_BUDGET
    for budget in dict.fromkeys((most, BUDGET)):
        calls = max(3, -(-2 * (sizes.next_deferred + 1) // budget))
        args = ("next", COUNT, 30_000, budget, 0)
        _, figures = measured(client, repeated, calls, m, client, keys, *args)
        rows.append(row("next", m, figures, budget=budget, deferred=sizes.next_deferred))
    if m.label == "new":
        try:
            m.call(client, keys, "next", COUNT, 30_000, OLD_MAX_BUDGET, 0)
            refused = None
        except redis.ResponseError as exc:
            refused = str(exc).split(" script:", 1)[0]
        rows[0]["budget_10000"] = refused or "accepted"
    return rows


def dead_letters(client: redis.Redis, key: str, n: int, now: int) -> list[str]:
    """``n`` dead letters of 1 KB ids (as a walk writes them), oldest first; their ids."""
    ids = [f"dead-{i:08d}-".ljust(1024, "x") for i in range(n)]
    for start in range(0, n, 1000):
        client.rpush(key, *[f"max_deliveries*5*{now}*{i}" for i in ids[start : start + 1000]])
    return ids


def requeue_one(m: Module, client: redis.Redis, name: str, wanted: str) -> int:
    """Old: one raw call (it looks at the first 10,000 letters). New: the client's loop."""
    if m.label == "old":
        return int(m.call(client, queue_keys(name).all, "requeue_dead", 1, wanted))
    return Rotator(client, name).requeue_dead(wanted)


def requeue_step(client: redis.Redis, m: Module, sizes: Sizes) -> list[dict[str, Any]]:
    """`requeue_dead ID` among 1 KB dead letters, the wanted letter last, then the 10,000th
    (as far as the old module looks). Old: one raw call. New: ``Rotator.requeue_dead``, the
    client's loop of `requeue_dead_from` calls."""
    rows = []
    places = dict.fromkeys((sizes.dead_letters, min(OLD_MAX_BUDGET, sizes.dead_letters)))
    name = f"bounds-dead-{m.label}"
    keys = queue_keys(name)
    for place in places:
        fresh(client)
        push_all(m, client, keys.all, ["seed"])  # the queue exists (meta, ring)
        ids = dead_letters(client, keys.dead, sizes.dead_letters, server_ms(client))
        dead_bytes = memory(client, keys.dead)
        requeued, figures = measured(client, requeue_one, m, client, name, ids[place - 1])
        rows.append(
            row(
                "requeue_dead", m, figures,
                letters=sizes.dead_letters, wanted_at=place, found=int(requeued) == 1,
                dead_memory_bytes=dead_bytes,
            )
        )  # fmt: skip
    return rows


def revoked_step(client: redis.Redis, m: Module, sizes: Sizes) -> list[dict[str, Any]]:
    """The revoked set after lease-and-nack rounds (every nack revokes a token), its memory;
    then every entry made older than both windows and `next`(100) + `nack` cycles until a
    whole lap has passed: the worst call is the trim (old: one ZREMRANGEBYSCORE at the lap's
    end; new: at most what the call added + 1000 per call)."""
    keys = queue_keys(f"bounds-revoked-{m.label}").all
    revoked = keys[5]
    jobs = sizes.revoked_jobs
    push_all(m, client, keys, job_ids(jobs))
    while int(client.zcard(revoked)) < sizes.revoked:
        nack_all(m, client, keys, lease_all(m, client, keys, jobs), 0)
    entries = int(client.zcard(revoked))
    size = memory(client, revoked)
    age_all(client, revoked, server_ms(client) - GONE_MS)

    def cycles() -> int:
        calls = 0
        for _ in range(2 * jobs // 100 + 2):  # each job visited at least once: a lap ends
            reply = m.call(client, keys, "next", 100, 3_600_000, BUDGET, 0)
            tokens = reply[3::2]
            if tokens:
                m.call(client, keys, "nack", 0, *tokens)
            calls += 1 + bool(tokens)
        return calls

    _, figures = measured(client, cycles)
    return [
        row(
            "revoked_trim", m, figures,
            entries=entries, memory_bytes=size, bytes_per_entry=round(size / entries, 1),
            entries_after=int(client.zcard(revoked)),
        )
    ]  # fmt: skip


def unsubscribe_step(client: redis.Redis, m: Module, sizes: Sizes) -> list[dict[str, Any]]:
    """`tunsubscribe` of a group whose revoked set holds many entries (old: DEL; new: UNLINK)."""
    topic = topic_keys(f"bounds-unsub-{m.label}")
    group = topic.group("g")
    keys = (*topic.all, *group.all)
    m.call(client, keys, "tsubscribe", "g")
    revoked = group.all[5]
    fill_zset(client, revoked, sizes.unsubscribe_revoked, server_ms(client))
    size = memory(client, revoked)
    _, figures = measured(client, lambda: m.call(client, keys, "tunsubscribe", "g"))
    gone = not client.exists(revoked)
    wait_lazyfree(client)
    lazy = client.config_get("lazyfree-lazy-user-del").get("lazyfree-lazy-user-del")
    return [
        row(
            "tunsubscribe", m, figures,
            revoked=sizes.unsubscribe_revoked, memory_bytes=size, deleted=gone,
            lazyfree_lazy_user_del=lazy,
        )
    ]  # fmt: skip


def whole_batch_ack(packed: bytes) -> bytes:
    """The batch ack of a packed element's whole batch, as the Python client sends it."""
    return packed[: packed.index(b"*", 1)] + b"/%d" % (packed.count(b"*") - 1)


def hot_loop(
    m: Module, client: redis.Redis, name: str, *, batch: int, jobs: int, via: str
) -> dict[str, Any]:
    """Consumes ``jobs`` by next_packed(``batch``), each call acking the previous batch whole
    (the Python client's loop); server us per call from INFO commandstats, and the commands
    the module issued per call."""
    keys = queue_keys(name).all
    push_all(m, client, keys, job_ids(jobs))
    call = m.call if via == "evalsha" else m.fcall
    client.config_resetstat()
    ack: list[bytes] = []
    while True:
        packed = call(client, keys, "next_packed", batch, 30_000, BUDGET, 0, *ack)[3]
        if not packed:
            break
        ack = [whole_batch_ack(packed)]
    stats = client.info("commandstats")
    calls = int(stats.get(f"cmdstat_{via}", {}).get("calls", 0))
    usec = int(stats.get(f"cmdstat_{via}", {}).get("usec", 0))
    issued = {
        name.removeprefix("cmdstat_"): round(int(value["calls"]) / calls, 2)
        for name, value in sorted(stats.items())
        if name not in (f"cmdstat_{via}",) and not name.startswith("cmdstat_config")
    }
    client.delete(*keys)
    return {"calls": calls, "usec": usec, "issued": issued}


def hot_step(
    client: redis.Redis, pair: tuple[Module, Module], sizes: Sizes
) -> list[dict[str, Any]]:
    """The one-job and 100-job loops, old and new interleaved in rounds; the median us/call."""
    samples: dict[tuple[str, str, int], list[float]] = {}
    issued: dict[tuple[str, str, int], dict[str, float]] = {}
    for round_ in range(sizes.hot_rounds):
        for via in ("evalsha", "fcall"):
            for batch, jobs in ((1, sizes.hot_one), (100, sizes.hot_batch)):
                for m in pair:
                    name = f"bounds-hot-{m.label}-{via}-{batch}-{round_}"
                    stat = hot_loop(m, client, name, batch=batch, jobs=jobs, via=via)
                    key = (m.label, via, batch)
                    samples.setdefault(key, []).append(stat["usec"] / stat["calls"])
                    issued[key] = stat["issued"]
    rows = []
    for (label, via, batch), values in samples.items():
        median = statistics.median(values)
        rows.append(
            {
                "step": "hot_path", "module": label, "via": via, "batch": batch,
                "us_per_call": round(median, 1), "us_per_job": round(median / batch, 2),
                "us_per_call_by_round": [round(v, 1) for v in values],
                "commands_per_call": round(sum(issued[label, via, batch].values()), 2),
                "issued_per_call": issued[label, via, batch],
            }
        )  # fmt: skip
    return rows


STEPS: tuple[tuple[str, Callable[[redis.Redis, Module, Sizes], list[dict[str, Any]]]], ...] = (
    ("stats", stats_step),
    ("tstats", tstats_step),
    ("next", next_step),
    ("requeue_dead", requeue_step),
    ("revoked_trim", revoked_step),
    ("tunsubscribe", unsubscribe_step),
)


def describe(r: dict[str, Any]) -> str:
    if r["step"] == "hot_path":
        return (
            f"  bounds hot_path {r['module']} {r['via']:<7} batch {r['batch']:>3}: "
            f"{r['us_per_call']:.1f} us/call"
        )
    text = f"  bounds {r['step']:<13} {r['module']}: worst {r['worst_ms']} ms in {r['calls']} calls"
    for key in ("budget", "wanted_at", "found", "memory_bytes", "dead_memory_bytes"):
        if key in r:
            text += f", {key} {r[key]}"
    return text


# -- the table ------------------------------------------------------------------------------------


def _cell(rows: list[dict[str, Any]], step: str, module: str, **match: Any) -> str:
    found = [
        r
        for r in rows
        if r["step"] == step
        and r["module"] == module
        and all(r.get(key) == value for key, value in match.items())
    ]
    if not found:
        return "-"
    r = found[0]
    if step == "hot_path":
        return f"{r['us_per_call']:.0f} us"
    text = f"{r['worst_ms']:.1f} ms"
    if step == "requeue_dead":
        text += f" ({r['calls']} call{'s' if r['calls'] > 1 else ''}"
        text += ", found)" if r["found"] else ", not found)"
    if step == "next":
        text += f" (BUDGET {r['budget']:,})"
    return text


def _memory(rows: list[dict[str, Any]], step: str, module: str, field: str) -> str:
    r = next((r for r in rows if r["step"] == step and r["module"] == module), None)
    if r is None:
        return "-"
    per = f", {r['bytes_per_entry']:.0f} B each" if "bytes_per_entry" in r else ""
    return f"{r[field] / 2**20:.1f} MiB{per}"


def markdown(data: dict[str, Any]) -> str:
    """The README's table: the worst call (ms of server time) and memory, old vs new."""
    sizes = data["sizes"]
    kinds = list(data["results"])
    head = "| | " + " | ".join(
        f"{kind} {data['results'][kind]['version']} {m}" for kind in kinds for m in ("old", "new")
    )
    lines = [head + " |", "|---|" + "---:|" * (2 * len(kinds))]
    dead, groups = sizes["dead_letters"], sizes["topic_groups"]
    specs: list[tuple[str, Callable[[list[dict[str, Any]], str], str]]] = [
        (f"`stats`, {sizes['stats_deferred']:,} deferred", lambda r, m: _cell(r, "stats", m)),
        (
            f"`tstats`, {groups} groups x {sizes['topic_deferred']:,} deferred",
            lambda r, m: _cell(r, "tstats", m),
        ),
        (
            f"`next` at its largest BUDGET, {sizes['next_deferred']:,} deferred",
            lambda r, m: _cell(r, "next", m, budget=OLD_MAX_BUDGET if m == "old" else BUDGET),
        ),
        (
            f"`requeue_dead ID`, {dead:,} letters of 1 KB, the id last",
            lambda r, m: _cell(r, "requeue_dead", m, wanted_at=dead),
        ),
        (
            f"`requeue_dead ID`, the id {min(dead, OLD_MAX_BUDGET):,}th",
            lambda r, m: _cell(r, "requeue_dead", m, wanted_at=min(dead, OLD_MAX_BUDGET)),
        ),
        (
            f"revoked set of {sizes['revoked']:,}: memory",
            lambda r, m: _memory(r, "revoked_trim", m, "memory_bytes"),
        ),
        (
            "its trim, once past the window (worst call)",
            lambda r, m: _cell(r, "revoked_trim", m),
        ),
        (
            f"`tunsubscribe`, {sizes['unsubscribe_revoked']:,} revoked",
            lambda r, m: _cell(r, "tunsubscribe", m),
        ),
        (
            "hot path: `next_packed` 1 + batch ack, EVALSHA / FCALL (us per call)",
            lambda r, m: (
                _cell(r, "hot_path", m, via="evalsha", batch=1)
                + " / "
                + _cell(r, "hot_path", m, via="fcall", batch=1)
            ),
        ),
        (
            "hot path: `next_packed` 100 + batch ack, EVALSHA / FCALL",
            lambda r, m: (
                _cell(r, "hot_path", m, via="evalsha", batch=100)
                + " / "
                + _cell(r, "hot_path", m, via="fcall", batch=100)
            ),
        ),
    ]
    for label, cell in specs:
        cells = [cell(data["results"][kind]["rows"], m) for kind in kinds for m in ("old", "new")]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_server(
    kind: str, pair: tuple[Module, Module], sizes: Sizes, workdir: Path, log: Any
) -> dict[str, Any]:
    with started(kind, workdir / f"bounds-{kind}") as server:
        client = server.client()
        client.config_set("slowlog-log-slower-than", -1)  # on only while measuring
        client.config_set("slowlog-max-len", SLOWLOG_LEN)
        log(f"bounds on {kind} {server.version}")
        rows: list[dict[str, Any]] = []
        for _, step in STEPS:
            for m in pair:
                fresh(client)
                began = time.perf_counter()
                m.load(client)
                for r in step(client, m, sizes):
                    r["seconds"] = round(time.perf_counter() - began, 1)
                    log(describe(r))
                    rows.append(r)
        fresh(client)
        for m in pair:
            m.load(client)
        for r in hot_step(client, pair, sizes):
            log(describe(r))
            rows.append(r)
        fresh(client)
        client.close()
        return {"version": server.version, "rows": rows}


def run(kinds: Sequence[str], mode: str, workdir: Path, out: Path, log: Any) -> dict[str, Any]:
    """Measures every step on each server in ``kinds`` and writes ``out / bounds.json``."""
    sizes = SIZES[mode]
    pair = modules()
    data: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "mode": mode,
            "date": time.strftime("%Y-%m-%d"),
        },
        "modules": {
            "old": f"bench/baseline: {OLD_COMMIT}'s lua/rotator.lua (sha1 {pair[0].sha})",
            "new": f"lua/rotator.lua (sha1 {pair[1].sha})",
        },
        "sizes": asdict(sizes),
        "results": {kind: run_server(kind, pair, sizes, workdir, log) for kind in kinds},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "bounds.json").write_text(json.dumps(data, indent=2) + "\n")
    return data


def main(argv: list[str] | None = None) -> int:
    return standard_main(argv, __doc__, RESULTS, "bounds", run=run, markdown=markdown)


if __name__ == "__main__":
    sys.exit(main())
