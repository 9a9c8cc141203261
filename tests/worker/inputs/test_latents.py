"""Latents loading: safetensors and npy only; every bad file fails naming the file and fault."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from producer.errors import InputNotFoundError, InvalidJobError
from producer.settings import Settings
from producer.wire.spec import InputSpec
from worker.inputs.latents import load_latents

LIMITS = {"max_frames": 200, "max_pixels": 256 * 256, "max_input_bytes": 4 * 1024**2}


def _load(path: Path, **kw: object) -> torch.Tensor:
    # Local inputs are confined to FRAMEFLEET_FILE_ROOTS: the test's folder is the one root.
    settings = Settings(**LIMITS, file_roots=str(path.parent))  # type: ignore[arg-type]
    return load_latents(InputSpec(uri=path.as_uri(), **kw), 16, settings)  # type: ignore[arg-type]


def test_npy_and_safetensors_load(tmp_path: Path) -> None:
    z = np.random.default_rng(0).standard_normal((16, 3, 4, 5)).astype(np.float32)
    np.save(tmp_path / "z.npy", z)
    save_file({"latents": torch.from_numpy(z[None]).to(torch.bfloat16)}, tmp_path / "z.safetensors")
    a = _load(tmp_path / "z.npy")
    b = _load(tmp_path / "z.safetensors")
    assert a.shape == b.shape == (16, 3, 4, 5) and a.dtype == b.dtype == torch.float32
    torch.testing.assert_close(a, b, atol=0.05, rtol=0.02)


def test_safetensors_with_several_tensors_needs_a_name(tmp_path: Path) -> None:
    save_file({"a": torch.zeros(16, 1, 2, 2), "b": torch.ones(16, 1, 2, 2)},
              tmp_path / "two.safetensors")
    with pytest.raises(InvalidJobError, match="input.tensor"):
        _load(tmp_path / "two.safetensors")
    assert float(_load(tmp_path / "two.safetensors", tensor="b").mean()) == 1.0
    with pytest.raises(InvalidJobError, match="'c' not in"):
        _load(tmp_path / "two.safetensors", tensor="c")


def _write_npy(path: Path, array: np.ndarray) -> Path:
    np.save(path, array)
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: _write_npy(p / "nan.npy", np.full((16, 2, 2, 2), np.nan, np.float32)),
         "NaN or Inf"),
        (lambda p: _write_npy(p / "inf.npy", np.full((16, 2, 2, 2), np.inf, np.float32)),
         "NaN or Inf"),
        (lambda p: _write_npy(p / "rank.npy", np.zeros((16, 2, 2), np.float32)), "rank 4"),
        (lambda p: _write_npy(p / "batch.npy", np.zeros((2, 16, 2, 2, 2), np.float32)),
         "batch of 2"),
        (lambda p: _write_npy(p / "ch.npy", np.zeros((4, 2, 2, 2), np.float32)),
         "4 latent channels"),
        (lambda p: _write_npy(p / "zero.npy", np.zeros((16, 0, 2, 2), np.float32)),
         "empty latents"),
        (lambda p: _write_npy(p / "long.npy", np.zeros((16, 60, 2, 2), np.float32)),
         "frames exceed"),
        (lambda p: _write_npy(p / "big.npy", np.zeros((16, 1, 40, 40), np.float32)),
         "320x320 exceed"),
        (lambda p: _write_npy(p / "int.npy", np.zeros((16, 1, 2, 2), np.int32)),
         "float array"),
    ],
)
def test_bad_latents(tmp_path: Path, make, message: str) -> None:  # type: ignore[no-untyped-def]
    path = make(tmp_path)
    with pytest.raises(InvalidJobError, match=message) as info:
        _load(path)
    assert path.name in str(info.value)


def test_pickle_renamed_npy_is_refused(tmp_path: Path) -> None:
    # A pickle could run code when loaded: it must be refused, never unpickled.
    path = tmp_path / "evil.npy"
    path.write_bytes(pickle.dumps({"latents": [1, 2, 3]}))
    with pytest.raises(InvalidJobError, match="evil.npy"):
        _load(path)


def test_object_array_npy_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "obj.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InvalidJobError, match="not a plain .npy"):
        _load(path)


def test_corrupt_safetensors(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(InvalidJobError, match="corrupt safetensors"):
        _load(path)


def test_pt_file_is_refused_by_format(tmp_path: Path) -> None:
    path = tmp_path / "z.pt"
    torch.save(torch.zeros(16, 1, 2, 2), path)
    with pytest.raises(InvalidJobError, match="input.format"):
        _load(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError, match="missing.npy"):
        _load(tmp_path / "missing.npy")


def test_oversized_file(tmp_path: Path) -> None:
    path = _write_npy(tmp_path / "huge.npy", np.zeros((16, 1, 200, 200), np.float32))
    small = Settings(max_input_bytes=1024, file_roots=str(tmp_path))
    with pytest.raises(InvalidJobError, match="over the 1024"):
        load_latents(InputSpec(uri=path.as_uri()), 16, small)


def test_a_file_bigger_than_the_memory_left_is_refused_before_it_is_read(tmp_path: Path) -> None:
    # Given a memory limit 30 MiB above what this process holds, and 256 MiB of latents (a
    # sparse file: nothing is written)
    from producer.errors import FatalJobError
    from worker.memory import MIB, rss_bytes

    big = tmp_path / "big.npy"
    np.lib.format.open_memmap(big, mode="w+", dtype=np.float32, shape=(16, 16, 512, 512)).flush()
    small = tmp_path / "small.npy"
    np.save(small, np.zeros((16, 2, 8, 8), np.float32))
    limit = rss_bytes() // MIB + 30
    settings = Settings(**{**LIMITS, "max_input_bytes": 2 * 1024**3},  # type: ignore[arg-type]
                        file_roots=str(tmp_path), max_rss_mib=limit)
    before = rss_bytes()
    # When the job's latents are read, then it fails naming the input and the limit, having
    # read none of it (a fatal error: another try would meet the same limit)
    with pytest.raises(FatalJobError) as refused:
        load_latents(InputSpec(uri=big.as_uri()), 16, settings)
    message = str(refused.value)
    assert not isinstance(refused.value, InvalidJobError)
    assert f"input.uri: {big.as_uri()}" in message and f"FRAMEFLEET_MAX_RSS_MIB={limit}" in message
    assert "refused before it was read" in message
    assert rss_bytes() - before < 16 * MIB
    # and a file within what is left loads under the same limit
    assert load_latents(InputSpec(uri=small.as_uri()), 16, settings).shape == (16, 2, 8, 8)
