"""The conformance scenarios (tests/conformance/*.json), run by Python on Redis 7.0 and Valkey
8.1, and on Redis 6.2 and 8.2, the oldest and the newest Redis rotator supports (6.2 has no
functions: the module by EVALSHA there).

The Node client runs the very same files (clients/node/test/conformance.test.ts); the format
is documented in tests/conformance/README.md.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from rotator.keys import KEY_ROLES, TOPIC_ROLES, QueueKeys, TopicKeys, queue_keys, topic_keys
from rotator.script import module_source
from tests.servers import ServerProcess

HERE = Path(__file__).resolve().parent / "conformance"
FILES = sorted(HERE.glob("*.json"))
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
ROLES = (*KEY_ROLES, "payloads", "items")


def scenarios() -> Iterator[Any]:
    for path in FILES:
        data = json.loads(path.read_text(encoding="utf-8"))
        for scenario in data["scenarios"]:
            yield pytest.param(path.name, scenario, id=f"{path.stem}:{scenario['name']}")


def normal(value: Any) -> Any:
    """A reply as the scenarios see it: text, integers, None and lists."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, list):
        return [normal(item) for item in value]
    return value


class Mismatch(AssertionError):
    pass


class Runner:
    def __init__(self, client: redis.Redis, keys: QueueKeys, topic: TopicKeys) -> None:
        self.client = client
        self.keys = keys
        self.topic = topic
        self.vars: dict[str, str] = {}
        self.sha = str(client.script_load(module_source()))
        self.sent_ms = 0.0

    def key(self, role: str) -> str:
        """A queue role, "topic:<role>" (the topic's own keys), "group:<GROUP>:<role>"
        (a group's thirteen; its "payloads" are the topic's bodies) or "marker:<NAME>"
        (the key "<base>:<NAME>" under the queue's base: push_chunk's marker)."""
        kind, _, rest = role.partition(":")
        if kind == "marker":
            return f"{self.keys.ring.removesuffix(':ring')}:{rest}"
        if kind == "topic":
            return self.topic.all[TOPIC_ROLES.index(rest)]
        if kind == "group":
            group, _, own = rest.rpartition(":")
            keys = self.topic.group(group)
            return keys.payloads if own == "payloads" else keys.all[KEY_ROLES.index(own)]
        return self.keys.with_items[ROLES.index(role)]

    def call_keys(self, step: dict[str, Any]) -> list[str]:
        # A marker "<base>:<NAME>" comes last: after the queue's keys (push_chunk's thirteen,
        # or as many as "keys" says: once), or after the topic's and its groups' (tpublish_chunk).
        marker = [self.key(f"marker:{step['marker']}")] if "marker" in step else []
        if "topic" in step:  # TOPIC KEYS, then each named group's thirteen
            groups = (k for g in step["topic"] for k in self.topic.group(g).all)
            return [*self.topic.all, *groups, *marker]
        if marker:
            return [*self.keys.with_items[: int(step.get("keys", 13))], *marker]
        if "group" in step:  # a group's thirteen (and with "keys": 14 the topic's bodies)
            group = self.topic.group(step["group"])
            return [*group.all, group.payloads][: int(step.get("keys", 13))]
        return list(self.keys.with_items[: int(step.get("keys", 13))])

    def snapshot_roles(self, step: dict[str, Any]) -> list[str]:
        """The queue's keys, the topic's, and those of every group the call names."""
        named = [*step.get("topic", []), *([step["group"]] if "group" in step else [])]
        groups = [f"group:{g}:{role}" for g in named for role in KEY_ROLES]
        marker = [f"marker:{step['marker']}"] if "marker" in step else []
        return [*ROLES, *(f"topic:{role}" for role in TOPIC_ROLES), *groups, *marker]

    def subst(self, text: str) -> str:
        return _VAR.sub(lambda m: self.vars[m.group(1)], text)

    def call(self, step: dict[str, Any]) -> Any:
        keys = self.call_keys(step)
        args = [self.subst(a) if isinstance(a, str) else str(a) for a in step["call"]]
        self.sent_ms = time.time() * 1000
        return normal(self.client.evalsha(self.sha, len(keys), *keys, *args))

    def snapshot(self, step: dict[str, Any]) -> list[Any]:
        return [self.read(role) for role in self.snapshot_roles(step)]

    def read(self, role: str) -> Any:
        key = self.key(role)
        kind = normal(self.client.type(key))
        if kind == "list":
            return normal(self.client.lrange(key, 0, -1))
        if kind == "set":
            return sorted(normal(list(self.client.smembers(key))))
        if kind == "zset":
            return normal(self.client.zrange(key, 0, -1))
        if kind == "hash":
            return {normal(k): normal(v) for k, v in self.client.hgetall(key).items()}
        if kind == "none":
            return None
        return normal(self.client.get(key))

    def match(self, want: Any, got: Any, where: str) -> None:
        if isinstance(want, dict):
            self.match_special(want, got, where)
        elif isinstance(want, list):
            if not isinstance(got, list) or len(got) != len(want):
                raise Mismatch(f"{where}: want {want!r}, got {got!r}")
            for i, (w, g) in enumerate(zip(want, got, strict=True)):
                self.match(w, g, f"{where}[{i}]")
        else:
            expected = self.subst(want) if isinstance(want, str) else want
            if got != expected or type(got) is not type(expected):
                raise Mismatch(f"{where}: want {expected!r}, got {got!r}")

    def match_special(self, want: dict[str, Any], got: Any, where: str) -> None:
        if "capture" in want or "match" in want:
            if "match" in want:
                found = isinstance(got, str) and re.search(self.subst(want["match"]), got)
                if not found:
                    raise Mismatch(f"{where}: {got!r} does not match {want['match']!r}")
                if "capture" in want:
                    self.vars[want["capture"]] = found.group(1) if found.re.groups else got
            elif "capture" in want:
                self.vars[want["capture"]] = str(got)
        elif "any" in want:
            pass
        elif "range" in want or "time" in want:
            low, high = want.get("range") or want["time"]
            base = self.sent_ms if "time" in want else 0
            if not isinstance(got, int) or not low <= got - base <= high:
                raise Mismatch(f"{where}: {got!r} not within {want!r} (sent at {self.sent_ms:.0f})")
        elif "pairs" in want:
            if not isinstance(got, list):
                raise Mismatch(f"{where}: want pairs, got {got!r}")
            found_pairs = dict(zip(got[::2], got[1::2], strict=True))
            for name, value in want["pairs"].items():
                if name not in found_pairs:
                    raise Mismatch(f"{where}: no {name!r} in {got!r}")
                self.match(value, found_pairs[name], f"{where}.{name}")
        elif "fields" in want:
            if not isinstance(got, dict):
                raise Mismatch(f"{where}: want a hash, got {got!r}")
            for name, value in want["fields"].items():
                field = self.subst(name)
                self.match(value, got.get(field), f"{where}.{field}")
        elif "len" in want:
            if not isinstance(got, list) or len(got) != want["len"]:
                raise Mismatch(f"{where}: want {want['len']} items, got {got!r}")
        else:
            raise Mismatch(f"{where}: unknown matcher {want!r}")

    def step(self, step: dict[str, Any], where: str) -> None:
        if "sleep_ms" in step:
            time.sleep(step["sleep_ms"] / 1000)
        elif "plant" in step:
            for role, value in step["plant"].items():
                self.client.set(self.key(role), value)
        elif "plant_fields" in step:
            for role, fields in step["plant_fields"].items():
                self.client.hset(self.key(role), mapping=fields)
        elif "state" in step:
            for role, want in step["state"].items():
                self.match(want, self.read(role), f"{where} state {role}")
        elif "error" in step:
            before = self.snapshot(step)
            try:
                reply = self.call(step)
            except redis.ResponseError as error:
                code = str(error).removeprefix("ERR ").split(" ", 1)[0]
                if code != step["error"]:
                    raise Mismatch(f"{where}: want {step['error']}, got {error}") from None
            else:
                raise Mismatch(f"{where}: want {step['error']}, got the reply {reply!r}")
            if self.snapshot(step) != before:
                raise Mismatch(f"{where}: the failed call wrote something")
        else:
            self.match(step.get("reply"), self.call(step), f"{where} reply")


def test_the_scenario_files_are_there() -> None:
    names = {path.stem for path in FILES}
    assert len(names) >= 11, names
    for path in FILES:
        data = json.loads(path.read_text(encoding="utf-8"))
        assert data["description"], path.name
        assert data["scenarios"], path.name


def run_scenario(client: redis.Redis, file: str, scenario: dict[str, Any]) -> None:
    name = f"conf-{uuid.uuid4().hex[:12]}"
    runner = Runner(client, queue_keys(name), topic_keys(name))
    for i, step in enumerate(scenario["steps"]):
        runner.step(step, f"{file} / {scenario['name']} / step {i + 1}")


@pytest.mark.parametrize(("file", "scenario"), list(scenarios()))
def test_conformance(client: redis.Redis, file: str, scenario: dict[str, Any]) -> None:
    run_scenario(client, file, scenario)


@pytest.mark.parametrize(("file", "scenario"), list(scenarios()))
def test_conformance_on_the_oldest_and_newest_redis(
    other_server: ServerProcess, file: str, scenario: dict[str, Any]
) -> None:
    with other_server.client() as client:
        run_scenario(client, file, scenario)
