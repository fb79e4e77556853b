"""The asyncio API is a true twin of the sync one: every public method of Rotator, Topic and
TopicGroup exists on its async twin with the same parameters (names, kinds, defaults) and
the same result type, awaitable. Compared by introspection, so the two cannot drift."""

from __future__ import annotations

import inspect
import typing
from typing import Any

import pytest

from rotator import Rotator, Topic, TopicGroup
from rotator.aio import AsyncRotator, AsyncTopic, AsyncTopicGroup

TWINS = [(Rotator, AsyncRotator), (Topic, AsyncTopic), (TopicGroup, AsyncTopicGroup)]
# Parameters whose types differ only by the client or callback being async.
ASYNC_TYPES = {"client", "idempotency", "handler"}
# Methods that are not awaited on either side: they build an object, they do no I/O.
NOT_AWAITED = {"from_url", "embedded", "group", "group_keys", "claim", "producer", "consumer"}


def public_methods(cls: type) -> dict[str, Any]:
    return {
        name: member
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and callable(member) and not isinstance(member, type)
    }


def public_properties(cls: type) -> set[str]:
    return {name for name, member in inspect.getmembers(cls) if isinstance(member, property)}


@pytest.mark.parametrize(("sync", "twin"), TWINS, ids=[a.__name__ for a, _ in TWINS])
def test_the_async_twin_has_every_public_method_and_attribute(sync: type, twin: type) -> None:
    assert set(public_methods(twin)) == set(public_methods(sync))
    assert public_properties(twin) == public_properties(sync)


@pytest.mark.parametrize(("sync", "twin"), TWINS, ids=[a.__name__ for a, _ in TWINS])
def test_every_method_takes_the_same_parameters_and_returns_the_same_type(
    sync: type, twin: type
) -> None:
    for name, method in public_methods(sync).items():
        async_method = getattr(twin, name)
        ours, theirs = inspect.signature(method), inspect.signature(async_method)
        assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == [
            (p.name, p.kind, p.default) for p in theirs.parameters.values()
        ], name
        if name in NOT_AWAITED:
            continue
        assert inspect.iscoroutinefunction(async_method), f"{twin.__name__}.{name} is not async"
        hints = typing.get_type_hints(method)
        async_hints = typing.get_type_hints(async_method)
        assert hints["return"] == async_hints["return"], name
        for parameter in ours.parameters:
            if parameter not in ASYNC_TYPES and parameter in hints:
                assert hints[parameter] == async_hints[parameter], f"{name}({parameter})"


def test_claim_is_a_context_manager_on_both_sides() -> None:
    assert hasattr(Rotator.claim(object.__new__(Rotator)), "__enter__")
    assert hasattr(AsyncRotator.claim(object.__new__(AsyncRotator)), "__aenter__")
