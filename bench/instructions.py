"""Instructions per module call, counted under valgrind's callgrind: the module's server work
measured the same way on a noisy machine, to compare two versions of the module.

    .venv/bin/python -m bench.instructions [--smoke | --quick] [--servers redis,valkey]
        [--before COMMIT_OR_FILE] [--table]

On this 2-core VM the server time of one call moves by 10-20% from minute to minute (other
tenants, frequency), more than most changes to the module are worth; an instruction count
moves by about 1%. Each server runs under ``valgrind --tool=callgrind`` (some 50 times
slower: the counts are the measure here, never the time), with both modules loaded: BEFORE
(``--before``: a commit, whose ``lua/rotator.lua`` git shows, or a file; by default the
module before issue 22, ``bench/baseline/rotator-5b7616c.lua``, which needs no git history)
and NOW, the working tree's. Both are driven with the same raw calls (bench.bounds' Module:
keys from ``rotator.keys``, less the roles an older module does not know). A case runs its
calls on a queue of its own after a few unmeasured ones; callgrind's counters are zeroed
before the measured calls (``callgrind_control -z``) and dumped after (``-d``), and the
total, divided by the number of calls, is the figure. It counts the whole server: reading
the command, the script, the commands it calls, the reply, and whatever else the server did
meanwhile (its cron runs at 10 Hz: a few thousand instructions a second, spread over the
calls). Rounds alternate the two modules; the median of the rounds is given with their
range. Results: ``bench/results/instructions.{json,md}``.

Cases, each by FCALL and by EVALSHA: a worker's one-job call (``next_packed 1`` carrying the
batch ack of the call before, the Python client's loop), the same with batches of 100, and a
push of one id onto a busy queue (nobody blocked: its wake list full). By FCALL only (the
default mode), where both modules have it: a payload queue's claim of 100 (``nextp_packed 100
DROP 1`` carrying the named batch ack of the call before: the packed element, whose payloads
it drops), bodies of 64 bytes, for one worker, for four taking turns (each acking the
batch it claimed a turn ago) and for four out of order (each once a round, in an order that
changes from round to round: ``bench.lua_steps.OUT_OF_ORDER``); and a blocked consumer's
cycle on an idle queue, less its ``BLPOP`` (a push of one id, the claim that follows it,
and the claim carrying its batch ack that finds the queue idle again: ``bench.wake``'s calls,
counted warm), a cycle as a call. And in each round, the pattern's floor (``bench/floor.lua`` by
EVALSHA, one job a call with the call before's token acked, as ``bench.profiles`` runs it),
against which the one-job cases are given too: the ratio issue 14's server-time target is
about, in counts that do not move with the machine; the one-job claim by FCALL also against
the module's contract, bare (``bench/contract_floor.lua``: the loop's seven commands on a
queue's thirteen keys with next_packed's arguments, and no logic), which splits what is left
into what the contract costs and what the module's Lua does, and the push by FCALL against
the push's contract, bare (the same library: its eight commands, no logic); and, where the
payload case runs, its
layout's floor (``bench/payload_floor.lua``, layout ``hash``, 100 a claim) and a Stream read by
one group (``XREADGROUP COUNT 100`` and the ``XACK`` of its entries), per 100 deliveries.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import redis

from bench.bounds import OLD_MODULE, Module, job_ids, push_all, whole_batch_ack
from bench.harness import (
    ROOT,
    machine_info,
    module_info,
    size_mode,
    sized_parser,
    write_results,
)
from bench.lua_steps import OUT_OF_ORDER
from bench.patterns import FLOOR_SCRIPT, preload_floor
from bench.payload_floor import FLOOR_SCRIPT as PAYLOAD_FLOOR_SCRIPT
from bench.payload_floor import floor_keys
from bench.payload_floor import preload_floor as preload_payload_floor
from bench.topics import preload_stream
from rotator.keys import queue_keys
from rotator.script import module_source
from tests.servers import ServerProcess

RESULTS = Path(__file__).resolve().parent / "results"
CONTRACT_SCRIPT = (RESULTS.parent / "contract_floor.lua").read_text(encoding="utf-8")
LEASE_MS = 30_000
BUDGET = 1000
WARM_CALLS = 20  # unmeasured calls first: the first defines what a library keeps


@dataclass(frozen=True)
class Sizes:
    rounds: int
    calls: int  # measured calls per case and round


SIZES = {"full": Sizes(5, 300), "quick": Sizes(3, 150), "smoke": Sizes(1, 10)}


@dataclass(frozen=True)
class Case:
    name: str
    via: str  # "fcall" or "evalsha"
    batch: int  # jobs per claim; 0: a push of one id
    payloads: bool = False  # a payload queue's claim (nextp_packed DROP 1), its acks named
    wake: bool = False  # a blocked consumer's cycle (wake_cycles), counted a cycle
    workers: int = 1  # a payload case's workers taking turns, each acking its batch before
    out_of_order: bool = False  # the workers' claims in lua_steps.OUT_OF_ORDER, not in turn


CASES = (
    *(
        Case(f"{what} by {via.upper()}", via, batch)
        for batch, what in ((1, "next_packed 1 + batch ack"), (100, "next_packed 100 + batch ack"),
                            (0, "push of one id, wake list full"))
        for via in ("fcall", "evalsha")
    ),
    Case("nextp_packed 100 + named batch ack by FCALL", "fcall", 100, payloads=True),
    Case("nextp_packed 100 + named batch ack, four workers taking turns, by FCALL", "fcall",
         100, payloads=True, workers=4),
    Case("nextp_packed 100 + named batch ack, four workers out of order, by FCALL", "fcall",
         100, payloads=True, workers=4, out_of_order=True),
    Case("a wake-up's cycle (push onto an idle queue, its claim, the ack finding it idle) by "
         "FCALL", "fcall", 1, wake=True),
)  # fmt: skip
BODY = b"x" * 64  # a payload queue's bodies (as bench.topics' PAYLOAD)
# What the module's cases are held against (each counted in every round): the pattern's floor
# for the one-job cases; for the payload case, its layout's floor and a Stream.
FLOOR, CONTRACT, PUSH_CONTRACT, PAYLOAD_FLOOR, STREAM = (
    "the floor: one job + ack (bench/floor.lua by EVALSHA)",
    "the contract, bare: the loop's 7 commands on 13 keys, no logic (bench/contract_floor.lua)",
    "the push's contract, bare: its 8 commands on 13 keys, no logic (bench/contract_floor.lua)",
    "the payload floor: 100 + ack (bench/payload_floor.lua, hash layout, by EVALSHA)",
    "a Stream: XREADGROUP COUNT 100 + XACK of the 100 (one group, bodies of 64 bytes)",
)
Figure_co = TypeVar("Figure_co", covariant=True)
Figure = TypeVar("Figure")  # (what a case driver returns: its meter's figure)


class Meter(Protocol[Figure_co]):
    """What measures a server's work for the case drivers below: callgrind's counts here
    (Counted), perf's samples of its time in bench.server_time."""

    @property
    def client(self) -> redis.Redis: ...

    def per_call(
        self, run: Callable[[int], object], calls: int, keys: Sequence[str]
    ) -> Figure_co: ...


