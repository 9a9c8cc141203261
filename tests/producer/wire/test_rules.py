"""The rules' submit-time check of local paths: refused outside the producer's roots, a warning
when the producer cannot know them; every URI and the output prefix judged decoded once."""

from __future__ import annotations

import re

import pytest

from producer.errors import InvalidJobError, PathRefusedError, SettingsError
from producer.settings import Settings
from producer.wire.rules import (
    check_local_paths,
    check_spec,
    check_uris,
    local_paths,
    spec_uris,
    time_limits,
)
from producer.wire.spec import DecoderSpec, InputSpec, JobSpec, OutputSpec


def _spec(input_uri: str, output_uri: str, weights: str | None = None) -> JobSpec:
    decoder = {"name": "wan2.1-vae", "weights": weights} if weights else {"name": "pattern"}
    return JobSpec.model_validate({"job_id": "p1", "input": {"uri": input_uri},
                                   "decoder": decoder, "output": {"uri": output_uri}})


def test_every_file_uri_of_a_spec_is_found_with_its_field() -> None:
    spec = _spec("file:///data/in/z.npy", "s3://b/out", weights="file:///models/vae")
    assert list(local_paths(spec)) == [("input.uri", "file:///data/in/z.npy"),
                                       ("decoder.weights", "file:///models/vae")]
    generate = JobSpec.model_validate({
        "job_id": "g1", "output": {"uri": "s3://b/o"},
        "generate": {"model": "file:///models/wan", "prompt": "a fox", "num_frames": 5}})
    assert ("generate.model", "file:///models/wan") in list(local_paths(generate))


def test_a_path_outside_the_roots_is_refused_at_submit_naming_the_field() -> None:
    settings = Settings(file_roots="/data:/models", broker_url="redis://127.0.0.1:1/0")
    assert check_local_paths(_spec("file:///data/in/z.npy", "file:///data/out"), settings) == []
    with pytest.raises(PathRefusedError) as info:
        check_local_paths(_spec("file:///data/in/z.npy", "file:///home/me/out"), settings)
    message = str(info.value)
    assert message.startswith("output.uri: file:///home/me/out is outside FRAMEFLEET_FILE_ROOTS")
    assert "(/data:/models)" in message
    # a root's name is no prefix of a sibling folder
    with pytest.raises(PathRefusedError, match="input.uri"):
        check_local_paths(_spec("file:///database/z.npy", "s3://b/o"), settings)
    # an empty FRAMEFLEET_FILE_ROOTS allows no local path at all
    with pytest.raises(PathRefusedError, match=r"\(none\)"):
        check_local_paths(_spec("file:///data/z.npy", "s3://b/o"),
                          Settings(file_roots="", broker_url="redis://127.0.0.1:1/0"))


def test_without_roots_here_the_workers_decide_and_the_client_says_so() -> None:
    settings = Settings(file_roots=None, broker_url="redis://127.0.0.1:1/0")
    (warning,) = check_local_paths(_spec("file:///x/z.npy", "file:///x/out"), settings)
    assert warning.startswith("input.uri, output.uri: local paths on the workers")
    assert "FRAMEFLEET_FILE_ROOTS is not set here" in warning
    # nothing local, nothing to say
    assert check_local_paths(_spec("s3://b/z.npy", "s3://b/out"), settings) == []


def test_the_embedded_mode_knows_its_own_folder() -> None:
    settings = Settings(broker_url="filesystem://", data_dir="/srv/demo/.framefleet")
    assert check_local_paths(_spec("file:///srv/demo/in.npy", "file:///srv/demo/v"),
                             settings) == []
    with pytest.raises(PathRefusedError, match="output.uri"):
        check_local_paths(_spec("file:///srv/demo/in.npy", "file:///srv/other"), settings)


def test_local_paths_are_judged_decoded_once() -> None:
    settings = Settings(file_roots="/data", broker_url="redis://127.0.0.1:1/0")
    # %64 is 'd': the worker's store opens /data/in/z.npy, so the client accepts it
    assert check_local_paths(_spec("file:///%64ata/in/z.npy", "s3://b/o"), settings) == []
    with pytest.raises(PathRefusedError, match=r"^input\.uri: file:///d%61tabase/z\.npy"):
        check_local_paths(_spec("file:///d%61tabase/z.npy", "s3://b/o"), settings)


OUT = "file:///R/out"


@pytest.mark.parametrize("uri", [f"{OUT}/%2e%2e/escaped", f"{OUT}/%2E%2E/escaped",
                                 f"{OUT}/x%2F..%2F..%2Fescaped", f"{OUT}/%252e%252e/escaped",
                                 f"{OUT}/x%00/escaped", f"{OUT}/..%5Cescaped",
                                 "file:///R/outside", "s3://b/R/out/x"])
