"""The weights rule both ends check, and the wire format's part in it."""

from __future__ import annotations

import pytest

from producer.errors import InvalidJobError
from producer.wire.spec import DecoderSpec, Manifest, parse_spec
from producer.wire.weights import check_weights, uses_random_weights

BASE = {"job_id": "w1", "input": {"uri": "s3://b/z.npy"}, "output": {"uri": "s3://b/out"}}


def test_random_is_a_value_of_its_own_and_marks_nothing_else() -> None:
    spec = parse_spec({**BASE, "decoder": {"weights": "random"}})
    assert spec.decoder.weights == "random" and uses_random_weights(spec.decoder)
    check_weights(spec.decoder)
    folder = DecoderSpec(weights="file:///srv/models/wan2.1/vae")
    check_weights(folder)
    assert not uses_random_weights(folder)
    assert not uses_random_weights(DecoderSpec(name="pattern"))


def test_no_weights_for_a_wan_decoder_is_refused_with_a_hint() -> None:
    with pytest.raises(InvalidJobError, match=r"^decoder\.weights: the wan2\.1-vae decoder "
                                              r"needs weights") as info:
        check_weights(parse_spec(BASE).decoder)
    assert "config.json" in str(info.value) and "random" in str(info.value)
    check_weights(DecoderSpec(name="pattern"))  # the pattern decoder needs none


def test_a_plain_path_as_weights_gets_a_file_uri_hint() -> None:
    with pytest.raises(InvalidJobError, match=r"decoder\.weights: .*file:///absolute/path"):
        parse_spec({**BASE, "decoder": {"weights": "models/wan2.1/vae"}})


def test_manifests_written_before_the_mark_still_parse() -> None:
    old = {"job_id": "j", "tenant": "t", "spec_digest": "d", "frames": 1, "width": 8,
           "height": 8, "fps": 16.0, "video_seconds": 0.1, "segments": []}
    assert Manifest.model_validate(old).random_weights is False
