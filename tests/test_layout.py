"""The layout's rules, checked on the source: module size, who spells a Redis key, the run
path's function size."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 400
MAX_RUN_FUNCTION_LINES = 60


def _modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_no_module_is_over_400_lines() -> None:
    big = {str(p.relative_to(ROOT)): n for p in _modules("producer", "worker", "tests")
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
