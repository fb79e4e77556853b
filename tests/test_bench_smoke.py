"""The benchmark suite runs end to end on tiny sizes, so it cannot rot unnoticed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import redis

from bench.bounds import OLD_MODULE, Module
from bench.counters import without_counters
from bench.instructions import CONTRACT, FLOOR, PAYLOAD_FLOOR, PUSH_CONTRACT, STREAM, cases_of
from bench.primitives import CASES, LIBRARY
from bench.server_time import (
    KERNEL,
    LEAN,
    LEAN_CLAIMS,
    LEAN_PACKED,
    LEAN_SCRIPT,
    MEASURED,
    SERVER,
    UNRESOLVED,
    buckets_of,
)
from rotator.keys import queue_keys
from rotator.script import module_source
from tests.servers import ServerProcess

ROOT = Path(__file__).resolve().parent.parent


def run_smoke(module: str, out: Path, timeout: float, *options: str) -> str:
    """`python -m <module> --smoke [options]` on Redis, its results written to `out`: it must
    succeed. Returns what it printed."""
    command = [sys.executable, "-m", module, "--smoke", "--servers", "redis", "--out", str(out)]
    done = subprocess.run(
        [*command, *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def test_bench_smoke_writes_every_scenario(tmp_path: Path) -> None:
    run_smoke("bench", tmp_path, timeout=300)
    data = json.loads((tmp_path / "redis.json").read_text())
    patterns = {row["pattern"] for row in data["patterns"]}
    assert patterns == {
        "rotator",
        "rotator-fcall",
        "rotator-asyncio",
        "rotator-work",
        "raw-limit",
        "floor",
        "streams",
        "processing-list",
    }
    assert all(row["jobs_per_s"] > 0 for row in data["patterns"])
    head_to_head = {(row["pattern"], row["batch"]) for row in data["head_to_head"]}
    assert head_to_head == {
        (pattern, batch) for pattern in ("rotator", "rotator-fcall", "streams") for batch in (1, 10)
    }
    assert all(len(row["jobs_per_s"]) == 2 for row in data["head_to_head"])
    assert {row["pattern"] for row in data["peers"]} >= {"dramatiq", "rq", "bullmq"}
    assert [row["queue_length"] for row in data["queue_length_scaling"]] == [1_000]
    assert [row["in_flight"] for row in data["in_flight_scaling"]] == [0, 100]
    scaling = data["queue_length_scaling"] + data["in_flight_scaling"]
    assert all(row["server_us_per_job"] > 0 for row in scaling)  # whichever way it calls
    assert data["memory_bytes_per_job"]["rotator_pending"] > 0
    kinds = {"rotator", "rotator-fcall", "topic-fcall", "handoff", "contract", "blpop", "streams"}
    kinds |= {"rotator-fcall-again", "rotator-fcall-bare-push"}  # (bench.wake's controls)
    assert set(data["wake_latency"]) == kinds | {"rotator-fcall-pool", "streams-pool"}
    assert all(wake["p50_ms"] is not None for wake in data["wake_latency"].values())
    profiled = {(row["pattern"], row["batch"]) for row in data["call_profile"]}
    assert profiled == {("ping", 1)} | {
        (pattern, batch)
        for pattern in ("floor", "rotator", "rotator-fcall", "streams")
        for batch in (1, 10)
    }
    script_rows = [row for row in data["call_profile"] if row["pattern"].startswith("rotator")]
    assert all(row["script_own_us"] > 0 and row["subcommand_us"] > 0 for row in script_rows)
    # Each run a process of its own, every round; rotator against the floor round by round.
    assert all(len(row["wall_us_by_round"]) == 2 for row in script_rows)
    for row in script_rows:
        low, high = row["wall_vs_floor_range"]
        assert 0 < low <= row["wall_vs_floor"] <= high
        # At one job a call the floor does less than the module. At ten it moves ten
        # elements where the module moves one packed batch, and since one worker's loop
        # (M.loop_lease) the two are about level (a CI smoke read 0.993).
        assert row["commands_vs_floor"] > (1 if row["batch"] == 1 else 0)
    report = (tmp_path / "README.md").read_text()
    assert "## redis" in report
    assert "Head to head (2 interleaved rounds" in report
    assert "| bare BLPOP (the floor) |" in report
    assert "Where one consumer's time goes" in report
    assert (tmp_path / "redis-throughput.png").stat().st_size > 0
    bounds = json.loads((tmp_path / "bounds.json").read_text())
    rows = bounds["results"]["redis"]["rows"]
    steps = {(row["step"], row["module"]) for row in rows}
    assert steps == {
        (step, module)
        for step in ("stats", "tstats", "next", "requeue_dead", "revoked_trim", "tunsubscribe")
        for module in ("old", "new")
    } | {("hot_path", "old"), ("hot_path", "new")}
    assert all(row["calls"] > 0 and row["worst_ms"] > 0 for row in rows if "worst_ms" in row)
    new_next = next(row for row in rows if row["step"] == "next" and row["module"] == "new")
    assert new_next["budget_10000"].startswith("ROTATOR_BADARG")
    assert all(row["found"] for row in rows if row["step"] == "requeue_dead")
    hot = {(row["module"], row["via"], row["batch"]) for row in rows if row["step"] == "hot_path"}
    assert hot == {
        (m, via, b) for m in ("old", "new") for via in ("evalsha", "fcall") for b in (1, 100)
    }
    assert all(row["us_per_call"] > 0 for row in rows if row["step"] == "hot_path")


def test_bench_leases_smoke(tmp_path: Path) -> None:
    """bench.leases (issue 21) end to end on tiny sizes: every state, module, via and phase."""
    printed = run_smoke("bench.leases", tmp_path, timeout=110)
    data = json.loads((tmp_path / "leases.json").read_text())
    assert set(data) == {"machine", "modules", "sizes", "targets", "results"}
    assert set(data["results"]) == {"redis"}
    result = data["results"]["redis"]
    assert set(result) >= {"version", "config", "claims", "ratios", "worst_calls", "reclaim"}
    claims = {(r["state"], r["module"], r["via"]) for r in result["claims"]}
    assert claims == {
        (state, module, via)
        for state in ("a", "b", "c")
        for module in ("old", "new")
        for via in ("evalsha", "fcall")
    }
    assert all(r["median_ms"] > 0 and r["calls_per_claim"] >= 1 for r in result["claims"])
    ratios = {(r["module"], r["via"]) for r in result["ratios"]}
    assert ratios == {(m, via) for m in ("old", "new") for via in ("evalsha", "fcall")}
    assert all(r["b_over_a"] is not None and r["c_over_a"] is not None for r in result["ratios"])
    setup = {(r["state"], r["module"]): r for r in result["setup"]}
    assert set(setup) == {(s, m) for s in ("b", "c") for m in ("old", "new")}
    assert all(r["in_flight_ok"] and r["shape_ok"] for r in setup.values()), result["setup"]
    phases = {(r["module"], r["phase"]) for r in result["phases"]}
    names = ["b_setup", "c_setup", "reclaim"]
    names += [f"{s}_claims_{via}" for s in ("a", "b", "c") for via in ("evalsha", "fcall")]
    assert phases == {(m, name) for m in ("old", "new") for name in names}
    worst = {r["module"]: r for r in result["worst_calls"]}
    assert set(worst) == {"old", "new"}
    assert all(r["worst_ms"] > 0 and r["command"] for r in worst.values())
    reclaim = {(r["module"], r["case"]): r for r in result["reclaim"]}
    assert set(reclaim) == {(m, c) for m in ("old", "new") for c in ("idle_before", "idle_after")}
    assert all(len(r["late_ms"]) == r["rounds"] for r in reclaim.values()), result["reclaim"]
    assert "| worst call, every phase (ms) |" in printed


def test_bench_scheduled_smoke(tmp_path: Path) -> None:
    """bench.scheduled (issue 15) end to end on tiny sizes: every section, and the ratio."""
    printed = run_smoke("bench.scheduled", tmp_path, timeout=120)
    data = json.loads((tmp_path / "scheduled.json").read_text())
    assert set(data) == {"machine", "module", "sizes", "targets", "results"}
    assert data["machine"]["mode"] == "smoke"
    assert data["targets"]["claim_ratio_max"] == 1.25
    assert set(data["results"]) == {"redis"}
    result = data["results"]["redis"]
    assert set(result) == {
        "version", "config", "load", "claims", "ratios", "push", "promotion", "ticks",
    }  # fmt: skip
    far = data["sizes"]["far"]
    assert result["load"]["scheduled_ok"]
    assert result["load"]["scheduled"] == far
    assert result["load"]["zset_bytes_per_job"] > 0
    batches = data["sizes"]["batches"]
    claims = {(row["batch"], row["scheduled"]) for row in result["claims"]}
    assert claims == {(batch, held) for batch in batches for held in (0, far)}
    assert all(row["median_jobs_per_s"] > 0 for row in result["claims"])
    assert all(row["median_server_us_per_job"] > 0 for row in result["claims"])
    assert [row["batch"] for row in result["ratios"]] == batches
    for row in result["ratios"]:  # present and positive; never a timing bound here
        assert row["wall_ratio"] > 0
        assert row["server_ratio"] > 0
        assert isinstance(row["within_target"], bool)
    pushes = {(row["command"], row["chunk"], row["onto_scheduled"]) for row in result["push"]}
    assert pushes == {
        (command, chunk, onto)
        for chunk in (1, 1000)
        for command, onto in (("push", 0), ("push_later", 0), ("push_later", far))
    }
    assert all(row["server_us_per_job"] > 0 for row in result["push"])
    assert all(row["wall_us_per_job"] > 0 for row in result["push"])
    promoted = {row["scheduled_later"] for row in result["promotion"]}
    assert promoted == {0, far}
    for row in result["promotion"]:
        assert row["promoting_calls"] == -(-data["sizes"]["promote"] // 1000)
        assert row["promotion_us_per_job"] is not None
        assert row["worst_call_ms"] > 0
    ticks = {row["case"]: row for row in result["ticks"]}
    recurring = {"schedule_load", "schedule_idle", "schedule_idle_hz100"}
    assert set(ticks) == {"load", "idle", "idle_hz100"} | recurring
    assert ticks["load"]["received"] == ticks["load"]["scheduled"] == data["sizes"]["tick_jobs"]
    assert ticks["load"]["background_claimed"] > 0
    for row in ticks.values():
        assert row["p50_ms"] is not None
        assert row["max_ms"] is not None
        assert len(row["delays_ms"]) == row["received"] > 0
    assert ticks["idle_hz100"]["hz"] == ticks["schedule_idle_hz100"]["hz"] == 100
    # A recurring schedule's ticks: as many as asked, each delivered at or after its tick
    # (the job id's tick ms, server TIME; received on the same host's clock), the ticks on
    # the schedule's grid, one job each (a skipped tick would mean a catch-up job).
    assert ticks["schedule_load"]["ticks"] == data["sizes"]["schedule_ticks"]
    assert ticks["schedule_idle"]["ticks"] == data["sizes"]["idle_rounds"]
    assert ticks["schedule_load"]["background_claimed"] > 0
    for case in recurring:
        row = ticks[case]
        assert row["received"] == row["ticks"], case
        assert row["min_ms"] >= 0, case
        every_ms = round(row["every_s"] * 1000)
        ticks_ms = row["ticks_ms"]
        assert len(ticks_ms) == row["received"]
        assert all(b > a and (b - a) % every_ms == 0 for a, b in pairwise(ticks_ms)), case
        assert row["skipped"] == sum((b - a) // every_ms - 1 for a, b in pairwise(ticks_ms))
    report = (tmp_path / "scheduled.md").read_text()
    assert "| ratio 5,000 / 0 scheduled, batch 1 (wall / server) |" in report
    assert "| recurring `schedule(every=0.373)` tick lateness, 4 ticks under a load" in report
    assert "| recurring tick lateness, idle, hz 100, 2 ticks |" in report
    assert "| ratio " in printed
    assert "delay after due" in printed
    assert "tick schedule_load" in printed


def test_bench_counters_smoke(tmp_path: Path) -> None:
    """bench.counters (issue 17) end to end on tiny sizes: the JSON's structure only (every
    phase by both vias, both sides, the differences), never a timing bound."""
    printed = run_smoke("bench.counters", tmp_path, timeout=120)
    data = json.loads((tmp_path / "counters.json").read_text())
    assert set(data) == {"machine", "modules", "sizes", "times", "target", "results"}
    assert data["machine"]["mode"] == "smoke"
    assert set(data["modules"]) == {"before", "after"}
    assert "8b6ec41" in data["modules"]["before"]
    assert set(data["results"]) == {"redis"}
    rows = data["results"]["redis"]["rows"]
    phases = ("0", "a", "b", "c", "d", "e1", "e100")
    assert {(r["phase"], r["via"]) for r in rows} == {
        (phase, via) for phase in phases for via in ("fcall", "evalsha")
    }
    rounds = data["sizes"]["rounds"]
    for r in rows:
        for side in (r["base"], r["test"]):
            assert set(side) >= {"label", "us_per_call", "us_per_call_by_round", "spread_us"}
            assert len(side["us_per_call_by_round"]) == rounds
            assert side["calls"] > 0
            assert side["leased"] > 0
            assert isinstance(side["issued_per_call"], dict)
        assert isinstance(r["diff_ns_per_call"], int)
        assert len(r["diff_ns_by_round"]) == rounds
        low, high = r["diff_ns_range"]
        assert low <= r["diff_ns_per_call"] <= high
        assert r["verdict"] in ("within noise", "higher every round", "lower every round")
    labels = {r["phase"]: (r["base"]["label"], r["test"]["label"]) for r in rows}
    assert labels["0"] == ("before", "before")  # the control
    assert labels["a"] == ("before", "after")
    assert labels["e1"] == ("without times", "with times")
    counted = next(r for r in rows if r["phase"] == "a")["test"]["counted"]
    assert set(counted) >= {"completed", "retried", "reclaimed", "dead_lettered"}
    parts = data["results"]["redis"]["parts"]
    assert set(parts["ns"]) == {
        "add", "add_none", "read_before", "read_before_base", "write_before",
        "write_before_base",
    }  # fmt: skip
    assert parts["encoding"] == "hashtable"  # a busy queue's meta hash, as the calls see it
    assert parts["call_now_changed"] == parts["ns"]["add"] + parts["ns"]["add_none"]
    report = (tmp_path / "counters.md").read_text()
    assert "| a. `next_packed 1` + batch ack | before " in report
    assert "| **a call that changes one counter: now (HINCRBY)" in report
    assert "FCALL: server µs per call" in printed


def test_bench_counters_isolate_runs_the_module_without_its_counters(tmp_path: Path) -> None:
    """--isolate: BEFORE is the module with its counters not written, and it leases and
    acks as the module does (the counts stay 0 on its side)."""
    source = module_source()
    bare = without_counters(source)
    call = "\n    M.add_counts(s)\n"  # (write_meta's, inside define_module)
    assert call in source
    assert call not in bare
    # No call reads a counter but one worker's loop `completed` (it writes the sum in the
    # HSET of its other numbers): they are only added to. A claim reads the meta fields of
    # META_FIELDS (read_meta_fields), one worker's loop those of LOOP_FIELDS; the bare module
    # reads no counter at all.
    assert "M.read('HMGET', K.meta, unpack(META_FIELDS))" in source
    assert "M.read('HMGET', K.meta, unpack(LOOP_FIELDS))" in source
    for fields, counted in (("local META_FIELDS = {", False), ("local LOOP_FIELDS = {", True)):
        listed = source.split(fields, 1)[1].split("}", 1)[0]
        assert "'seq'" in listed
        assert ("'completed'" in listed) == counted
        assert "'completed'" not in bare.split(fields, 1)[1].split("}", 1)[0]
    assert "'completed', completed + jobs" in source
    assert "'completed'," not in bare.split("function M.loop_lease(", 1)[1].split("\n  end\n")[0]
    run_smoke("bench.counters", tmp_path, 120, "--phases", "a", "--via", "fcall", "--isolate")
    data = json.loads((tmp_path / "counters.json").read_text())
    assert data["modules"]["before"].startswith("rotator-without-counters.lua (`--isolate`")
    [row] = data["results"]["redis"]["rows"]
    assert row["base"]["leased"] > 0
    assert row["test"]["counted"]["completed"] > 0


def test_bench_unique_quick(tmp_path: Path) -> None:
    """bench.unique (issue 16) end to end at its --quick sizes (a few seconds on Redis):
    every section and case, the sanity checks it makes, never a timing bound."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.unique",
            "--quick",
            "--servers",
            "redis",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads((tmp_path / "unique.json").read_text())
    assert set(data) == {"machine", "module", "sizes", "results"}
    assert data["machine"]["mode"] == "quick"
    assert set(data["results"]) == {"redis"}
    result = data["results"]["redis"]
    assert set(result) == {"version", "config", "push", "memory", "claims", "cancel"}
    rows = result["push"]["rows"]
    assert {(r["batch"], r["case"]) for r in rows} == {
        (batch, case) for batch in (1, 100) for case in ("plain", "new", "held")
    }
    assert all(r["median_server_us_each"] > 0 and r["median_wall_us_each"] > 0 for r in rows)
    ratios = {(r["batch"], r["case"]) for r in result["push"]["ratios"]}
    assert ratios == {(batch, case) for batch in (1, 100) for case in ("new", "held")}
    memory = {(r["state"], r["held"]): r for r in result["memory"]}
    assert set(memory) == {
        (state, held)
        for state in ("waiting", "in_flight", "scheduled")
        for held in data["sizes"]["held"]
    }
    assert all(r["ids_bytes_per_job"] > 0 and r["queue_bytes_per_job"] > 0 for r in memory.values())
    claims = {(r["batch"], r["queue"]) for r in result["claims"]["rows"]}
    assert claims == {(batch, q) for batch in (1, 100) for q in ("untracked", "tracked")}
    assert all(r["median_jobs_per_s"] > 0 for r in result["claims"]["rows"])
    assert [r["batch"] for r in result["claims"]["ratios"]] == [1, 100]
    assert all(r["throughput_ratio"] > 0 for r in result["claims"]["ratios"])
    assert result["claims"]["ids_left"] == 0  # the index is empty after each drain + sweep
    cancels = {(r["state"], r["batch"]): r for r in result["cancel"]}
    assert set(cancels) == {
        (state, batch) for state in ("scheduled", "waiting", "in_flight") for batch in (1, 100)
    }
    assert all(r["clean"] for r in cancels.values()), result["cancel"]
    assert all(r["median_server_us_each"] > 0 for r in cancels.values())
    report = (tmp_path / "unique.md").read_text()
    assert "| tracked / untracked, `next(100, ack=<previous>)` (throughput / server time" in report
    assert "| cancel, in flight, 1 a call " in done.stdout


