"""The pieces of issue 26 that need no server: the ledger's layout and file reader, the one-line
cost summary, the stage a status shows, a conflict's named fields, the report per job, and a
plot of one point."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from producer.client.conflict import conflict, differences
from producer.client.jobstate import from_meta
from producer.cost.fleet import fleet_summary
from producer.cost.pricing import default_catalog, prices_for
from producer.errors import LedgerError
from producer.settings import Settings
from producer.state.ledger import NAME_RE, LedgerReader, day_prefixes, record_name
from producer.wire.results import HeldRun, LedgerRecord, Progress, StateTime
from producer.wire.spec import JobSpec
from tests.producer.cost.test_cost import make_result

PRICES = prices_for("g7e.2xlarge", "on-demand", default_catalog())
DEC_1 = dt.datetime(2026, 12, 1, 22, 14, 30, 123000, tzinfo=dt.UTC).timestamp()


def _record(job_id: str, tenant: str, finished_at: float, ok: bool = True) -> LedgerRecord:
    result = make_result(job_id, tenant, node="w1", finished_at=finished_at, wall_s=10,
                         video_seconds=3, prices=PRICES) if ok else None
    held = () if ok else (HeldRun(job_id=job_id, tenant=tenant, status="failure",
                                  reason="StorageError", node="w1", device="cpu",
                                  started_at=finished_at - 4, finished_at=finished_at,
                                  gpu_seconds=4, prices=PRICES),)
    return LedgerRecord(
        key=job_id if tenant == "default" else f"{tenant}:{job_id}", job_id=job_id,
        tenant=tenant, spec_digest="0" * 64, status="success" if ok else "failure",
        node="w1", states=(StateTime(state="STARTED", at=finished_at - 10),),
        output_uri=f"s3://b/out/{tenant}/{job_id}", result=result, held=held,
        finished_at=finished_at)


def test_a_record_lies_under_its_day_and_tenant_named_by_time_and_job() -> None:
    name = record_name(_record("clip-4.2", "acme", DEC_1), "3f2a1b9c")
    assert name == "day=2026-12-01/tenant=acme/221430123-clip-4.2-3f2a1b9c.json"
    match = NAME_RE.match(name.rsplit("/", 1)[1])
    assert match is not None and match.group("job_id") == "clip-4.2"
    # a month's report lists a month's days, each a prefix of its own
    days = day_prefixes(DEC_1 - 2 * 86_400, DEC_1)
    assert days == ["day=2026-11-29/", "day=2026-11-30/", "day=2026-12-01/"]


def test_the_file_reader_filters_by_time_tenant_and_job(tmp_path: Path) -> None:
    records = [_record("a1", "acme", DEC_1 - 86_400), _record("a2", "acme", DEC_1, ok=False),
               _record("b1", "beta", DEC_1)]
    for i, r in enumerate(records):
        path = tmp_path / record_name(r, f"{i:08x}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(r.model_dump_json() + "\n")
    (tmp_path / "day=2026-12-01" / "tenant=beta" / "000000000-junk-00000000.json").write_text("{}")
    reader = LedgerReader(tmp_path.as_uri(), Settings())
    assert [r.job_id for r in reader.records()] == ["a1", "a2", "b1"]  # junk skipped
    assert [r.job_id for r in reader.records(since=DEC_1 - 60)] == ["a2", "b1"]
    assert [r.job_id for r in reader.records(tenant="acme")] == ["a1", "a2"]
    assert [r.job_id for r in reader.records(tenant="acme", job_id="a2")] == ["a2"]
    assert reader.records(since=DEC_1 - 60, until=DEC_1 - 30) == []
    # what the cost report makes of them: a row per job key
    found = reader.records()
    rows = fleet_summary([r.result for r in found if r.result], by="job",
                         held=[h for r in found for h in r.held])
    assert [(row.group, row.jobs, row.failed_runs) for row in rows] == [
        ("acme:a1", 1, 0), ("acme:a2", 0, 1), ("beta:b1", 1, 0)]


def test_the_reader_opens_the_ledger_decoded_once(tmp_path: Path) -> None:
    record = _record("a1", "acme", DEC_1)
    path = tmp_path / "the ledger" / record_name(record, "00000000")
    path.parent.mkdir(parents=True)
    path.write_text(record.model_dump_json() + "\n")
    reader = LedgerReader(f"{tmp_path.as_uri()}/the%20ledger", Settings())
    assert [r.job_id for r in reader.records()] == ["a1"]
    for uri in (f"{tmp_path.as_uri()}/the%20ledger/%2e%2e", f"{tmp_path.as_uri()}/x%2F..%2Fy",
                "s3://b/ledger/%252e%252e", "s3://b//ledger", "http://h/ledger"):
        with pytest.raises(LedgerError, match=r"^FRAMEFLEET_LEDGER_URI: "):
            LedgerReader(uri, Settings())


def test_cost_prints_as_one_line_summary() -> None:
    cost = make_result("j", "t", node="w", finished_at=1, wall_s=5, video_seconds=3,
                       prices=PRICES).cost
    assert cost is not None
    text = str(cost)
    assert "\n" not in text and len(text) < 160, text
    assert text.startswith(f"${cost.total_usd:.6f} total: GPU ")
    assert "per video-minute (g7e.2xlarge on-demand $3.3600/h)" in text
    assert "sources" in json.dumps(cost.model_dump())  # the whole report is still there


def test_status_names_the_stage_and_the_worker() -> None:
    def detail(**p: object) -> str:
        base = {"frames_done": 0, "frames_total": 49, "segments_done": 0, "worker": "gpu0@h"}
        return from_meta("j", "PROGRESS", {**base, **p}, True).detail()

    assert detail(stage="denoise", steps_done=37, steps_total=40) == "denoise 37/40 on gpu0@h"
    assert detail(frames_done=13, segments_done=1) == "decode 13/49 frames, 1 segment on gpu0@h"
    assert detail(stage="upload", frames_done=49, segments_done=3) == (
        "upload: 49/49 frames decoded, 3 segments stored on gpu0@h")
    # a report from a newer worker still reads as PROGRESS on that worker
    newer = from_meta("j", "PROGRESS", {"stage": "polish", "worker": "gpu1@h"}, True)
    assert (newer.state, newer.worker) == ("PROGRESS", "gpu1@h")
    assert Progress(frames_done=1, frames_total=1, segments_done=0).worker is None


def test_a_conflict_names_the_fields_that_differ() -> None:
    first = JobSpec.model_validate({"job_id": "c", "tenant": "acme", "input": {"uri": "s3://b/z"},
                                    "decoder": {"name": "pattern"}, "output": {"uri": "s3://b/o"}})
    second = first.model_copy(update={"priority": 9, "video": first.video.model_copy(
        update={"crf": 30})})
    text = str(conflict(second, json.dumps(first.model_dump(mode="json"))))
    assert "was already submitted with a different spec: priority: 5 -> 9; video.crf: 20 -> 30" \
        in text
    assert "not kept" in str(conflict(second, None))
    many = differences({f"f{i}": i for i in range(8)}, {f"f{i}": -i for i in range(8)})
    assert len(many) == 7  # f0 is equal


def test_a_plot_of_one_point_spans_one_bucket_either_side(tmp_path: Path) -> None:
    from matplotlib import dates

    from producer.cli.cost_plot import cost_figure, write_plot

    one = [make_result("p", "t", node="w", finished_at=DEC_1, wall_s=5, video_seconds=3,
                       prices=PRICES)]
    fig = cost_figure(one, bucket_s=3600, by="tenant")
    low, high = fig.axes[0].get_xlim()
    span_days = high - low
    assert abs(span_days - 2 / 24) < 1e-6, span_days  # two hours, not years
    assert dates.num2date(low).year == 2026
    write_plot(one, tmp_path / "one.png", bucket_s=3600, by="tenant")
    assert (tmp_path / "one.png").stat().st_size > 1000
