"""The call profile alone: where one consumer's one-job call goes, rotator by FCALL and by
EVALSHA beside the pattern's floor and Streams, each consumer a process of its own, in
interleaved rounds (``bench.profiles.call_profile``, as ``python -m bench`` runs it).

    .venv/bin/python -m bench.calls [--quick | --smoke] [--servers redis,valkey] [--table]

Issue 14's server-time target (a one-job ``next`` with an ack at most 2x the floor's
command time) and client-wall target (at most 1.25x the floor's wall time) are this
profile's ratios, taken round by round (median and range). ``python -m bench`` measures them
among everything else; this runs them alone, in minutes, so that they can be measured again
on a day the machine runs at its normal speed. Its PING row says how fast that is: a round
trip's wall time, which every one-job figure is mostly made of, so a slow day (a PING of
200 µs where it is 65-85 on a normal one) draws the wall ratios towards 1; the command
times' ratios are the server's alone. Writes ``bench/results/calls.{json,md}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import run_on_each_server, standard_main, write_results
from bench.profiles import call_profile
from bench.report import call_profile_section
from tests.servers import ServerProcess

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Sizes:
    jobs: int  # one-job calls per consumer run
    rounds: int


SIZES = {"full": Sizes(10_000, 5), "quick": Sizes(2_000, 3), "smoke": Sizes(100, 2)}


def run(servers: list[str], mode: str, workdir: Path, out: Path, log: Any) -> dict[str, Any]:
    sizes = SIZES[mode]

    def measure(server: ServerProcess) -> dict[str, Any]:
        log(f"{server.kind} {server.version}: {sizes.jobs} one-job calls a run")
        return {"rows": call_profile(server.client(), server.url, (1,), **vars(sizes))}

    data = run_on_each_server(servers, mode, workdir, measure, **vars(sizes))
    return write_results(out, "calls", data, markdown)


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# The call profile of a one-job call (`python -m bench.calls`)",
        "",
        f"{data['machine']['mode']}, {data['machine']['date']}, module "
        f"{data['module']['commit']}: {data['jobs']} one-job calls a consumer run, each acking "
        "the job of the call before.",
    ]
    for server, run_ in data["results"].items():
        lines += ["", f"## {server} {run_['version']}", *call_profile_section(run_["rows"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return standard_main(argv, __doc__, RESULTS, "calls", run=run, markdown=markdown)


if __name__ == "__main__":
    raise SystemExit(main())