def test_the_output_prefix_is_checked_on_the_decoded_form(uri: str) -> None:
    settings = Settings(output_prefix=OUT, broker_url="redis://127.0.0.1:1/0")
    with pytest.raises(InvalidJobError, match=r"^output\.uri: "):
        settings.check_output_uri(uri)
    with pytest.raises(InvalidJobError, match=r"^output\.uri: "):  # built past the validators
        check_spec(_unchecked(output=uri), settings)


def test_an_output_under_the_prefix_passes_however_it_is_spelt() -> None:
    settings = Settings(output_prefix=OUT + "/", broker_url="redis://127.0.0.1:1/0")
    for uri in (OUT, f"{OUT}/", f"{OUT}/a/b", "file:///R/%6Fut/a", "file://localhost/R/out/a"):
        settings.check_output_uri(uri)
    s3 = Settings(output_prefix="s3://b/videos", broker_url="redis://127.0.0.1:1/0")
    s3.check_output_uri("s3://b/videos/acme")
    for uri in ("s3://b/videos2", "s3://b//videos/x", "s3://c/videos/x", "s3://b/videos/%2e%2e"):
        with pytest.raises(InvalidJobError, match=r"^output\.uri: "):
            s3.check_output_uri(uri)


def test_a_prefix_that_does_not_decode_safely_is_a_settings_error() -> None:
    with pytest.raises(SettingsError, match="FRAMEFLEET_OUTPUT_PREFIX: .* segments are not"):
        Settings(output_prefix="file:///R/out/%2e%2e")


def _unchecked(**uris: str) -> JobSpec:
    """A pattern job whose URIs were set past pydantic's validators (``model_construct``)."""
    spec = _spec("s3://b/in/z.npy", "s3://b/out")
    parts: dict[str, object] = {}
    if "output" in uris:
        parts["output"] = OutputSpec.model_construct(uri=uris["output"])
    if "input" in uris:
        parts["input"] = InputSpec.model_construct(uri=uris["input"])
    if "weights" in uris:
        parts["decoder"] = DecoderSpec.model_construct(
            name="wan2.1-vae", preset="wan2.1", dtype="auto", seed=0, weights=uris["weights"])
    return spec.model_copy(update=parts)


@pytest.mark.parametrize(("part", "uri", "field"), [
    ("input", "s3://b/in/%2e%2e/secret.npy", "input.uri"),
    ("input", "file:///R/in%2F..%2Fsecret.npy", "input.uri"),
    ("input", "s3://b//secret.npy", "input.uri"),
    ("weights", "file:///models/%2E%2E/etc", "decoder.weights"),
    ("weights", "file:///models/vae%00", "decoder.weights"),
])
def test_every_uri_of_a_spec_is_decoded_by_the_rules(part: str, uri: str, field: str) -> None:
    with pytest.raises(InvalidJobError, match=rf"^{re.escape(field)}: "):
        check_spec(_unchecked(**{part: uri}), Settings(broker_url="redis://127.0.0.1:1/0"))


def test_the_generate_uris_are_named_by_their_field() -> None:
    spec = JobSpec.model_validate({
        "job_id": "g1", "output": {"uri": "s3://b/o"},
        "generate": {"model": "file:///models/wan", "prompt": "file:///a/../b", "num_frames": 5,
                     "image": "s3://b/in/a.png"}})
    assert [f for f, _ in spec_uris(spec)] == ["generate.model", "generate.image", "output.uri"]
    check_uris(spec)  # a prompt is no URI, whatever it looks like
    bad = spec.model_copy(update={"generate": spec.generate.model_copy(  # type: ignore[union-attr]
        update={"image": "s3://b/in/%252e%252e/a.png"})})
    with pytest.raises(InvalidJobError, match=r"^generate\.image: "):
        check_uris(bad)


def test_time_limits_follow_the_spec_never_the_message() -> None:
    settings = Settings(max_time_limit_s=600)
    assert time_limits({"time_limit_s": 30}, settings) == (30 + settings.hard_limit_after_s, 30)
    # anything but a limit the fleet allows gets the fleet's longest (refused on receipt)
    for payload in ({"time_limit_s": 0}, {"time_limit_s": 601}, {"time_limit_s": True},
                    {"time_limit_s": 1.5}, {"time_limit_s": "30"}, {}, None, [1]):
        assert time_limits(payload, settings) == (600 + settings.hard_limit_after_s, 600), payload
    # the hard limit's distance is the worker's setting (FRAMEFLEET_HARD_LIMIT_AFTER_S)
    assert settings.hard_limit_after_s == 60
    assert time_limits({"time_limit_s": 30}, Settings(hard_limit_after_s=5)) == (35, 30)
