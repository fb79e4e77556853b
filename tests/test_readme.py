"""The README's examples, run as written."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import redis

from tests.servers import ServerProcess, find_cli_binary

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def fenced_block_after(marker: str) -> str:
    match = re.search(re.escape(marker) + r"\s*```bash\n(.*?)```", README, re.DOTALL)
    assert match, f"README has no bash block after {marker}"
    return match.group(1)


def test_the_redis_cli_example_runs_verbatim(
    server: ServerProcess, client: redis.Redis, tmp_path: Path
) -> None:
    # A redis-cli on PATH that talks to the test server, so the lines run unchanged.
    shim = tmp_path / "redis-cli"
    shim.write_text(f'#!/bin/sh\nexec {find_cli_binary("redis")} -p {server.port} "$@"\n')
    shim.chmod(0o755)
    if leftovers := [*client.keys("rotator:{orders}:*"), *client.keys("rotator:{emails}:*")]:
        client.delete(*leftovers)
    script = "set -eu\n" + fenced_block_after("<!-- redis-cli-example -->")
    result = subprocess.run(
        ["bash", "-c", script],
        cwd=ROOT,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout.split("\n")
    assert out[0] == "2"  # push
    assert out[1:4] == ["0", "30000", "0"]  # next: not idle, 30 s to the lease deadline, 0 acked
    assert out[4].startswith("job-1*")
    assert out[5] == "0"  # not reclaimed
    assert out[6] == "1"  # ack of job-2's token
    stats = dict(zip(out[7:105:2], out[8:105:2], strict=True))
    assert stats["length"] == "2"
    assert stats["in_flight"] == "1"
    assert stats["done"] == "1"
    assert (stats["scheduled"], stats["paused"], stats["schedules"]) == ("0", "0", "0")
    assert (stats["rate_limit_jobs"], stats["rate_limit_ms"]) == ("0", "0")
    assert (stats["pushed"], stats["delivered"], stats["completed"]) == ("2", "2", "0")
    assert stats["dsum"] == "0"
    assert stats["cancelled"] == "0"
    assert out[105:110] == ["1", "1", "1", "1", "1"]  # push_later ... rate_limit
    assert out[110:137] == ["0"] * 6 + ["2"] + ["0"] * 19 + ["90"]  # durations
    # unique push, cancel, push_priority, unschedule, pushp_later
    assert out[137:] == ["2", "1", "1", "1", "1", ""]
    assert client.hgetall("rotator:{emails}:ids") == {
        b"mail-1": b"p",
        b"*mail-2": b"1",
        b"mail-9": b"q3",
    }
    assert client.zcard("rotator:{orders}:scheduled") == 2  # job-3 and job-4 (pushp_later)
    assert client.hgetall("rotator:{orders}:payloads") == {b"job-4": b'{"n":4}'}
    assert client.llen("rotator:{orders}:ring") == 1  # its sentinel: both jobs are leased
    assert client.llen("rotator:{orders}:leases") == 2


def test_the_topic_example_runs_as_written(server: ServerProcess, client: redis.Redis) -> None:
    match = re.search(r"<!-- topic-example -->\s*```python\n(.*?)```", README, re.DOTALL)
    assert match, "README has no topic example"
    if leftovers := client.keys("rotator:{news}:*"):
        client.delete(*leftovers)
    code = match.group(1).replace("redis://localhost:6379/0", server.url)
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    ids = namespace["ids"]
    assert isinstance(ids, list)
    assert len(ids) == 2
    # Unsubscribed at the end: the group's keys are gone, the topic's retained log is not.
    assert not client.keys("rotator:{news}:group:*")
    assert client.hlen("rotator:{news}:topic:bodies") == 2
    assert client.zcard("rotator:{news}:topic:log") == 1  # one run: one publish call


def test_the_node_example_runs_as_written(
    server: ServerProcess, client: redis.Redis, tmp_path: Path
) -> None:
    match = re.search(r"<!-- node-example -->\s*```js\n(.*?)```", README, re.DOTALL)
    assert match, "README has no Node example"
    node = shutil.which("node")
    package = ROOT / "clients" / "node"
    if node is None or not (package / "dist" / "index.js").exists():
        pytest.fail(
            "the Node example needs node and the built package: `apt-get install -y nodejs npm`,"
            " then `npm ci && npm run build` in clients/node (python3 tasks.py test does both)",
            pytrace=False,
        )
    if leftovers := client.keys("rotator:{invoices}:*"):
        client.delete(*leftovers)
    # `require("rotator-queue")` finds the package as an installed one would be.
    modules = tmp_path / "node_modules"
    modules.mkdir()
    (modules / "rotator-queue").symlink_to(package)
    script = tmp_path / "example.js"
    script.write_text(match.group(1).replace("redis://localhost:6379/0", server.url))
    result = subprocess.run(
        [node, str(script)],
        env={"PATH": "/usr/bin:/bin", "NODE_PATH": f"{modules}:{package / 'node_modules'}"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["sending inv-4", "1 1 LeaseLost"]
    assert client.zcard("rotator:{invoices}:scheduled") == 1  # inv-3, in a minute
