"""Import modules in a fresh interpreter where some packages cannot be imported: what the
producer image (no torch, no codec) and a producer's light install would see."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_SCRIPT = """
import importlib, pkgutil, sys
blocked, modules, walk = sys.argv[1].split(","), sys.argv[2].split(","), sys.argv[3] == "1"
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"blocked import of {name}")
        return None
sys.meta_path.insert(0, Block())
skip = tuple(p for p in sys.argv[4].split(",") if p)
for name in modules:
    module = importlib.import_module(name)
    if walk:
        for info in pkgutil.walk_packages(module.__path__, name + "."):
            if not info.name.startswith(skip) and not info.name.endswith("__main__"):
                importlib.import_module(info.name)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in blocked)
assert not loaded, loaded
print("ok")
"""


def import_blocked(modules: Iterable[str], blocked: Iterable[str], *, walk: bool = False,
                   skip: Iterable[str] = ()) -> subprocess.CompletedProcess[str]:
    """Import ``modules`` (with ``walk``, every module of those packages but ``skip``
    prefixes) where importing any of ``blocked`` raises; stdout is ``ok`` when they loaded
    and none of the blocked packages was even attempted."""
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT, ",".join(blocked), ",".join(modules),
         "1" if walk else "0", ",".join(skip)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
