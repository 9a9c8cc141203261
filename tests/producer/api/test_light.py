"""The gateway never imports torch, a codec or worker code: the producer image has none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BLOCKER = """
import sys
BLOCKED = {"torch", "av", "diffusers", "transformers", "worker"}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked import of {name}")
        return None
sys.meta_path.insert(0, Block())
import producer.api.app, producer.api.serve, producer.cli
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not loaded, loaded
print("ok")
"""


def test_the_gateway_imports_without_torch_av_or_worker() -> None:
    out = subprocess.run([sys.executable, "-c", BLOCKER], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
