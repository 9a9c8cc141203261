"""Chaos: a zombie run. A host is stopped (SIGSTOP to every process of it) in the middle of a
job, for longer than the job's lease: the host-loss sweep delivers the job again and another
host runs it. Then the stopped host resumes, its run intact: the zombie. Two heals: 2 s after
the other run started, and after the job's SUCCESS (``tests/e2e/zombies.py`` stages it and
checks one end).

On code without fencing the zombie ran to its end: a second successful execution, the playlist
and the manifest rewritten after the SUCCESS, a second ``succeeded`` webhook, and at times its
result stored over the other run's. ``make test`` runs the heal after SUCCESS once; ``make
chaos`` both heals, ``RUNS`` times.
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import Client
from producer.settings import get_settings
from tests.e2e.chaos_helpers import FULL, RUNS, Jobs
from tests.e2e.hosts import Host
from tests.e2e.test_host_loss import RECOVERY_ENV
from tests.e2e.webhook_fleet import webhook_env
from tests.e2e.zombies import HEALS, JOB, Stage
from tests.receiver import Receiver

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


@pytest.fixture
def stage(tmp_path: Path, worker_env: dict[str, str], redis_url: str, s3: Any, s3_bucket: str,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Stage]:
    redis.Redis.from_url(redis_url).flushdb()
    with Receiver() as receiver:
        env = {**worker_env, **RECOVERY_ENV, **webhook_env(receiver.port),
               "FRAMEFLEET_LEDGER_URI": f"s3://{s3_bucket}/ledger"}
        for key, value in webhook_env(receiver.port).items():
            monkeypatch.setenv(key, value)  # the client checks the job's webhook at submit
        get_settings.cache_clear()
        names = itertools.count()
        hosts = [Host(f"zhost{next(names)}", tmp_path / "hosts", env) for _ in range(2)]
        try:
            for h in hosts:
                h.start()
            for h in hosts:
                h.wait_ready(180)
            client = Client(broker_url=redis_url, backend_url=redis_url)
            yield Stage(hosts, Jobs(client, s3, s3_bucket), receiver, redis_url, tmp_path)
        finally:
            for h in hosts:
                h.terminate()  # SIGCONT first: a stopped process never acts on SIGTERM
            for h in hosts:
                h.stop(timeout=20)
    get_settings.cache_clear()


def _stop(host: Host) -> None:
    host.kill(signal.SIGSTOP)


def _resume(host: Host) -> None:
    host.kill(signal.SIGCONT)


@pytest.mark.timeout(400 * RUNS)
@pytest.mark.parametrize("heal", HEALS if FULL else HEALS[:1])
def test_a_stopped_host_s_run_writes_nothing_once_another_run_took_its_job(
        stage: Stage, heal: str) -> None:
    uri = stage.jobs.put_input("zombie", JOB)
    for run in range(RUNS):
        stage.run(f"zombie-{heal}-{run}", uri, heal, _stop, _resume)
