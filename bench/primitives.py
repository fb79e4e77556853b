"""What a module call's building blocks cost the server, in instructions (callgrind): an
FCALL's fixed cost, its declared keys, and a queue's numeric state kept as a field per number
or packed in one field, on Redis 7 and Valkey 8.

    .venv/bin/python -m bench.primitives [--smoke | --quick] [--servers redis,valkey] [--table]

Issue 14 asks a one-job claim to cost at most twice the pattern's floor on the server; the
module's own call (``bench.instructions``) says what it costs in all, this says what its
parts cost, so a layout change can be judged before it is made. Each case is one function of
``bench/primitives.lua``, called by FCALL ``calls`` times on a server under callgrind; the
figure is the whole call as the server runs it (parsing, the FCALL's dispatch, the keys and
arguments made Lua strings, the commands, the reply), the median of the rounds, with their
range. Read rows against the no-op's: that is what every FCALL costs before it does
anything. The module reads its meta hash by one HMGET (a claim asks for 23 fields, a plain
queue has 6 of them), each present number through ``tonumber`` and the walk's twelve numbers,
packed in one field, through ``struct.unpack``: one row makes that read as the claim does,
one as it did before the walk was packed (34 fields, 13 numbers present); the others read and
write 24 numbers as fields and packed in one field (Redis and Valkey ship ``cmsgpack`` and
``struct`` to scripts).
Results: ``bench/results/primitives.{json,md}``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import machine_info, standard_main, write_results
from bench.instructions import Counted, counted_server, valgrind_command

RESULTS = Path(__file__).resolve().parent / "results"
LIBRARY = (Path(__file__).parent / "primitives.lua").read_text(encoding="utf-8")
STAMP = "1795926272913"
DECLARED = 13  # the keys a queue command of the module declares


@dataclass(frozen=True)
class Case:
    what: str
    function: str
    keys: int = 2
    args: tuple[str, ...] = ()


CASES = (
    Case("FCALL of a no-op, 2 keys", "noop"),
    Case(f"FCALL of a no-op, {DECLARED} keys (a queue command's)", "noop", DECLARED),
    Case(
        f"FCALL of a no-op, {DECLARED} keys and 6 arguments (a one-job claim's)",
        "noop",
        DECLARED,
        ("1", "30000", "1000", "0", "*1795926303218.1.1795926272913*5", "x"),
    ),
    Case("reply of 4 (a one-job claim's)", "reply_4", args=("*1795926303218.1.17959*j2",)),
    Case("16 tonumber of a 13-digit stamp", "tonumber_16", args=(STAMP,)),
    Case(
        "read a one-job claim's meta: HMGET of its 23 fields, tonumber of the 4 numbers there, "
        "struct.unpack of the walk's 12",
        "read_claim_meta",
    ),
    Case(
        "read it as before the walk was packed: HMGET of 34 fields, tonumber of the 13 there",
        "read_claim_meta_34",
    ),
    Case("read 24 numbers: HMGET of 24 fields, tonumber each", "read_fields"),
    Case("read 24 numbers: HGET of one field, cmsgpack.unpack", "read_msgpack"),
    Case("read 24 numbers: HGET of one field, struct.unpack", "read_struct"),
    Case("write 8 numbers: HSET of 8 fields", "write_8_fields"),
    Case("write 24 numbers: HSET of one field, cmsgpack.pack", "write_msgpack"),
    Case("write 24 numbers: HSET of one field, struct.pack", "write_struct"),
)


@dataclass(frozen=True)
class Sizes:
    calls: int
    rounds: int


SIZES = {"full": Sizes(2_000, 3), "quick": Sizes(500, 1), "smoke": Sizes(50, 1)}


def per_call(counted: Counted, case: Case, keys: list[str], calls: int) -> float:
    """Instructions per FCALL of ``case`` (``calls`` of them, after one to warm it)."""
    client, function, numkeys = counted.client, case.function, case.keys
    keys_and_args = (*keys[:numkeys], *case.args)
    client.fcall(function, numkeys, *keys_and_args)  # (the first call of a function allocates)
    total = counted.instructions(
        lambda: [client.fcall(function, numkeys, *keys_and_args) for _ in range(calls)]
    )
    return total / calls


def run(servers: list[str], mode: str, workdir: Path, out: Path, log: Any) -> dict[str, Any]:
    valgrind_command()
    sizes = SIZES[mode]
    runs = []
    for kind in servers:
        with counted_server(kind, workdir / kind) as counted:
            client = counted.client
            keys = [f"primitives:{{q}}:{i}" for i in range(DECLARED)]
            client.function_load(LIBRARY, replace=True)
            client.fcall("prepare", 2, *keys[:2])
            log(f"{kind} {counted.server.version}: {sizes.calls} calls a case")
            samples: dict[str, list[float]] = {case.what: [] for case in CASES}
            for _ in range(sizes.rounds):
                for case in CASES:
                    samples[case.what].append(per_call(counted, case, keys, sizes.calls))
            rows: list[dict[str, Any]] = [
                {
                    "case": case.what,
                    "instructions": statistics.median(samples[case.what]),
                    "range": [min(samples[case.what]), max(samples[case.what])],
                }
                for case in CASES
            ]
            for row in rows:
                log(f"  {row['case']}: {row['instructions'] / 1000:.1f}k")
            runs.append({"server": f"{kind} {counted.server.version}", "rows": rows})
    data = {"machine": machine_info(mode), "sizes": vars(sizes), "runs": runs}
    return write_results(out, "primitives", data, markdown)


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# What a module call's parts cost the server (callgrind)",
        "",
        f"`python -m bench.primitives` ({data['machine']['mode']}), {data['machine']['date']}: "
        f"{data['sizes']['calls']} calls a case by FCALL, median of {data['sizes']['rounds']} "
        "rounds (range). Beyond the no-op: less the first row, what every FCALL costs.",
        "",
        "| server | case | instructions a call | beyond the no-op |",
        "|---|---|---:|---:|",
    ]
    for each in data["runs"]:
        noop = each["rows"][0]["instructions"]
        for row in each["rows"]:
            low, high = row["range"]
            count = row["instructions"]
            lines.append(
                f"| {each['server']} | {row['case']} | {count / 1000:.1f}k "
                f"({low / 1000:.1f}-{high / 1000:.1f}) | {(count - noop) / 1000:.1f}k |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return standard_main(argv, __doc__, RESULTS, "primitives", run=run, markdown=markdown)


if __name__ == "__main__":
    raise SystemExit(main())