def test_bench_retries_smoke(tmp_path: Path) -> None:
    """bench.retries end to end on tiny sizes: both cases and batches, a marker each push call
    (the bench checks it), the marker's memory; never a timing bound."""
    out = run_smoke("bench.retries", tmp_path, 120)
    result = json.loads((tmp_path / "retries.json").read_text())["results"]["redis"]
    for section in ("push", "push_later", "publish"):
        rows = {(r["batch"], r["case"]): r for r in result[section]["rows"]}
        assert set(rows) == {(b, c) for b in (1, 100) for c in ("plain", "retry_for")}
        assert all(r["median_server_us_each"] > 0 for r in rows.values())
        assert [r["batch"] for r in result[section]["ratios"]] == [1, 100]
    for memory in ("memory", "publish_memory"):
        assert all(m["marker_bytes"] > 0 and 0 < m["ttl_ms"] <= 60_000 for m in result[memory])
    assert "| `retry_for` over plain, 100 a call (server / wall time) |" in out
    assert "| with `retry_for` (`tpublish_chunk`), 1 a call (server / wall µs an id) |" in out
    assert "| with `retry_for` (`once ... push_later`), 1 a call (server / wall µs an id) |" in out
    assert "| a publish call's marker, 100 id(s) a call (memory, kept) |" in out


