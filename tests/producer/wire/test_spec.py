"""The wire format: good specs round-trip, bad values fail naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from producer.errors import InvalidJobError
from producer.wire.spec import (
    RESULT_SCHEMA_VERSION,
    STAGE_NAMES,
    JobResult,
    JobSpec,
    Manifest,
    SegmentInfo,
    StageTimings,
    WorkerInfo,
    check_stage_fields,
    parse_spec,
    segment_name,
)

GOOD = {
    "job_id": "job-1",
    "tenant": "acme",
    "input": {"uri": "s3://bucket/latents/a.safetensors"},
    "output": {"uri": "s3://bucket/videos/"},
}


def test_good_spec_defaults_and_round_trip() -> None:
    spec = parse_spec(GOOD)
    assert spec.output.uri == "s3://bucket/videos"
    assert spec.output_prefix == "s3://bucket/videos/acme/job-1"
    assert spec.input.resolved_format == "safetensors"
    assert spec.pipeline.mode == "async" and spec.pipeline.ring_slots == 3
    again = parse_spec(spec.model_dump_json())
    assert again == spec and again.digest() == spec.digest()


def test_digest_changes_with_content() -> None:
    a = parse_spec(GOOD)
    b = parse_spec({**GOOD, "video": {"crf": 30}})
    assert a.digest() != b.digest()


def test_spec_is_frozen() -> None:
    spec = parse_spec(GOOD)
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen error type
        spec.job_id = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"job_id": "../etc"}, "job_id"),
        ({"job_id": ".."}, "job_id"),
        ({"job_id": "a/b"}, "job_id"),
        ({"job_id": ""}, "job_id"),
        ({"job_id": "x" * 129}, "job_id"),
        ({"tenant": "a b"}, "tenant"),
        ({"input": {"uri": "http://example.com/a.npy"}}, "input.uri"),
        ({"input": {"uri": "file://relative/a.npy"}}, "input.uri"),
        ({"input": {"uri": "s3:///nobucket.npy"}}, "input.uri"),
        ({"output": {"uri": "file:///tmp/../etc"}}, "output.uri"),
        ({"decoder": {"name": "sd-vae"}}, "decoder.name"),
        ({"decoder": {"dtype": "int8"}}, "decoder.dtype"),
        ({"video": {"fps": 0}}, "video.fps"),
        ({"video": {"fps": -5}}, "video.fps"),
        ({"video": {"crf": 52}}, "video.crf"),
        ({"video": {"codec": "libvpx"}}, "video.codec"),
        ({"video": {"preset": "ludicrous"}}, "video.preset"),
        ({"video": {"segment_frames": 0}}, "video.segment_frames"),
        ({"pipeline": {"mode": "turbo"}}, "pipeline.mode"),
        ({"pipeline": {"ring_slots": 1}}, "pipeline.ring_slots"),
        ({"priority": 10}, "priority"),
        ({"time_limit_s": 0}, "time_limit_s"),
        ({"unknown_field": 1}, "unknown_field"),
    ],
)
def test_bad_values_name_the_field(patch: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidJobError) as info:
        parse_spec({**GOOD, **patch})
    assert field in str(info.value)


def test_missing_required_field() -> None:
    with pytest.raises(InvalidJobError, match="output"):
        parse_spec({k: v for k, v in GOOD.items() if k != "output"})


def test_not_json() -> None:
    with pytest.raises(InvalidJobError):
        parse_spec("{not json")


def test_format_must_be_inferable() -> None:
    spec = parse_spec({**GOOD, "input": {"uri": "s3://b/latents.pt"}})
    with pytest.raises(InvalidJobError, match="input.format"):
        _ = spec.input.resolved_format


def test_job_result_schema_requires_segments() -> None:
    with pytest.raises(Exception):  # noqa: B017 - pydantic ValidationError
        JobResult.model_validate({"job_id": "x"})


def _result() -> JobResult:
    segment = SegmentInfo(index=0, uri="s3://b/out/acme/j/" + segment_name(0), first_frame=0,
                          frames=5, bytes=10, sha256="0" * 64, seconds=0.3125)
    manifest = Manifest(job_id="j", tenant="acme", spec_digest="0" * 64, frames=5, width=64,
                        height=32, fps=16.0, video_seconds=0.3125, segments=(segment,))
    return JobResult(manifest=manifest, manifest_uri="s3://b/out/acme/j/manifest.json",
                     timings=StageTimings(wall_s=1.0), finished_at=1.0,
                     worker=WorkerInfo(hostname="h", node="n", pid=1, device="cpu"))


def test_job_result_carries_its_manifest_once() -> None:
    # Given a result in the current schema
    result = _result()
    data = result.model_dump(mode="json")
    # Then the manifest's facts are in it exactly once, under "manifest", and it round-trips
    assert data["schema_version"] == RESULT_SCHEMA_VERSION == 2
    assert data["manifest"]["frames"] == 5 and "frames" not in data
    assert JobResult.model_validate_json(result.model_dump_json()) == result


def test_job_result_of_schema_1_is_refused() -> None:
    # A version-1 result (the manifest's fields copied flat) names what does not fit.
    flat = _result().model_dump(mode="json")
    flat.update(flat.pop("manifest"))  # brings the manifest's schema_version 1 along
    with pytest.raises(ValidationError, match="schema_version") as info:
        JobResult.model_validate(flat)
    assert "manifest" in str(info.value)


def test_segment_name_is_the_output_layout() -> None:
    assert segment_name(0) == "segment-00000.mp4"
    assert segment_name(12345) == "segment-12345.mp4"


def test_stage_names_are_checked_against_the_records_that_spell_them() -> None:
    assert STAGE_NAMES == ("load", "adapter_load", "text_encode", "denoise", "preview",
                           "decode", "postprocess", "d2h", "encode", "upload")
    assert {f"{s}_s" for s in STAGE_NAMES} <= set(StageTimings.model_fields)
    # and a record missing a stage is refused by name
    with pytest.raises(TypeError, match=r"\['d2h'\]"):
        check_stage_fields(["load_s", "adapter_load_s", "text_encode_s", "denoise_s",
                            "preview_s", "decode_s", "postprocess_s", "encode_s", "upload_s"],
                           "X")


def test_jobspec_type_is_exported() -> None:
    import producer

    assert producer.JobSpec is JobSpec
