"""Wake latency, interleaved: push -> claim for an idle blocked consumer, rotator by FCALL and
by EVALSHA beside a bare BLPOP and a Streams XREADGROUP BLOCK, the consumers blocked at once
and woken in turn (``bench.profiles.wake_latency``; issue 14 asks rotator's p50 within 1.2x
of XREADGROUP's), and a topic's group woken by a publish (a Stream's consumer group is what
a topic is set beside: issue 23). Beside them, two references: a prototype of a hand-off wake-up
(``bench/handoff_push.lua``: the push claims its job by the module's own claim in the same
call and hands it to the blocked consumer through a list it BLPOPs, so the consumer wakes
holding a lease instead of a token that sends it to claim), and the module's contract, bare
(``bench/contract_floor.lua``: the push's nine commands and the one-job loop's eight,
pipelined behind the consumer's BLPOP as ``next(block=...)`` sends its claim, no logic),
which says what the protocol and its state cost apart from the module's Lua. And a worker
pool's case: four idle consumers, each in its own process, blocked on one queue (by FCALL),
beside four in one Stream's consumer group: a push wakes one of them. And two controls of
the FCALL kind: the same kind again with a consumer of its own (an A/A control: two kinds
alike land apart by the bench's own noise, which the rounds' range does not show), and its
consumer woken by the module's push sent as a bare FCALL by redis-py (what the Python
client's push adds to the latency).

    .venv/bin/python -m bench.wake [--quick | --smoke] [--servers redis,valkey] [--table]

Each kind's samples are cut into consecutive rounds, and its p50 is given against the
Stream's round by round (the median of the rounds' ratios, with their range): on this 2-core
VM the wake-up of an idle process moves by 2x from one minute to the next, so kinds measured
one after another (as ``python -m bench`` did before) were compared across different minutes.
A second, shorter pass (``WAKE_TIMED`` wake-ups a kind) runs with the server's slow log
taking every command, for the server's own time of each kind's push and of the claim that
follows the wake-up (apart, as logging every command slows every call): how much of the
latency the two calls' server time is, on a server that had idled 80 ms.
Writes ``bench/results/wake.{json,md}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import run_on_each_server, standard_main, write_results
from bench.profiles import WAKE_CONSUMERS, wake_latency
from bench.report import WAKE_LABELS
from tests.servers import ServerProcess

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Sizes:
    samples: int  # wake-ups per kind
    rounds: int


SIZES = {"full": Sizes(500, 5), "quick": Sizes(200, 5), "smoke": Sizes(8, 2)}


def run(servers: list[str], mode: str, workdir: Path, out: Path, log: Any) -> dict[str, Any]:
    sizes = SIZES[mode]

    def measure(server: ServerProcess) -> dict[str, Any]:
        log(f"{server.kind} {server.version}: {sizes.samples} wake-ups a consumer")
        return wake_latency(server.url, **vars(sizes))

    data = run_on_each_server(servers, mode, workdir, measure, **vars(sizes))
    return write_results(out, "wake", data, markdown)


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Wake latency, interleaved (`python -m bench.wake`)",
        "",
        f"{data['samples']} wake-ups a consumer, the consumers blocked at once and woken "
        f"in turn, 20 ms apart; p50 against the Stream's in {data['rounds']} rounds (median, "
        "range). Milliseconds from the push to the consumer holding the job. Server µs: the "
        "median server time (the slow log's, in a pass of its own) of the push and of the "
        "claim that followed the wake-up (rotator's module call, the BLPOP, the XREADGROUP; "
        "the hand-off's push is the module's push and claim in one call, its claim the BLPOP "
        "of what it was handed; the contract's are its two functions).",
        "",
    ]
    for server, run_ in data["results"].items():
        lines += [
            f"| {server} {run_['version']} | p50 ms | p99 ms | p50 vs Streams (range) "
            "| push, server µs | claim, server µs |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for kind in WAKE_CONSUMERS:
            wake = run_[kind]
            low, high = wake["p50_vs_streams_range"]
            timed = wake.get("wake_server_us", {})  # (none in runs from before it)
            lines.append(
                f"| {WAKE_LABELS.get(kind, kind)} | {wake['p50_ms']:.2f} | {wake['p99_ms']:.2f} "
                f"| {wake['p50_vs_streams']:.2f}x ({low:.2f}-{high:.2f}) "
                f"| {_us(timed.get('push'))} | {_us(timed.get('claim'))} |"
            )
        lines.append("")
    return "\n".join(lines)


def _us(value: float | None) -> str:
    return "" if value is None else f"{value:.0f}"


def main(argv: list[str] | None = None) -> int:
    return standard_main(argv, __doc__, RESULTS, "wake", run=run, markdown=markdown)


if __name__ == "__main__":
    raise SystemExit(main())