def test_bench_rate_limit_smoke(tmp_path: Path) -> None:
    """bench.rate_limit (issue 16) end to end on tiny sizes: every field, sane counts."""
    printed = run_smoke("bench.rate_limit", tmp_path, timeout=120)
    data = json.loads((tmp_path / "rate_limit.json").read_text())
    assert set(data) == {"machine", "module", "sizes", "target_error_pct", "results"}
    assert data["machine"]["mode"] == "smoke"
    assert len(data["module"]["sha1"]) == 40
    assert set(data["results"]) == {"redis"}
    [row] = data["results"]["redis"]["limits"]
    assert row["limit_jobs"] == 50
    assert row["claimed"] > 0
    assert row["steady_rate"] > 0
    assert 0 < row["first_period"] <= row["most_in_a_period"]
    assert isinstance(row["within_target"], bool)  # present; never a timing bound here
    assert "| steady rate (error) |" in (tmp_path / "rate_limit.md").read_text()
    assert "50/s" in printed


def test_bench_priorities_smoke(tmp_path: Path) -> None:
    """bench.priorities (issue 16) end to end on tiny sizes: every section and case, the order
    checks each drain makes (it fails otherwise), never a timing bound."""
    printed = run_smoke("bench.priorities", tmp_path, timeout=120)
    data = json.loads((tmp_path / "priorities.json").read_text())
    assert set(data) == {"machine", "module", "sizes", "results"}
    assert data["machine"]["mode"] == "smoke"
    assert set(data["results"]) == {"redis"}
    result = data["results"]["redis"]
    assert set(result) == {"version", "claims", "control", "push", "memory"}
    claims = {(r["batch"], r["queue"]) for r in result["claims"]["rows"]}
    assert claims == {(batch, q) for batch in (1, 100) for q in ("none", "one", "three")}
    assert all(r["median_jobs_per_s"] > 0 for r in result["claims"]["rows"])
    ratios = {(r["batch"], r["queue"]) for r in result["claims"]["ratios"]}
    assert ratios == {(batch, q) for batch in (1, 100) for q in ("one", "three")}
    control = {(r["batch"], r["queue"]) for r in result["control"]["rows"]}
    assert control == {(batch, side) for batch in (1, 100) for side in ("before", "after")}
    assert all(r["server_ratio"] > 0 for r in result["control"]["ratios"])
    pushes = {(r["batch"], r["case"]) for r in result["push"]["rows"]}
    assert pushes == {(batch, case) for batch in (1, 100) for case in ("plain", "priority")}
    assert all(r["median_server_us_each"] > 0 for r in result["push"]["rows"])
    [memory] = result["memory"]
    assert memory["prioritized_bytes_per_job"] > 0
    assert memory["ring_bytes_per_job"] > 0
    assert memory["sample_member"].startswith("*5*")
    report = (tmp_path / "priorities.md").read_text()
    assert "| three levels in use (0, 3, 7) over never used, `next(100, " in report
    assert "| memory, 300 jobs " in printed


