"""The runner without Celery: outputs, manifest last, reuse, conflicts, OOM fallback, weights."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from producer.errors import DeviceOutOfMemory, InvalidJobError, JobConflictError
from producer.settings import get_settings
from producer.wire.spec import DecoderSpec, InputSpec, JobSpec, OutputSpec, VideoSpec, segment_name
from worker.decoders.pattern import PatternDecoder
from worker.decoders.wan import build_vae
from worker.run import DecoderCache, Run, run_job


@pytest.fixture(autouse=True)
def _file_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The runner's local paths are confined to FRAMEFLEET_FILE_ROOTS: allow the test's folder.
    monkeypatch.setenv("FRAMEFLEET_FILE_ROOTS", str(tmp_path))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def _spec(tmp: Path, job_id: str = "r1", **video: int) -> JobSpec:
    np.save(tmp / "z.npy", np.zeros((16, 4, 4, 6), np.float32))
    return JobSpec(job_id=job_id, input=InputSpec(uri=(tmp / "z.npy").as_uri()),
                   decoder=DecoderSpec(name="pattern"), video=VideoSpec(**video),
                   output=OutputSpec(uri=(tmp / "out").as_uri()))


def test_outputs_and_manifest(tmp_path: Path) -> None:
    spec = _spec(tmp_path, segment_frames=5)
    result = run_job(spec, DecoderCache(torch.device("cpu")))
    folder = tmp_path / "out" / "default" / "r1"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["index.m3u8", "manifest.json"] + [segment_name(i) for i in range(3)]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["frames"] == 13 == result.manifest.frames
    assert [s["first_frame"] for s in manifest["segments"]] == [0, 5, 10]
    assert result.manifest_uri == (folder / "manifest.json").as_uri()
    # The manifest is the last file written: no segment is newer
    newest_segment = max((folder / n).stat().st_mtime_ns for n in names if n != "manifest.json")
    assert (folder / "manifest.json").stat().st_mtime_ns >= newest_segment


def test_rerun_reuses_complete_output_and_refuses_other_spec(tmp_path: Path) -> None:
    cache = DecoderCache(torch.device("cpu"))
    first = run_job(_spec(tmp_path), cache)
    again = run_job(_spec(tmp_path), cache)
    assert again.reused and again.manifest.segments == first.manifest.segments
    with pytest.raises(JobConflictError, match="different spec"):
        run_job(_spec(tmp_path, crf=30), cache)


class _OomUnlessTiled(PatternDecoder):
    def __init__(self, tiled: bool = False) -> None:
        super().__init__()
        self.tiled = tiled

    def with_tiling(self) -> _OomUnlessTiled:
        return _OomUnlessTiled(tiled=True)

    def stream(self, latents: torch.Tensor) -> Iterator[torch.Tensor]:
        if not self.tiled:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        yield from super().stream(latents)


class _Cache(DecoderCache):
    def get(self, spec: DecoderSpec) -> PatternDecoder:  # type: ignore[override]
        return _OomUnlessTiled()


def test_oom_is_retryable_and_tiled_attempt_succeeds(tmp_path: Path) -> None:
    cache = _Cache(torch.device("cpu"))
    with pytest.raises(DeviceOutOfMemory, match="tiled=False"):
        run_job(_spec(tmp_path), cache)
    spec = _spec(tmp_path)
    result = run_job(spec, cache, Run(spec, tiled=True))
    assert result.manifest.frames == 13


# --- weights: random only when asked, a missing folder named plainly ------------------------


def _wan_spec(tmp: Path, job_id: str, **decoder: str) -> JobSpec:
    np.save(tmp / "w.npy", np.zeros((16, 2, 4, 4), np.float32))
    return JobSpec.model_validate({
        "job_id": job_id, "input": {"uri": (tmp / "w.npy").as_uri()},
        "decoder": {"name": "wan2.1-vae", "preset": "tiny", **decoder},
        "output": {"uri": (tmp / "out").as_uri()},
    })


def test_a_wan_job_without_weights_fails_at_once_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(InvalidJobError, match=r"^decoder\.weights: .* needs weights") as info:
        run_job(_wan_spec(tmp_path, "no-weights"), DecoderCache(torch.device("cpu")))
    assert "diffusers" in str(info.value) and '"random"' in str(info.value)  # the hint
    assert not (tmp_path / "out").exists()  # nothing was decoded or written


def test_random_weights_are_marked_in_the_manifest_and_the_result(tmp_path: Path) -> None:
    result = run_job(_wan_spec(tmp_path, "noise", weights="random"),
                     DecoderCache(torch.device("cpu")))
    assert result.random_weights and result.manifest.random_weights
    on_disk = json.loads((tmp_path / "out" / "default" / "noise" / "manifest.json").read_text())
    assert on_disk["random_weights"] is True
    # and a reused output keeps the mark
    again = run_job(_wan_spec(tmp_path, "noise", weights="random"),
                    DecoderCache(torch.device("cpu")))
    assert again.reused and again.random_weights


def test_a_weights_folder_is_loaded_and_is_not_marked_random(tmp_path: Path) -> None:
    # Given a diffusers-layout folder (save_pretrained of a tiny AutoencoderKLWan)
    build_vae("tiny", seed=7).save_pretrained(tmp_path / "vae")
    assert {p.name for p in (tmp_path / "vae").iterdir()} >= {
        "config.json", "diffusion_pytorch_model.safetensors"}
    spec = _wan_spec(tmp_path, "real", weights=(tmp_path / "vae").as_uri())
    result = run_job(spec, DecoderCache(torch.device("cpu")))
    assert result.manifest.frames == 5 and not result.random_weights
    assert not result.manifest.random_weights


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda d: None, "no such folder"),
        (lambda d: (d.parent.mkdir(exist_ok=True), d.write_text("x")), "not a folder"),
        (lambda d: d.mkdir(parents=True), "has no config.json"),
        (lambda d: (d.mkdir(parents=True), (d / "config.json").write_text("{}"),
                    (d / "diffusion_pytorch_model.bin").write_bytes(b"pickle")),
         "has no diffusion_pytorch_model.safetensors"),
        (lambda d: (d.mkdir(parents=True), (d / "config.json").write_text("{not json"),
                    (d / "diffusion_pytorch_model.safetensors").write_bytes(b"x")),
         "config.json is not readable"),
        # what the folder holds is checked too: no device, nothing outside the roots
        (lambda d: (d.mkdir(parents=True), (d / "config.json").symlink_to("/dev/zero"),
                    (d / "diffusion_pytorch_model.safetensors").write_bytes(b"x")),
         "config.json is outside the folders"),
        (lambda d: (d.mkdir(parents=True), os.mkfifo(d / "config.json"),
                    (d / "diffusion_pytorch_model.safetensors").write_bytes(b"x")),
         "config.json is not a regular file"),
        (lambda d: (d.mkdir(parents=True), (d / "config.json").symlink_to("/etc/hostname"),
                    (d / "diffusion_pytorch_model.safetensors").write_bytes(b"x")),
         "config.json is outside the folders"),
    ],
    ids=["missing", "a-file", "no-config", "pickle-only", "bad-config", "dev-zero-config",
         "fifo-config", "config-outside-roots"],
)
def test_a_bad_weights_folder_is_named_plainly_without_hub_talk(
    tmp_path: Path, make: Callable[[Path], object], words: str
) -> None:
    folder = tmp_path / "models" / "wan2.1-vae"
    make(folder)
    spec = _wan_spec(tmp_path, "bad-folder", weights=folder.as_uri())
    with pytest.raises(InvalidJobError) as info:
        run_job(spec, DecoderCache(torch.device("cpu")))
    message = str(info.value)
    assert message.startswith("decoder.weights: ") and words in message and str(folder) in message
    assert not any(w in message.lower() for w in ("hub", "huggingface", "repo id", "repo_id"))


def test_weights_the_decoder_cannot_use_are_refused(tmp_path: Path) -> None:
    cache = DecoderCache(torch.device("cpu"))
    with pytest.raises(InvalidJobError, match="only file:// folders"):
        run_job(_wan_spec(tmp_path, "s3w", weights="s3://models/vae"), cache)
    pattern = JobSpec.model_validate({
        **_spec(tmp_path).model_dump(mode="json"), "decoder": {"name": "pattern",
                                                               "weights": "random"}})
    with pytest.raises(InvalidJobError, match="the pattern decoder takes no weights"):
        run_job(pattern, cache)
