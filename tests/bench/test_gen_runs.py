"""The benchmark's own device work (diffusers' run, the forward check) holds the device as a
job of the process's owner, after the builds that earlier jobs queued have run: a build's
CUDA-graph capture beside it broke both on an H200 (the capture was invalidated, and diffusers'
conv3d failed with "operation not permitted when stream is capturing")."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from bench.generate.gen_runs import baseline, forward_error
from bench.generate.gen_specs import gen_spec
from worker.generate.model.presets import build_pipeline, save_configs
from worker.generate.request.folder import read_model
from worker.owner import DEVICE

SIZE = (64, 64, 9)


def test_diffusers_and_the_forward_check_never_run_beside_a_build(tmp_path: Path) -> None:
    cpu = torch.device("cpu")
    pipe = build_pipeline("tiny", cpu, torch.float32, seed=0)
    folder = save_configs(pipe, tmp_path / "tiny")
    info = read_model(folder)
    forwards = threading.Event()
    held: list[bool] = []

    def seen(*_: object) -> None:
        held.append(DEVICE.holds())
        forwards.set()

    hook = pipe.transformer.register_forward_pre_hook(seen)
    overlapped: list[bool] = []
    # A build queued while a job holds the device (as a job's new decode size queues one): it
    # starts once the job ends, and records whether a forward ran while it did.
    with DEVICE.job("queues a build"):
        assert DEVICE.submit("probe-build", lambda: overlapped.append(forwards.wait(1.0)))
    try:
        base = baseline(pipe, gen_spec(folder, SIZE, 2, "exact"), info, cpu,
                        tmp_path / "base.mp4")
        err = forward_error(pipe.transformer, pipe.transformer, SIZE, info, cpu)
    finally:
        hook.remove()
    assert overlapped == [False], "a forward ran while the build did"
    assert held and all(held), held  # every forward of both held the device
    assert not DEVICE.holds()
    assert base["latents"].shape[0] == pipe.transformer.config.out_channels
    assert err == 0.0  # the same eager module against itself
