"""``framefleet doctor`` and the workers' persistence warning, against real Redis servers and
SeaweedFS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from producer.cli import doctor
from producer.settings import Settings
from producer.state.broker import broker_persistence, check_broker_url
from tests.require import require_binary
from tests.services import REDIS_INSTALL, REPO_ROOT, RedisServer
from worker import metrics
from worker.concerns import lease
from worker.lifecycle import persistence


class _Redis(RedisServer):
    """A throwaway Redis with extra arguments (snapshots, CONFIG renamed away)."""

    def __init__(self, workdir: Path, extra: list[str], appendonly: bool = False) -> None:
        super().__init__(require_binary("redis-server", REDIS_INSTALL), workdir, appendonly)
        self.extra = extra

    def argv(self) -> list[str]:
        return [*super().argv(), *self.extra]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[dict[str, RedisServer]]:
    found = {
        "none": _Redis(tmp_path / "none", []),
        "aof": _Redis(tmp_path / "aof", [], appendonly=True),
        "rdb": _Redis(tmp_path / "rdb", ["--save", "3600 1"]),
        "managed": _Redis(tmp_path / "managed", ["--rename-command", "CONFIG", ""]),
    }
    try:
        for server in found.values():
            server.start()
        yield found
    finally:
        for server in found.values():
            server.stop()


def test_broker_persistence_levels(servers: dict[str, RedisServer]) -> None:
    levels = {name: check_broker_url(s.url) for name, s in servers.items()}
    assert {k: v.level for k, v in levels.items() if v} == {
        "none": "none", "aof": "aof", "rdb": "rdb", "managed": "unknown"}
    assert "loses every queued job" in levels["none"].detail  # type: ignore[union-attr]
    assert "CONFIG refused" in levels["managed"].detail  # type: ignore[union-attr]
    assert check_broker_url("filesystem://") is None
    # Managed Redis with an AOF still says so through INFO
    client = redis.Redis.from_url(servers["managed"].url)
    client.info = lambda section=None: {"aof_enabled": 1}  # type: ignore[method-assign]
    assert broker_persistence(client).level == "aof"
    # doctor: FAIL / OK / WARN / WARN
    statuses = {name: doctor.check_broker(Settings(broker_url=s.url)).status
                for name, s in servers.items()}
    assert statuses == {"none": "FAIL", "aof": "OK", "rdb": "WARN", "managed": "WARN"}


def test_a_worker_warns_and_sets_the_gauge(servers: dict[str, RedisServer],
                                           caplog: pytest.LogCaptureFixture) -> None:
    gauge = metrics.BROKER_PERSISTENT
    for name, expected in (("none", 0.0), ("managed", -1.0), ("aof", 1.0)):
        caplog.clear()
        found = persistence.check_at_start(servers[name].url)
        assert found is not None
        assert gauge._value.get() == expected  # type: ignore[attr-defined]
        warned = [r for r in caplog.records if r.levelname == "WARNING"]
        assert bool(warned) == (name != "aof"), name
    # An unreachable broker: no crash, nothing claimed
    down = RedisServer("redis-server", Path("/nonexistent")).url
    assert persistence.check_at_start(down) is None


def test_delivery_settings() -> None:
    ok = Settings()
    assert doctor.check_visibility(ok).status == "OK"
    assert doctor.check_backoff(ok).status == "OK"
    tight = Settings(max_time_limit_s=3600, visibility_timeout_s=3620)
    assert doctor.check_visibility(tight).status == "FAIL"
    slow_retry = Settings(max_time_limit_s=60, visibility_timeout_s=130, retry_backoff_max_s=200)
    assert doctor.check_backoff(slow_retry).status == "FAIL"


def test_recovery_bound() -> None:
    assert doctor.LEASE_TTL_S == lease.LEASE_TTL_S
    check = doctor.check_recovery(Settings())
    assert check.status == "OK" and "within about 12 s" in check.detail
    assert doctor.check_recovery(Settings(recovery_period_s=0)).status == "WARN"
    assert doctor.check_recovery(Settings(recovery_grace_s=300)).status == "WARN"
    # the defaults before: a lost host's job waited about 55 s, over the 15 s promise
    assert doctor.check_recovery(Settings(recovery_period_s=10,
                                          recovery_grace_s=45)).status == "WARN"
    split = Settings(broker_url="redis://127.0.0.1:6379/0",
                     result_backend="redis://10.0.0.9:6379/0")
    assert "different Redis servers" in doctor.check_recovery(split).detail


def test_bind_addresses() -> None:
    assert doctor.check_bind(Settings(), container=False).status == "OK"
    anywhere = Settings(metrics_addr="0.0.0.0")  # type: ignore[arg-type]
    assert doctor.check_bind(anywhere, container=False).status == "WARN"
    assert doctor.check_bind(anywhere, container=True).status == "OK"


def test_compile_cache_and_file_roots(tmp_path: Path) -> None:
    assert doctor.check_compile_cache(Settings()).status == "OK"  # not set
    fake: Any = SimpleNamespace(compile_cache_dir=str(tmp_path / "cache"))
    assert doctor.check_compile_cache(fake).status == "OK"
    (tmp_path / "file").write_bytes(b"x")
    fake = SimpleNamespace(compile_cache_dir=str(tmp_path / "file" / "cache"))
    assert doctor.check_compile_cache(fake).status == "FAIL"
    assert "refused" in doctor.check_file_roots(Settings()).detail
    assert doctor.check_file_roots(Settings(file_roots=str(tmp_path))).status == "OK"
    assert doctor.check_file_roots(Settings(file_roots=str(tmp_path / "no"))).status == "FAIL"
    assert doctor.check_file_roots(Settings(file_roots="/")).status == "WARN"


def test_s3_probe(s3: Any, s3_bucket: str) -> None:
    s = Settings(s3_endpoint_url=s3.endpoint_url)
    assert doctor.check_s3(Settings(), None).detail == "not configured"
    assert doctor.check_s3(s, None).status == "WARN"
    ok = doctor.check_s3(s, f"s3://{s3_bucket}/videos", s3.client())
    assert ok.status == "OK", ok.detail
    assert s3.client().get_object(Bucket=s3_bucket, Key="videos/.framefleet-doctor")
    # (SeaweedFS creates a missing bucket on a PUT by its admin: refused keys stand in)
    wrong = doctor.check_s3(s, f"s3://{s3_bucket}/videos", s3.client(secret_key="wrong"))
    assert wrong.status == "FAIL" and "SignatureDoesNotMatch" in wrong.detail, wrong.detail


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FRAMEFLEET_", "AWS_"))}
    return subprocess.run([sys.executable, "-m", "producer.cli", "doctor", *args], cwd=REPO_ROOT,
                          env={**base, "PYTHONPATH": str(REPO_ROOT), **env},
                          capture_output=True, text=True, timeout=60)


def test_cli_lines_json_and_exit_code(servers: dict[str, RedisServer]) -> None:
    bad = _cli(env={"FRAMEFLEET_BROKER_URL": servers["none"].url})
    assert bad.returncode == 1, bad.stderr
    lines = bad.stdout.strip().splitlines()
    assert len(lines) == len(doctor.run_checks(Settings(), probe=lambda url: None))
    assert all(line.split(" ", 1)[0] in {"OK", "WARN", "FAIL"} for line in lines)
    assert lines[0].startswith("FAIL broker persistence:")
    good = _cli("--json", env={"FRAMEFLEET_BROKER_URL": servers["aof"].url})
    assert good.returncode == 0, good.stdout + good.stderr
    report = json.loads(good.stdout)
    assert report["ok"] is True
    assert {c["name"] for c in report["checks"]} >= {
        "broker persistence", "visibility timeout", "retry back-off", "host-loss recovery", "s3",
        "bind addresses", "compile cache", "file roots"}
