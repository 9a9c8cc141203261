"""The device's part of previews, on the tiny random Wan pipelines: x0 read at the scheduler's
step equals references computed without it (diffusers' own UniPC x0, and the last Euler step,
which lands on x0), the latents are untouched, the RGB clip is the published factors applied to
that x0, and a preview that cannot be made never stops the denoise."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from producer.settings import Settings
from tests.worker.generate.tiny import tiny_generate
from worker.generate.conditions.text import encode_prompt
from worker.generate.denoise.latent_rgb import (
    WAN21_BIAS,
    WAN21_RGB,
    WAN22_BIAS,
    WAN22_RGB,
    rgb_factors,
)
from worker.generate.denoise.loop import denoise, job_pipeline
from worker.generate.denoise.preview import Previews, Shot, flow_scheduler, watch_x0
from worker.generate.request.folder import read_model

SETTINGS = Settings(device="cpu", max_denoise_steps=50, file_roots=tempfile.gettempdir())


class Sink:
    """Keeps every shot (their clips taken at once) and every failure."""

    def __init__(self, take: bool = True, refuse: bool = False) -> None:
        self.clips: dict[int, np.ndarray] = {}
        self.failures: list[BaseException] = []
        self.take, self.refuse = take, refuse

    def offer(self, shot: Shot) -> bool:
        if self.refuse:
            return False
        if self.take:
            self.clips[shot.step], _ = shot.take()
        return True

    def failed(self, error: BaseException) -> None:
        self.failures.append(error)


class Recorder:
    """A previews stand-in that keeps x0 of every ``every``-th step."""

    def __init__(self, every: int) -> None:
        self.every, self.x0 = every, {}  # type: ignore[var-annotated]

    def wants(self, step: int) -> bool:
        return step % self.every == 0

    def __call__(self, step: int, steps: int, x0: torch.Tensor) -> None:
        self.x0[step] = x0.clone()


def _embeds(model: Path, gen: Any) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(model)
    pipe.set_progress_bar_config(disable=True)
    positive, negative = encode_prompt(pipe, gen, torch.device("cpu"), on_host=False)
    return pipe, positive, negative


def _run(pipe: Any, gen: Any, positive: torch.Tensor, negative: torch.Tensor | None,
         watch: Any = None, euler: bool = False) -> tuple[torch.Tensor, Any]:
    """One denoise of ``pipe`` with ``watch`` on its scheduler (None: as without previews)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from worker.generate.denoise.loop import generator

    info = read_model(Path(gen.model.removeprefix("file://")))
    run = job_pipeline(pipe, gen, info)
    if euler:
        run.scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    if watch is not None:
        watch(run.scheduler)
    latents = run(prompt=None, prompt_embeds=positive, negative_prompt_embeds=negative,
                  height=gen.height, width=gen.width, num_frames=gen.num_frames,
                  num_inference_steps=gen.num_inference_steps,
                  guidance_scale=gen.guidance_scale, generator=generator(gen),
                  output_type="latent", return_dict=False)[0]
    return latents, run.scheduler


def test_the_factors_are_comfyuis_per_latent_format() -> None:
    wan21, wan22 = rgb_factors(16), rgb_factors(48)
    assert wan21 is not None and wan22 is not None
    # one row per colour over the channels, and a bias per colour
    assert [len(r) for r in wan21[0]] == [16] * 3 and len(wan21[1]) == 3
    assert [len(r) for r in wan22[0]] == [48] * 3 and len(wan22[1]) == 3
    # spot values of comfy/latent_formats.py (Wan21, Wan22): channel 0, channel 39, the bias
    assert WAN21_RGB[0] == (-0.1299, -0.1692, 0.2932) and WAN21_BIAS == (-0.1835, -0.0868, -0.3360)
    assert WAN22_RGB[39] == (-0.3441, -0.3543, -0.2008) and WAN22_BIAS == (0.0317, -0.0878, -0.1388)
    assert wan21[0][0][6] == -0.3477 and wan22[0][2][21] == 0.2863
    # a format with no published factors has none (its jobs make no previews)
    assert rgb_factors(12) is None
    previews = Previews(1, Sink())
    assert previews.start(12, (3, 4, 6), torch.device("cpu")) is False
    assert not previews.wants(1)


def test_x0_at_the_step_is_unipcs_own_estimate_and_the_latents_are_untouched(
        tiny_model: Path) -> None:
    gen = tiny_generate(tiny_model, num_inference_steps=6)
    pipe, positive, negative = _embeds(tiny_model, gen)
    plain, _ = _run(pipe, gen, positive, negative)
    # Given the scheduler's own x0 (UniPC computes x0_pred = x_t - sigma_t * v in its step and
    # keeps it as model_outputs[-1]), read after every step by an independent wrapper
    theirs: dict[int, torch.Tensor] = {}
    ours = Recorder(every=1)

    def both(scheduler: Any) -> None:
        watch_x0(scheduler, ours, gen.num_inference_steps)  # type: ignore[arg-type]
        step = scheduler.step

        def after(*args: Any, **kwargs: Any) -> Any:
            out = step(*args, **kwargs)
            theirs[scheduler.step_index] = scheduler.model_outputs[-1].clone()
            return out
        scheduler.step = after

    watched, scheduler = _run(pipe, gen, positive, negative, watch=both)
    assert type(scheduler).__name__ == "UniPCMultistepScheduler" and flow_scheduler(scheduler)
    # Then every step's x0 is theirs, and the latents are bit for bit a run's without previews
    assert sorted(ours.x0) == sorted(theirs) == list(range(1, 7))
    for step, x0 in ours.x0.items():
        torch.testing.assert_close(x0, theirs[step], rtol=0, atol=1e-6)
    assert torch.equal(watched, plain)
    # and x0 is not the noisy latents: early estimates differ from the final ones, late ones
    # approach them
    first, last = (float((ours.x0[s] - plain).norm() / plain.norm()) for s in (1, 6))
    assert last < first