def test_bench_buffering_smoke(tmp_path: Path) -> None:
    """bench.buffering (issue 16) end to end on tiny sizes: every case once, each drain
    checked by the bench itself (it fails otherwise), the module calls a job takes one by
    one and buffered, never a timing bound."""
    printed = run_smoke("bench.buffering", tmp_path, timeout=120)
    data = json.loads((tmp_path / "buffering.json").read_text())
    assert set(data) == {"machine", "module", "sizes", "targets", "results"}
    assert data["machine"]["mode"] == "smoke"
    assert len(data["module"]["sha1"]) == 40
    assert data["module"]["commit"]
    assert data["targets"] == {"producer_ratio_min": 20.0}
    assert set(data["results"]) == {"redis"}
    rows = {row["case"]: row for row in data["results"]["redis"]["rows"]}
    one_by_one = {"q.push(id)": 1, "await aq.push(id)": 1, "next(1, ack=previous)": 1}
    one_by_one["next(1) + ack(job)"] = 2
    buffered = {
        "p.push(id)": "q.push(id)",
        "p.push(id), 4 threads": "q.push(id)",
        "await p.push(id)": "await aq.push(id)",
        "consumer, c.ack(job)": "next(1, ack=previous)",
        "async consumer, await c.ack(job)": "next(1, ack=previous)",
    }
    assert set(rows) == set(one_by_one) | set(buffered)
    sizes = data["sizes"]
    for case, calls in one_by_one.items():
        row = rows[case]
        assert row["jobs"] == sizes["one_by_one"]
        assert calls <= row["calls_per_job"] < calls + 0.1, row  # one call (two) a job
    for case, base in buffered.items():
        row = rows[case]
        assert row["jobs"] == sizes["buffered"]
        assert (row["part"], row["vs"]) == (rows[base]["part"], base)
        assert 0 < row["calls_per_job"] < 0.1, row  # batched: 500 (100) jobs a call
        assert row["ratio"] > 0
    assert rows["next(1) + ack(job)"]["vs"] == "next(1, ack=previous)"
    assert all(row["jobs_per_s"] > 0 and row["server_us_per_job"] > 0 for row in rows.values())
    assert all(len(row["seconds"]) == sizes["rounds"] for row in rows.values())
    assert "Target: p.push(id) 20x q.push(id)." in printed


def test_bench_sharded_smoke(tmp_path: Path) -> None:
    """bench.sharded (issue 19) end to end on tiny sizes: both clusters, every setup and
    section, the model's figures, never a timing bound."""
    printed = run_smoke("bench.sharded", tmp_path, timeout=120)
    data = json.loads((tmp_path / "sharded.json").read_text())
    assert set(data) == {"machine", "module", "sizes", "results", "model"}
    assert data["machine"]["mode"] == "smoke"
    assert set(data["results"]) == {"redis"}
    result = data["results"]["redis"]
    assert set(result) == {"version", "flow", "idle", "push_one", "wake"}
    setups = {"single-1m", "sharded-1m", "sharded-3m"}
    rounds = data["sizes"]["rounds"]
    flows = result["flow"]["rows"]
    assert sorted(r["setup"] for r in flows) == sorted(setups) * rounds
    for r in flows:
        masters = 3 if r["setup"] == "sharded-3m" else 1
        assert len(r["masters"]) == masters
        assert sum(m["jobs"] for m in r["masters"]) == r["jobs"] == data["sizes"]["jobs"]
        assert sum(m["wake_list"] for m in r["masters"]) == 1
        assert r["jobs_per_s"] > 0
        assert r["server_cpu_us_per_job"] > 0
        assert r["consumer_cpu_us_per_job"] > 0
        assert r["evalsha_calls_per_job"] > 0  # the module by EVALSHA, the cluster default
    three = next(r for r in flows if r["setup"] == "sharded-3m")
    assert [m["shards"] for m in three["masters"]] == [4, 4, 4]
    assert all(m["jobs"] > 0 and m["evalsha_calls"] > 0 for m in three["masters"])
    assert {r["test"] for r in result["flow"]["ratios"]} == {"sharded-3m", "sharded-1m"}
    laps = {r["setup"]: r["calls_per_lap"] for r in result["idle"]["rows"]}
    assert laps == {"single-1m": 1, "sharded-1m": 12, "sharded-3m": 12}
    pushes = {r["setup"]: r for r in result["push_one"]["rows"]}
    assert set(pushes) == setups
    assert pushes["sharded-3m"]["wake_master_extra_cpu_us_per_push"] is not None
    wake = result["wake"]
    for setup in ("single", "sharded"):
        assert wake[setup]["samples"] == data["sizes"]["wake_samples"]
        assert 0 < wake[setup]["p50_ms"] <= wake[setup]["p99_ms"] <= wake[setup]["max_ms"]
    assert wake["wake_list_master"] not in wake["sharded_pushed_to"]  # pushes to other masters
    model = data["model"]["redis"]
    assert set(model["nodes"]) == {"1", "3", "10", "100"}
    assert model["nodes"]["100"]["shards"] == 100
    assert all(row["jobs_per_s"] > 0 for row in model["nodes"].values())
    report = (tmp_path / "sharded.md").read_text()
    assert "## The model: how far it goes on 10 and 100 nodes" in report
    assert "| end to end jobs/s (one queue, 1 master / 12 shards, 1 master / 12 shards, 3" in report
    assert "sharded-3m / sharded-1m: throughput" in printed
    assert "| wake latency ms, 12 shards, 3 masters, push to another master: p99 |" in report


