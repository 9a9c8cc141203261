"""Speed tiers through real Redis, SeaweedFS and a Celery worker: each tier's job succeeds and
says its tier in the manifest and the result; fp8 on a CPU worker fails at once naming the
field, the worker healthy after it; a cached job delivered again after a SIGKILL mid-denoise
gives byte-identical segments."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from producer.client import Client
from producer.errors import JobFailed
from producer.wire.spec import JobSpec, OutputSpec, VideoSpec
from tests.e2e.chaos_helpers import kill_pool_child, new_pool_child, wait_for
from tests.worker.generate.test_generate_e2e import _get, _mid_denoise
from tests.worker.generate.tiny import tiny_generate

pytestmark = pytest.mark.e2e
TAYLOR = {"kind": "taylorseer", "cache_interval": 2, "disable_cache_before_step": 2}


def _spec(job_id: str, bucket: str, model: Path, **kw: Any) -> JobSpec:
    return JobSpec(job_id=job_id, tenant="tiers", generate=tiny_generate(model, **kw),
                   output=OutputSpec(uri=f"s3://{bucket}/out"), video=VideoSpec(segment_frames=4))


def test_each_tier_through_the_fleet(client: Client, worker: Any, s3: Any, s3_bucket: str,
                                     tiny_model: Path) -> None:
    # exact, and exact with a step cache: both succeed and say so in manifest and result
    for job_id, extra, cache in (("t-exact", {}, "none"), ("t-cache", {"cache": TAYLOR},
                                                          "taylorseer")):
        result = client.submit(_spec(job_id, s3_bucket, tiny_model, num_inference_steps=6,
                                     **extra)).wait(timeout=120)
        facts = result.manifest.generate
        assert facts is not None and (facts.tier, facts.cache) == ("exact", cache)
        stored = json.loads(_get(s3, s3_bucket, f"out/tiers/{job_id}/manifest.json"))
        assert (stored["generate"]["tier"], stored["generate"]["cache"]) == ("exact", cache)
        assert result.cost is not None and (result.cost.tier, result.cost.cache) == ("exact",
                                                                                     cache)
    # fp8 on this CPU worker: at once, naming the field, no retry
    t0 = time.monotonic()
    with pytest.raises(JobFailed) as e:
        client.submit(_spec("t-fp8", s3_bucket, tiny_model, tier="fp8",
                            dtype="auto")).wait(timeout=60)
    assert "generate.tier: fp8 needs a GPU" in e.value.message
    assert "InvalidJobError" in e.value.kind
    assert time.monotonic() - t0 < 30
    assert "Retry in" not in worker.log_text()
    # and the worker runs the next job
    again = client.submit(_spec("t-after", s3_bucket, tiny_model)).wait(timeout=60)
    assert again.manifest.frames == 9


def test_cached_job_after_sigkill_gives_identical_segments(
    client: Client, worker: Any, s3: Any, s3_bucket: str, tiny_model: Path
) -> None:
    cache = {**TAYLOR, "cache_interval": 3}
    handle = client.submit(_spec("c-kill", s3_bucket, tiny_model, num_inference_steps=300,
                                 cache=cache))
    p = wait_for(lambda: _mid_denoise(handle), 60, "denoise progress")
    old = kill_pool_child(worker)
    new_pool_child(worker, old)
    result = handle.wait(timeout=180)
    assert "WorkerLostError" in worker.log_text()
    clean = client.submit(_spec("c-clean", s3_bucket, tiny_model, num_inference_steps=300,
                                cache=cache)).wait(timeout=180)
    assert ([s.sha256 for s in result.manifest.segments]
            == [s.sha256 for s in clean.manifest.segments])
    for seg in result.manifest.segments:
        data = _get(s3, s3_bucket, f"out/tiers/c-kill/segment-{seg.index:05d}.mp4")
        assert hashlib.sha256(data).hexdigest() == seg.sha256
    assert result.manifest.generate is not None
    assert result.manifest.generate.cache == "taylorseer"
    print(f"killed at denoise {p.steps_done}/{p.steps_total}; rerun identical")
