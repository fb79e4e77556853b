"""No-op tasks for the Python peers; importable by their worker processes."""

from __future__ import annotations


def noop() -> None:
    """What every peer runs per job: nothing."""