def test_bench_topics_smoke(tmp_path: Path) -> None:
    """bench.topics (issue 23) on tiny sizes: a row per pattern, group count and consumer
    count, each a median with its range, the payload queue beside the Stream whose entries
    carry bodies, with one consumer and with four."""
    out = tmp_path / "topics.json"
    run_smoke("bench.topics", out, timeout=180)
    data = json.loads(out.read_text())
    rows = {
        (row["pattern"], row["groups"], row["clients"]): row for row in data["results"]["redis"]
    }
    assert set(rows) == {
        ("rotator-payload-queue", 1, 1),
        ("rotator-payload-queue", 1, 4),
        ("streams", 1, 4),
        *(
            (pattern, groups, 1)
            for pattern in ("rotator-topic", "streams")
            for groups in (1, 3, 10)
        ),
    }
    for row in rows.values():
        assert row["rounds"] == 1
        low, high = row["consume_deliveries_per_s_range"]
        assert 0 < low <= row["consume_deliveries_per_s"] <= high
        assert row["consume_server_us_per_delivery"] > 0
        assert row["consume_client_us_per_delivery"] > 0
    for (pattern, _, clients), row in rows.items():
        if clients == 1:
            assert row["publish_server_us_per_msg"] > 0
            assert row["retained_bytes_per_msg"] > 64  # each body is 64 bytes
        if clients == 1 and pattern != "rotator-payload-queue":  # publish 1000 a call too
            assert row["publish_1000_server_us_per_msg"] > 0
            low, high = row["publish_1000_msgs_per_s_range"]
            assert 0 < low <= row["publish_1000_msgs_per_s"] <= high
    for groups in (1, 3, 10):
        assert rows[("rotator-topic", groups, 1)]["undelivered_bytes_per_entry"] > 0
        assert rows[("streams", groups, 1)]["undelivered_bytes_per_entry"] == 0


def test_bench_payload_floor_smoke(tmp_path: Path) -> None:
    """bench.payload_floor (issue 23) on tiny sizes: the layouts' floors beside the payload
    queue and the Stream, with one consumer and four, each with its ratio to the Stream of its
    round; the floors' consumers check every body they got."""
    out = tmp_path / "payload_floor.json"
    printed = run_smoke("bench.payload_floor", out, timeout=180)
    data = json.loads(out.read_text())
    rows = {(row["pattern"], row["clients"]): row for row in data["results"]["redis"]}
    patterns = ("streams", "rotator-payload-queue", "floor-hash", "floor-moved", "floor-inline")
    assert set(rows) == {(pattern, clients) for pattern in patterns for clients in (1, 4)}
    for (pattern, _), row in rows.items():
        assert row["messages"] == data["messages"] == 500
        assert row["consume_deliveries_per_s"] > 0
        assert row["consume_server_us_per_delivery"] > 0
        # The server process's whole CPU time a delivery (INFO cpu: its getrusage, which the
        # kernel accounts by ticks). Over 500 deliveries a tick's error can exceed what
        # reading commands and writing replies add to the command time (a CI run read 36.9
        # against 41.9 µs), so the smoke does not compare the two; the full runs do.
        assert row["consume_server_cpu_us_per_delivery"] > 0
        assert row["consume_client_us_per_delivery"] > 0
        assert row["vs_streams"] == 1.0 if pattern == "streams" else row["vs_streams"] > 0
    assert data["module"]["path"] == "lua/rotator.lua"
    assert "| floor-inline | 4 |" in (tmp_path / "payload_floor.md").read_text()
    assert "| server CPU µs |" in printed
    assert "| floor-hash | 1 |" in printed


def test_bench_node_smoke(tmp_path: Path) -> None:
    """bench.node (issue 18) on tiny sizes: the worker rows at concurrency 1 and 16 and the
    batch rows (against a BullMQ Worker at concurrency 100, BullMQ's manual loop and the
    Python client's batch loop), each a median within its range, never a timing bound. It
    installs BullMQ itself (bench/peers.py: npm install in bench/bullmq) and needs the Node
    client built (python3 tasks.py test builds it before pytest)."""
    printed = run_smoke("bench.node", tmp_path, timeout=300)
    data = json.loads((tmp_path / "node.json").read_text())
    assert set(data) == {"machine", "module", "sizes", "servers"}
    assert data["machine"]["mode"] == "smoke"
    assert data["machine"]["node"]
    assert data["machine"]["bullmq"]
    assert len(data["module"]["sha1"]) == 40
    assert data["sizes"] == {"jobs": 300, "rounds": 1, "batch": 100}
    assert set(data["servers"]) == {"redis"}
    result = data["servers"]["redis"]
    assert [row["concurrency"] for row in result["rows"]] == [1, 16]
    assert [row["peer"] for row in result["batch_rows"]] == [
        "bullmq-worker-100",
        "bullmq-manual",
        "python-batch",
    ]
    for row in result["rows"] + result["batch_rows"]:
        for side in ("rotator", "peer"):
            low, high = row[f"{side}_range"]
            assert 0 < low <= row[f"{side}_jobs_per_s"] <= high, row
            assert len(row["samples"][side]) == 1
        low, high = row["ratio_range"]
        assert 0 < low <= row["ratio"] <= high, row
    report = (tmp_path / "node.md").read_text()
    assert "## Workers" in report
    assert "## Batch claims" in report
    assert "| redis " in report
    assert "BullMQ `Worker`, concurrency 100" in report
    assert "python-batch:" in printed


def test_bench_lane_smoke(tmp_path: Path) -> None:
    run_smoke("bench.lane", tmp_path, 300, "--rounds", "2")
    (run,) = json.loads((tmp_path / "lane.json").read_text())
    sides = {(row["side"], row["batch"]) for row in run["head_to_head"]}
    assert sides == {
        (side, batch)
        for side in ("rotator-fcall", "rotator-fcall-redispy", "streams")
        for batch in (1, 10)
    }
    assert all(len(row["vs_streams_by_round"]) == 2 for row in run["head_to_head"])
    assert all(row["vs_streams"] > 0 for row in run["head_to_head"])
    profiled = {row["side"]: row for row in run["one_job"]}
    assert set(profiled) == {"rotator-fcall", "rotator-fcall-redispy", "floor", "streams"}
    assert all(row["wall_us"] > row["client_cpu_us"] > 0 for row in profiled.values())
    assert all(row["commands_us"] > 0 for row in profiled.values())
    assert "| redis | batch 1, 1 client |" in (tmp_path / "lane.md").read_text()


def test_bench_wake_smoke(tmp_path: Path) -> None:
    """bench.wake on tiny sizes: the consumers blocked at once and woken in turn; every kind
    gets each of its wake-ups, and its p50 against the Stream's, round by round."""
    printed = run_smoke("bench.wake", tmp_path, 120)
    data = json.loads((tmp_path / "wake.json").read_text())
    run = data["results"]["redis"]
    kinds = {"rotator", "rotator-fcall", "topic-fcall", "handoff", "contract", "blpop", "streams"}
    kinds |= {"rotator-fcall-pool", "streams-pool"}  # (four idle consumers on one queue, group)
    kinds |= {"rotator-fcall-again", "rotator-fcall-bare-push"}  # (an A/A control; no client)
    assert kinds == set(run) - {"version"}
    for kind in kinds:
        assert 0 < run[kind]["p50_ms"] <= run[kind]["p99_ms"] < 5000
        low, high = run[kind]["p50_vs_streams_range"]
        assert 0 < low <= run[kind]["p50_vs_streams"] <= high
    assert run["streams"]["p50_vs_streams"] == 1.0
    assert "| Streams XREADGROUP BLOCK |" in printed
    # The slow log's pass: every kind's push and the claim after its wake-up, found and timed
    # (the module's calls run commands of their own: longer than an LPUSH or a BLPOP).
    for kind in kinds:
        timed = run[kind]["wake_server_us"]
        for call in ("push", "claim"):
            assert timed[call] is not None, (kind, timed)
            assert 0 <= timed[call] < 100_000, (kind, timed)
    for kind in ("rotator", "rotator-fcall", "topic-fcall", "rotator-fcall-bare-push"):
        assert run[kind]["wake_server_us"]["push"] > run["blpop"]["wake_server_us"]["push"]
        assert run[kind]["wake_server_us"]["claim"] > run["blpop"]["wake_server_us"]["claim"]
    # The hand-off prototype's push is the module's push and claim in one call (more than
    # either alone), and what wakes its consumer is a BLPOP of the element it was handed.
    handoff = run["handoff"]["wake_server_us"]
    assert handoff["push"] > run["rotator-fcall"]["wake_server_us"]["push"]
    assert handoff["claim"] < run["rotator-fcall"]["wake_server_us"]["claim"]
    assert "| a hand-off push (prototype: bench/handoff_push.lua, FCALL) |" in printed
    # The contract, bare: its push makes the module's push's commands without its logic.
    contract = run["contract"]["wake_server_us"]
    assert contract["push"] < run["rotator-fcall"]["wake_server_us"]["push"]


