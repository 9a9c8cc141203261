"""Compile artifacts' index and loads (worker/generate/model/artifacts.py, artifact_index.py):
what an artifact covers, what refuses one (another stamp, a checksum, a size over the bound, a
bad index), that a worse artifact never replaces a better one, and a round trip through a real
S3 server (SeaweedFS) with a real compile (inductor's C++ backend, one small function)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import torch

from producer.errors import InvalidJobError
from producer.settings import Settings
from tests.services.s3_server import S3Server
from tests.worker.generate.tiny import save_tiny_model
from worker.generate.model import artifacts
from worker.generate.model.artifact_index import (
    INDEX,
    Entry,
    Stamp,
    dump_index,
    match,
    merged,
    parse_index,
)
from worker.stores import storage

STAMP = Stamp("a" * 64, "exact", "2.13.0", "3.6.0", "NVIDIA H200")


def _entry(stamp: Stamp = STAMP, sizes: tuple[str, ...] = ("480x832x81",),
           data: bytes = b"x") -> Entry:
    return Entry(stamp, stamp.file_name(), list(sizes), "2026-12-04T00:00:00Z", len(data),
                 hashlib.sha256(data).hexdigest())


def test_a_miss_names_what_differs_first() -> None:
    entries = [_entry()]
    assert match(entries, STAMP) == (entries[0], "")
    newer = Stamp(STAMP.config, "exact", "2.14.0", "3.6.0", "NVIDIA H200")
    assert match(entries, newer)[1] == "torch 2.13.0 in the artifact, 2.14.0 here"
    other_gpu = Stamp(STAMP.config, "exact", "2.13.0", "3.6.0", "NVIDIA A100-SXM4-80GB")
    assert match(entries, other_gpu)[1].startswith("device NVIDIA H200 in the artifact")
    other_model = Stamp("b" * 64, "exact", "2.13.0", "3.6.0", "NVIDIA H200")
    assert match(entries, other_model)[1].startswith("model config aaaa")
    fp8 = Stamp(STAMP.config, "fp8", "2.13.0", "3.6.0", "NVIDIA H200")
    assert match(entries, fp8) == (None, "no artifact for tier fp8")


def test_a_worse_artifact_never_replaces_a_better_one() -> None:
    both = _entry(sizes=("480x832x81", "704x1280x121"))
    index = [both]
    assert merged(index, _entry(sizes=("480x832x81",))) is None  # fewer sizes
    assert merged(index, _entry(sizes=("480x832x81", "704x1280x121"))) is None  # no gain
    more = _entry(sizes=("480x832x81", "704x1280x121", "480x832x49"))
    assert merged(index, more) == [more]
    other = _entry(Stamp(STAMP.config, "fp8", "2.13.0", "3.6.0", "NVIDIA H200"))
    assert merged(index, other) == [both, other]  # another stamp: added beside it


def test_the_index_is_checked_field_by_field() -> None:
    good = json.loads(dump_index([_entry()]))
    assert parse_index(dump_index([_entry()])) == [_entry()]
    for field, value, said in [("file", "../../etc/passwd", "file"),
                               ("sha256", "zz", "sha256"), ("bytes", -1, "bytes"),
                               ("sizes", ["big"], "sizes"), ("torch", 2, "torch")]:
        bad = json.loads(json.dumps(good))
        bad["artifacts"][0][field] = value
        with pytest.raises(ValueError, match=rf"artifacts\[0\]\.{said}"):
            parse_index(json.dumps(bad).encode())
    with pytest.raises(ValueError, match="schema"):
        parse_index(b'{"schema": 9, "artifacts": []}')


def _place_with(folder: Path, data: bytes, entry: Entry) -> artifacts.Place:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / entry.file).write_bytes(data)
    (folder / INDEX).write_bytes(dump_index([entry]))
    return artifacts.Place(str(folder))


def test_a_refused_artifact_is_a_miss_with_its_reason_never_a_load(tmp_path: Path) -> None:
    data = b"not what the index says"
    # a checksum that differs
    entry = _entry(data=b"something else of the same length!!"[:len(data)])
    loaded = artifacts.load([_place_with(tmp_path / "a", data, entry)], STAMP, 2**20)
    assert loaded.entry is None and "sha256" in loaded.reason
    # more bytes than the index says: the read stops at its bound
    entry = _entry(data=data[:5])
    loaded = artifacts.load([_place_with(tmp_path / "b", data, entry)], STAMP, 2**20)
    assert loaded.entry is None and "byte limit" in loaded.reason
    # an index over the size bound
    entry = _entry(data=data)
    loaded = artifacts.load([_place_with(tmp_path / "c", data, entry)], STAMP, 16)
    assert loaded.entry is None and "limit" in loaded.reason
    # a link where the artifact goes is not followed
    place = _place_with(tmp_path / "d", data, entry)
    (tmp_path / "d" / entry.file).unlink()
    (tmp_path / "d" / entry.file).symlink_to(tmp_path / "c" / entry.file)
    loaded = artifacts.load([place], STAMP, 2**20)
    assert loaded.entry is None and entry.file in loaded.reason
    # no place has one
    assert artifacts.load([artifacts.Place(str(tmp_path / "none"))], STAMP, 2**20).reason \
        == "no artifact for tier exact"
    with pytest.raises(InvalidJobError, match="FRAMEFLEET_COMPILE_ARTIFACTS"):
        artifacts.Place("relative/folder")


def test_the_config_digest_is_the_architecture_not_the_weights(tmp_path: Path) -> None:
    one = save_tiny_model(tmp_path / "one", seed=0)
    other_weights = save_tiny_model(tmp_path / "two", seed=1)
    assert artifacts.config_digest(one) == artifacts.config_digest(other_weights)
    config = json.loads((one / "transformer" / "config.json").read_text())
    config["num_layers"] += 1
    (other_weights / "transformer" / "config.json").write_text(json.dumps(config))
    assert artifacts.config_digest(one) != artifacts.config_digest(other_weights)


@pytest.fixture
def s3_settings(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    monkeypatch.setattr(storage, "_clients", {})
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
    yield Settings(s3_endpoint_url=s3.endpoint_url, s3_region=s3.region, s3_max_attempts=1)


def test_an_artifact_round_trips_through_s3(s3_bucket: str, s3_settings: Settings,
                                            tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))  # restored after
    artifacts.start_recording()
    torch.compile(lambda x: (x * 3).cos(), fullgraph=True)(torch.ones(4))
    place = artifacts.Place(f"s3://{s3_bucket}/fleet/compiled", s3_settings)
    stamp = Stamp("c" * 64, "exact", *artifacts.versions(), "cpu")
    written = artifacts.save(place, stamp, ["32x48x9"], 2**26)
    assert written is not None and written.bytes > 0
    # the same sizes again: nothing is written over it
    assert artifacts.save(place, stamp, ["32x48x9"], 2**26) is None
    loaded = artifacts.load([place], stamp, 2**26)
    assert loaded.entry == written and loaded.where == f"s3://{s3_bucket}/fleet/compiled/" \
        f"{written.file}"


def test_the_compile_command_names_a_bad_argument(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tests.services.base import REPO_ROOT

    model = save_tiny_model(tmp_path / "tiny")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "FRAMEFLEET_DEVICE": "cpu"}
    for args, said in [(["--tiers", "turbo", "--sizes", "32x48x9"], "--tiers: turbo"),
                       (["--tiers", "fp8", "--sizes", "32x48x9"], "generate.tier: fp8 needs")]:
        done = subprocess.run([sys.executable, "-m", "producer.cli", "compile", "--model",
                               str(model), *args], env=env, text=True, capture_output=True,
                              timeout=300, check=False)
        assert done.returncode == 1 and f"error: {said}" in done.stderr, done.stderr[-2000:]
    assert not (model / "compiled").exists()


def test_the_index_lists_the_decoder_graphs_and_more_of_them_is_better() -> None:
    graphs = ["first 48x44x80", "steady 48x44x80"]
    entry = _entry(sizes=("704x1280x121",))
    entry.graphs = graphs
    assert parse_index(dump_index([entry])) == [entry]
    # an index written before graphs were recorded reads as covering none
    old = json.loads(dump_index([_entry(sizes=("704x1280x121",))]))
    del old["artifacts"][0]["graphs"]
    (read,) = parse_index(json.dumps(old).encode())
    assert read.graphs == []
    # the same sizes with the decoder's graphs replace it; without them, never
    assert merged([read], entry) == [entry]
    assert merged([entry], read) is None
    bad = json.loads(dump_index([entry]))
    bad["artifacts"][0]["graphs"] = ["steady ../x"]
    with pytest.raises(ValueError, match=r"artifacts\[0\]\.graphs"):
        parse_index(json.dumps(bad).encode())


def test_each_decoder_graph_is_a_hit_or_a_miss_with_its_reason() -> None:
    from worker.generate.model.graphs import judge

    def outcomes() -> dict[str, dict[str, object]]:
        served = {"captured": True, "fxgraph": {"hit": 1, "miss": 0}}
        compiled = {"captured": True, "fxgraph": {"hit": 0, "miss": 1}}
        return {"steady 48x44x80": dict(served), "first 48x44x80": dict(compiled),
                "steady 48x30x52": dict(compiled), "first 48x30x52": {"captured": False}}

    entry = _entry()
    entry.graphs = ["first 48x44x80", "steady 48x44x80"]
    found = artifacts.Loaded(STAMP, entry, "")
    said = outcomes()
    judge(said, [found], "no artifact for tier exact")
    assert {k: (v["result"], v["reason"]) for k, v in said.items()} == {
        "steady 48x44x80": ("hit", ""),
        "first 48x44x80": ("miss", "cache: the artifact covers it, yet the FX graph cache "
                                   "missed"),
        "steady 48x30x52": ("miss", "graph: not in the artifact"),
        "first 48x30x52": ("miss", "error: not captured (the decoder logged why); it runs "
                                   "eager")}
    said = outcomes()
    judge(said, [artifacts.Loaded(STAMP, None, "torch 2.0.0 in the artifact, 2.11.0 here")],
          "torch 2.0.0 in the artifact, 2.11.0 here")
    assert said["first 48x44x80"]["reason"] == "torch 2.0.0 in the artifact, 2.11.0 here"
    from worker.metrics.start import reason_code

    assert [reason_code(v["reason"]) for v in said.values()] == ["", "torch", "torch",
                                                                 "error"]
    assert reason_code("graph: not in the artifact") == "graph"
