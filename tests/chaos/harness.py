"""The controller side of a chaos run: one server, worker and producer processes, faults,
the final drain and the checker. Used by the tests in this folder and by ``bench/soak.py``.

Every process it starts is recorded and is the only thing it ever signals; ``close`` kills
what is left, by pid, and stops the server.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from rotator import Rotator, RotatorError
from rotator.protocol import seconds_to_ms
from tests.chaos.checker import QueueState, Report, check, read_state
from tests.chaos.eventlog import (
    DoneIndex,
    EventLog,
    chaos_client,
    error_kind,
    tail_event,
)
from tests.chaos.faultproxy import PASS, FaultProxy, Mode
from tests.chaos.producer import Producer
from tests.chaos.worker import ChaosWorker, make_idempotency
from tests.servers import Kind, ServerProcess

REPO = Path(__file__).resolve().parents[2]
QUEUE = "chaos"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# Every report written in this process, for the session summary (see conftest.py).
REPORTS: list[Report] = []


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process, from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


@dataclass
class Proc:
    name: str
    role: str  # worker or producer
    popen: subprocess.Popen[bytes]
    log: Path
    options: dict[str, Any] = field(default_factory=dict)
    # Exit statuses that are not a finding: a clean stop, and what the run itself dealt this
    # process (a SIGKILL; a SIGTERM that came before its handler, see stop_processes).
    expected_exits: set[int] = field(default_factory=lambda: {0})

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None


class ChaosRun:
    """One queue on one fresh server, the processes around it, and the faults dealt out."""

    def __init__(
        self,
        kind: Kind,
        workdir: Path,
        *,
        seed: int,
        test: str,
        config: Mapping[str, str] | None = None,
        payloads: bool = False,
    ) -> None:
        self.kind: Kind = kind
        # Every job carries its own body (chaos_body): producers push it, workers check it.
        self.payloads = payloads
        self.workdir = workdir
        self.seed = seed
        self.test = test
        self.rng = random.Random(seed)
        self.server = ServerProcess(kind, workdir / "server", config)
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.errs = workdir / "stderr"
        self.errs.mkdir(exist_ok=True)
        self.queue = QUEUE
        self.faults: Counter[str] = Counter()
        self.notes: dict[str, Any] = {}
        self.procs: list[Proc] = []
        self.snapshots: list[QueueState] = []
        self.kills: list[float] = []  # unix times of the server's SIGKILLs
        self.schedules: dict[str, str] = {}  # recurring schedules made: name -> job id
        self.intervals: dict[str, int] = {}  # their job ids -> interval ms, for the checker
        self._names: Counter[str] = Counter()
        self._admin: redis.Redis | None = None
        self._admin_port = 0

    # -- server ----------------------------------------------------------------------------

    def start(self) -> None:
        self.server.start()

    @property
    def url(self) -> str:
        return self.server.url

    def admin(self) -> redis.Redis:
        """A client that never replays a command (DEBUG SLEEP twice would be a longer stall)."""
        if self._admin is None or self._admin_port != self.server.port:
            self._close_admin()
            self._admin = self.server.client(
                socket_timeout=15, socket_connect_timeout=2, retry=Retry(NoBackoff(), 0)
            )
            self._admin_port = self.server.port
        return self._admin

    def _close_admin(self) -> None:
        if self._admin is not None:
            with contextlib.suppress(Exception):
                self._admin.close()
            self._admin = None

    def admin_call(self, *args: Any) -> Any:
        """One admin command. A connection error is retried once on a fresh connection: after
        a restart the old one is dead, and a command sent on it never reached the server."""
        client: Any = self.admin()  # execute_command is untyped in redis-py
        try:
            return client.execute_command(*args)
        except redis.ConnectionError:
            self._close_admin()
            client = self.admin()
            return client.execute_command(*args)

    def rotator(self, client: redis.Redis | None = None, lease: float = 30.0) -> Rotator:
        return Rotator(client or self.admin(), self.queue, timeout=lease, payloads=self.payloads)

    def kill9_server(self, gap: float) -> None:
        """SIGKILL the server, wait ``gap`` seconds, start it again on the same port."""
        self.kills.append(time.time())
        self.server.kill9()
        self._close_admin()
        time.sleep(gap)
        self.server.start()
        self.faults["server_restarts"] += 1

    def server_down(self, seconds: float) -> None:
        """Shut the server down for ``seconds`` (its data persists), then start it again."""
        self.server.stop()
        self._close_admin()
        time.sleep(seconds)
        self.server.start()
        self.faults["server_downs"] += 1

    @property
    def lossy(self) -> bool:
        """Whether a SIGKILL of this server may lose writes it acknowledged (AOF fsynced
        every second or never, or no AOF at all)."""
        config = self.server.config
        return config.get("appendonly") != "yes" or config.get("appendfsync") != "always"

    def aof_loads(self) -> int:
        """How many launches of the server said they loaded the append-only file."""
        log = self.server.log_path.read_text(errors="replace")
        return sum("DB loaded from append only file" in line for line in log.splitlines())

    # -- processes -------------------------------------------------------------------------

    def calls_in_turn(self, role: str, functions: bool | None) -> bool:
        """How the next process of ``role`` calls the module: as asked, or, not asked, FCALL
        for the first two (the library, as rotator calls it by default, with what it keeps
        from call to call), EVALSHA for the next two, and so on: every run of two workers or
        more meets both, and a run whose workers alternate two modes (our loop and
        ``Rotator.work``) meets each mode both ways. On a server without functions (Redis
        6.2) every process calls by EVALSHA, as a default client does there: asking for FCALL
        would only raise FunctionsUnavailable."""
        if self.kind == "redis6":
            return False
        return self._names[role] // 2 % 2 == 0 if functions is None else functions

    def _spawn(
        self,
        role: str,
        module: str,
        argv: list[str],
        options: dict[str, Any],
        env: Mapping[str, str] | None,
    ) -> Proc:
        self._names[role] += 1
        name = f"{role}{self._names[role]}"
        log = self.logs / f"{name}.log"
        with (self.errs / f"{name}.err").open("wb") as err:
            popen = subprocess.Popen(
                [sys.executable, "-m", module, *argv, "--log", str(log)],
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,  # a Ctrl-C in the terminal reaches the test only
            )
        proc = Proc(name, role, popen, log, options)
        self.procs.append(proc)
        return proc

    def spawn_worker(
        self,
        *,
        lease: float = 1.5,
        job_ms: tuple[float, float] = (1.0, 3.0),
        mode: str = "loop",
        idempotency: str = "log",
        batch: int = 1,
        poll: float = 0.5,
        socket_timeout: float = 2.0,
        url: str | None = None,
        functions: bool | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Proc:
        """A worker process; ``functions``: FCALL (True) or EVALSHA (False); by default the
        run's workers take FCALL (rotator's default) and EVALSHA in turn (calls_in_turn)."""
        functions = self.calls_in_turn("worker", functions)
        options: dict[str, Any] = {
            "lease": lease,
            "job_ms": job_ms,
            "mode": mode,
            "idempotency": idempotency,
            "batch": batch,
            "poll": poll,
            "socket_timeout": socket_timeout,
            "url": url,
            "functions": functions,
        }
        argv = [
            "--url",
            url or self.url,
            "--queue",
            self.queue,
            "--logs-dir",
            str(self.logs),
            "--lease",
            str(lease),
            "--seed",
            str(self.rng.randrange(2**32)),
            "--job-ms",
            f"{job_ms[0]}:{job_ms[1]}",
            "--mode",
            mode,
            "--idempotency",
            idempotency,
            "--batch",
            str(batch),
            "--poll",
            str(poll),
            "--socket-timeout",
            str(socket_timeout),
            *(["--functions"] if functions else []),
            *(["--payloads"] if self.payloads else []),
        ]
        return self._spawn("worker", "tests.chaos.worker", argv, options, env)

    def respawn(self, proc: Proc) -> Proc:
        """A new worker with the options of ``proc`` (crash-point settings not carried over)."""
        return self.spawn_worker(**proc.options)

    def spawn_producer(
        self,
        *,
        count: int,
        start: int = 0,
        prefix: str = "j",
        batch: int = 50,
        rate: float = 1000.0,
        socket_timeout: float = 2.0,
        url: str | None = None,
        functions: bool | None = None,
        later: float = 0.0,
        soon: float = 0.0,
        spread: float = 0.0,
        priorities: Sequence[int] = (),
        retry_for: float = 0.0,
    ) -> Proc:
        """A producer process; ``later``, ``soon`` and ``spread``: scheduled pushes;
        ``priorities``: the levels its batches take in turn; ``retry_for``: its Rotator's
        (see ``producer.py``); ``functions`` as for :meth:`spawn_worker`."""
        functions = self.calls_in_turn("producer", functions)
        argv = [
            "--url",
            url or self.url,
            "--queue",
            self.queue,
            "--prefix",
            prefix,
            "--start",
            str(start),
            "--count",
            str(count),
            "--batch",
            str(batch),
            "--rate",
            str(rate),
            "--seed",
            str(self.rng.randrange(2**32)),
            "--socket-timeout",
            str(socket_timeout),
            *(["--functions"] if functions else []),
            *(["--payloads"] if self.payloads else []),
            *(
                ["--later", str(later), "--soon", str(soon), "--spread", str(spread)]
                if later
                else []
            ),
            *(["--priorities", ",".join(map(str, priorities))] if priorities else []),
            *(["--retry-for", str(retry_for)] if retry_for else []),
        ]
        return self._spawn("producer", "tests.chaos.producer", argv, {}, None)

    def inline_producer(self, name: str = "test") -> Producer:
        """A producer in the test's own process, logging to ``<name>.log``."""
        return Producer(self.url, self.queue, EventLog(self.logs / f"{name}.log"))

    def wait_booted(self, procs: list[Proc], timeout: float = 15.0) -> None:
        """Returns once every process wrote its BOOT line (connected, script loaded)."""
        give_up = time.monotonic() + timeout
        for proc in procs:
            while b" BOOT " not in _read(proc.log):
                if not proc.alive:
                    raise AssertionError(f"{proc.name} exited before booting: {self.stderr(proc)}")
                if time.monotonic() > give_up:
                    raise AssertionError(f"{proc.name} did not boot within {timeout} s")
                time.sleep(0.02)

    def wait_log(self, proc: Proc, needle: str, timeout: float) -> bool:
        """Waits for a line containing ``needle`` in a process's log."""
        give_up = time.monotonic() + timeout
        data = needle.encode()
        while time.monotonic() < give_up:
            if data in _read(proc.log):
                return True
            time.sleep(0.01)
        return False

    def kill9(self, proc: Proc) -> str | None:
        """SIGKILL a worker; returns the last event it logged (what it was doing)."""
        proc.expected_exits.add(-signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.popen.wait(timeout=10)
        self.faults["worker_kills"] += 1
        last = tail_event(proc.log) or "none"
        self.faults[f"killed_after_{last}"] += 1
        return last

    def kill_busy(self, workers: list[Proc], wait: float = 1.0) -> tuple[Proc, str | None]:
        """SIGKILL a live worker that is mid-job (its last event is START) if one shows up
        within ``wait`` seconds, else any live worker that has booted."""
        live = [w for w in workers if w.alive]
        give_up = time.monotonic() + wait
        while True:
            busy = [w for w in live if tail_event(w.log) == "START"]
            if busy or time.monotonic() > give_up:
                break
            time.sleep(0.002)
        booted = [w for w in live if tail_event(w.log) is not None]
        victim = self.rng.choice(busy or booted or live)
        return victim, self.kill9(victim)

    def replace_busy(self, workers: list[Proc]) -> tuple[Proc, str | None]:
        """SIGKILL a worker as :meth:`kill_busy` does, and start another in its place in
        ``workers``; the killed worker and its last event."""
        victim, last = self.kill_busy(workers)
        workers[workers.index(victim)] = self.respawn(victim)
        return victim, last

    def kill_clients(self) -> None:
        """Kills every client connection but the admin's (CLIENT KILL TYPE normal)."""
        self.admin_call("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        self.faults["client_kills"] += 1

    def blackhole(self, proxy: FaultProxy, seconds: float = 1.5) -> None:
        """``proxy`` answers nothing for ``seconds`` (longer than the clients' socket
        timeout), then passes everything."""
        proxy.set_mode(Mode(blackhole=True))
        time.sleep(seconds)
        proxy.set_mode(PASS)
        self.faults["blackholes"] += 1

    def signal(self, proc: Proc, sig: signal.Signals) -> None:
        if proc.alive:
            os.kill(proc.pid, sig)

    def wait_exit(self, proc: Proc, timeout: float) -> int | None:
        try:
            return proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop_processes(self, role: str | None = None, timeout: float = 8.0) -> None:
        """SIGCONT + SIGTERM, then SIGKILL what did not exit within ``timeout``."""
        procs = [p for p in self.procs if p.alive and (role is None or p.role == role)]
        for proc in procs:
            # (workers and producers install their handler before their first event: one
            # that has logged none dies of SIGTERM's default action, which is then our stop)
            if tail_event(proc.log) is None:
                proc.expected_exits.add(-signal.SIGTERM)
            self.signal(proc, signal.SIGCONT)
            self.signal(proc, signal.SIGTERM)
        give_up = time.monotonic() + timeout
        for proc in procs:
            if self.wait_exit(proc, max(0.1, give_up - time.monotonic())) is None:
                proc.expected_exits.add(-signal.SIGKILL)
                self.faults["stop_kills"] += 1
                self.signal(proc, signal.SIGKILL)
                proc.popen.wait(timeout=10)

    def stderr(self, proc: Proc, limit: int = 2000) -> str:
        data = (self.errs / f"{proc.name}.err").read_bytes()
        return data[-limit:].decode(errors="replace")

    def unexpected_exits(self) -> dict[str, str]:
        """Processes that died of something other than a clean stop or a signal the run dealt
        them (``Proc.expected_exits``)."""
        found = {}
        for proc in self.procs:
            code = proc.popen.poll()
            if code is None or code in proc.expected_exits:
                continue
            found[proc.name] = f"exit {code}: {self.stderr(proc)}"
        return found

    # -- recurring schedules -----------------------------------------------------------------

    def schedule(self, name: str, every: float, job_id: str | None = None) -> None:
        """Declares an interval schedule; ``check`` tells the checker and removes it before
        the final drain (a schedule never lets a queue fall quiet)."""
        assert self.rotator().schedule(name, every=every, job_id=job_id)
        self.schedules[name] = job_id or name
        self.intervals[job_id or name] = seconds_to_ms(every, "every")

    def unschedule_all(self, timeout: float = 10.0) -> None:
        give_up = time.monotonic() + timeout
        for name in self.schedules:
            while True:
                try:
                    self.rotator().unschedule(name)
                    break
                except RedisError:
                    self._close_admin()
                    if time.monotonic() > give_up:
                        raise
                    time.sleep(0.1)

    # -- observing -------------------------------------------------------------------------

    def snapshot(self) -> None:
        """Reads the queue's keys in one MULTI for the checker's mid-run invariants."""
        try:
            self.snapshots.append(read_state(self.admin(), self.rotator()))
        except RedisError:
            self._close_admin()  # down or restarted: the next call connects afresh

    def settle(self, timeout: float) -> bool:
        """Waits until nothing is pending, in flight, deferred or scheduled (workers finished)."""
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            try:
                stats = self.rotator().stats()
            except RedisError:
                self._close_admin()
            else:
                if (
                    stats.pending == 0
                    and stats.in_flight == 0
                    and stats.deferred == 0
                    and stats.scheduled == 0
                ):
                    return True
            time.sleep(0.1)
        return False

    def run_for(self, seconds: float, every: float, action: Callable[[], object]) -> None:
        """Calls ``action`` every ``every`` seconds (jittered) for ``seconds``, snapshotting."""
        give_up = time.monotonic() + seconds
        while time.monotonic() < give_up:
            time.sleep(self.rng.uniform(0.5, 1.5) * every)
            action()
            self.snapshot()

    # -- the end ---------------------------------------------------------------------------

    def drain(self, lease: float = 1.5, timeout: float = 25.0) -> bool:
        """One clean in-process worker until the queue is quiet (only the sentinel left)."""
        log = EventLog(self.logs / "drain.log")
        client = chaos_client(
            self.url,
            socket_timeout=5.0,
            on_failure=lambda error: log.write("RETRY", error_kind(error)),
        )
        rotator = Rotator(
            client,
            self.queue,
            timeout=lease,
            idempotency=make_idempotency(log, DoneIndex(self.logs)),
            payloads=self.payloads,
        )
        worker = ChaosWorker(
            rotator, log, random.Random(self.seed), job_ms=(0.0, 0.0), payloads=self.payloads
        )
        give_up = time.monotonic() + timeout
        try:
            while time.monotonic() < give_up:
                try:
                    jobs = rotator.next(100, block=0.25)
                    for job in jobs:
                        worker.process(job)
                    if not jobs:
                        rotator.sweep()  # one lap: acked elements go, leftovers age
                        rotator.sweep()  # a second lap drops the leftovers
                        if read_state(client, rotator).quiet:
                            return True
                except (RedisError, RotatorError) as error:
                    log.write("ERR", "drain", error_kind(error))
                    time.sleep(0.1)
            return False
        finally:
            client.close()
            log.close()

    def check(self, **options: Any) -> Report:
        """Stops every process, drains, runs the checker and writes report.json."""
        self.stop_processes()
        # Nothing claims now, so no tick fires between the stop and this.
        self.unschedule_all()
        lease = float(options.pop("drain_lease", 1.5))
        drained = self.drain(lease=lease, timeout=float(options.pop("drain_timeout", 25.0)))
        self._close_admin()  # the server may have been restarted since the last admin call
        final = read_state(self.admin(), self.rotator())
        report = check(
            self.logs,
            final,
            test=self.test,
            kind=self.kind,
            version=self.server.version,
            seed=self.seed,
            snapshots=self.snapshots,
            faults=dict(self.faults),
            schedules=self.intervals,
            leases={
                "drain": seconds_to_ms(lease, "lease"),
                **{
                    p.name: seconds_to_ms(p.options["lease"], "lease")
                    for p in self.procs
                    if p.role == "worker"
                },
            },
            lossy_restarts=self.kills if self.lossy else (),
            **options,
        )
        if self.payloads:
            # Every job was acked: every payload must be gone with it, copies' counts too.
            report.payload_run = True
            report.payloads_left = int(self.admin().hlen(self.rotator().keys.payloads))
        report.notes.update(self.notes)
        report.notes["drained"] = drained
        report.notes["calls"] = dict(
            Counter("fcall" if p.options["functions"] else "evalsha" for p in self.procs
                    if p.role == "worker")
        )  # fmt: skip
        exits = self.unexpected_exits()
        if exits:
            report.notes["unexpected_exits"] = exits
        report.write(self.workdir / "report.json")
        REPORTS.append(report)
        return report

    def close(self) -> None:
        for proc in self.procs:
            if proc.alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGKILL)
                proc.popen.wait(timeout=10)
        self._close_admin()
        self.server.stop()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""
