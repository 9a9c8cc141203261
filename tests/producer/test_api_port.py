"""The gateway's default port is free beside the quickstart's SeaweedFS: no port that ``weed
mini`` (or ``weed server``/``weed volume``, whose volume server takes 8080) opens by default,
nor their gRPC ports (+10000)."""

from __future__ import annotations

import re
import subprocess

from producer.ports import DEFAULT_API_PORT
from producer.settings import Settings
from tests.require import require_binary
from tests.services import WEED_INSTALL


def test_the_api_default_port_is_none_that_seaweedfs_takes() -> None:
    weed = require_binary("weed", WEED_INSTALL)
    taken: set[int] = set()
    for command in ("mini", "server", "volume"):
        usage = subprocess.run([weed, command, "-h"], capture_output=True, text=True,
                               timeout=60)
        text = usage.stdout + usage.stderr
        # "-volume.port int\n    volume server http listen port (default 8080)"
        ports = {int(p) for p in re.findall(r"port[^\n]*\n\s+[^\n]*\(default (\d+)\)", text)}
        assert ports, (command, text[:500])
        taken |= ports | {p + 10000 for p in ports}
    assert 8333 in taken and 9333 in taken  # the parse found the S3 and master ports
    assert DEFAULT_API_PORT not in taken, sorted(taken)
    assert Settings().api_port == DEFAULT_API_PORT
