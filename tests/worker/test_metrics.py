"""Worker metrics scraped over real HTTP from a server of this test process."""

from __future__ import annotations

import re
import secrets
import time
import urllib.request
import uuid
from typing import Any

import pytest
import redis
from celery.exceptions import SoftTimeLimitExceeded

from producer import errors
from producer.app import QUEUE, TASK_NAME
from producer.cli.cost import read_held
from producer.client import Client, JobHandle
from producer.cost import job_cost
from producer.cost.pricing import default_catalog, prices_for
from producer.errors import JobFailed, SettingsError
from producer.ops import exporter
from producer.settings import Settings
from producer.wire.spec import (
    JobResult,
    Manifest,
    SegmentInfo,
    StageTimings,
    WorkerInfo,
)
from tests.e2e.helpers import push_undecodable
from tests.services import free_port
from worker import labels, metrics

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(port: int) -> Samples:
    """GET /metrics from loopback and parse the text format into {(name, labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: Samples = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match and not line.startswith("#"):
            labels = frozenset(_LABEL.findall(match.group(2) or ""))
            samples[(match.group(1), labels)] = float(match.group(3))
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def make_result(tenant: str, *, reused: bool = False) -> JobResult:
    prices = prices_for("g7e.2xlarge", "on-demand", default_catalog())
    cost = job_cost(
        tenant=tenant,
        prices=prices,
        gpu_seconds=12.5,
        s3_puts=3,
        stored_bytes=3_000_000,
        video_seconds=6.0,
    )
    segments = tuple(
        SegmentInfo(
            index=i,
            uri=f"s3://b/out/{tenant}/j/segment-{i:05d}.mp4",
            first_frame=48 * i,
            frames=48,
            bytes=1_000_000,
            sha256="0" * 64,
            seconds=3.0,
        )
        for i in range(2)
    )
    timings = StageTimings(
        load_s=0.2,
        decode_s=9.5,
        postprocess_s=0.01,
        d2h_s=0.02,
        encode_s=1.5,
        upload_s=0.3,
        wall_s=12.5,
        gpu_busy_ratio=0.97,
    )
    return JobResult(
        manifest=Manifest(
            job_id="j",
            tenant=tenant,
            spec_digest="0" * 64,
            segments=segments,
            frames=96,
            video_seconds=6.0,
            width=832,
            height=480,
            fps=16.0,
        ),
        manifest_uri=f"s3://b/out/{tenant}/j/manifest.json",
        timings=timings,
        worker=WorkerInfo(hostname="h", node="gpu0@h", pid=1, device="cuda:0"),
        cost=cost,
        reused=reused,
        finished_at=time.time(),
    )


def test_port_zero_means_off() -> None:
    assert metrics.start_metrics_server(0) == 0


def test_observe_job_is_scraped_with_its_values(metrics_port: int) -> None:
    tenant = f"t{secrets.token_hex(4)}"
    before = scrape(metrics_port)
    result = make_result(tenant)

    metrics.observe_job("success", tenant, result)
    metrics.observe_job("failure", tenant, None, reason="StorageError")
    after = scrape(metrics_port)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    jobs = "framefleet_jobs_total"
    assert value(after, jobs, status="success", reason="", tenant=tenant) == 1
    assert value(after, jobs, status="failure", reason="StorageError", tenant=tenant) == 1
    assert result.cost is not None
    assert value(after, "framefleet_cost_usd_total", tenant=tenant) == pytest.approx(
        result.cost.total_usd, rel=1e-12
    )
    assert delta("framefleet_frames_total") == 96
    assert delta("framefleet_output_bytes_total") == 2_000_000
    assert delta("framefleet_video_seconds_total") == 6.0
    assert delta("framefleet_job_wall_seconds_count") == 1
    assert delta("framefleet_job_wall_seconds_sum") == pytest.approx(12.5)
    assert delta("framefleet_job_wall_seconds_bucket", le="20.0") == 1
    assert delta("framefleet_job_wall_seconds_bucket", le="10.0") == 0
    for stage, seconds in [("load", 0.2), ("decode", 9.5), ("encode", 1.5), ("upload", 0.3)]:
        # a decode job's stages: tier and cache "none"
        assert delta("framefleet_stage_seconds_count", stage=stage, tier="none",
                     cache="none") == 1
        assert delta("framefleet_stage_seconds_sum", stage=stage, tier="none",
                     cache="none") == pytest.approx(seconds)
    assert value(after, "framefleet_gpu_busy_ratio", device="cuda:0") == 0.97
    price = {"instance_type": "g7e.2xlarge", "capacity": "on-demand"}
    assert value(after, "framefleet_gpu_cost_usd_per_hour", **price) == 3.36
    # The process collector is served too (process_start_time_seconds etc.).
    assert any(name.startswith("process_") for name, _ in after)


def test_reused_result_counts_the_job_but_not_its_timings(metrics_port: int) -> None:
    tenant = f"t{secrets.token_hex(4)}"
    before = scrape(metrics_port)
    metrics.observe_job("success", tenant, make_result(tenant, reused=True))
    after = scrape(metrics_port)
    assert value(after, "framefleet_jobs_total", status="success", reason="", tenant=tenant) == 1
    assert value(after, "framefleet_job_wall_seconds_count") == value(
        before, "framefleet_job_wall_seconds_count"
    )
    assert value(after, "framefleet_frames_total") == value(before, "framefleet_frames_total")


def test_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError, match="status must be one of"):
        metrics.observe_job("done", "t", None)


def test_a_retry_is_no_outcome_and_has_its_own_counter(metrics_port: int) -> None:
    tenant = f"t{secrets.token_hex(4)}"
    with pytest.raises(ValueError, match="observe_retry"):
        metrics.observe_job("retry", tenant, None)
    metrics.observe_retry("retry", tenant, "StorageError")
    metrics.observe_retry("requeue", tenant, "DeviceOutOfMemory")
    after = scrape(metrics_port)
    retries = "framefleet_job_retries_total"
    assert value(after, retries, kind="retry", reason="StorageError", tenant=tenant) == 1
    assert value(after, retries, kind="requeue", reason="DeviceOutOfMemory", tenant=tenant) == 1
    # Nothing ended: the outcome counter has no series of this tenant at all.
    assert not [k for k in after if k[0] == "framefleet_jobs_total" and ("tenant", tenant) in k[1]]


class _ClassOfOurOwn(errors.InvalidJobError):
    """A subclass outside producer.errors: its reason is the nearest class of the tree."""


@pytest.mark.parametrize(("error", "reason"), [
    (errors.InvalidJobError("job_id: bad"), "InvalidJobError"),
    (errors.UnknownInstanceTypeError("m9"), "UnknownInstanceTypeError"),
    (_ClassOfOurOwn("x"), "InvalidJobError"),
    (errors.StorageError("503 from s3://b/k"), "StorageError"),
    (SoftTimeLimitExceeded(), "TimeLimitExceeded"),
    (KeyError("surprise"), "UnexpectedError"),
    (None, "UnexpectedError"),
])  # fmt: skip
def test_failure_reason_is_an_error_class_never_the_message(
    error: BaseException | None, reason: str
) -> None:
    assert labels.failure_reason(error) == reason
    assert reason in labels.REASONS


def test_reason_is_bounded_and_only_for_failures() -> None:
    with pytest.raises(ValueError, match="REASONS"):
        metrics.observe_job("failure", "t", None, reason="could not reach s3://b/k")
    with pytest.raises(ValueError, match="REASONS"):
        metrics.observe_job("failure", "t", None)
    with pytest.raises(ValueError, match="REASONS"):
        metrics.observe_job("success", "t", None, reason="StorageError")
    with pytest.raises(ValueError, match="REASONS"):
        metrics.observe_retry("retry", "t", "free text")


def test_tenant_label_keeps_only_allowed_names() -> None:
    allowed = Settings(metrics_tenants="acme,beta").metrics_tenant_names
    assert labels.tenant_label("acme", allowed) == "acme"
    assert labels.tenant_label("zeta", allowed) == labels.OTHER_TENANT == "other"
    # By default no name is kept: the label has one value, whatever the tenants.
    assert labels.tenant_label("acme", Settings().metrics_tenant_names) == "other"
    # "*" keeps every name, on purpose.
    every = Settings(metrics_tenants="*").metrics_tenant_names
    assert every is None and labels.tenant_label("zeta", every) == "zeta"
    for bad in ("acme beta", "a,,b", ",".join(f"t{i}" for i in range(101)), "../x"):
        with pytest.raises(SettingsError, match="FRAMEFLEET_METRICS_TENANTS"):
            Settings(metrics_tenants=bad)


def test_metrics_tenants_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAMEFLEET_METRICS_TENANTS", "acme,beta")
    assert Settings().metrics_tenant_names == frozenset({"acme", "beta"})


def test_metric_names_cover_every_family() -> None:
    names = metrics.metric_names()
    for name in (
        "framefleet_jobs_total",
        "framefleet_job_retries_total",
        "framefleet_queue_wait_seconds_bucket",
        "framefleet_gpu_held_seconds_total",
        "framefleet_queue_oldest_age_seconds",
        "framefleet_job_wall_seconds_bucket",
        "framefleet_stage_seconds_sum",
        "framefleet_frames_total",
        "framefleet_output_bytes_total",
        "framefleet_gpu_busy_ratio",
        "framefleet_gpu_utilization_ratio",
        "framefleet_gpu_memory_used_bytes",
        "framefleet_torch_vram_allocated_bytes",
        "framefleet_cost_usd_total",
        "framefleet_queue_depth",
    ):
        assert name in names


# --- a real worker ----------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_real_worker_counts_every_end_its_reason_queue_wait_and_held_time(
    redis_url: str, worker_factory: Any, s3: Any, s3_bucket: str
) -> None:
    from tests.e2e.helpers import pattern_spec, put_latents

    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    uri = put_latents(s3, s3_bucket, "in/m.npy", latent_frames=2, fmt="npy")
    # Given jobs queued before any worker runs (so they wait), of every kind of end:
    good = client.submit(pattern_spec("m-good", uri, s3_bucket, tenant="acme"))
    zeta = client.submit(pattern_spec("m-zeta", uri, s3_bucket, tenant="zeta"))
    nope = f"s3://{s3_bucket}/in/nope.npy"
    missing = client.submit(pattern_spec("m-missing", nope, s3_bucket, tenant="acme"))
    not_a_spec = str(uuid.uuid4())  # valid JSON, but no spec: fails before it runs
    client.app.send_task(TASK_NAME, args=[{"hello": "world"}], task_id=not_a_spec)
    # the key of "m-good" with another spec, sent around the client: refused at the claim (and
    # dropped, nothing stored: m-good's own result stays)
    other = pattern_spec("m-good", uri, s3_bucket, tenant="acme", segment_frames=3)
    client.app.send_task(TASK_NAME, args=[other.model_dump(mode="json")], task_id=other.key)
    undecodable = push_undecodable(r)
    time.sleep(1.0)
    port = free_port()
    # When a worker that keeps only the name "acme" in its tenant label takes them.
    worker_factory(1, env={"FRAMEFLEET_METRICS_PORT": str(port),
                           "FRAMEFLEET_METRICS_TENANTS": "acme"})
    good.wait(timeout=120)
    zeta.wait(timeout=120)
    for handle in (missing, *(JobHandle(client.app, i) for i in (not_a_spec, undecodable))):
        with pytest.raises(JobFailed):
            handle.wait(timeout=60)
    jobs = "framefleet_jobs_total"
    deadline = time.monotonic() + 60  # the dropped message leaves no state to wait for
    while value(samples := scrape(port), jobs, status="failure", reason="JobConflictError",
                tenant="acme") < 1:
        assert time.monotonic() < deadline, "the conflicting message was not counted"
        time.sleep(0.2)
    assert good.status() == "SUCCESS"
    # Then every end is counted once, with its reason; "zeta" is "other".
    assert value(samples, jobs, status="success", reason="", tenant="acme") == 1
    assert value(samples, jobs, status="success", reason="", tenant="other") == 1
    assert value(samples, jobs, status="failure", reason="InputNotFoundError", tenant="acme") == 1
    assert value(samples, jobs, status="failure", reason="InvalidJobError", tenant="unknown") == 1
    assert value(samples, jobs, status="failure", reason="JobConflictError", tenant="acme") == 1
    assert not [labels for name, labels in samples if ("tenant", "zeta") in labels]
    # The queue wait of the stamped jobs: at least the second they waited for a worker.
    wait = "framefleet_queue_wait_seconds"
    assert value(samples, f"{wait}_count", tenant="acme") == 2
    assert value(samples, f"{wait}_sum", tenant="acme") >= 2 * 1.0
    assert value(samples, f"{wait}_bucket", tenant="acme", le="0.5") == 0
    # Held time for every end, and a record of the failed run for the cost report.
    held = "framefleet_gpu_held_seconds_total"
    assert value(samples, held, status="success", tenant="acme") > 0
    assert value(samples, held, status="failure", tenant="acme") > 0
    (record,) = read_held(client.app)
    assert (record.job_id, record.tenant, record.status) == ("m-missing", "acme", "failure")
    assert record.reason == "InputNotFoundError" and record.device == "cpu"
    assert record.prices is not None and 0 < record.gpu_seconds < 60
    # And the message no worker could decode is counted by the fleet exporter.
    exporter.export_once(r, [QUEUE])
    undecoded = {"status": "failure", "reason": "InvalidJobError", "tenant": "unknown"}
    assert exporter.EXPORTER_REGISTRY.get_sample_value(jobs, undecoded) == 1
    client.app.close()
    r.close()
