"""Every broker-URL mistake is one line: the checks in ``producer/settings/urls.py``, and the
CLI, the worker and the launcher against them (real processes; a real redis-server with
requirepass for the wrong password)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from producer.errors import SettingsError
from producer.settings import Settings
from producer.settings.urls import mask, url_problem
from tests.require import require_binary
from tests.services import REDIS_INSTALL, REPO_ROOT, RedisServer, free_port
from worker.lifecycle.launcher import CONFIG_EXIT

PASSWORD = "right-pw"


class PasswordRedis(RedisServer):
    """redis-server with ``requirepass``."""

    def argv(self) -> list[str]:
        return [*super().argv(), "--requirepass", PASSWORD]


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PasswordRedis]:
    server = PasswordRedis(require_binary("redis-server", REDIS_INSTALL),
                           tmp_path_factory.mktemp("locked"))
    server.password = PASSWORD
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize(("url", "says"), [
    ("127.0.0.1:16391", "did you mean redis://127.0.0.1:16391/0"),
    ("http://127.0.0.1:1/", "scheme http:// is not supported"),
    ("redis://:pw@/0", "no host"),
    ("redis://h:notaport/0", "not a valid URL"),
    ("redis://h:6379/zero", "database number"),
    ("sentinel://h:26379", "FRAMEFLEET_SENTINEL_MASTER"),
    ("sentinel://h:26379;redis://h2:6379", "must be a sentinel:// URL"),
    ("redis://a:1/0;redis://b:1/0", "only sentinel:// URLs"),
    ("", "empty"),
])
def test_bad_urls_are_named(url: str, says: str) -> None:
    problem = url_problem(url, ("redis", "rediss", "sentinel", "filesystem"), None)
    assert problem is not None and says in problem


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/0", "rediss://:t@h:6379/0?ssl_cert_reqs=required", "filesystem://",
])
def test_good_urls_pass(url: str) -> None:
    assert url_problem(url, ("redis", "rediss", "sentinel", "filesystem"), None) is None
    assert url_problem("sentinel://a:26379/0;sentinel://b:26379/0", ("sentinel",), "m") is None


def test_passwords_are_masked_in_the_settings_error() -> None:
    assert mask("sentinel://:pw1@a:1/0;sentinel://u:pw2@b:2/0") == (
        "sentinel://:***@a:1/0;sentinel://u:***@b:2/0")
    with pytest.raises(SettingsError) as e:
        Settings(broker_url="redis://:hunter2@h:1/0;x", result_backend=None)
    assert "hunter2" not in str(e.value) and "FRAMEFLEET_BROKER_URL=" in str(e.value)
    with pytest.raises(SettingsError, match="FRAMEFLEET_RESULT_BACKEND='http"):
        Settings(result_backend="http://x:1/")


BAD = ["127.0.0.1:16391", "http://127.0.0.1:1/", "redis://:x@127.0.0.1:1/0;y"]


def run(argv: list[str], url: str, timeout: float) -> tuple[int, list[str], float]:
    env = {**os.environ, "FRAMEFLEET_BROKER_URL": url, "FRAMEFLEET_METRICS_PORT": "0",
           "FRAMEFLEET_DEVICE": "cpu", "PYTHONWARNINGS": "ignore"}
    env.pop("FRAMEFLEET_RESULT_BACKEND", None)
    start = time.monotonic()
    out = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    return out.returncode, lines, time.monotonic() - start


def one_error_line(lines: list[str]) -> str:
    """The one ``error:`` line, and no traceback (Celery may add its root-user warning)."""
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, lines
    assert not any("Traceback" in line for line in lines), lines
    return errors[0]


CLI = [sys.executable, "-m", "producer.cli", "status", "x"]
WORKER = [sys.executable, "-m", "celery", "-A", "worker.lifecycle.main", "worker", "-c", "1",
          "-n", "urlcheck@%h", "--without-gossip", "--without-mingle"]
LAUNCHER = [sys.executable, "-m", "worker", "--cpu", "1"]


@pytest.mark.parametrize("url", BAD)
@pytest.mark.parametrize(("argv", "code"), [(CLI, 1), (WORKER, CONFIG_EXIT), (LAUNCHER, 1)],
                         ids=["cli", "worker", "launcher"])
def test_bad_url_is_one_line(argv: list[str], code: int, url: str) -> None:
    rc, lines, took = run(argv, url, timeout=60)
    line = one_error_line(lines)
    assert line.startswith("error: invalid settings: FRAMEFLEET_BROKER_URL="), line
    assert rc == code and took < 60
    assert ":x@" not in line


@pytest.mark.parametrize(("argv", "code"), [(CLI, 1), (WORKER, CONFIG_EXIT), (LAUNCHER, 1)],
                         ids=["cli", "worker", "launcher"])
def test_wrong_password_is_one_line(locked: PasswordRedis, argv: list[str], code: int) -> None:
    url = f"redis://:wrong-pw@127.0.0.1:{locked.port}/0"
    rc, lines, took = run(argv, url, timeout=60)
    line = one_error_line(lines)
    assert "password" in line and "wrong-pw" not in line, line
    assert rc == code and took < 60
    assert not any(" ready." in line for line in lines), lines


def test_launcher_stops_on_a_worker_configuration_error(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A worker that exits CONFIG_EXIT is not restarted: the launcher stops with it."""
    from worker.lifecycle import launcher as launcher_module

    starts = tmp_path / "starts"
    code = f"open({str(starts)!r}, 'a').write('x'); raise SystemExit({CONFIG_EXIT})"
    monkeypatch.setattr(launcher_module, "worker_command",
                        lambda name: [sys.executable, "-c", code])
    slot = launcher_module.WorkerSlot(f"cpu0@test-{free_port()}", {})
    start = time.monotonic()
    rc = launcher_module.Launcher([slot], drain_s=5).run(poll_s=0.1)
    assert rc == CONFIG_EXIT and time.monotonic() - start < 10
    assert starts.read_text() == "x"  # started once, never restarted
