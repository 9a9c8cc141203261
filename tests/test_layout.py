"""The layout's rules, checked on the source: module size, who spells a Redis key, the run
path's function size, the floors of imports in ``worker/`` and ``producer/``, and ``bench/``'s
groups (no module over 400 lines, no two modules importing each other)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 400
MAX_RUN_FUNCTION_LINES = 60


def _modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_no_module_is_over_400_lines() -> None:
    big = {str(p.relative_to(ROOT)): n for p in _modules("producer", "worker", "tests", "bench")
           if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not big, big


def test_one_module_spells_the_redis_keys() -> None:
    spelled = [str(p.relative_to(ROOT)) for p in _modules("producer", "worker")
               if "framefleet:" in p.read_text()]
    assert spelled == ["producer/state/keys.py"]


def test_no_function_of_the_run_path_is_over_60_lines() -> None:
    long = {}
    for path in [*_modules("worker/run"), ROOT / "worker/tasks.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_RUN_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert not long, long


#: worker/'s floors, lowest first: a room imports its own modules and rooms on lower floors only,
#: never one on its floor or above. A name is a module or a package (its modules with it); the
#: top package's name stands for its ``__init__`` alone.
WORKER_FLOORS = [
    # the base modules: start-up noise, label values and the stuck-job watchdog (any room may
    # name the stage its run waits in); then the package itself, devices, the device owner,
    # the memory guard a run polls, the Prometheus series (and above them the stuck-job
    # counter's former module, kept for its callers)
    ["worker.quiet", "worker.labels", "worker.watchdog"],
    ["worker", "worker.devices", "worker.owner", "worker.memory", "worker.metrics"],
    ["worker.decoders", "worker.stores", "worker.stuck_metrics"],
    ["worker.pipeline", "worker.inputs"],
    ["worker.sinks", "worker.generate"],
    ["worker.run"],
    ["worker.concerns"],
    ["worker.tasks"],
    ["worker.lifecycle", "worker.commands"],
    ["worker.__main__"],
]
#: producer/'s floors, the same rule. The wire's models stand below the settings (which parse
#: URIs and webhook host entries with them); the fleet's rules for a spec read the settings.
PRODUCER_FLOORS = [
    ["producer.errors", "producer.ports"],
    ["producer.wire", "producer.webhooks.hosts"],
    ["producer.settings"],
    ["producer", "producer.spec", "producer.state", "producer.webhooks"],
    ["producer.wire.rules", "producer.app"],
    ["producer.client", "producer.cost"],
    ["producer.ops", "producer.api"],
    ["producer.cli"],
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, at its top or inside a function: ``from a import b`` names
    ``a.b`` where that is a module, else ``a``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                base = ROOT / sub.replace(".", "/")
                yield sub if base.with_suffix(".py").exists() or base.is_dir() else node.module


def _room(module: str, floors: list[list[str]]) -> tuple[int, str] | None:
    """The floor and the room (the longest name of the table that holds ``module``)."""
    best: tuple[int, str] | None = None
    for floor, rooms in enumerate(floors):
        for room in rooms:
            inside = module == room or ("." in room and module.startswith(room + "."))
            if inside and (
                    best is None or len(room) > len(best[1])):
                best = (floor, room)
    return best


@pytest.mark.parametrize("package,floors", [("worker", WORKER_FLOORS),
                                            ("producer", PRODUCER_FLOORS)])
def test_no_import_runs_up_a_floor(package: str, floors: list[list[str]]) -> None:
    unplaced, upward = [], []
    for path in _modules(package):
        module = _module_name(path)
        here = _room(module, floors)
        if here is None:
            unplaced.append(module)
            continue
        for target in _imports(path):
            if target.split(".")[0] != package:
                continue
            there = _room(target, floors)
            assert there is not None, f"{module} imports {target}, on no floor"
            if there[1] != here[1] and there[0] >= here[0]:
                upward.append(f"{module} (floor {here[0]}) -> {target} (floor {there[0]})")
    assert not unplaced, unplaced
    assert not upward, upward


def test_no_two_bench_modules_import_each_other() -> None:
    # Given each bench module's imports of other bench modules (lazy ones too)
    graph = {_module_name(p): {t for t in _imports(p) if t.startswith("bench.")}
             for p in _modules("bench")}
    # When the graph is walked from every module
    cycles = []

    def walk(module: str, path: list[str]) -> None:
        for target in sorted(graph.get(module, ())):
            if target in path:
                cycles.append([*path[path.index(target):], target])
            elif target in graph:
                walk(target, [*path, target])

    for module in graph:
        walk(module, [module])
    # Then no path comes back to where it started
    assert not cycles, cycles