def valgrind_command() -> list[str]:
    """callgrind, or a failure that says how to install it."""
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        raise SystemExit(
            "bench.instructions needs valgrind (callgrind): sudo apt-get install -y valgrind"
        )
    return ["valgrind", "--tool=callgrind", "--quiet"]


def module_at(before: str) -> str:
    """The source of ``before``: a file, or a commit's lua/rotator.lua."""
    path = Path(before)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    shown = subprocess.run(
        ["git", "show", f"{before}:lua/rotator.lua"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if shown.returncode != 0:
        raise SystemExit(f"--before {before}: no such file, and git cannot show it: {shown.stderr}")
    return shown.stdout


class Watched:
    """A server that a tool measures from outside (callgrind here, perf in
    bench.server_time): a client of it, and its process id."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self._client = redis.Redis(port=server.port, socket_timeout=120)
        self.pid = str(self._client.info("server")["process_id"])

    @property
    def client(self) -> redis.Redis:
        return self._client


class Counted(Watched):
    """A server under callgrind, and how many instructions it ran during a piece of work."""

    def __init__(self, server: ServerProcess, dumps: Path) -> None:
        super().__init__(server)
        self.dumps = dumps

    def instructions(self, work: Callable[[], object]) -> int:
        for old in glob.glob(str(self.dumps / "callgrind.out.*")):
            os.remove(old)
        subprocess.run(["callgrind_control", "-z", self.pid], capture_output=True, check=True)
        work()
        subprocess.run(["callgrind_control", "-d", self.pid], capture_output=True, check=True)
        for _ in range(100):  # (the dump is written by the server's process, soon after)
            found = sorted(glob.glob(str(self.dumps / "callgrind.out.*")), key=os.path.getmtime)
            total = callgrind_total(Path(found[-1]).read_text()) if found else None
            if total is not None:
                return total
            time.sleep(0.05)
        raise RuntimeError("callgrind wrote no dump")

    def per_call(self, run: Callable[[int], object], calls: int, keys: Sequence[str]) -> float:
        """Instructions per call of ``run(n)``, which makes ``n`` calls: ``WARM_CALLS`` of them
        first, not counted (the first defines what a library keeps), then ``calls`` counted;
        ``keys`` deleted after."""
        run(WARM_CALLS)
        total = self.instructions(lambda: run(calls))
        self.client.delete(*keys)
        return total / calls


def callgrind_total(dump: str) -> int | None:
    """The instructions a callgrind dump counted in all (None: not written whole yet)."""
    total = re.search(r"^(?:summary|totals):\s+(\d+)", dump, re.MULTILINE)
    return int(total[1]) if total else None


@contextmanager
def counted_server(kind: str, workdir: Path) -> Iterator[Counted]:
    dumps = workdir / "callgrind"
    dumps.mkdir(parents=True, exist_ok=True)
    wrapper = [*valgrind_command(), f"--callgrind-out-file={dumps}/callgrind.out.%p"]
    with ServerProcess(kind, workdir, wrapper=wrapper) as server:  # type: ignore[arg-type]
        yield Counted(server, dumps)


def per_call(meter: Meter[Figure], module: Module, case: Case, calls: int, tag: str) -> Figure:
    """``meter``'s figure per call of ``case`` by ``module`` (``calls`` of them)."""
    if case.payloads:
        return payload_claims(meter, module, case, calls, tag)
    if case.wake:
        return wake_cycles(meter, module, calls, tag)
    client = meter.client
    keys = queue_keys(f"instructions-{module.label}-{case.via}-{case.batch}-{tag}").all
    call = module.call if case.via == "evalsha" else module.fcall
    if case.batch == 0:
        pushed = iter(job_ids(WARM_CALLS + calls))

        def pushes(n: int) -> None:  # (the first 17 fill the wake list: nobody is blocked)
            for _ in range(n):
                call(client, keys, "push", next(pushed))

        return meter.per_call(pushes, calls, keys)
    push_all(module, client, keys, job_ids((WARM_CALLS + calls + 1) * case.batch))
    ack: list[bytes] = []

    def claims(n: int) -> None:
        nonlocal ack
        for _ in range(n):
            packed = call(client, keys, "next_packed", case.batch, LEASE_MS, BUDGET, 0, *ack)[3]
            ack = [whole_batch_ack(packed)]

    return meter.per_call(claims, calls, keys)


def wake_cycles(meter: Meter[Figure], module: Module, calls: int, tag: str) -> Figure:
    """``meter``'s figure per cycle of a consumer blocked on an idle queue, by FCALL (as
    bench.wake's consumer makes it, less the BLPOP): a push of one id onto the idle queue,
    the claim of one job that follows it (acking nothing), and the claim carrying that
    job's batch ack, which finds the queue idle again."""
    client = meter.client
    keys = queue_keys(f"instructions-{module.label}-wake-{tag}").all
    pushed = iter(job_ids(WARM_CALLS + calls + 1))
    module.fcall(client, keys, "push", next(pushed))
    held = module.fcall(client, keys, "next_packed", 1, LEASE_MS, BUDGET, 0)[3]

    def cycles(n: int) -> None:
        nonlocal held
        for _ in range(n):
            idle = module.fcall(client, keys, "next_packed", 1, LEASE_MS, BUDGET, 0,
                                whole_batch_ack(held))  # fmt: skip
            assert idle[0] == 1, idle  # (idle: the queue held nothing else)
            module.fcall(client, keys, "push", next(pushed))
            held = module.fcall(client, keys, "next_packed", 1, LEASE_MS, BUDGET, 0)[3]

    return meter.per_call(cycles, calls, keys)


def payload_claims(
    meter: Meter[Figure], module: Module, case: Case, calls: int, tag: str
) -> Figure:
    """``meter``'s figure per payload claim of ``case.batch`` jobs, each carrying the named
    batch ack of the claim before (the Python client's loop on a payload queue); with
    ``case.workers`` of them taking turns, of the claim its worker made a turn ago (or four
    out of order: ``case.out_of_order``)."""
    client = meter.client
    names = queue_keys(f"instructions-{module.label}-payloads-{case.batch}-{tag}")
    keys = [*names.all, names.payloads]
    ids = job_ids((WARM_CALLS + calls + case.workers) * case.batch)
    for start in range(0, len(ids), 1000):
        pairs = [half for job_id in ids[start : start + 1000] for half in (job_id, BODY)]
        module.fcall(client, keys, "pushp", *pairs)
    acks: list[list[bytes]] = [[] for _ in range(case.workers)]
    turn = 0

    def claims(n: int) -> None:
        nonlocal turn
        for _ in range(n):
            worker = turn % case.workers
            if case.out_of_order:
                worker = OUT_OF_ORDER[turn % len(OUT_OF_ORDER)]
            turn += 1
            reply = module.fcall(client, keys, "nextp_packed", case.batch, LEASE_MS, BUDGET, 0, 1,
                                 *acks[worker])  # fmt: skip
            acks[worker] = [reply[3]]  # (the named batch ack: the packed element itself)

    return meter.per_call(claims, calls, keys)


def floor_per_call(meter: Meter[Figure], calls: int, tag: str) -> Figure:
    """``meter``'s figure per call of the pattern's floor (bench/floor.lua by EVALSHA, as
    bench.profiles calls it): one job a call, the token of the call before acked, on a ring
    preloaded as its steady state has it (from the tail: an acked lease, then a pending id)."""
    client, name = meter.client, f"instructions-floor-{tag}"
    keys = (name, f"{name}:done")
    preload_floor(client, name, WARM_CALLS + calls + 1)
    sha = client.script_load(FLOOR_SCRIPT)
    tokens: list[bytes] = []

    def calls_of(n: int) -> None:
        nonlocal tokens
        for _ in range(n):
            tokens = client.evalsha(sha, 2, *keys, LEASE_MS, 1, *tokens)

    return meter.per_call(calls_of, calls, keys)


def contract_per_call(meter: Meter[Figure], calls: int, tag: str) -> Figure:
    """``meter``'s figure per call of the module's contract, bare (bench/contract_floor.lua by
    FCALL, as the module is called in a worker's one-job loop): its seven commands on a
    queue's thirteen keys, with next_packed's arguments and a batch ack, and no logic."""
    client = meter.client
    keys = queue_keys(f"instructions-contract-{tag}").all
    client.function_load(CONTRACT_SCRIPT, replace=True)
    client.rpush(keys[0], *job_ids(WARM_CALLS + calls + 1))
    client.rpush(keys[10], "*1.1.1*job")
    now = int(time.time() * 1000)
    ack = f"*{now + LEASE_MS}.1.{now}/1"  # (a batch ack of a real one's size: never parsed)

    def calls_of(n: int) -> None:
        for _ in range(n):
            client.fcall("rotator_contract_claim", len(keys), *keys, "next_packed", 1, LEASE_MS,
                         BUDGET, 0, ack)  # fmt: skip

    return meter.per_call(calls_of, calls, keys)


def push_contract_per_call(meter: Meter[Figure], calls: int, tag: str) -> Figure:
    """``meter``'s figure per push of one id by the push's contract, bare
    (bench/contract_floor.lua by FCALL): the module's push's nine commands on a queue's
    thirteen keys, and no logic."""
    client = meter.client
    keys = queue_keys(f"instructions-push-contract-{tag}").all
    client.function_load(CONTRACT_SCRIPT, replace=True)
    pushed = iter(job_ids(WARM_CALLS + calls))

    def pushes(n: int) -> None:
        for _ in range(n):
            client.fcall("rotator_contract_push", len(keys), *keys, "push", next(pushed))

    return meter.per_call(pushes, calls, keys)


def payload_floor_per_call(meter: Meter[Figure], calls: int, tag: str) -> Figure:
    """``meter``'s figure per claim of 100 of the payload queue's layout floor
    (bench/payload_floor.lua, layout ``hash``: ids in the ring, bodies in a hash) by EVALSHA,
    each acking the batch before, as bench.payload_floor runs it."""
    client, name = meter.client, f"instructions-payload-floor-{tag}"
    keys = floor_keys(name)
    preload_payload_floor("hash")(client, name, job_ids((WARM_CALLS + calls + 1) * 100))
    sha = client.script_load(PAYLOAD_FLOOR_SCRIPT)
    previous: list[bytes] = []

    def claims(n: int) -> None:
        nonlocal previous
        for _ in range(n):
            previous = [client.evalsha(sha, len(keys), *keys, "hash", 100, *previous)[0]]

    return meter.per_call(claims, calls, keys)


def stream_per_call(meter: Meter[Figure], calls: int, tag: str) -> Figure:
    """``meter``'s figure per 100 deliveries of a Stream read by one group (bench.topics' preload:
    an id and a 64-byte body an entry): an XREADGROUP COUNT 100 and the XACK of its entries."""
    client, name = meter.client, f"instructions-stream-{tag}"
    preload_stream(client, name, job_ids((WARM_CALLS + calls) * 100))

    def batches(n: int) -> None:
        for _ in range(n):
            reply: Any = client.xreadgroup("workers", "c", {name: ">"}, count=100)
            ((_, entries),) = reply
            client.xack(name, "workers", *[entry[0] for entry in entries])

    return meter.per_call(batches, calls, [name])


REFERENCES: dict[str, Callable[[Counted, int, str], float]] = {
    FLOOR: floor_per_call,
    CONTRACT: contract_per_call,
    PUSH_CONTRACT: push_contract_per_call,
    PAYLOAD_FLOOR: payload_floor_per_call,
    STREAM: stream_per_call,
}


def held_against(case: Case) -> tuple[str, ...]:
    """The references a case is given against: the floor for a one-job claim (and the bare
    contract for one by FCALL, which calls it as the module is called), the push's bare
    contract for a push by FCALL, the payload floor and a Stream for the payload claim; none
    for the others (a wake-up's cycle among them)."""
    if case.payloads:
        return (PAYLOAD_FLOOR, STREAM)
    if case.wake:
        return ()
    if case.batch == 0:
        return (PUSH_CONTRACT,) if case.via == "fcall" else ()
    if case.batch != 1:
        return ()
    return (FLOOR, CONTRACT) if case.via == "fcall" else (FLOOR,)


def cases_of(pair: tuple[Module, Module]) -> list[Case]:
    """The cases both modules can run (a module from before payload batches has no
    nextp_packed)."""
    return [
        case
        for case in CASES
        if not case.payloads or all("nextp_packed" in module.source for module in pair)
    ]


def run_server(
    kind: str, pair: tuple[Module, Module], sizes: Sizes, workdir: Path, log: Any
) -> dict[str, Any]:
    with counted_server(kind, workdir / kind) as counted:
        for module in pair:
            module.load(counted.client)
        log(f"{kind} {counted.server.version} under callgrind on port {counted.server.port}")
        samples: dict[tuple[str, str], list[float]] = {}
        cases = cases_of(pair)
        # (each reference some case is held against, counted once a round)
        counts: dict[str, list[float]] = {name: [] for c in cases for name in held_against(c)}
        for round_ in range(sizes.rounds):
            for case in cases:
                order = pair if round_ % 2 == 0 else pair[::-1]
                for module in order:
                    figure = per_call(counted, module, case, sizes.calls, str(round_))
                    samples.setdefault((case.name, module.label), []).append(figure)
            for name, by_round in counts.items():
                by_round.append(REFERENCES[name](counted, sizes.calls, str(round_)))
        rows = []
        for case in cases:
            row = compared(samples[case.name, "before"], samples[case.name, "now"])
            row["against"] = {
                name: against(row["now_by_round"], counts[name]) for name in held_against(case)
            }
            rows.append(
                {"case": case.name, "via": case.via, "batch": case.batch, "wake": case.wake, **row}
            )
            log(f"  {case.name}: {figures(row)} a call")
        for name, by_round in counts.items():
            log(f"  {name}: {statistics.median(by_round) / 1000:.1f}k a call")
        return {
            "server": kind,
            "version": counted.server.version,
            "rows": rows,
            "references": {
                name: {"median": statistics.median(by_round), "by_round": by_round}
                for name, by_round in counts.items()
            },
        }


def against(now: list[float], reference: list[float]) -> dict[str, Any]:
    """NOW's counts against a reference's, round by round: the median ratio and its range."""
    ratios = [n / r for n, r in zip(now, reference, strict=True)]
    return {"median": statistics.median(ratios), "range": [min(ratios), max(ratios)]}


def compared(before: list[float], now: list[float]) -> dict[str, Any]:
    """A case's counts by round, BEFORE's and NOW's: their medians, and the median of the
    rounds' ratios."""
    return {
        "before": statistics.median(before),
        "now": statistics.median(now),
        "now_vs_before": statistics.median(n / b for n, b in zip(now, before, strict=True)),
        "before_by_round": before,
        "now_by_round": now,
    }


def figures(row: dict[str, Any]) -> str:
    """A compared row as the log shows it."""
    return f"{row['before'] / 1000:.1f}k -> {row['now'] / 1000:.1f}k ({row['now_vs_before']:.3f})"


def cells(row: dict[str, Any]) -> str:
    """A compared row's table cells: before, now, and the ratio with the rounds' range."""
    ratios = [n / b for n, b in zip(row["now_by_round"], row["before_by_round"], strict=True)]
    return (
        f"{row['before'] / 1000:.1f}k | {row['now'] / 1000:.1f}k | {row['now_vs_before']:.3f} "
        f"({min(ratios):.3f}-{max(ratios):.3f})"
    )


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Instructions per module call (callgrind), before and now",
        "",
        f"`python -m bench.instructions` ({data['machine']['mode']}), {data['machine']['date']}: "
        f"before = {data['before']}, now = module {data['module']['commit']}; "
        f"{data['sizes']['calls']} calls a case, median of {data['sizes']['rounds']} rounds.",
        "",
        "| server | case | before | now | now / before (range) |",
        "|---|---|---:|---:|---:|",
    ]
    for run in data["runs"]:
        for row in run["rows"]:
            lines.append(f"| {run['server']} {run['version']} | {row['case']} | {cells(row)} |")
    lines += [
        "",
        "NOW against references counted in the same rounds: the pattern's floor for the one-job "
        "calls (issue 14 asks them for at most twice its server time), the module's contract, "
        "bare, for the one-job claim and the push (what the module's own Lua costs beyond its "
        "commands), the payload layout's floor and a Stream for the payload claim (issue 23 "
        "asks it for 1.2x a Stream's deliveries per second):",
        "",
        "| server | case | reference | reference's | now | now / reference (range) |",
        "|---|---|---|---:|---:|---:|",
    ]
    for run in data["runs"]:
        references = run.get("references", {})  # (a run of before they were counted has none)
        for row in run["rows"]:
            for name, ratio in row.get("against", {}).items():
                low, high = ratio["range"]
                lines.append(
                    f"| {run['server']} {run['version']} | {row['case']} | {name} | "
                    f"{references[name]['median'] / 1000:.1f}k | {row['now'] / 1000:.1f}k | "
                    f"{ratio['median']:.2f} ({low:.2f}-{high:.2f}) |"
                )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = sized_parser(__doc__, RESULTS, "instructions.json")
    parser.add_argument(
        "--before", default=str(OLD_MODULE.relative_to(ROOT)),
        help="the module to compare with: a commit or a file (default: %(default)s)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    out: Path = args.out
    if args.table:
        print(markdown(json.loads((out / "instructions.json").read_text())))
        return 0
    valgrind_command()
    sizes = SIZES[size_mode(args)]
    pair = (Module("before", module_at(args.before)), Module("now", module_source()))

    def log(line: str) -> None:
        print(line, flush=True)

    data: dict[str, Any] = {
        "machine": machine_info(size_mode(args)),
        "module": module_info(),
        "before": args.before,
        "sizes": asdict(sizes),
    }
    with tempfile.TemporaryDirectory(prefix="rotator-instructions-") as tmp:
        data["runs"] = [
            run_server(kind, pair, sizes, Path(tmp), log) for kind in args.servers.split(",")
        ]
    log(markdown(write_results(out, "instructions", data, markdown)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
