"""The stores open the decoded form the checks saw (``producer.wire.base.decode_uri``), once:
encoded dots, separators, NUL and double encoding are refused by the store itself, naming the
field, before any folder is made or any request is sent. A real folder, and SeaweedFS for
``s3://``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import numpy as np
import pytest

from producer.errors import InvalidJobError
from producer.settings import Settings
from producer.wire.spec import DecoderSpec, InputSpec
from tests.services import S3Server
from worker.inputs.latents import load_latents
from worker.inputs.weights import resolve_weights
from worker.stores import storage
from worker.stores.storage import FileStore, JobOutput, S3Store, open_uri, read_uri

ATTACKS = ("%2e%2e/escaped", "%2E%2E/escaped", "x%2F..%2Fescaped", "..%5Cescaped",
           "%252e%252e/escaped", "x%00/escaped", ".%2e/escaped")


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("tail", ATTACKS)
def test_a_file_output_that_decodes_out_of_its_folder_is_refused_by_the_store(
    tmp_path: Path, tail: str
) -> None:
    (tmp_path / "out").mkdir()
    settings = Settings(file_roots=str(tmp_path))
    before = _tree(tmp_path)
    uri = f"{(tmp_path / 'out').as_uri()}/{tail}"
    with pytest.raises(InvalidJobError, match=r"^output\.uri: "):
        JobOutput(f"{uri}/default/j1", settings)
    with pytest.raises(InvalidJobError, match=r"^input\.uri: "):
        read_uri(f"{uri}/z.npy", 100, settings, field="input.uri")
    assert _tree(tmp_path) == before


def test_the_key_is_the_decoded_path_once(tmp_path: Path) -> None:
    settings = Settings(file_roots=str(tmp_path))
    (tmp_path / "a b").mkdir()
    (tmp_path / "a b" / "z.npy").write_bytes(b"latents")
    store, key = open_uri(f"{tmp_path.as_uri()}/a%20b/z.npy", settings, "input.uri")
    assert isinstance(store, FileStore) and "/" + key == str(tmp_path / "a b" / "z.npy")
    assert read_uri(f"{tmp_path.as_uri()}/a%20b/z.npy", 100, settings) == b"latents"
    # a name that is itself '%2e' cannot be named at all: %25 decodes to a '%', refused
    (tmp_path / "%2e").mkdir()
    (tmp_path / "%2e" / "z.npy").write_bytes(b"x")
    with pytest.raises(InvalidJobError, match="decoded once"):
        read_uri(f"{tmp_path.as_uri()}/%252e/z.npy", 100, settings, field="input.uri")


@pytest.mark.parametrize("key", ["../x", "a/../x", "./x", "a//x", "/x", "a\x00b", "a\\b",
                                 "a%2e", "a?b", "a#b", "a\nb"])
def test_a_key_handed_to_a_store_must_be_plain(tmp_path: Path, key: str) -> None:
    store = FileStore(tmp_path, Settings(file_roots=str(tmp_path)), field="output.uri")
    with pytest.raises(InvalidJobError, match=r"^output\.uri: .* is not a plain key"):
        store.put_bytes(key, b"x", "text/plain")
    assert _tree(tmp_path) == set()


def test_latents_and_weights_read_the_decoded_path(tmp_path: Path) -> None:
    settings = Settings(file_roots=str(tmp_path / "in"), max_input_bytes=1024**2)
    (tmp_path / "in").mkdir()
    np.save(tmp_path / "in" / "z.npy", np.zeros((16, 1, 2, 2), np.float32))
    np.save(tmp_path / "secret.npy", np.zeros((16, 1, 2, 2), np.float32))
    good = InputSpec(uri=f"{tmp_path.as_uri()}/%69n/z.npy")  # %69 is 'i'
    assert load_latents(good, 16, settings).shape == (16, 1, 2, 2)
    # built past the validators, as a careless caller could: the store still refuses
    for uri in (f"{tmp_path.as_uri()}/in/%2e%2e/secret.npy",
                f"{tmp_path.as_uri()}/in%2F..%2Fsecret.npy"):
        with pytest.raises(InvalidJobError, match=r"^input\.uri: "):
            load_latents(InputSpec.model_construct(uri=uri), 16, settings)
    weights = DecoderSpec.model_construct(name="wan2.1-vae", preset="wan2.1", dtype="auto",
                                          seed=0, weights=f"{tmp_path.as_uri()}/in/%2e%2e")
    with pytest.raises(InvalidJobError, match=r"^decoder\.weights: "):
        resolve_weights(weights, settings)


@pytest.fixture
def s3_settings(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    monkeypatch.setattr(storage, "_clients", {})
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
    yield Settings(s3_endpoint_url=s3.endpoint_url, s3_region=s3.region, s3_max_attempts=1)


def _keys(s3: S3Server, bucket: str) -> list[str]:
    return sorted(o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket).get("Contents", []))


@pytest.mark.parametrize("tail", [*ATTACKS, "/escaped", "a//b"])
def test_an_s3_key_that_decodes_out_of_its_prefix_is_refused_before_any_request(
    s3: S3Server, s3_bucket: str, s3_settings: Settings, tail: str
) -> None:
    s3.client().put_object(Bucket=s3_bucket, Key="secret.npy", Body=b"secret")
    with pytest.raises(InvalidJobError, match=r"^output\.uri: "):
        JobOutput(f"s3://{s3_bucket}/videos/{tail}/default/j1", s3_settings)
    with pytest.raises(InvalidJobError, match=r"^input\.uri: "):
        read_uri(f"s3://{s3_bucket}/videos/{tail}/secret.npy", 100, s3_settings,
                 field="input.uri")
    assert _keys(s3, s3_bucket) == ["secret.npy"]


def test_the_decoded_key_is_what_boto3_is_sent(
    s3: S3Server, s3_bucket: str, s3_settings: Settings
) -> None:
    out = JobOutput(f"s3://{s3_bucket}/my%20videos/caf%C3%A9/default/j1", s3_settings)
    out.put_bytes("manifest.json", b"{}")
    assert _keys(s3, s3_bucket) == ["my videos/café/default/j1/manifest.json"]
    assert out.uri("manifest.json") == f"s3://{s3_bucket}/my videos/café/default/j1/manifest.json"
    # and the URI the store reports reads back to the same key (no second decode can differ)
    assert read_uri(out.uri("manifest.json"), 10, s3_settings) == b"{}"
    store = S3Store(s3_bucket, s3_settings, field="output.uri")
    for key in ("../x", "/x", "a//x", "a/./x", "a%2e%2e", ""):
        with pytest.raises(InvalidJobError, match=r"^output\.uri: "):
            store.put_bytes(key, b"x", "text/plain")
    assert _keys(s3, s3_bucket) == ["my videos/café/default/j1/manifest.json"]
