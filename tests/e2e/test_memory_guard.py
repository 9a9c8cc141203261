"""The memory guard, end to end: a job whose latents would grow its worker past
FRAMEFLEET_MAX_RSS_MIB fails at once, before they are read, naming the input and the limit, and
the same worker process (not killed, not replaced) runs the next job to success and is still
under the limit. (A job that grows past the limit while it decodes:
``tests/worker/concerns/test_memory.py``.)

Real Redis, SeaweedFS and a Celery worker process. The big job's latents (800 MiB, a sparse
``file://`` file under the worker's FRAMEFLEET_FILE_ROOTS) are more than the limit on their
own; the small job needs the worker's usual few hundred MiB.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from producer.client import Client
from producer.errors import JobFailed
from tests.e2e.chaos_helpers import CHAOS_ENV, SMALL_JOB, Jobs, pool_child
from tests.e2e.helpers import pattern_spec
from tests.services import S3Server

pytestmark = [pytest.mark.e2e]

#: An idle CPU worker's pool process holds about 300 MiB, and after a small job as much.
LIMIT_MIB = 700
#: (C, T, h, w) float32: 800 MiB of latents for 1597 frames of 1088x1920.
BIG = (16, 400, 136, 240)


@pytest.mark.timeout(240)
def test_a_job_over_the_memory_limit_fails_naming_it_and_the_worker_goes_on(
    redis_url: str, worker_factory: Any, s3: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    # Given a worker whose memory limit is 700 MiB, and latents larger than that
    redis.Redis.from_url(redis_url).flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    big = tmp_path / "big.npy"
    np.lib.format.open_memmap(big, mode="w+", dtype=np.float32, shape=BIG).flush()
    (worker,) = worker_factory(1, env={**CHAOS_ENV, "FRAMEFLEET_MAX_RSS_MIB": str(LIMIT_MIB),
                                       "FRAMEFLEET_FILE_ROOTS": str(tmp_path)})
    pid = pool_child(worker).pid
    jobs = Jobs(client, s3, s3_bucket)
    # When a job that needs them runs
    t0 = time.monotonic()
    handle = client.submit(pattern_spec("too-big", big.as_uri(), s3_bucket, time_limit_s=50))
    with pytest.raises(JobFailed) as failed:
        handle.wait(timeout=90)
    took = time.monotonic() - t0
    # Then it fails quickly, naming the input and the limit, without reading the file
    message = str(failed.value)
    print(f"memory guard: {message} ({took:.1f} s)")
    assert f"FRAMEFLEET_MAX_RSS_MIB={LIMIT_MIB}" in message, message
    assert f"input.uri: {big.as_uri()}" in message and "refused before it was read" in message
    assert took < 60
    assert pool_child(worker).pid == pid
    # and the same worker runs the next job to success, never through the OOM killer
    ok = jobs.submit("after-guard", jobs.put_input("small", SMALL_JOB), SMALL_JOB)
    result = ok.wait(timeout=60)
    assert result.manifest.frames == 21
    child = pool_child(worker)
    rss = child.memory_info().rss / 2**20
    print(f"memory guard: the worker's RSS after the next job: {rss:.0f} MiB")
    assert child.pid == pid and rss < LIMIT_MIB
    assert worker.running and "Killed" not in worker.log_text()
