"""The rules' submit-time check of local paths: refused outside the producer's roots, a warning
when the producer cannot know them."""

from __future__ import annotations

import pytest

from producer.errors import PathRefusedError
from producer.rules import check_local_paths, local_paths
from producer.settings import Settings
from producer.spec import JobSpec


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
