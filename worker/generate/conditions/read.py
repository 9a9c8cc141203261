"""What a generate job conditions on besides its prompt: images and LoRA adapters.

Read and checked before the denoise starts (every refusal names its field), and turned into
what diffusers' pipeline call takes (``image``, ``last_image``) and what the manifest records
(the files' sha256, the image's sizes, the LoRAs' scales and experts).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from producer.settings import Settings
from producer.wire.spec import GenerateSpec, ImageFacts, LoraFacts
from worker.generate.conditions import adapters
from worker.generate.model.cache import Resident
from worker.generate.request.folder import ModelInfo
from worker.inputs.image import JobImage, load_image


@dataclass
class Conditions:
    """One job's images (pipeline keyword arguments) and adapters, and their facts."""

    call: dict[str, Any] = field(default_factory=dict)  # image=, last_image= (PIL, sized)
    image: ImageFacts | None = None
    last_image: ImageFacts | None = None
    loras: tuple[LoraFacts, ...] = ()
    used: list[Any] = field(default_factory=list)  # adapters.prepare's answer
    adapter_load_s: float = 0.0

    @property
    def i2v(self) -> bool:
        return "image" in self.call


def _facts(img: JobImage, resize: str) -> ImageFacts:
    return ImageFacts(sha256=img.sha256, format=img.format, source_size=img.source_size,
                      size=img.size, resize=resize)


def read_conditions(gen: GenerateSpec, info: ModelInfo, entry: Resident,
                    settings: Settings) -> Conditions:
    """The job's images, read and sized, and its LoRAs loaded on ``entry``'s model."""
    cond = Conditions()
    for name in ("image", "last_image"):
        uri = getattr(gen, name)
        if uri is not None:
            img = load_image(uri, f"generate.{name}", gen.width, gen.height, gen.image_resize,
                             settings)
            cond.call[name] = img.image
            setattr(cond, name, _facts(img, gen.image_resize))
    if gen.loras or (entry.adapters is not None and entry.adapters.any()):
        if entry.adapters is None:
            entry.adapters = adapters.Adapters()
        cond.used, cond.adapter_load_s = adapters.prepare(entry.pipe, entry.adapters, gen,
                                                          settings, info.experts)
        cond.loras = tuple(
            LoraFacts(uri=lora.uri, sha256=sha, scale=lora.scale, name=lora.name,
                      expert=lora.expert)
            for _, lora, sha, _ in cond.used)
    return cond


@contextmanager
def adapters_on(entry: Resident, cond: Conditions) -> Iterator[None]:
    """The job's adapters active (none: every loaded one disabled) for the block's duration."""
    if entry.adapters is None or not entry.adapters.any():
        yield
        return
    with adapters.active(entry.pipe, entry.adapters, cond.used):
        yield
