"""``framefleet wait`` as a script sees it: it rides out a Redis restart, and each way a job
can end has its own exit status (README: "Exit statuses"). Real Redis, SeaweedFS, workers; the
CLI as a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from producer.cli.output import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_UNAVAILABLE,
)
from producer.client import Client
from tests.e2e.chaos_helpers import LONG_JOB, wait_for
from tests.e2e.helpers import pattern_spec, put_latents
from tests.services import REPO_ROOT, RedisServer, durable_redis
from tests.terminal import ctrl_c_as_from_a_terminal

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
#: One CPU worker sharing two cores with the test: torch's threads would spin against the
#: encoder's (see tests/e2e/chaos_helpers.py).
WORKER_ENV = {"FRAMEFLEET_DEVICE": "cpu", "OMP_NUM_THREADS": "1",
              "FRAMEFLEET_RETRY_BACKOFF_S": "0.5"}


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test only, append-only (a restart keeps the job's records); requested
    before ``worker_factory``, so the workers stop first."""
    with durable_redis(tmp_path / "redis") as server:
        yield server


def _env(server: RedisServer, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEFLEET_")}
    return {**base, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "200",
            "FRAMEFLEET_BROKER_URL": server.url, **extra}


def _cli(server: RedisServer, *args: str, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "producer.cli", *args], cwd=REPO_ROOT,
                            env=_env(server, **extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=ctrl_c_as_from_a_terminal)


def _long(client: Client, s3: Any, bucket: str, job_id: str) -> str:
    uri = put_latents(s3, bucket, f"in/{job_id}.safetensors", LONG_JOB["latent_frames"],
                      LONG_JOB["h"], LONG_JOB["w"])
    spec = pattern_spec(job_id, uri, bucket, segment_frames=LONG_JOB["segment_frames"])
    return client.submit(spec).key


def test_redis_restarted_under_wait_then_success(
    own_redis: RedisServer, worker_factory: Any, s3: Any, s3_bucket: str
) -> None:
    # Given a job running on a worker, and `framefleet wait` following it
    env = {**WORKER_ENV, "FRAMEFLEET_BROKER_URL": own_redis.url,
           "FRAMEFLEET_RESULT_BACKEND": own_redis.url}
    worker_factory(1, env=env)
    client = Client(broker_url=own_redis.url, backend_url=own_redis.url)
    key = _long(client, s3, s3_bucket, "blip-1")
    wait = _cli(own_redis, "wait", key, "--json")
    wait_for(lambda: _polling(own_redis, wait.pid) or None, 30, "wait polling")
    wait_for(lambda: client.state(key).state == "PROGRESS" or None, 60, "the job mid-way")
    # When Redis restarts under them (down 2 s)
    own_redis.stop()
    time.sleep(2)
    own_redis.start()
    # Then wait says so once, and reports the job's SUCCESS with exit status 0
    out, err = wait.communicate(timeout=180)
    assert wait.returncode == 0, err
    assert '"frames": 237' in out
    notes = [line for line in err.splitlines() if line.strip()]
    assert len(notes) == 2, err
    assert notes[0].startswith(f"note: result backend {own_redis.url}: connection refused; "
                               "waiting up to 120 s for it to come back")
    assert notes[1].startswith(f"note: job {key}: reachable again after ")
    assert "Traceback" not in err


def test_each_end_has_its_exit_status(
    own_redis: RedisServer, worker_factory: Any, s3: Any, s3_bucket: str
) -> None:
    env = {**WORKER_ENV, "FRAMEFLEET_BROKER_URL": own_redis.url,
           "FRAMEFLEET_RESULT_BACKEND": own_redis.url}
    worker_factory(1, env=env)
    client = Client(broker_url=own_redis.url, backend_url=own_redis.url)
    # A job that fails: 3, its reason on one line
    missing = pattern_spec("gone-1", f"s3://{s3_bucket}/in/missing.npy", s3_bucket)
    client.submit(missing)
    failed = _cli(own_redis, "wait", "gone-1")
    _, err = failed.communicate(timeout=60)
    assert failed.returncode == EXIT_FAILED, err
    assert err.strip().startswith("error: job gone-1 failed: InputNotFoundError: no such object")
    # A job cancelled while it runs: 4
    key = _long(client, s3, s3_bucket, "cancel-1")
    wait_for(lambda: client.state(key).state == "PROGRESS" or None, 60, "the job mid-way")
    cancelled = _cli(own_redis, "wait", key)
    client.cancel(key)
    _, err = cancelled.communicate(timeout=60)
    assert cancelled.returncode == EXIT_CANCELLED, err
    assert err.strip().splitlines()[-1] == f"error: job {key} was cancelled"


def test_broker_gone_for_good_is_69_after_the_outage_budget(
    own_redis: RedisServer, s3: Any, s3_bucket: str
) -> None:
    # Given a queued job (no worker) and a wait that tolerates 2 s without Redis
    client = Client(broker_url=own_redis.url, backend_url=own_redis.url)
    client.submit(pattern_spec("away-1", f"s3://{s3_bucket}/in/z.npy", s3_bucket))
    wait = _cli(own_redis, "wait", "away-1", "--json", FRAMEFLEET_WAIT_OUTAGE_S="2")
    wait_for(lambda: _polling(own_redis, wait.pid) or None, 30, "wait polling")
    # When Redis goes away and stays away
    own_redis.stop()
    t0 = time.monotonic()
    _, err = wait.communicate(timeout=60)
    # Then wait gives up after the budget, with 69 and one line saying why
    assert wait.returncode == EXIT_UNAVAILABLE, err
    assert time.monotonic() - t0 < 30
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[0].startswith("note: result backend") and "waiting up to 2 s" in lines[0]
    assert lines[-1].startswith("error: result backend") and "no answer for" in lines[-1]
    assert "FRAMEFLEET_WAIT_OUTAGE_S=2" in lines[-1]
    own_redis.start()  # the fixture stops it


def _polling(server: RedisServer, pid: int) -> bool:
    """Process ``pid`` (the wait) has read a result from ``server``: one of its connections is
    a client whose last command was a GET (it is in its loop, having reached Redis once)."""
    import psutil
    import redis

    ports = {c.laddr.port for c in psutil.Process(pid).net_connections("tcp")
             if c.raddr and c.raddr.port == server.port}
    admin = redis.Redis.from_url(server.url)
    try:
        return any(int(str(c["addr"]).rsplit(":", 1)[1]) in ports
                   and c.get("cmd") in ("get", "mget") for c in admin.client_list())
    finally:
        admin.close()


def test_ctrl_c_on_wait_says_the_job_goes_on(own_redis: RedisServer, s3: Any,
                                             s3_bucket: str) -> None:
    client = Client(broker_url=own_redis.url, backend_url=own_redis.url)
    client.submit(pattern_spec("ctrl-c-1", f"s3://{s3_bucket}/in/z.npy", s3_bucket))
    wait = _cli(own_redis, "wait", "ctrl-c-1", "--json")
    wait_for(lambda: _polling(own_redis, wait.pid) or None, 30, "wait polling")
    os.kill(wait.pid, signal.SIGINT)
    _, err = wait.communicate(timeout=30)
    assert wait.returncode == EXIT_INTERRUPTED, err
    assert err.strip() == ("error: interrupted: job ctrl-c-1 goes on without you (framefleet "
                           "wait ctrl-c-1 follows it again; framefleet cancel ctrl-c-1 stops it)")
    assert client.state("ctrl-c-1").state == "QUEUED"


def test_wait_says_why_a_queued_job_waits(own_redis: RedisServer, s3: Any,
                                         s3_bucket: str) -> None:
    # Given a job queued with no worker anywhere, and a hint after 1 s
    client = Client(broker_url=own_redis.url, backend_url=own_redis.url)
    client.submit(pattern_spec("alone-1", f"s3://{s3_bucket}/in/z.npy", s3_bucket))
    wait = _cli(own_redis, "wait", "alone-1", "--json", "--timeout", "6",
                FRAMEFLEET_IDLE_HINT_S="1")
    _, err = wait.communicate(timeout=60)
    # Then wait says so once, and times out with 124 (the job goes on waiting)
    assert wait.returncode == 124, err
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1, err
    assert notes[0].startswith("note: job alone-1 is queued: no worker has taken a job since "
                               "Redis kept count (this one waits ")
    assert "no worker answers a ping" in notes[0]
    # (the broker it asked is named after it)
    assert err.strip().splitlines()[-1].startswith("error: job alone-1 still QUEUED after 6 s")
