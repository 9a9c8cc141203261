"""A GPU's attention choice kept beside the compile artifacts: written with an artifact, taken
by a worker of the same GPU and torch (in place: the processors already point at it), ignored
when it is another's, malformed, or names a kernel this worker cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from worker.generate.model.artifact_index import Stamp
from worker.generate.model.artifacts import Place
from worker.generate.tier import attnchoice
from worker.generate.tier.attnproc import Mode

GPU = "NVIDIA Test GPU 80GB"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attnchoice, "_CHOICES", {})


def _stamp(torch_version: str = str(torch.__version__)) -> Stamp:
    return Stamp("c" * 64, "exact", torch_version, "3.6.0", GPU)


def _measured(exact: str = "flash", attn8: str | None = None) -> attnchoice.Choice:
    key = (GPU, str(torch.__version__))
    choice = attnchoice.Choice(exact=exact, attn8=attn8, device=GPU, torch=key[1],
                               measured_ms={"default": 2.0, exact: 1.5})
    attnchoice._CHOICES[key] = choice
    return choice


def test_kept_and_taken_in_place(tmp_path: Path) -> None:
    place = Place(str(tmp_path))
    _measured("flash")
    attnchoice.keep(place, _stamp())
    assert attnchoice.file_name(GPU) == "attention-NVIDIA-Test-GPU-80GB.json"
    doc = json.loads((tmp_path / attnchoice.file_name(GPU)).read_text())
    assert (doc["device"], doc["exact"], doc["attn8"]) == (GPU, "flash", None)
    # another worker of this GPU: its processors point at its own, measured, choice
    attnchoice._CHOICES.clear()
    mine = _measured("stock")
    attnchoice.take(place, _stamp(), 1 << 20)
    assert attnchoice._CHOICES[(GPU, str(torch.__version__))] is mine
    assert isinstance(mine, Mode) and mine.exact == "flash"  # what the artifact traced


def test_another_torch_or_a_bad_file_is_ignored(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    place = Place(str(tmp_path))
    _measured("flash")
    attnchoice.keep(place, _stamp())
    attnchoice._CHOICES.clear()
    mine = _measured("stock")
    attnchoice.take(place, _stamp("9.9.9"), 1 << 20)  # no file for it: nothing read
    assert mine.exact == "stock"
    path = tmp_path / attnchoice.file_name(GPU)
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "torch": "9.9.9"}))  # another torch's choice
    attnchoice.take(place, _stamp(), 1 << 20)
    assert mine.exact == "stock"
    path.write_text(json.dumps({**doc, "exact": "turbo"}))
    attnchoice.take(place, _stamp(), 1 << 20)
    assert mine.exact == "stock" and "exact kernel 'turbo'" in caplog.text
    path.write_text("{not json")
    attnchoice.take(place, _stamp(), 1 << 20)
    assert mine.exact == "stock"


def test_an_8_bit_kernel_this_worker_cannot_run_is_not_taken(tmp_path: Path) -> None:
    place = Place(str(tmp_path))
    _measured("stock", attn8="cudnn")
    attnchoice.keep(place, _stamp())
    attnchoice._CHOICES.clear()
    mine = _measured("stock")
    attnchoice.take(place, _stamp(), 1 << 20)  # this CPU has no cuDNN float8 attention
    assert mine.attn8 is None


def test_nothing_is_kept_before_a_measurement(tmp_path: Path) -> None:
    place = Place(str(tmp_path))
    attnchoice.current(torch.device("cpu"))
    attnchoice.keep(place, Stamp("c" * 64, "exact", str(torch.__version__), "none", "cpu"))
    assert not list(tmp_path.iterdir())


def test_measured_on_the_cpu_keeps_diffusers_attention() -> None:
    """The CPU has none of the GPU kernels: each is tried and left out, the 8-bit attention is
    none with its reason, and the exact tier keeps diffusers' attention."""
    choice = attnchoice.measure(torch.device("cpu"), heads=2, head_dim=16, tokens=256)
    assert choice is attnchoice.current(torch.device("cpu"))
    assert (choice.exact, choice.attn8) == ("stock", None)
    assert set(choice.measured_ms) == {"default"} and choice.measured_ms["default"] > 0
    assert "8-bit attention: none (no CUDA device)" in choice.why
