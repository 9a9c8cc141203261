"""MemoryGuard: a run that grows the worker past FRAMEFLEET_MAX_RSS_MIB fails naming the limit,
and the worker frees the job's memory afterwards (real runs, real RSS of this process)."""

from __future__ import annotations

import ctypes
import gc
import re
import time
from pathlib import Path

import numpy as np
import torch
from celery import Celery

from producer.settings import Settings
from producer.wire.spec import JobResult, VideoSpec
from tests.worker.concerns.scripted import Scripted, job_spec
from worker.memory import MIB, rss_bytes
from worker.run import DecoderCache, Run, run_job

BALLAST_MIB = 512


def test_a_run_over_the_limit_fails_naming_it_and_its_memory_is_freed(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    # Given a limit 256 MiB above what this process holds now, and a job that holds 512 MiB
    # more while it decodes
    spec = job_spec(tmp_path, tenant).model_copy(update={"video": VideoSpec(segment_frames=8)})
    np.save(tmp_path / "z.npy", np.zeros((16, 10, 4, 6), np.float32))
    cache = DecoderCache(torch.device("cpu"))
    warm = spec.model_copy(update={"job_id": "warm"})
    run_job(warm, cache, Run(warm, Settings(file_roots=str(tmp_path))))  # the decode's memory
    # Freed heap that earlier tests left with glibc would be handed back during the run (and
    # RSS fall below the baseline): hand it back before measuring.
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    limit = rss_bytes() // MIB + 256
    settings = Settings(file_roots=str(tmp_path), max_rss_mib=limit)

    def work(run: Run, attempt: int) -> JobResult:
        ballast = torch.ones(BALLAST_MIB * MIB, dtype=torch.uint8)  # touched: resident
        result = run_job(run.spec, cache, run)
        del ballast
        return result

    t0 = time.monotonic()
    result = Scripted(app, spec, settings, work).apply(spec.key)
    # Then it failed at its first decoded chunk, naming the limit and what was measured
    assert result.state == "FAILURE"
    message = str(result.result)
    assert f"FRAMEFLEET_MAX_RSS_MIB={limit}" in message, message
    measured = int(re.search(r"RSS measured (\d+) MiB while decoding", message)[1])  # type: ignore[index]
    assert measured > limit
    assert time.monotonic() - t0 < 30
    assert not (tmp_path / "out" / tenant / spec.job_id / "manifest.json").exists()
    # and the job's memory is back: this process is under the limit again
    assert rss_bytes() // MIB < limit, (rss_bytes() // MIB, limit)
    # and the next job (within the limit) succeeds
    ok = spec.model_copy(update={"job_id": "after"})
    done = Scripted(app, ok, settings, lambda run, attempt: run_job(ok, cache, run)).apply(ok.key)
    assert done.state == "SUCCESS", done.result


def test_the_guard_is_off_at_zero(app: Celery, tmp_path: Path, tenant: str) -> None:
    # Given a limit of 0 (off)
    spec = job_spec(tmp_path, tenant)
    cache = DecoderCache(torch.device("cpu"))
    settings = Settings(file_roots=str(tmp_path), max_rss_mib=0)
    result = Scripted(app, spec, settings,
                      lambda run, attempt: run_job(spec, cache, run)).apply(spec.key)
    # Then it runs, and no guard was attached
    assert result.state == "SUCCESS", result.result


def test_a_limit_below_the_worker_itself_fails_the_job_at_its_first_poll(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    limit = 1
    spec = job_spec(tmp_path, tenant)
    cache = DecoderCache(torch.device("cpu"))
    settings = Settings(file_roots=str(tmp_path), max_rss_mib=limit)
    result = Scripted(app, spec, settings,
                      lambda run, attempt: run_job(spec, cache, run)).apply(spec.key)
    assert result.state == "FAILURE"
    assert "FRAMEFLEET_MAX_RSS_MIB=1;" in str(result.result), result.result
