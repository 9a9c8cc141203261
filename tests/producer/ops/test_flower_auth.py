"""``framefleet flower`` on loopback unless told otherwise, behind the login of the settings
(given to Flower in its environment, never on its command line). A real Flower on the test
Redis."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.infra.test_flower import FlowerProcess


class PlainFlower(FlowerProcess):
    """``framefleet flower --port=P``: no address given, and the API behind the login too."""

    def argv(self) -> list[str]:
        return [*super().argv()[:-2], f"--port={self.port}"]

    def _answers(self) -> bool:
        return self.get("/")[0] in (200, 401) and "Connected to redis" in self.log_text()

    def get_auth(self, path: str, user: str, password: str) -> int:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request = urllib.request.Request(self.url + path,
                                         headers={"Authorization": f"Basic {token}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as e:
            return e.code


@pytest.fixture
def flower(redis_url: str, tmp_path: Path) -> PlainFlower:
    return PlainFlower(tmp_path / "flower", redis_url, env={
        "FLOWER_UNAUTHENTICATED_API": "", "FRAMEFLEET_FLOWER_BASIC_AUTH": "admin:s3cret-pw"})


def test_flower_binds_loopback_and_asks_for_the_login(flower: PlainFlower) -> None:
    flower.start()
    try:
        flower.wait_ready()
        # Listens on loopback only
        listening = {c.laddr.ip for c in psutil.Process(flower.pid).net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == flower.port}
        assert listening == {"127.0.0.1"}, listening
        # Asks for the login of FRAMEFLEET_FLOWER_BASIC_AUTH, and takes it
        assert flower.get("/")[0] == 401
        assert flower.get_auth("/", "admin", "wrong") == 401
        assert flower.get_auth("/", "admin", "s3cret-pw") == 200
        # The password is in no command line (`ps` shows those to every user)
        assert "s3cret-pw" not in " ".join(psutil.Process(flower.pid).cmdline())
    finally:
        flower.stop()
