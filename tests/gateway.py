"""``framefleet api`` as a real uvicorn process on loopback, and the files it reads.

Shared by the API's tests and the load benchmark: a keys file (each key stored as its sha256,
as in production), a model map, and a ``GatewayProcess`` that runs the CLI command with the
given settings and waits until ``/readyz`` answers.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.services import REPO_ROOT, _Process, free_port

#: The hls.js the package ships and the page serves (the pinned npm file).
HLS_JS = REPO_ROOT / "producer" / "api" / "static" / "hls.min.js"


@dataclass(frozen=True)
class Key:
    tenant: str
    secret: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"}


def write_keys(path: Path, tenants: Mapping[str, Mapping[str, Any]]) -> dict[str, Key]:
    """A keys file with one fresh random key per tenant (``tenants``: extra fields each);
    returns the keys, which exist nowhere else."""
    keys, lines = {}, []
    for tenant, extra in tenants.items():
        key = Key(tenant, "ffk_" + secrets.token_urlsafe(32))
        keys[tenant] = key
        lines += ["[[keys]]", f'tenant = "{tenant}"',
                  f'sha256 = "{hashlib.sha256(key.secret.encode()).hexdigest()}"']
        lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return keys


def write_models(path: Path, models: Mapping[str, Mapping[str, Any]]) -> Path:
    """A model map (JSON): name -> entry."""
    path.write_text(json.dumps({"models": models}))
    return path


class GatewayProcess(_Process):
    """``python -m producer.cli api`` with ``env`` on a free loopback port."""

    def __init__(self, workdir: Path, env: Mapping[str, str], name: str = "gateway",
                 cwd: Path = REPO_ROOT) -> None:
        super().__init__(name, workdir / f"{name}.log")
        self.cwd = cwd  # elsewhere than the checkout: the package is an installed one
        self.port = free_port()
        self.env = {**os.environ, **env, "FRAMEFLEET_API_ADDR": "127.0.0.1",
                    "FRAMEFLEET_API_PORT": str(self.port), "PYTHONUNBUFFERED": "1"}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/readyz", timeout=2) as r:
                return int(r.status) == 200
        except (OSError, urllib.error.HTTPError):
            return False

    def start(self, timeout: float = 60.0) -> float:
        self._spawn([sys.executable, "-m", "producer.cli", "api"], self.env, self.cwd)
        return self._wait_until(self._ready, timeout, "ready /readyz", 0.1)