def test_bench_calls_smoke(tmp_path: Path) -> None:
    """bench.calls on tiny sizes: the one-job call profile alone, every pattern beside the
    floor, each against it round by round; rotator's module call spends more command time
    than the floor script, which does less, and a PING, which does nothing."""
    printed = run_smoke("bench.calls", tmp_path, 120)
    data = json.loads((tmp_path / "calls.json").read_text())
    rows = {row["pattern"]: row for row in data["results"]["redis"]["rows"]}
    assert set(rows) == {"ping", "floor", "rotator", "rotator-fcall", "streams"}
    for pattern in ("rotator", "rotator-fcall", "streams"):
        low, high = rows[pattern]["wall_vs_floor_range"]
        assert 0 < low <= rows[pattern]["wall_vs_floor"] <= high, pattern
        assert rows[pattern]["commands_vs_floor"] > 0, pattern
    for pattern in ("rotator", "rotator-fcall"):
        assert (
            rows[pattern]["commands_us"]
            > rows["floor"]["commands_us"]
            > rows["ping"]["commands_us"]
        )
    assert "| rotator-fcall | 1 |" in printed


def test_bench_tracked_smoke(tmp_path: Path) -> None:
    """bench.tracked (issue 21) end to end on tiny sizes: the product before the lease list,
    unpacked from bench/baseline and run with its own package and module (each loop checks
    which module file its package loads), beside the product now and Streams."""
    printed = run_smoke("bench.tracked", tmp_path, timeout=120)
    data = json.loads((tmp_path / "tracked.json").read_text())
    assert data["before"] == "5b7616c"
    (run,) = data["runs"]
    assert run["server"] == "redis"
    cells = {(row["mode"], row["batch"], row["clients"]) for row in run["rows"]}
    assert cells == {(mode, b, c) for mode in ("evalsha", "fcall") for b, c in ((1, 1), (10, 2))}
    for row in run["rows"]:
        assert set(row["jobs_per_s"]) == {"before", "now", "streams"}
        assert all(rate > 0 for rates in row["jobs_per_s"].values() for rate in rates)
        assert row["now_vs_before"] > 0
    assert "| now / before (range) |" in printed
    assert (tmp_path / "tracked.md").read_text().count("| redis ") == 4


def test_bench_instructions_smoke(tmp_path: Path) -> None:
    """bench.instructions on tiny sizes: Redis under callgrind, both modules, every case; a
    count per call in the range a module call takes (tens of thousands of instructions at the
    least: the server reads the command, runs the script, writes the reply)."""
    printed = run_smoke("bench.instructions", tmp_path, 300)
    data = json.loads((tmp_path / "instructions.json").read_text())
    assert data["before"] == "bench/baseline/rotator-5b7616c.lua"
    (run,) = data["runs"]
    assert run["server"] == "redis"
    for row in run["rows"]:
        assert 10_000 < row["before"] < 10_000_000, row
        assert 10_000 < row["now"] < 10_000_000, row
    (wake,) = [row for row in run["rows"] if row["wake"]]
    rows = [row for row in run["rows"] if not row["wake"]]
    cases = {(row["via"], row["batch"]) for row in rows}
    assert cases == {(via, batch) for via in ("fcall", "evalsha") for batch in (0, 1, 100)}
    by = {(row["via"], row["batch"]): row["now"] for row in rows}
    # An EVALSHA call runs the module's file first; FCALL runs only its main.
    assert by["evalsha", 1] > by["fcall", 1]
    # A hundred jobs a call are more work than one.
    assert by["fcall", 100] > by["fcall", 1]
    # A wake-up's cycle (by FCALL, held against nothing) is three calls: a push and two claims.
    assert (wake["via"], wake["against"]) == ("fcall", {})
    assert wake["now"] > by["fcall", 1] + by["fcall", 0]
    assert "| now / before (range) |" in printed
    # The pattern's floor and the bare contract: calls of their own, less work than the
    # module's one-job call, which is given against both (by EVALSHA, against the floor
    # only). (The smoke's modules have no payload case: no payload references.)
    references = {name: figure["median"] for name, figure in run["references"].items()}
    assert set(references) == {FLOOR, CONTRACT, PUSH_CONTRACT}
    assert 10_000 < references[FLOOR] < by["fcall", 1]
    # The contract's thirteen keys and seven commands cost more than the floor's two and six.
    assert references[FLOOR] < references[CONTRACT] < by["fcall", 1]
    # The push's eight commands, bare, cost less than the module's push that makes them.
    assert 10_000 < references[PUSH_CONTRACT] < by["fcall", 0]
    for row in rows:
        wanted = {FLOOR, CONTRACT} if row["via"] == "fcall" else {FLOOR}
        if row["batch"] == 0:
            wanted = {PUSH_CONTRACT} if row["via"] == "fcall" else set()
        assert set(row["against"]) == (wanted if row["batch"] in (0, 1) else set()), row
        for name, ratio in row["against"].items():
            assert ratio["median"] == row["now"] / references[name]
    assert "| now / reference (range) |" in printed


def test_bench_primitives_smoke(tmp_path: Path) -> None:
    """bench.primitives on tiny sizes: Redis under callgrind, every case, a count per call in
    the range an FCALL takes; a call that declares more keys does more work."""
    printed = run_smoke("bench.primitives", tmp_path, 300)
    data = json.loads((tmp_path / "primitives.json").read_text())
    (run,) = data["runs"]
    assert run["server"].startswith("redis 7")
    assert [row["case"] for row in run["rows"]] == [case.what for case in CASES]
    for row in run["rows"]:
        assert 5_000 < row["instructions"] < 1_000_000, row
    noop_2_keys, noop_13_keys = (row["instructions"] for row in run["rows"][:2])
    assert noop_13_keys > noop_2_keys
    assert "| beyond the no-op |" in printed


