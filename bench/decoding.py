"""Client instructions per claim reply, counted under valgrind's callgrind: what the Python
client spends turning a module reply into jobs (and a payload batch into its named ack), in
two versions of the client, on a machine whose timings move more than the change is worth.

    .venv/bin/python -m bench.decoding [--smoke | --quick] [--before COMMIT] [--table]

The client's share of a worker's call is what is left beside the server's (issue 14's client
wall time, issue 23's client µs per delivery), and most of it is building ``Job`` tuples. A
timer on this 2-core VM moves by 10-30% from one run to the next; an instruction count by
well under 1%. Each version's ``rotator`` package (BEFORE: ``git archive`` of a commit's;
NOW: the working tree's) decodes the same recorded replies in a Python of its own under
``valgrind --tool=callgrind``, ``calls`` of them, less what the same Python counts with none
(its start-up, once a round): that difference, divided by ``calls``, is the figure (it counts
everything the decode does, the old jobs' deallocation included, as a consumer loop pays
it). Rounds alternate the two versions; the median of the rounds is given with their range.
A Python under callgrind takes some 15 s to start: the smoke size counts two cases. Results:
``bench/results/decoding.{json,md}``. No server is involved: the server's side is
``bench.instructions``.

Cases: a one-job ``next_packed`` reply (the worker loop's), one of 100 jobs, a payload
queue's ``nextp_packed`` reply of 100 (bodies of 64 bytes), and that reply decoded, noted as
the client's batch and acked whole (the named batch ack a payload loop sends).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

from bench.harness import ROOT, git_commit, machine_info, size_mode, sized_parser, write_results
from bench.instructions import callgrind_total, cells, compared, figures, valgrind_command

RESULTS = Path(__file__).resolve().parent / "results"

CASES = {
    "one": "next_packed reply of 1 job",
    "plain100": "next_packed reply of 100 jobs",
    "payload100": "nextp_packed reply of 100 jobs, 64-byte bodies",
    "named100": "nextp_packed reply of 100, noted and acked whole (named batch ack)",
}

# Run by a Python of its own with the version's package first on its path: argv is
# (tree, case, calls). The replies are built the same for every version.
DRIVER = """
import sys
sys.path.insert(0, sys.argv[1])
from rotator import commands, protocol
stamp = b"*1795911095898.1.1795910796252*"
one = [0, 0, 1, stamp + b"m-000000000001"]
packed = stamp + b"*".join(b"m-%012d" % i for i in range(100))
plain = [0, 0, 1, packed]
payloads = [0, 0, 1, packed] + [b"x" * 64] * 100
def named():
    reply = commands.decode_next_packed_payloads(payloads)
    batches = protocol.Batches()
    batches.note(reply)
    return batches.pack_refs(reply.jobs, named=True)
work = {
    "one": lambda: commands.decode_next_packed(one),
    "plain100": lambda: commands.decode_next_packed(plain),
    "payload100": lambda: commands.decode_next_packed_payloads(payloads),
    "named100": named,
}[sys.argv[2]]
kept = None
for _ in range(int(sys.argv[3])):
    kept = work()  # (the reply before is freed here, as a consumer loop frees it)
"""


@dataclass(frozen=True)
class Sizes:
    rounds: int
    calls: dict[str, int]  # decodes per case measured


SIZES = {
    "full": Sizes(3, {"one": 20_000, "plain100": 2_000, "payload100": 2_000, "named100": 2_000}),
    "quick": Sizes(1, {"one": 5_000, "plain100": 500, "payload100": 500, "named100": 500}),
    "smoke": Sizes(1, {"one": 2_000, "named100": 200}),
}


def instructions(tree: Path, case: str, calls: int) -> int:
    """Instructions a Python runs decoding ``calls`` replies of ``case`` with ``tree``'s
    client, start-up included."""
    with tempfile.TemporaryDirectory(prefix="rotator-decoding-") as tmp:
        out = Path(tmp) / "callgrind.out"
        done = subprocess.run(
            [*valgrind_command(), f"--callgrind-out-file={out}",
             sys.executable, "-c", DRIVER, str(tree), case, str(calls)],
            cwd=tree, capture_output=True, text=True, check=False,
        )  # fmt: skip
        total = callgrind_total(out.read_text()) if out.exists() else None
        if done.returncode != 0 or total is None:
            raise RuntimeError(f"the {case} driver failed: {done.stderr[-2000:]}")
        return total


def client_at(commit: str, into: Path) -> Path:
    """The ``rotator`` package of ``commit``, extracted under ``into``."""
    archived = subprocess.run(
        ["git", "archive", commit, "rotator"], cwd=ROOT, capture_output=True, check=False
    )
    if archived.returncode != 0:
        raise SystemExit(f"--before {commit}: git cannot archive it: {archived.stderr.decode()}")
    with tarfile.open(fileobj=BytesIO(archived.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def measure(before: Path, sizes: Sizes, log: Any) -> list[dict[str, Any]]:
    trees = {"before": before, "now": ROOT}
    samples: dict[tuple[str, str], list[float]] = {}
    for round_ in range(sizes.rounds):
        labels = ("before", "now") if round_ % 2 == 0 else ("now", "before")
        for label in labels:
            start_up = instructions(trees[label], "one", 0)
            for case, calls in sizes.calls.items():
                figure = (instructions(trees[label], case, calls) - start_up) / calls
                samples.setdefault((case, label), []).append(figure)
    rows = []
    for case in sizes.calls:
        what = CASES[case]
        row = {"case": what, **compared(samples[case, "before"], samples[case, "now"])}
        log(f"  {what}: {figures(row)} a decode")
        rows.append(row)
    return rows


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Client instructions per claim reply (callgrind), before and now",
        "",
        f"`python -m bench.decoding` ({data['machine']['mode']}), {data['machine']['date']}: "
        f"before = {data['before']}, now = {data['now']}; Python {data['machine']['python']}; "
        f"median of {data['sizes']['rounds']} rounds.",
        "",
        "| case | before | now | now / before (range) |",
        "|---|---:|---:|---:|",
    ]
    for row in data["rows"]:
        lines.append(f"| {row['case']} | {cells(row)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = sized_parser(__doc__, RESULTS, "decoding.json")
    parser.add_argument("--before", default="HEAD", help="the commit to compare with")
    args = parser.parse_args(argv)
    out: Path = args.out
    if args.table:
        print(markdown(json.loads((out / "decoding.json").read_text())))
        return 0
    valgrind_command()
    sizes = SIZES[size_mode(args)]

    def log(line: str) -> None:
        print(line, flush=True)

    data: dict[str, Any] = {
        "machine": machine_info(size_mode(args)),
        "before": args.before,
        "now": git_commit("rotator"),
        "sizes": asdict(sizes),
    }
    with tempfile.TemporaryDirectory(prefix="rotator-decoding-before-") as tmp:
        data["rows"] = measure(client_at(args.before, Path(tmp)), sizes, log)
    log(markdown(write_results(out, "decoding", data, markdown)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
