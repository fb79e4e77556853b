"""Lua VM instructions per module call, by the module's function: where its own Lua goes.

    .venv/bin/python -m bench.lua_steps [--smoke | --quick] [--out DIR] [--table]

``bench.instructions`` counts the whole server and ``bench.server_time`` samples it; neither
says which of the module's functions the interpreter's share is spent in. This runs the
module under lupa (Lua 5.1, as Redis and Valkey embed it) on the test harness's stand-in for
Redis (``tests/lua/harness.py``, cross-checked against real servers by the scenarios),
loaded as a function library and called as FCALL calls it (the chunk once, then the function
it registered), and counts every VM instruction of the measured calls with a debug hook
(``debug.sethook``, a count of 1), by the function it runs in (the line it is defined on).
The stand-in's own Lua (its ``redis.call``, its globals) is left out, so the figure is the
module's Lua alone: exact and repeatable, no server and no clock involved, but it counts VM
instructions, not what each costs (a table look-up or a new string costs more than an
addition; the C functions the module calls, ``string.find`` or ``redis.call``, count as the
one instruction that calls them). Results: ``bench/results/lua_steps.{json,md}``.

Cases, each after a few unmeasured calls on a queue of its own: a worker's one-job call
(``next_packed 1`` carrying the batch ack of the call before: one worker's loop, issue 14's
case), the same with batches of 100, a push of one id, and the claim a consumer blocked on
an idle queue makes when a push of one id wakes it (the calls between, its ack finding the
queue idle and the push, not counted), and a worker of a queue with payloads claiming 100 a
call with the named batch ack of the call before (issue 23's case), and four such workers
taking turns, each acking the batch it claimed a turn ago, and four out of order.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.bounds import job_ids, whole_batch_ack
from bench.harness import machine_info, module_info, standard_main, write_results
from tests.lua.harness import MODULE_CHUNKNAME, MODULE_PATH, Harness

RESULTS = Path(__file__).resolve().parent / "results"
BODY = b"x" * 64  # (a payload, as bench.instructions' payload claims carry)
CALLS = {"smoke": 5, "quick": 50, "full": 200}  # measured calls a case (the count is exact)
WARM_CALLS = 5
LEASE_MS, BUDGET = 60_000, 1000
SHOWN = 12  # functions a case's table lists, the most expensive first

# The hook: every VM instruction of a module function counted by the line it is defined on.
_COUNT_HOOK = """
function(counts, chunkname)
  local getinfo = debug.getinfo
  debug.sethook(function()
    local info = getinfo(2, 'S')
    if info.source == chunkname then
      local at = info.linedefined
      counts[at] = (counts[at] or 0) + 1
    end
  end, '', 1)
