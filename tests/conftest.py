"""Shared fixtures: real Redis and SeaweedFS per test session, real Celery workers per test.

Nothing here is autouse: a test that needs no server starts none. A missing server binary
skips the tests that need it, or fails them when ``CI=true`` (see ``tests/require.py``).
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path

import pytest
import redis

from tests.parallel import mark_serial, own_database, slow_first
from tests.require import require_binary
from tests.services import (
    REDIS_INSTALL,
    WEED_INSTALL,
    RedisServer,
    S3Server,
    WorkerFactory,
    WorkerProcess,
)
from tests.services.celery_worker import stop_workers

_WORKERS = pytest.StashKey[list[WorkerProcess]]()


def pytest_configure(config: pytest.Config) -> None:
    for line in (
        "gpu: needs a CUDA GPU",
        "chaos: long fault-injection tests (servers and workers killed mid-job)",
        "e2e: end-to-end through real Redis, S3 and Celery workers",
    ):
        config.addinivalue_line("markers", line)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects (the ``serial`` pass of make test)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_serial(items)
    slow_first(items)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of an empty Redis database: ``FRAMEFLEET_TEST_REDIS_URL``, else a throwaway server.

    The database is flushed once, at session start; tests that need isolation from each other
    use unique keys and queue names, or their own ``RedisServer``. Under ``pytest-xdist`` each
    worker is a session of its own: its own server, or its own database of the given one.
    """
    url = os.environ.get("FRAMEFLEET_TEST_REDIS_URL")
    url = own_database(url) if url else url
    server: RedisServer | None = None
    if not url:
        binary = require_binary("redis-server", REDIS_INSTALL)
        server = RedisServer(binary, tmp_path_factory.mktemp("redis"))
        server.start()
        url = server.url
    try:
        client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        try:
            client.flushdb()
        finally:
            client.close()
        yield url
    finally:
        if server is not None:
            server.stop()


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A throwaway SeaweedFS S3 endpoint on loopback, with SigV4 keys, for the session.

    A test that stops or pauses it must bring it back (``start()``/``resume()``) before it
    ends, since later tests share it.
    """
    binary = require_binary("weed", WEED_INSTALL)
    server = S3Server(binary, tmp_path_factory.mktemp("s3"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3: S3Server) -> str:
    """A fresh, empty bucket with a unique name (left behind: the server is throwaway)."""
    name = f"ff-test-{secrets.token_hex(6)}"
    s3.client().create_bucket(Bucket=name)
    return name


@pytest.fixture
def worker_env(redis_url: str, s3: S3Server) -> dict[str, str]:
    """Environment that points a worker at the test Redis and S3 (override per test)."""
    return {
        "FRAMEFLEET_BROKER_URL": redis_url,
        "FRAMEFLEET_RESULT_BACKEND": redis_url,
        "FRAMEFLEET_S3_ENDPOINT_URL": s3.endpoint_url,
        "FRAMEFLEET_S3_REGION": s3.region,
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        # Several workers share this host: no fixed /metrics port (tests that scrape set one).
        "FRAMEFLEET_METRICS_PORT": "0",
    }


@pytest.fixture
def worker_factory(
    request: pytest.FixtureRequest, tmp_path: Path, worker_env: dict[str, str]
) -> Iterator[WorkerFactory]:
    """``start(n=1, env=None)``: start ``n`` workers, wait until each is ready, return them.

    ``env`` is added to ``worker_env``. Workers are named ``w1``, ``w2``, … (unique within
    the test) and all are stopped when the test ends; if it failed, their logs are attached
    to the report.
    """
    workers: list[WorkerProcess] = []
    request.node.stash[_WORKERS] = workers
    numbers = itertools.count(1)

    def start(
        n: int = 1, env: Mapping[str, str] | None = None, ready_timeout: float = 60.0
    ) -> list[WorkerProcess]:
        started = []
        for _ in range(n):
            merged = {**worker_env, **(env or {})}
            worker = WorkerProcess(f"w{next(numbers)}", tmp_path / "workers", merged)
            workers.append(worker)
            worker.start()
            started.append(worker)
        # Started together, waited for together: n workers boot in parallel.
        for worker in started:
            worker.wait_ready(ready_timeout)
        return started

    try:
        yield start
    finally:
        stop_workers(workers)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the worker logs to the report of a test that failed."""
    report = yield
    if report.failed and call.when in ("setup", "call"):
        for worker in item.stash.get(_WORKERS, []):
            report.sections.append((f"celery worker {worker.worker_name} log", worker.log_text()))
    return report


@pytest.fixture
def file_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Allow the test's own folder as a ``file://`` root (local paths are confined to
    ``FRAMEFLEET_FILE_ROOTS``) for code that reads the settings of this process."""
    from producer.settings import get_settings

    monkeypatch.setenv("FRAMEFLEET_FILE_ROOTS", str(tmp_path))
    get_settings.cache_clear()
    yield tmp_path
    get_settings.cache_clear()