def test_bench_primitives_reads_and_writes_the_same_numbers_every_way(
    redis_server: ServerProcess,
) -> None:
    """The layouts bench.primitives compares hold the same state: its three reads of the
    prepared hash give the same sum, and each write leaves numbers its read gives back."""
    client = redis.Redis(port=redis_server.port)
    name = uuid.uuid4().hex
    keys = [f"primitives-test:{{{name}}}:state", f"primitives-test:{{{name}}}:written"]
    client.function_load(LIBRARY, replace=True)
    try:
        client.fcall("prepare", 2, *keys)
        expected = sum(1795926272913 + i for i in range(1, 25))
        for read in ("read_fields", "read_msgpack", "read_struct"):
            assert client.fcall(read, 2, *keys) == expected, read
        # (the numbers a queue has: the same, packed and as a field each)
        assert client.fcall("read_claim_meta", 2, *keys) == 13
        assert client.fcall("read_claim_meta_34", 2, *keys) == 13
        assert client.fcall("write_8_fields", 2, *keys) == 8
        assert client.hmget(keys[1], "a", "h") == [b"1795926272914", b"1795926272921"]
        for write, read in (("write_msgpack", "read_msgpack"), ("write_struct", "read_struct")):
            client.fcall(write, 2, *keys)
            assert client.fcall(read, 2, keys[1], keys[0]) == expected, write
    finally:
        client.delete(*keys)
        client.function_delete("rotator_primitives")


def test_bench_primitives_reads_the_meta_fields_the_module_reads() -> None:
    """bench.primitives' claim meta read asks for the fields lua/rotator.lua's read_meta does,
    in its order: the row stays the module's own cost when the module changes."""

    def quoted(source: str, start: str, end: str) -> list[str]:
        """The quoted names from ``start`` to the first ``end`` after it."""
        at = source.index(start) + len(start)
        return re.findall(r"'([a-z_]+)'", source[at : source.index(end, at)])

    module = quoted(module_source(), "local META_FIELDS = {", "}")
    bench = quoted(LIBRARY, "local CLAIM_FIELDS = {", "}")
    assert len(module) == 24
    assert bench == module
    # (and the walk's numbers packed as the module packs them)
    walk = quoted(module_source(), "local WALK_FIELDS = {", "}")
    assert "local WALK_FORMAT, ABSENT = '<" + "d" * len(walk) + "', -1 / 0" in LIBRARY


def test_bench_instructions_holds_the_payload_claim_against_its_floor_and_a_stream(
    tmp_path: Path,
) -> None:
    """With a module that has the payload claim on both sides (here the working tree's file),
    the payload case runs, and is given against the payload layout's floor and a Stream
    counted in the same run: each a count of its own in a call's range, the Stream's 100
    deliveries costing more than the floor's (two commands, the floor's one script)."""
    printed = run_smoke("bench.instructions", tmp_path, 300, "--before", "lua/rotator.lua")
    (run,) = json.loads((tmp_path / "instructions.json").read_text())["runs"]
    references = {name: figure["median"] for name, figure in run["references"].items()}
    assert set(references) == {FLOOR, CONTRACT, PUSH_CONTRACT, PAYLOAD_FLOOR, STREAM}
    assert all(10_000 < count < 10_000_000 for count in references.values()), references
    assert references[STREAM] > references[PAYLOAD_FLOOR]
    payloads = [row for row in run["rows"] if row["via"] == "fcall" and row["batch"] == 100
                and "nextp" in row["case"]]  # fmt: skip
    assert len(payloads) == 3  # (one worker, four taking turns, four out of order)
    for payload in payloads:
        assert set(payload["against"]) == {PAYLOAD_FLOOR, STREAM}
        assert payload["against"][STREAM]["median"] == payload["now"] / references[STREAM]
    assert f"| {STREAM} |" in printed


def test_bench_instructions_has_the_payload_case_where_both_modules_have_nextp_packed() -> None:
    """The payload claim is measured only against a module that has it (the default baseline,
    from before payload batches, does not)."""
    now = Module("now", module_source())
    old = Module("before", OLD_MODULE.read_text(encoding="utf-8"))
    assert [case.name for case in cases_of((now, now)) if case.payloads] == [
        "nextp_packed 100 + named batch ack by FCALL",
        "nextp_packed 100 + named batch ack, four workers taking turns, by FCALL",
        "nextp_packed 100 + named batch ack, four workers out of order, by FCALL",
    ]
    assert not [case for case in cases_of((old, now)) if case.payloads]


@pytest.mark.timeout(400)
def test_bench_decoding_smoke(tmp_path: Path) -> None:
    """bench.decoding on tiny sizes: the client of HEAD and the working tree's, counted under
    callgrind (two cases); a one-job reply's decode costs thousands of instructions (a
    start-up's count moves by some 2M of 905M from run to run: a thousand a decode at the
    smoke's 2,000, ten thousand at its 200 batches), and a batch of 100 noted and acked more
    than ten one-job replies."""
    printed = run_smoke("bench.decoding", tmp_path, 360, "--before", "HEAD")
    data = json.loads((tmp_path / "decoding.json").read_text())
    assert data["before"] == "HEAD"
    one, named = data["rows"]
    assert one["case"] == "next_packed reply of 1 job"
    assert 5_000 < one["before"] < 200_000, one
    assert 5_000 < one["now"] < 200_000, one
    assert named["now"] > 10 * one["now"], (named, one)
    assert "| next_packed reply of 1 job |" in printed


@pytest.mark.timeout(400)
def test_bench_server_time_smoke(tmp_path: Path) -> None:
    """bench.server_time on tiny sizes, on Valkey (whose binary keeps its symbols): every case
    and reference has server time, the module's calls spend some of theirs in Lua and a
    Stream's none, and each case is given against its references, the ratio of their user
    times."""
    printed = run_smoke("bench.server_time", tmp_path, 360, "--servers", "valkey")
    (run,) = json.loads((tmp_path / "server_time.json").read_text())["runs"]
    assert run["server"] == "valkey"
    rows = {row["case"]: row for row in run["rows"]}
    one_job, payload = (case.name for case, _ in MEASURED)
    assert set(rows) == {one_job, payload, FLOOR, LEAN, LEAN_PACKED, PAYLOAD_FLOOR, STREAM}
    assert all(row["user_us"] > 0 for row in rows.values()), rows

    def lua_us(row: dict[str, Any]) -> float:
        buckets: dict[str, float] = row["buckets_us"]
        return sum(us for bucket, us in buckets.items() if bucket.startswith("Lua"))

    assert lua_us(rows[one_job]) > 0
    assert lua_us(rows[payload]) > 0
    assert lua_us(rows[STREAM]) == 0
    assert set(rows[one_job]["against"]) == {FLOOR, LEAN, LEAN_PACKED}
    assert set(rows[LEAN]["against"]) == set(rows[LEAN_PACKED]["against"]) == {FLOOR}
    # Each case's command time, as INFO commandstats has it (its scripts' or Stream commands').
    assert all(row["command_us"] > 0 for row in rows.values()), rows
    assert set(rows[payload]["against"]) == {PAYLOAD_FLOOR, STREAM}
    one, floor = rows[one_job], rows[FLOOR]
    assert one["all_us"] == pytest.approx(one["user_us"] + one["kernel_us"])
    ratio = one["against"][FLOOR]
    assert ratio["user"]["median"] == pytest.approx(one["user_us"] / floor["user_us"])
    assert ratio["all"]["median"] == pytest.approx(one["all_us"] / floor["all_us"])
    assert "| Lua interpreter |" in printed


