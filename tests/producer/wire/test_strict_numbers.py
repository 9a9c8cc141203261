"""The wire takes numbers as numbers: a boolean, a numeric string or a float is not an integer
(``true`` once became 1 step, ``"2"`` two), nor a string or a boolean a float; JSON text and
a parsed dict are judged alike, and the error names the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from producer.errors import InvalidJobError
from producer.wire.spec import parse_spec


def spec(generate: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    return {"job_id": "strict-1", "tenant": "acme",
            "generate": {"model": "file:///models/wan", "prompt": "x",
                         "num_inference_steps": 4, **(generate or {})},
            "output": {"uri": "s3://videos/out"}, **top}


@pytest.mark.parametrize("value", [True, False, "2", "2.0", 2.0, [2], None])
@pytest.mark.parametrize("field", ["num_inference_steps", "width", "height", "num_frames",
                                   "seed"])
@pytest.mark.parametrize("as_json", [False, True])
def test_an_integer_field_takes_integers_only(field: str, value: Any, as_json: bool) -> None:
    data = spec({field: value})
    with pytest.raises(InvalidJobError, match=rf"generate\.{field}: Input should be a valid "
                       "integer"):
        parse_spec(json.dumps(data) if as_json else data)


@pytest.mark.parametrize(("top", "field"), [
    ({"priority": True}, "priority"), ({"time_limit_s": "60"}, "time_limit_s"),
    ({"video": {"crf": 20.0}}, "video.crf"),
    ({"video": {"segment_frames": True}}, "video.segment_frames"),
    ({"pipeline": {"ring_slots": "3"}}, "pipeline.ring_slots"),
])
def test_top_level_integers_are_strict_too(top: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidJobError, match=rf"{field}: Input should be a valid integer"):
        parse_spec(spec(**top))


@pytest.mark.parametrize(("generate", "message"), [
    ({"guidance_scale": True}, "generate.guidance_scale: Input should be a valid number"),
    ({"guidance_scale": "5"}, "generate.guidance_scale: Input should be a valid number"),
    ({"save_latents": 1}, "generate.save_latents: Input should be a valid boolean"),
    ({"save_latents": "true"}, "generate.save_latents: Input should be a valid boolean"),
])
def test_floats_and_booleans_are_strict(generate: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidJobError, match=message):
        parse_spec(spec(generate))


def test_plain_numbers_still_pass() -> None:
    parsed = parse_spec(json.dumps(spec({"guidance_scale": 5, "seed": 7, "width": 832},
                                        video={"fps": 24})))
    assert parsed.generate is not None
    assert (parsed.generate.guidance_scale, parsed.generate.seed) == (5.0, 7)
    assert parsed.video.fps == 24.0


def test_every_is_strict_over_the_steps_too() -> None:
    # 5 over 4 steps is a count (the preview after step 1 only); 5.0 is no count
    gen = parse_spec(spec({"preview": {"every": 5}})).generate
    assert gen is not None and gen.preview is not None and gen.preview.every == 5
    with pytest.raises(InvalidJobError, match=r"generate\.preview\.every: Input should be a "
                       "valid integer"):
        parse_spec(spec({"preview": {"every": 5.0}}))
