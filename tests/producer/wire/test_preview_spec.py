"""``generate.preview``: checked with the field named, left out of the digest while unset (a
spec that does not use it keeps the digest it had before previews existed), the worker's
default documented and range-checked, the ``preview`` webhook event and the status line."""

from __future__ import annotations

from typing import Any

import pytest

from producer.errors import InvalidJobError, SettingsError
from producer.settings import Settings
from producer.wire.spec import (
    PREVIEW_LATEST,
    PreviewInfo,
    Progress,
    parse_spec,
    preview_name,
)

#: The digest of :data:`SPEC` as main computed it before ``generate.preview`` existed.
DIGEST_BEFORE_PREVIEWS = "d09a12225fe5a3c79cfe3b56198a46376d23f8bf8d8d7979c440b7061d358cff"


def spec(**generate: Any) -> dict[str, Any]:
    return {"job_id": "fox-1", "tenant": "acme",
            "generate": {"model": "file:///models/wan", "prompt": "a red fox",
                         "num_inference_steps": 20, "seed": 42, **generate},
            "output": {"uri": "s3://videos/out"},
            "notify": {"urls": ["https://hooks.example.com/f"], "events": ["segment", "succeeded"]}}


def test_a_spec_without_previews_keeps_its_digest() -> None:
    assert parse_spec(spec()).digest() == DIGEST_BEFORE_PREVIEWS
    # asking for previews is another job (a rerun of the same spec still matches its manifest)
    every_5 = parse_spec(spec(preview={"every": 5}))
    assert every_5.digest() != DIGEST_BEFORE_PREVIEWS
    assert every_5.digest() == parse_spec(spec(preview={"every": 5})).digest()
    assert parse_spec(spec(preview={"every": 0})).digest() not in (
        DIGEST_BEFORE_PREVIEWS, every_5.digest())


@pytest.mark.parametrize(("preview", "message"), [
    ({"every": -1}, "generate.preview.every: Input should be greater than or equal to 0"),
    ({"every": "often"}, "generate.preview.every: Input should be a valid integer"),
    # strict: a boolean, a numeric string and a float are not counts
    ({"every": True}, "generate.preview.every: Input should be a valid integer"),
    ({"every": "2"}, "generate.preview.every: Input should be a valid integer"),
    ({"every": 2.0}, "generate.preview.every: Input should be a valid integer"),
    ({}, "generate.preview.every: Field required"),
    ({"every": 2, "size": 64}, "generate.preview.size: Extra inputs are not permitted"),
])
def test_a_bad_preview_is_refused_naming_the_field(preview: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidJobError) as e:
        parse_spec(spec(preview=preview))
    assert message in str(e.value), str(e.value)


def test_every_step_and_none_are_fine() -> None:
    gen = parse_spec(spec(preview={"every": 20})).generate
    assert gen is not None and gen.preview is not None and gen.preview.every == 20
    # over the steps: the one after step 1 (no rule between two fields: the API's schema
    # says every rule of a request)
    gen = parse_spec(spec(preview={"every": 21})).generate
    assert gen is not None and gen.preview is not None and gen.preview.every == 21
    gen = parse_spec(spec(preview={"every": 0})).generate
    assert gen is not None and gen.preview is not None and gen.preview.every == 0


def test_the_default_is_a_range_checked_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().preview_every == 2  # on unless the operator turns previews off
    monkeypatch.setenv("FRAMEFLEET_PREVIEW_EVERY", "4")
    assert Settings().preview_every == 4
    monkeypatch.setenv("FRAMEFLEET_PREVIEW_EVERY", "-1")
    with pytest.raises(SettingsError, match="FRAMEFLEET_PREVIEW_EVERY='-1'"):
        Settings()
    monkeypatch.setenv("FRAMEFLEET_PREVIEW_EVERY", "10001")
    with pytest.raises(SettingsError, match="FRAMEFLEET_PREVIEW_EVERY='10001'"):
        Settings()


def test_receivers_may_ask_for_preview_events() -> None:
    parsed = parse_spec({**spec(), "notify": {"urls": ["https://h.example.com/"],
                                              "events": ["preview", "segment"]}})
    assert parsed.notify is not None and parsed.notify.events == ("preview", "segment")
    # not by default: a receiver that asks for nothing gets no previews
    default = parse_spec({**spec(), "notify": {"urls": ["https://h.example.com/"]}})
    assert default.notify is not None and "preview" not in default.notify.events


def test_the_status_line_names_the_newest_preview() -> None:
    uri = "s3://videos/out/acme/fox-1/" + preview_name(5)
    shown = PreviewInfo(step=5, steps_total=20, uri=uri, latest_uri=uri.replace(
        preview_name(5), PREVIEW_LATEST), width=416, height=240, frames=21, fps=4.0)
    p = Progress(frames_done=0, frames_total=81, segments_done=0, stage="denoise", steps_done=7,
                 steps_total=20, preview=shown)
    assert p.describe() == f"denoise 7/20, preview at {uri}"
    assert preview_name(5) == "previews/step-0005.mp4" and PREVIEW_LATEST.startswith("previews/")
    # once it decodes the line is about frames (the preview stays in the payload)
    decoding = p.model_copy(update={"stage": "decode", "frames_done": 5})
    assert decoding.describe() == "decode 5/81 frames, 0 segments"
    # a report without a preview reads as before, and parses from its old payload
    plain = Progress.model_validate({"frames_done": 0, "frames_total": 81, "segments_done": 0,
                                     "stage": "denoise", "steps_done": 7, "steps_total": 20})
    assert plain.describe() == "denoise 7/20" and plain.preview is None
