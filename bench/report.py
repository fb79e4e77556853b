"""Turns the JSON results into the Markdown tables and PNG plots committed with them."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from rotator.defaults import DEFAULT_WORK_BATCH

WAKE_LABELS = {
    "rotator": "rotator next(block=...)",
    "rotator-fcall": "rotator next(block=...), functions=True (FCALL)",
    "rotator-fcall-again": "the same again, a consumer of its own (an A/A control: the noise)",
    "rotator-fcall-bare-push": "the same, woken by the module's push as a bare FCALL (no client)",
    "topic-fcall": "a topic's group, next(block=...) woken by a publish (FCALL)",
    "handoff": "a hand-off push (prototype: bench/handoff_push.lua, FCALL)",
    "contract": "the module's contract, bare (bench/contract_floor.lua: push, claim after BLPOP)",
    "blpop": "bare BLPOP (the floor)",
    "streams": "Streams XREADGROUP BLOCK",
    "rotator-fcall-pool": "rotator next(block=...) by FCALL, four idle consumers on the queue",
    "streams-pool": "Streams XREADGROUP BLOCK, four idle consumers in the group",
}


def call_profile_section(rows: list[dict[str, Any]]) -> list[str]:
    """Where one consumer's time goes per job: its own CPU, the server's CPU, and of the
    server's the command time (for rotator: the script's own Lua and the commands it calls);
    wall and command time against the floor's, round by round (median and range)."""
    if not rows:
        return []
    out = [
        "",
        f"Where one consumer's time goes, µs per job, each run a consumer process of its own"
        f" ({rows[0].get('rounds', 1)} interleaved rounds, medians; CPU from getrusage and INFO"
        " cpu; command time from INFO commandstats; against the floor: per round, median and"
        " range):",
        "",
        "| pattern | batch | wall | client CPU | server CPU | of which commands "
        "| script's own Lua | its commands | wall vs floor | commands vs floor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        split = bool(row.get("subcommand_us"))
        cells = [
            row["pattern"], row["batch"], row["wall_us"], row["client_cpu_us"],
            row["server_cpu_us"], row.get("commands_us", "-"),
            row["script_own_us"] if split else "-", row["subcommand_us"] if split else "-",
            _versus(row, "wall"), _versus(row, "commands"),
        ]  # fmt: skip
        out.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return out


def _versus(row: dict[str, Any], field: str) -> str:
    ratio, span = row.get(f"{field}_vs_floor"), row.get(f"{field}_vs_floor_range")
    if ratio is None or not span:
        return "-"
    return f"{ratio:.2f}x ({span[0]:.2f}-{span[1]:.2f})"


def _find(rows: list[dict[str, Any]], pattern: str, batch: int, clients: int) -> float | None:
    for row in rows:
        if (row["pattern"], row["batch"], row["clients"]) == (pattern, batch, clients):
            return float(row["jobs_per_s"])
    return None


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "n/a"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _scaling_row(row: dict[str, Any], key: str) -> str:
    return f"| {row[key]:,} | {row['server_us_per_job']} | {row['wall_us_per_job']} |"


def server_section(run: dict[str, Any]) -> list[str]:
    rows = run["patterns"]
    out = [f"## {run['server']} {run['version']}", ""]
    out += [
        "| pattern | batch | clients | jobs/s | p50 ms | p99 ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        out.append(
            f"| {row['pattern']} | {row['batch']} | {row['clients']} | {row['jobs_per_s']:,.0f} "
            f"| {_ms(row['p50_ms'])} | {_ms(row['p99_ms'])} |"
        )
    out += ["", "Peers (each through its own worker, no-op task):", ""]
    out += ["| peer | setup | jobs/s |", "|---|---|---:|"]
    for row in run["peers"]:
        out.append(f"| {row['pattern']} | {row['extra']} | {row['jobs_per_s']:,.0f} |")
    batches = sorted({row["batch"] for row in rows})
    clients = sorted({row["clients"] for row in rows})
    big, small, many = max(batches), min(batches), max(clients)
    # work() as users run it: its default batch (claims grow to it for fast jobs).
    work_batch = DEFAULT_WORK_BATCH if DEFAULT_WORK_BATCH in batches else big
    work = _find(rows, "rotator-work", work_batch, 1)
    peer = {
        row["pattern"] + str(row["extra"].get("concurrency", "")): row["jobs_per_s"]
        for row in run["peers"]
    }
    out += head_to_head_section(run.get("head_to_head", []))
    out += ["", "Ratios (from the table above, one run each; head-to-head medians above):", ""]
    out.append(
        f"- rotator vs Streams, batch {big}, {many} clients: "
        f"{_ratio(_find(rows, 'rotator', big, many), _find(rows, 'streams', big, many))}"
    )
    out.append(
        f"- rotator vs Streams, batch {small}, 1 client: "
        f"{_ratio(_find(rows, 'rotator', small, 1), _find(rows, 'streams', small, 1))}"
    )
    label = f"work() (1 process, batch {work_batch})"
    out.append(f"- {label} vs dramatiq: {_ratio(work, peer.get('dramatiq'))}")
    out.append(f"- {label} vs rq: {_ratio(work, peer.get('rq'))}")
    if "bullmq16" in peer:
        out.append(f"- {label} vs BullMQ (concurrency 16): {_ratio(work, peer['bullmq16'])}")
    out += ["", "Server µs per job (push + claim + ack + cleanup, batch 100, steady state):", ""]
    out += ["| queue length | server µs/job | wall µs/job |", "|---:|---:|---:|"]
    for row in run["queue_length_scaling"]:
        out.append(
            f"| {row['queue_length']:,} | {row['server_us_per_job']} | {row['wall_us_per_job']} |"
        )
    out += ["", "| young in-flight jobs | server µs/job | wall µs/job |", "|---:|---:|---:|"]
    for row in run["in_flight_scaling"]:
        out.append(
            f"| {row['in_flight']:,} | {row['server_us_per_job']} | {row['wall_us_per_job']} |"
        )
    out += ["", "Bytes per job (16-byte ids, MEMORY USAGE):", ""]
    out += ["| what | bytes |", "|---|---:|"]
    out += [f"| {k} | {v} |" for k, v in run["memory_bytes_per_job"].items()]
    out += call_profile_section(run.get("call_profile", []))
    out += ["", "Wake latency (push -> claim, idle blocked consumer in its own process):", ""]
    out += ["| consumer | p50 ms | p99 ms |", "|---|---:|---:|"]
    for kind, wake in run["wake_latency"].items():
        out.append(
            f"| {WAKE_LABELS.get(kind, kind)} | {_ms(wake['p50_ms'])} | {_ms(wake['p99_ms'])} |"
        )
    out.append("")
    return out


def head_to_head_section(rows: list[dict[str, Any]]) -> list[str]:
    """The target comparisons, measured in interleaved rounds: medians, and the ratio to
    Streams taken within each round (median and range)."""
    if not rows:
        return []
    rounds = len(rows[0]["jobs_per_s"])
    out = ["", f"Head to head ({rounds} interleaved rounds; median jobs/s, ratio to Streams "
           "per round: median and range):", ""]  # fmt: skip
    out += ["| pattern | batch | clients | median jobs/s | vs Streams | range |"]
    out += ["|---|---:|---:|---:|---:|---|"]
    for row in rows:
        ratios = row["vs_streams_by_round"]
        out.append(
            f"| {row['pattern']} | {row['batch']} | {row['clients']} "
            f"| {row['median_jobs_per_s']:,.0f} | {statistics.median(ratios):.2f}x "
            f"| {min(ratios):.2f} to {max(ratios):.2f}x |"
        )
    return out


def plot(run: dict[str, Any], out: Path) -> list[str]:
    names = []
    rows = run["patterns"]
    patterns = list(dict.fromkeys(row["pattern"] for row in rows))
    batches = sorted({row["batch"] for row in rows})
    clients = sorted({row["clients"] for row in rows})
    fig, axes = plt.subplots(1, len(clients), figsize=(6 * len(clients), 4), squeeze=False)
    width = 0.8 / len(batches)
    for ax, n in zip(axes[0], clients, strict=True):
        for i, batch in enumerate(batches):
            values = [_find(rows, p, batch, n) or 0 for p in patterns]
            ax.bar(
                [x + i * width for x in range(len(patterns))], values, width, label=f"batch {batch}"
            )
        ax.set_xticks([x + width * (len(batches) - 1) / 2 for x in range(len(patterns))])
        ax.set_xticklabels(patterns, rotation=30, ha="right")
        ax.set_ylabel("jobs/s")
        ax.set_title(f"{run['server']}: {n} client process(es)")
        ax.legend()
    fig.tight_layout()
    name = f"{run['server']}-throughput.png"
    fig.savefig(out / name, dpi=90)
    plt.close(fig)
    names.append(name)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in (
        (axes[0], "queue_length_scaling", "queue_length"),
        (axes[1], "in_flight_scaling", "in_flight"),
    ):
        xs = [max(row[label], 1) for row in run[key]]
        ax.plot(xs, [row["server_us_per_job"] for row in run[key]], marker="o", label="server")
        ax.plot(xs, [row["wall_us_per_job"] for row in run[key]], marker="o", label="wall")
        ax.set_xscale("log")
        ax.set_xlabel(label.replace("_", " "))
        ax.set_ylabel("µs per job")
        ax.legend()
    fig.suptitle(f"{run['server']}: cost per job")
    fig.tight_layout()
    name = f"{run['server']}-scaling.png"
    fig.savefig(out / name, dpi=90)
    plt.close(fig)
    names.append(name)
    return names


def write_report(runs: list[dict[str, Any]], out: Path) -> None:
    machine = runs[0]["machine"] if runs else {}
    lines = [
        "# Benchmark results",
        "",
        f"Mode {machine.get('mode')}, {machine.get('date')}, {machine.get('cpus')} CPUs, "
        f"Python {machine.get('python')}, {machine.get('platform')}. Loopback, persistence off. "
        "Made by `python -m bench`; do not edit by hand.",
        "",
    ]
    for run in runs:
        lines += server_section(run)
        lines += [f"![{name}]({name})" for name in plot(run, out)] + [""]
    (out / "README.md").write_text("\n".join(lines))
