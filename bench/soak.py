"""The chaos soak: every fault of ``tests/chaos`` mixed at random for N minutes per server.

    python bench/soak.py --minutes 5                 # Redis 7, then Valkey 8
    python bench/soak.py --minutes 2 --servers valkey --seed 42

Per server: a fresh server (AOF ``appendfsync always``, ``noeviction``), a fault proxy in
front of half the workers and of the producers, four workers (our loop and the library's
``Rotator.work``, EVALSHA and FCALL, batches of 1 and 5), and producers pushing all along.
Every 1-3 s one fault, drawn with the seed: worker SIGKILL, server SIGKILL and restart (gap
shorter or longer than the lease), server down, CLIENT PAUSE, DEBUG SLEEP, a zombie (SIGSTOP
past its lease), a SCRIPT/FUNCTION FLUSH burst, an OOM window, lost replies and dropped
connections, a blackhole, CLIENT KILL. Then the faults stop, a clean worker drains the queue
and the checker of ``tests/chaos/checker.py`` judges the run; its figures are printed and
each run's report.json, event logs and server log stay in ``--workdir``.

Exit status 1 if any run lost a job, processed an unexpected one, has an unexplained
duplicate, a false reclaim, a broken ring or did not end quiescent. Client errors that are
not losses (for instance NOSCRIPT surfacing during a flush burst) are reported, not failed.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.chaos.checker import Report
from tests.chaos.faultproxy import PASS, FaultProxy, Mode
from tests.chaos.harness import ChaosRun, Proc
from tests.servers import Kind

LEASE = 1.5
CONFIG = {"appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "noeviction"}
CHUNK = 2000  # ids per producer process; a new one starts when one finishes
RATE = 250.0  # ids per second per producer


class Soak:
    def __init__(self, kind: Kind, workdir: Path, seed: int, minutes: float) -> None:
        self.run = ChaosRun(kind, workdir, seed=seed, test=f"soak-{minutes:g}min", config=CONFIG)
        self.rng = self.run.rng
        self.minutes = minutes
        self.proxy: FaultProxy | None = None
        self.workers: list[Proc] = []
        self.producers: list[Proc] = []
        self.chunks = 0

    # -- setup -----------------------------------------------------------------------------

    def start(self) -> None:
        self.run.start()
        self.proxy = FaultProxy(self.run.server.port, seed=self.rng.randrange(2**32))
        self.proxy.start()
        shapes: list[dict[str, Any]] = [
            {"mode": "loop", "batch": 1, "functions": False, "url": self.proxy.url},
            {"mode": "loop", "batch": 5, "functions": True, "url": None},
            {"mode": "work", "batch": 1, "functions": False, "url": None},
            {"mode": "work", "batch": 5, "functions": True, "url": self.proxy.url},
        ]
        self.workers = [
            self.run.spawn_worker(lease=LEASE, job_ms=(1.0, 5.0), socket_timeout=2.0, **shape)
            for shape in shapes
        ]
        self.run.wait_booted(self.workers)
        self.feed()

    def feed(self) -> None:
        """Keeps one producer pushing: a new chunk of ids whenever the last one is done."""
        if any(p.alive for p in self.producers):
            return
        assert self.proxy is not None
        self.chunks += 1
        self.producers.append(
            self.run.spawn_producer(
                count=CHUNK,
                prefix=f"s{self.chunks:03d}-",
                batch=self.rng.choice([1, 10, 50]),
                rate=RATE,
                url=self.rng.choice([self.proxy.url, None]),
                functions=self.rng.random() < 0.5,
            )
        )

    # -- faults ----------------------------------------------------------------------------

    def faults(self) -> dict[str, Callable[[], None]]:
        return {
            "worker_kill": self.worker_kill,
            "server_kill": self.server_kill,
            "server_down": self.server_down,
            "client_pause": self.client_pause,
            "debug_sleep": self.debug_sleep,
            "zombie": self.zombie,
            "flush_burst": self.flush_burst,
            "oom_window": self.oom_window,
            "lost_replies": self.lost_replies,
            "blackhole": self.blackhole,
            "client_kill": self.client_kill,
        }

    def worker_kill(self) -> None:
        victim, _ = self.run.kill_busy(self.workers)
        self.workers[self.workers.index(victim)] = self.run.respawn(victim)

    def server_kill(self) -> None:
        self.run.kill9_server(self.rng.choice([self.rng.uniform(0.1, 1.0), LEASE + 1.0]))

    def server_down(self) -> None:
        self.run.server_down(self.rng.uniform(1.0, 2.5))

    def stalled(self, name: str) -> None:
        self.run.faults["stalls"] += 1
        self.run.faults[name] += 1

    def client_pause(self) -> None:
        seconds = self.rng.choice([0.3, 2.5])
        self.run.admin_call("CLIENT", "PAUSE", str(int(seconds * 1000)), "WRITE")
        time.sleep(seconds)
        self.stalled("client_pauses")

    def debug_sleep(self) -> None:
        self.run.admin_call("DEBUG", "SLEEP", str(self.rng.choice([0.3, 2.0])))
        self.stalled("debug_sleeps")

    def zombie(self) -> None:
        victim = self.rng.choice([w for w in self.workers if w.alive])
        self.run.signal(victim, signal.SIGSTOP)
        time.sleep(2 * LEASE)
        self.run.signal(victim, signal.SIGCONT)
        self.stalled("zombies")

    def flush_burst(self) -> None:
        what = self.rng.choice(["SCRIPT", "FUNCTION"])
        for _ in range(20):
            self.run.admin_call(what, "FLUSH")
            time.sleep(self.rng.uniform(0.005, 0.05))
        self.run.faults[f"{what.lower()}_flush_bursts"] += 1

    def oom_window(self) -> None:
        used = int(self.run.admin().info("memory")["used_memory"])
        self.run.admin_call("CONFIG", "SET", "maxmemory", str(used + 256 * 1024))
        time.sleep(self.rng.uniform(1.0, 2.0))
        self.run.admin_call("CONFIG", "SET", "maxmemory", "0")
        self.run.faults["oom_windows"] += 1

    def lost_replies(self) -> None:
        assert self.proxy is not None
        self.proxy.set_mode(Mode(drop_after=0.03, drop_before=0.01))
        time.sleep(self.rng.uniform(1.0, 3.0))
        self.proxy.set_mode(PASS)
        self.run.faults["lost_reply_windows"] += 1

    def blackhole(self) -> None:
        assert self.proxy is not None
        self.proxy.set_mode(Mode(blackhole=True))
        time.sleep(self.rng.uniform(1.0, 2.5))
        self.proxy.set_mode(PASS)
        self.run.faults["blackholes"] += 1

    def client_kill(self) -> None:
        self.run.admin_call("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        self.run.faults["client_kills"] += 1

    # -- the run ---------------------------------------------------------------------------

    def soak(self) -> Report:
        menu = self.faults()
        give_up = time.monotonic() + self.minutes * 60
        try:
            self.start()
            while time.monotonic() < give_up:
                time.sleep(self.rng.uniform(1.0, 3.0))
                self.feed()
                name = self.rng.choice(sorted(menu))
                print(f"  {time.strftime('%H:%M:%S')} {name}", flush=True)
                menu[name]()
                self.run.snapshot()
            self.run.stop_processes("producer")
            if self.proxy is not None:
                self.proxy.set_mode(PASS)
            if not self.run.server.running:
                self.run.server.start()
            self.run.admin_call("CONFIG", "SET", "maxmemory", "0")
            self.run.notes["settled"] = self.run.settle(timeout=60)
            report = self.run.check(allow_leftovers=True, drain_timeout=60.0)
            if self.proxy is not None:
                report.notes["proxy"] = {
                    k: v for k, v in sorted(self.proxy.stats.items()) if ":" not in k
                }
            report.write(self.run.workdir / "report.json")
            return report
        finally:
            if self.proxy is not None:
                self.proxy.stop()
            self.run.close()


def print_report(report: Report) -> None:
    figures = report.figures()
    explained = report.duplicates - sum(d["processed"] - 1 for d in report.unexplained.values())
    print(f"\n== {figures['server']}  (seed {report.seed}) ==")
    rows = [
        ("jobs pushed (confirmed)", report.pushed),
        ("pushes of unknown outcome", report.uncertain),
        ("jobs processed", report.processed),
        ("worker kills (SIGKILL)", figures["worker_kills"]),
        ("server restarts (SIGKILL)", figures["server_restarts"]),
        ("stalls (pause, sleep, zombie)", figures["stalls"]),
        ("jobs lost", figures["lost"]),
        ("duplicates processed", report.duplicates),
        ("  explained", explained),
        ("  unexplained", figures["unexplained"]),
        ("reclaims", report.reclaims),
        ("duplicates prevented (idempotency)", report.idempotent_skips),
        ("late acks fenced", report.fenced_acks),
        ("false reclaims", len(report.false_reclaims)),
        ("quiescent at the end", report.quiescent),
    ]
    for label, value in rows:
        print(f"{label:<36} {value}")
    print(f"{'faults':<36} {json.dumps(report.faults, sort_keys=True)}")
    print(f"{'client errors by kind':<36} {json.dumps(report.errors, sort_keys=True)}")
    if report.structure:
        print(f"{'structure':<36} {report.structure[:5]}")
    print(f"{'verdict':<36} {'ok' if report.ok else 'FAILED'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/soak.py", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, required=True, help="per server")
    parser.add_argument("--servers", default="redis,valkey")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rotator-soak-"))
    print(f"soak: {args.minutes:g} min per server, seed {seed}, workdir {workdir}", flush=True)
    reports = []
    for kind in args.servers.split(","):
        if kind not in ("redis", "valkey"):
            parser.error(f"unknown server {kind!r}")
        server: Kind = "redis" if kind == "redis" else "valkey"
        print(f"\n{kind}:", flush=True)
        reports.append(Soak(server, workdir / kind, seed, args.minutes).soak())
    for report in reports:
        print_report(report)
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