end
"""
_FUNCTION_NAME = re.compile(r"function\s+([\w.:]+)\s*\(|(\w+)\s*=\s*function\s*\(")


@dataclass
class Step:
    """One function of the module: where it is defined, and its VM instructions a call."""

    line: int
    name: str
    per_call: float


@dataclass
class Case:
    name: str
    calls: int
    per_call: float  # the module's VM instructions a call, all its functions together
    functions: list[Step]


def function_names() -> dict[int, str]:
    """The name of the function defined on each line of the module (its main chunk: 0)."""
    names = {0: "(the chunk)"}
    for number, line in enumerate(MODULE_PATH.read_text(encoding="utf-8").splitlines(), 1):
        found = _FUNCTION_NAME.search(line)
        if found:
            names[number] = found[1] or found[2]
    return names


def counted(
    harness: Harness, calls: int, call: Callable[[], None], prepare: Prepare = None
) -> dict[int, int]:
    """The module's VM instructions over ``calls`` calls of ``call``, by defining line; the
    calls ``prepare`` makes before each (a case's other calls) are not counted."""
    counts = harness.script.runtime_eval("{}")
    start = harness.script.runtime_eval(_COUNT_HOOK)
    stop = harness.script.runtime_eval("function() debug.sethook() end")
    chunkname = b"@" + MODULE_CHUNKNAME.removeprefix("@").encode()
    try:
        for _ in range(calls):
            if prepare:
                prepare()
            start(counts, chunkname)
            call()
            stop()
    finally:
        stop()
    return {int(line): int(n) for line, n in counts.items()}


Prepare = Callable[[], None] | None  # a case's calls before each counted one, uncounted
Setup = Callable[[Harness, int], tuple[Prepare, Callable[[], None]]]


def worker_loop(batch: int) -> Setup:
    """A worker claiming ``batch`` jobs a call, acking the batch before whole."""

    def setup(harness: Harness, calls: int) -> tuple[Prepare, Callable[[], None]]:
        ids = job_ids((WARM_CALLS + calls + 2) * batch)  # (the ring never runs dry)
        for start in range(0, len(ids), 1000):
            harness.call("push", *ids[start : start + 1000])
        held = [harness.call("next_packed", batch, LEASE_MS, BUDGET, 0)]

        def call() -> None:
            packed = held[0]
            assert isinstance(packed, list), packed
            assert isinstance(packed[3], bytes), packed
            ack = whole_batch_ack(packed[3])
            held[0] = harness.call("next_packed", batch, LEASE_MS, BUDGET, 0, ack)

        return None, call

    return setup


def push_one(harness: Harness, _: int) -> tuple[Prepare, Callable[[], None]]:
    harness.call("push", *job_ids(1000, prefix="old"))
    pushed = iter(job_ids(100_000))

    def call() -> None:
        assert harness.call("push", next(pushed)) == 1

    return None, call


def claim_after_a_wake_up(harness: Harness, _: int) -> tuple[Prepare, Callable[[], None]]:
    """A consumer blocked on an idle queue (bench.wake's): uncounted, the claim carrying the
    batch ack of its last job, which finds the queue idle, and a push of one id; counted,
    the claim that follows the push, acking nothing."""
    pushed = iter(job_ids(100_000))
    harness.call("push", next(pushed))
    held = [harness.call("next_packed", 1, LEASE_MS, BUDGET, 0)]

    def element() -> bytes:
        reply = held[0]
        assert isinstance(reply, list), reply
        assert isinstance(reply[3], bytes), reply
        return reply[3]

    def prepare() -> None:
        idle = harness.call("next_packed", 1, LEASE_MS, BUDGET, 0, whole_batch_ack(element()))
        assert isinstance(idle, list), idle
        assert idle[0] == 1, idle  # (idle: the queue held nothing else)
        harness.call("push", next(pushed))

    def call() -> None:
        held[0] = harness.call("next_packed", 1, LEASE_MS, BUDGET, 0)
        element()

    return prepare, call


def payload_queue(harness: Harness, jobs: int) -> list[str]:
    """A queue with payloads holding ``jobs`` jobs, bodies of BODY: its keys."""
    keys = [*harness.keys, harness.keys[0].removesuffix(":ring") + ":payloads"]
    ids = job_ids(jobs)
    for start in range(0, len(ids), 1000):
        pairs = [half for job_id in ids[start : start + 1000] for half in (job_id, BODY)]
        harness.call_keys(keys, "pushp", *pairs)
    return keys


def payload_loop(harness: Harness, calls: int) -> tuple[Prepare, Callable[[], None]]:
    """A worker of a queue with payloads claiming 100 a call (nextp_packed DROP 1), each
    call carrying the named batch ack of the one before, whose payloads it drops."""
    keys = payload_queue(harness, (WARM_CALLS + calls + 2) * 100)
    held = [harness.call_keys(keys, "nextp_packed", 100, LEASE_MS, BUDGET, 0, 1)]

    def call() -> None:
        reply = held[0]
        assert isinstance(reply, list), reply
        assert isinstance(reply[3], bytes), reply
        held[0] = harness.call_keys(keys, "nextp_packed", 100, LEASE_MS, BUDGET, 0, 1, reply[3])

    return None, call


def payload_turns(harness: Harness, calls: int) -> tuple[Prepare, Callable[[], None]]:
    """Four workers of a queue with payloads taking turns, each claiming 100 a call with the
    named batch ack of the batch it claimed a turn ago (the oldest in flight)."""
    return payload_workers(harness, calls, (0, 1, 2, 3))


def payload_out_of_order(harness: Harness, calls: int) -> tuple[Prepare, Callable[[], None]]:
    """Four such workers out of order: each claims once a round, in an order that changes
    from round to round (OUT_OF_ORDER), so half the named acks are of a batch other than the
    lease list's tail."""
    return payload_workers(harness, calls, OUT_OF_ORDER)


# Four workers' claims out of order (bench.instructions' too): four rounds, each worker once
# a round. (One order repeated would settle into turns: each acking the oldest batch.)
OUT_OF_ORDER = (1, 0, 3, 2, 3, 2, 1, 0, 2, 0, 3, 1, 0, 3, 1, 2)


def payload_workers(
    harness: Harness, calls: int, order: tuple[int, ...]
) -> tuple[Prepare, Callable[[], None]]:
    """Four workers of a queue with payloads claiming 100 a call in ``order``, each with the
    named batch ack of the batch it claimed last."""
    keys = payload_queue(harness, (WARM_CALLS + calls + 5) * 100)
    held = [harness.call_keys(keys, "nextp_packed", 100, LEASE_MS, BUDGET, 0, 1) for _ in range(4)]
    turn = [0]

    def call() -> None:
        worker = order[turn[0] % len(order)]
        reply = held[worker]
        assert isinstance(reply, list), reply
        assert isinstance(reply[3], bytes), reply
        held[worker] = harness.call_keys(
            keys, "nextp_packed", 100, LEASE_MS, BUDGET, 0, 1, reply[3]
        )
        turn[0] += 1

    return None, call


# A case: its name, and what readies a queue for its calls and returns them: the call to
# count, and what goes before each (uncounted).
CASES: list[tuple[str, Setup]] = [
    ("next_packed 1 + batch ack (one worker's loop)", worker_loop(1)),
    ("next_packed 100 + batch ack", worker_loop(100)),
    ("push of one id", push_one),
    ("next_packed 1 after a wake-up (acks nothing; pushed onto the idle queue)",
     claim_after_a_wake_up),
    ("nextp_packed 100 + named batch ack (a worker of a queue with payloads)", payload_loop),
    ("nextp_packed 100 + named batch ack, four workers taking turns", payload_turns),
    ("nextp_packed 100 + named batch ack, four workers out of order", payload_out_of_order),
]  # fmt: skip


def measure(name: str, make: Setup, calls: int) -> Case:
    harness = Harness(f"steps-{len(name)}", library=True)
    prepare, call = make(harness, calls)
    for _ in range(WARM_CALLS):
        if prepare:
            prepare()
        call()
    counts = counted(harness, calls, call, prepare)
    names = function_names()
    steps = sorted(
        (Step(line, names.get(line, "?"), n / calls) for line, n in counts.items()),
        key=lambda step: -step.per_call,
    )
    return Case(name, calls, sum(n for n in counts.values()) / calls, steps)


def run(_: list[str], mode: str, __: Path, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
    data: dict[str, Any] = {
        "machine": machine_info(mode, lua="lupa's Lua 5.1"),
        "module": module_info(),
        "cases": [],
    }
    for name, make in CASES:
        case = measure(name, make, CALLS[mode])
        log(f"{name}: {case.per_call:.0f} VM instructions a call")
        data["cases"].append(asdict(case))
    return write_results(out, "lua_steps", data, markdown)


def markdown(data: dict[str, Any]) -> str:
    module = data["module"]
    lines = [
        "# The module's Lua VM instructions a call, by function (`python -m bench.lua_steps`)",
        "",
        f"{data['machine']['mode']}, {data['machine']['date']}, module {module['commit']}: "
        "lupa's Lua 5.1 on the test harness's stand-in for Redis, the module loaded as a "
        "library; every VM instruction of the measured calls, by the function it runs in.",
    ]
    for case in data["cases"]:
        lines += [
            "",
            f"## {case['name']}: {case['per_call']:.0f} a call ({case['calls']} calls)",
            "",
            "| function | defined at | a call | share |",
            "|---|---:|---:|---:|",
        ]
        for step in case["functions"][:SHOWN]:
            share = step["per_call"] / case["per_call"]
            lines.append(
                f"| `{step['name']}` | {step['line']} | {step['per_call']:.0f} | {share:.0%} |"
            )
        rest = case["functions"][SHOWN:]
        if rest:
            other = sum(step["per_call"] for step in rest)
            lines.append(f"| {len(rest)} others | | {other:.0f} | {other / case['per_call']:.0%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return standard_main(argv, __doc__, RESULTS, "lua_steps", run=run, markdown=markdown)


if __name__ == "__main__":
    sys.exit(main())
