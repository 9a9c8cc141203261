"""A GPU worker you can trust, on the CPU: output that is not finite is never a SUCCESS, and a
CUDA error retires the pool process and runs the job again on a fresh one. Real Redis,
SeaweedFS (the ledger) and Celery worker processes."""

from __future__ import annotations

import re
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
import torch
from safetensors.torch import load_file, save_file

from producer.client import Client
from producer.errors import JobFailed
from producer.wire.results import LedgerRecord
from producer.wire.spec import JobSpec, OutputSpec, VideoSpec
from tests.e2e.helpers import pattern_spec, put_latents
from tests.services import WorkerProcess, free_port
from tests.worker.generate.tiny import save_tiny_model, tiny_generate

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _nan_model(folder: Path) -> Path:
    """A tiny Wan folder whose transformer makes NaN: every tier on it denoises to NaN."""
    save_tiny_model(folder)
    (weights,) = (folder / "transformer").glob("*.safetensors")
    tensors = load_file(weights)
    tensors["proj_out.weight"] = torch.full_like(tensors["proj_out.weight"], float("nan"))
    save_file(tensors, weights)
    return folder


def _metric(port: int, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_nan_output_fails_at_once_with_a_record_and_a_count(
    redis_url: str, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path,
    worker_env: dict[str, str],
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    model = _nan_model(tmp_path / "nan-wan")
    port = free_port()
    ledger = f"s3://{s3_bucket}/ledger"
    (w,) = worker_factory(1, env={
        "FRAMEFLEET_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "FRAMEFLEET_LEDGER_URI": ledger,
        "FRAMEFLEET_FILE_ROOTS": str(tmp_path), "FRAMEFLEET_METRICS_PORT": str(port)})
    client = Client(broker_url=redis_url, backend_url=redis_url)
    # Given a generate job on a tier that makes NaN latents
    spec = JobSpec(job_id="nan-1", tenant="acme", generate=tiny_generate(model),
                   output=OutputSpec(uri=f"s3://{s3_bucket}/out"),
                   video=VideoSpec(segment_frames=4))
    # When it runs, it fails at once naming the tier and the stage
    with pytest.raises(JobFailed) as failed:
        client.submit(spec).wait(timeout=120)
    assert failed.value.kind == "NonFiniteOutput"
    assert re.search(r"generate\.tier exact: the denoise made non-finite latents",
                     failed.value.message), failed.value.message
    # with no retry, no video under its prefix (only the previews the denoise made while it
    # ran, as a cancelled job keeps them), one ledger record and one count
    assert "Retry in" not in w.log_text() and "retry:" not in w.log_text()
    listed = s3.client().list_objects_v2(Bucket=s3_bucket, Prefix="out/acme/nan-1/")
    assert [o["Key"] for o in listed.get("Contents", [])
            if not o["Key"].endswith("ledger.json")
            and not o["Key"].startswith("out/acme/nan-1/previews/")] == []
    records = [LedgerRecord.model_validate_json(s3.client().get_object(
        Bucket=s3_bucket, Key=o["Key"])["Body"].read()) for o in s3.client().list_objects_v2(
        Bucket=s3_bucket, Prefix="ledger/").get("Contents", [])]
    assert [(r.key, r.status, r.reason) for r in records] == [
        ("acme:nan-1", "failure", "NonFiniteOutput")]
    assert _metric(port, "framefleet_jobs_total", status="failure",
                   reason="NonFiniteOutput") == 1
    # and the worker goes on: a finite job after it succeeds
    small = put_latents(s3, s3_bucket, "in/small.npy", latent_frames=3, fmt="npy")
    assert client.submit(pattern_spec("ok-after", small, s3_bucket)).wait(timeout=60)


class FaultyWorker(WorkerProcess):
    def argv(self) -> list[str]:
        argv = super().argv()
        argv[argv.index("-A") + 1] = "tests.e2e.faulty_worker"
        return argv


def test_a_cuda_error_retires_the_pool_process_and_the_job_runs_again(
    redis_url: str, s3: Any, s3_bucket: str, tmp_path: Path, worker_env: dict[str, str]
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    marker = tmp_path / "device-error-once"
    marker.touch()
    w = FaultyWorker("faulty", tmp_path / "workers", {
        **worker_env, "FRAMEFLEET_DEVICE": "cpu", "OMP_NUM_THREADS": "1",
        "FRAMEFLEET_TEST_DEVICE_ERROR": str(marker)})
    w.start()
    try:
        w.wait_ready(60)
        (first,) = psutil.Process(w.pid).children()
        client = Client(broker_url=redis_url, backend_url=redis_url)
        latents = put_latents(s3, s3_bucket, "in/z.npy", latent_frames=5, fmt="npy")
        # Given a job whose first run meets a CUDA error (injected in its decoder)
        handle = client.submit(pattern_spec("cuda-err", latents, s3_bucket))
        # When it ends, it succeeded: delivered again, to a fresh pool process
        result = handle.wait(timeout=180)
        assert result.manifest.frames == 17 and not marker.exists()
        assert result.worker.pid != first.pid
        assert not first.is_running()
        log = w.log_text()
        assert log.count("CUDA error in pool process") == 1, log[-3000:]
        assert "WorkerLostError" in log
        # and the worker stays up: its new pool process runs the next job too
        assert w.running
        again = client.submit(pattern_spec("after-cuda-err", latents, s3_bucket))
        assert again.wait(timeout=120).worker.pid == result.worker.pid
    finally:
        w.stop()
        shutil.rmtree(tmp_path / "workers", ignore_errors=True)