def test_x0_of_the_last_euler_step_is_the_result(tiny_model: Path) -> None:
    # The last step of FlowMatchEuler goes to sigma 0: x_T = x_t + (0 - sigma_t)·v = x0, so
    # the estimate read at that step is exactly what the loop returns.
    gen = tiny_generate(tiny_model, num_inference_steps=4)
    pipe, positive, negative = _embeds(tiny_model, gen)
    plain, _ = _run(pipe, gen, positive, negative, euler=True)
    ours = Recorder(every=2)
    watched, scheduler = _run(
        pipe, gen, positive, negative, euler=True,
        watch=lambda s: watch_x0(s, ours, 4))  # type: ignore[arg-type]
    assert flow_scheduler(scheduler) and sorted(ours.x0) == [2, 4]
    assert torch.equal(watched, plain)
    torch.testing.assert_close(ours.x0[4], plain, rtol=0, atol=1e-5)


def test_the_clip_is_the_factors_on_x0_one_pixel_per_latent_cell(tiny_model: Path) -> None:
    gen = tiny_generate(tiny_model, num_inference_steps=4)
    pipe, positive, negative = _embeds(tiny_model, gen)
    info = read_model(tiny_model)
    ref = Recorder(every=1)
    _run(pipe, gen, positive, negative, watch=lambda s: watch_x0(s, ref, 4))  # type: ignore[arg-type]
    # When the job's denoise makes previews every 2 steps
    sink = Sink()
    latents, stopped = denoise(pipe, gen, info, positive, negative, lambda d, t: None,
                               lambda: False, previews=Previews(2, sink))
    # Then the first comes after step 1 (something to see at once), then every 2nd step
    assert not stopped and sorted(sink.clips) == [1, 2, 4] and not sink.failures
    # Then each clip is ComfyUI's projection of that step's x0, computed here with numpy
    weight = np.array(WAN21_RGB, dtype=np.float64)  # (C, 3)
    for step, clip in sink.clips.items():
        x0 = ref.x0[step][0].double().numpy()  # (C, T, h, w)
        rgb = np.einsum("cthw,co->thwo", x0, weight) + np.array(WAN21_BIAS)
        want = np.clip(np.round((rgb + 1) * 127.5), 0, 255).astype(np.uint8)
        assert clip.shape == (3, gen.height // 8, gen.width // 8, 3) == want.shape
        assert np.abs(clip.astype(int) - want.astype(int)).max() <= 1
    torch.testing.assert_close(latents, ref.x0[4], rtol=0, atol=1e-1)  # the same run


def test_a_preview_that_cannot_be_made_never_stops_the_denoise(tiny_model: Path) -> None:
    gen = tiny_generate(tiny_model, num_inference_steps=4)
    pipe, positive, negative = _embeds(tiny_model, gen)
    info = read_model(tiny_model)
    plain, _ = denoise(pipe, gen, info, positive, negative, lambda d, t: None, lambda: False)

    class Broken(Sink):
        def offer(self, shot: Shot) -> bool:
            raise OSError("the writer is gone")

    # a sink that raises: each failure is reported, the loop goes on, the latents are the same
    broken = Broken()
    latents, _ = denoise(pipe, gen, info, positive, negative, lambda d, t: None, lambda: False,
                         previews=Previews(1, broken))
    assert [str(e) for e in broken.failures] == ["the writer is gone"] * 4
    assert torch.equal(latents, plain)
    # a sink that takes nothing (its queue full): the previews are skipped, nothing fails
    refusing = Sink(refuse=True)
    previews = Previews(1, refusing)
    latents, _ = denoise(pipe, gen, info, positive, negative, lambda d, t: None, lambda: False,
                         previews=previews)
    assert previews.skipped == 4 and not refusing.failures and torch.equal(latents, plain)
    # buffers the writer still holds: no more previews until it gives them back
    held = Sink(take=False)
    previews = Previews(1, held)
    denoise(pipe, gen, info, positive, negative, lambda d, t: None, lambda: False,
            previews=previews)
    assert previews.skipped == 4 - 3 and not held.failures  # three buffers, four steps


@pytest.mark.parametrize("every", [0, -2])
def test_every_is_at_least_one(every: int) -> None:
    with pytest.raises(ValueError, match="every must be >= 1"):
        Previews(every, Sink())


def test_a_scheduler_that_is_not_flow_matching_makes_none() -> None:
    from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    assert flow_scheduler(UniPCMultistepScheduler(prediction_type="flow_prediction",
                                                  use_flow_sigmas=True))
    assert flow_scheduler(FlowMatchEulerDiscreteScheduler())
    assert not flow_scheduler(UniPCMultistepScheduler(prediction_type="epsilon"))
    assert not flow_scheduler(DDIMScheduler())
