"""The Sentinel deployments' start script, and the defaults the manifests must agree with."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "infra" / "k8s" / "overlays" / "sentinel" / "redis-ha.sh"


def script_default(variable: str) -> str:
    """The default ``redis-ha.sh`` gives ``variable`` (``${HA_MASTER_NAME:-framefleet}``)."""
    found = re.findall(rf"\$\{{{variable}:-([^}}]*)\}}", SCRIPT.read_text())
    assert found and len(set(found)) == 1, f"{variable}: {found}"
    return str(found[0])