def test_bench_server_time_puts_each_function_in_its_part_of_the_server() -> None:
    """The buckets of perf's report lines (as `perf report -F period,dso,sym` prints them):
    a kernel function, Lua's, the allocator's (glibc's by name, jemalloc's by its library), a
    stripped binary's address, and the server's own commands (Valkey's cron visiting its
    scripting engines among them, not Lua's); periods add up per bucket."""
    report = "\n".join(
        [
            "# Samples: 9K of event 'cpu-clock'",
            "     2600520  [kernel.kallsyms]  [k] __alloc_skb",
            "      400080  valkey-server      [.] luaV_execute",
            "      200040  valkey-server      [.] luaH_getstr",
            "      200040  valkey-server      [.] sweeplist",
            "      200040  libc.so.6          [.] _int_malloc",
            "      200040  libc.so.6          [.] cfree@GLIBC_2.2.5",
            "      200040  libjemalloc.so.2   [.] 0x00000000000370ef",
            "      200040  redis-server       [.] 0x000000000015ef95",
            "      400080  valkey-server      [.] findBucket.lto_priv.0",
            "      200040  valkey-server      [.] scriptingEngineManagerForEachEngine",
            "      200040  valkey-server      [.] luaArgsToServerArgv",
            "      200040  libc.so.6          [.] __memmove_avx_unaligned_erms",
            "      200040  libc.so.6          [.] __GI_____strtod_l_internal",
        ]
    )
    assert buckets_of(report) == {
        KERNEL: 2600520,
        "Lua interpreter": 400080,
        "Lua tables": 200040,
        "Lua garbage collector": 200040,
        "memory allocator": 600120,
        UNRESOLVED: 200040,
        SERVER: 600120,
        "Lua <-> server (calls, arguments, replies)": 200040,
        "C library: memory and string copies": 200040,
        "C library: numbers and text": 200040,
    }


@pytest.mark.parametrize("layout", ["fields", "packed"])
def test_bench_lean_claim_claims_one_worker_loop_and_refuses_any_other_state(
    redis_server: ServerProcess, layout: str
) -> None:
    """bench/lean_claim.lua (the prototype bench.server_time holds the one-job claim against)
    claims the ring's tail id with the ack of the batch before, as the module's short way
    does; a malformed ack is refused, and so is any state but one worker's loop (here an ack
    set that exists), for the module's long way."""
    client = redis.Redis(port=redis_server.port)
    client.function_load(LEAN_SCRIPT, replace=True)
    keys = queue_keys(f"lean-test-{uuid.uuid4().hex}").all
    claim = LEAN_CLAIMS[layout]
    try:
        client.lpush(keys[0], "*lap")
        client.rpush(keys[0], "job-1", "job-2", "job-3")
        ack = client.fcall("lean_seed", 13, *keys, layout)
        reply = client.fcall(claim, 13, *keys, "next_packed", 1, 30_000, 1000, 0, ack)
        assert reply[:3] == [0, 30_000, 1]  # (the earliest deadline: its own)
        assert reply[3].endswith(b"*job-3")
        assert client.lrange(keys[10], 0, -1) == [reply[3]]  # (the acked batch replaced)
        with pytest.raises(redis.ResponseError, match="ROTATOR_BADTOKEN"):
            client.fcall(claim, 13, *keys, "next_packed", 1, 30_000, 1000, 0, "*nonsense")
        client.sadd(keys[1], "job-0*1.1.1")
        with pytest.raises(redis.ResponseError, match="LEAN_OTHER_STATE"):
            client.fcall(claim, 13, *keys, "next_packed", 1, 30_000, 1000, 0, ack)
        assert client.llen(keys[0]) == 3  # (nothing popped by the refused calls)
    finally:
        client.delete(*keys)
        client.function_delete("rotator_lean_claim")


def test_bench_lua_steps_smoke(tmp_path: Path) -> None:
    """bench.lua_steps on tiny sizes: each case's calls counted by the module's functions,
    the stand-in's own Lua left out. One worker's loop spends its steps in M.loop_lease most
    (and builds no walk's table: read_walk_state never runs), a claim of 100 more than a
    claim of one, and the counts add up to the case's figure."""
    printed = run_smoke("bench.lua_steps", tmp_path, 120)
    data = json.loads((tmp_path / "lua_steps.json").read_text())
    one, hundred, push, woken, payloads, turns, out_of_order = data["cases"]
    assert one["name"].startswith("next_packed 1 + batch ack")
    names = [step["name"] for step in one["functions"]]
    assert names[0] == "M.loop_lease", names
    assert "M.read_walk_state" not in names
    assert "main" in names  # (the library's entry: the chunk itself ran once, before)
    assert "(the chunk)" not in names
    for case in (one, hundred, push, woken, payloads, turns, out_of_order):
        assert case["per_call"] == pytest.approx(sum(s["per_call"] for s in case["functions"]))
    assert 200 < one["per_call"] < hundred["per_call"]
    # A push of plain ids takes its own path, and a consumer woken by one a fresh start:
    # neither builds the walk's state, and the calls between (not counted) leave no trace.
    assert "M.plain_push" in [step["name"] for step in push["functions"]]
    assert "M.push_ids" not in [step["name"] for step in push["functions"]]
    woken_names = [step["name"] for step in woken["functions"]]
    assert woken_names[0] == "M.fresh_lease", woken_names
    assert not {"M.read_walk_state", "M.push", "M.fast_lease"} & set(woken_names)
    # A worker of a queue with payloads takes one worker's loop too, its named batch ack's
    # payloads dropped from there (not the short way's tables).
    payload_names = [step["name"] for step in payloads["functions"]]
    assert {"M.loop_lease", "M.loop_named", "M.forget"} <= set(payload_names), payload_names
    assert not {"M.read_walk_state", "M.fast_lease", "M.check_named"} & set(payload_names)
    # So do four such workers taking turns, each acking the batch at the lease list's tail.
    turn_names = [step["name"] for step in turns["functions"]]
    assert {"M.loop_lease", "M.young_stop", "M.forget"} <= set(turn_names), turn_names
    assert not {"M.read_walk_state", "M.fast_lease"} & set(turn_names)
    # And four out of order: a named ack of a batch not at the tail takes it out at once.
    out_names = [step["name"] for step in out_of_order["functions"]]
    assert {"M.loop_lease", "M.takes_out", "M.young_stop"} <= set(out_names), out_names
    assert not {"M.read_walk_state", "M.fast_lease", "M.fast_marks"} & set(out_names)
    assert "| `M.loop_lease` |" in printed


def test_bench_durability_smoke(tmp_path: Path) -> None:
    """bench.durability on tiny sizes, on Valkey (it has WAITAOF): every way of waiting
    pushes with each appendfsync setting, each push confirmed (a NotDurable would end the
    run), and the table names each way."""
    printed = run_smoke("bench.durability", tmp_path, 120, "--servers", "valkey")
    data = json.loads((tmp_path / "durability.json").read_text())
    run = data["results"]["valkey"]
    ways = {"plain", "local", "ack", "fsync", "fsync-alone"}
    for fsync in ("always", "everysec"):
        assert set(run[fsync]) == ways
        for way in ways:
            low, high = run[fsync][way]["ms_range"]
            assert 0 < low <= run[fsync][way]["ms"] <= high < 10_000, (fsync, way)
    assert "| replica's fsync (WAIT 1, WAITAOF 1 1: rotator) |" in printed
