"""The model folder of a generate job: where it is, and what its configs say.

Everything here reads small JSON files only (no weights), so a bad spec fails in milliseconds,
before any model is loaded. :func:`model_folder` is the one place a job's model path is
resolved: path confinement of local files applies here.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from producer.errors import InvalidJobError
from producer.settings import Settings, get_settings
from producer.wire.fits import check_fits
from producer.wire.reach import Reach, reach
from producer.wire.rules import fleet_limits
from producer.wire.spec import GenerateSpec
from worker.generate.model.tiny import RANDOM_MARKER
from worker.generate.request.loader import approve, read_config
from worker.inputs.tree import Entry
from worker.stores.paths import file_roots, local_folder
from worker.stores.storage import locate

#: Pipelines a generate job runs: text to video (and, for Wan2.2 TI2V, image to video), and
#: image to video (Wan2.1 I2V 14B with its CLIP image encoder, Wan2.2 I2V A14B).
PIPELINES = ("WanPipeline", "WanImageToVideoPipeline")


def model_folder(uri: str, settings: Settings | None = None) -> Path:
    """``file://`` URI (or plain absolute path, for settings) → a checked diffusers folder.

    With ``settings`` (a job's folder) the path must lie under ``FRAMEFLEET_FILE_ROOTS``
    (``worker.stores.paths``: one refusal whether or not it exists); without (the operator's
    ``FRAMEFLEET_WARMUP_MODEL``) it is taken as configured. Either way everything it holds is
    checked (``worker.generate.request.loader``: regular files, bounded configs, safetensors
    weights, config limits; with settings, every file and folder symlink under the roots) before any
    model is loaded. Returns the folder with its symlinks resolved.
    """
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        raise InvalidJobError(f"generate.model: only local folders are loaded, got {uri!r}")
    path = Path(locate(uri, "generate.model").path if parsed.scheme else uri)
    if not path.is_absolute():
        raise InvalidJobError(f"generate.model: not an absolute path: {uri!r}")
    roots = None
    if settings is not None:
        path = local_folder(path, settings, field="generate.model", uri=uri)
        roots = file_roots(settings)
    path = Path(os.path.realpath(path))
    if not path.exists():
        raise InvalidJobError(f"generate.model: folder {path} does not exist")
    if not path.is_dir():
        raise InvalidJobError(f"generate.model: {path} is not a folder")
    approve(path, roots, settings, uri)
    return path


def _json(folder: Path, rel: str) -> dict[str, Any]:
    """One config of the folder, read bounded and without blocking (missing: named)."""
    path = folder / rel
    real = Path(os.path.realpath(path))
    try:
        info = os.stat(real)
    except FileNotFoundError:
        raise InvalidJobError(f"generate.model: {rel} missing: {path}") from None
    except OSError as e:
        raise InvalidJobError(f"generate.model: unreadable {path}: {e}") from e
    if not stat.S_ISREG(info.st_mode):
        raise InvalidJobError(f"generate.model: {path} is not a regular file")
    return read_config(Entry(rel, real, info.st_size), get_settings(), folder.as_uri())


def _labelled_random(folder: Path) -> bool:
    """Whether the folder says its weights are random (``RANDOM_MARKER``, a JSON object with
    ``"random_weights": true``; the walk has checked it is a regular file under the roots)."""
    if not os.path.lexists(folder / RANDOM_MARKER):
        return False
    return _json(folder, RANDOM_MARKER).get("random_weights") is True


def _component(index: dict[str, Any], name: str) -> bool:
    entry = index.get(name)
    return isinstance(entry, list) and len(entry) == 2 and entry[0] is not None


@dataclass(frozen=True)
class ModelInfo:
    """What the configs of a Wan pipeline folder say about the jobs it can run."""

    path: Path
    pipeline: str
    spatial_factor: int  # VAE spatial compression (8 for Wan2.1, 16 for Wan2.2's VAE)
    temporal_factor: int
    patch: tuple[int, int]  # transformer patch (h, w)
    experts: int  # 1, or 2 (transformer_2: Wan2.2 A14B)
    boundary_ratio: float | None
    expand_timesteps: bool  # Wan2.2 TI2V
    shift_key: str | None  # the scheduler's flow-shift option, None if it has none
    #: how it conditions on an image: none (T2V), "first_frame" (TI2V: the first latent
    #: frame, expand_timesteps) or "channels" (I2V: mask + image latents beside the noise)
    image_input: str = "none"
    image_encoder: bool = False  # Wan2.1 I2V: CLIP image embeddings (image_dim)
    #: a last frame too: image channels, and CLIP embeddings of two images where it has them
    #: (FLF2V's pos_embed_seq_len); Wan2.1 I2V's encoder takes one image
    last_frame: bool = False
    #: the folder carries the marker of random weights (``framefleet models tiny``): noise
    random_weights: bool = False
    #: the largest size and frame count its rotary positions cover (``producer.wire.reach``)
    reach: Reach | None = None

    @property
    def size_multiple(self) -> tuple[int, int]:
        """Height and width must be multiples of these (VAE factor x transformer patch)."""
        return self.spatial_factor * self.patch[0], self.spatial_factor * self.patch[1]


def read_model(path: Path) -> ModelInfo:
    """Read ``model_index.json`` and the component configs; errors name the missing part."""
    index = _json(path, "model_index.json")
    pipeline = str(index.get("_class_name"))
    if pipeline not in PIPELINES:
        raise InvalidJobError(
            f"generate.model: {path} is a {pipeline}; generate runs {', '.join(PIPELINES)}"
        )
    listed = [n for n in ("transformer", "transformer_2") if _component(index, n)]
    experts = [n for n in listed if (path / n / "config.json").is_file()]
    if not experts or len(experts) < len(listed):
        missing = sorted(set(listed) - set(experts)) or ["transformer"]
        raise InvalidJobError(
            f"generate.model: {path} has no transformer ({', '.join(missing)}/config.json "
            "missing)"
        )
    transformer = _json(path, f"{experts[0]}/config.json")
    vae = _json(path, "vae/config.json")
    scheduler = _json(path, "scheduler/scheduler_config.json")
    patch = transformer.get("patch_size") or (1, 2, 2)
    shift_key = next((k for k in ("flow_shift", "shift") if k in scheduler), None)
    ratio = index.get("boundary_ratio")
    expand = bool(index.get("expand_timesteps", False))
    image_input = "first_frame" if expand else "none"
    if pipeline == "WanImageToVideoPipeline" and not expand:
        image_input = "channels"
        z_dim = int(vae.get("z_dim", 16))
        if int(transformer.get("in_channels", 0)) != 2 * z_dim + 4:
            raise InvalidJobError(
                f"generate.model: {path}: an image-to-video transformer takes {2 * z_dim + 4} "
                f"input channels (noise, mask, image), its config says "
                f"{transformer.get('in_channels')}")
    encoder = transformer.get("image_dim") is not None
    if encoder and not all(_component(index, n) for n in ("image_encoder", "image_processor")):
        raise InvalidJobError(f"generate.model: {path}: its transformer takes CLIP image "
                              "embeddings, but image_encoder or image_processor is missing")
    return ModelInfo(
        path=path,
        pipeline=pipeline,
        spatial_factor=int(vae.get("scale_factor_spatial", 8)),
        temporal_factor=int(vae.get("scale_factor_temporal", 4)),
        patch=(int(patch[1]), int(patch[2])),
        experts=len(experts),
        boundary_ratio=None if ratio is None else float(ratio),
        expand_timesteps=expand,
        shift_key=shift_key,
        image_input=image_input,
        image_encoder=encoder,
        last_frame=image_input == "channels" and (
            not encoder or transformer.get("pos_embed_seq_len") is not None),
        random_weights=_labelled_random(path),
        reach=_reach(transformer, vae, path),
    )


def _reach(transformer: dict[str, Any], vae: dict[str, Any], path: Path) -> Reach:
    try:
        return reach(transformer, vae)
    except ValueError as e:
        raise InvalidJobError(f"generate.model: {path}: {e}") from None


def check_request(gen: GenerateSpec, info: ModelInfo, settings: Settings) -> None:
    """What the spec alone cannot check: the model's multiples and experts, the fleet's limits.
    The sizes, frames and steps are the one check the client and the gateway make at submit
    (``producer.wire.fits``), naming every field at fault."""
    check_fits(gen, info.reach, fleet_limits(settings))
    two_experts = info.experts == 2 and info.boundary_ratio is not None
    for field, given in (("guidance_scale_2", gen.guidance_scale_2),
                         ("boundary_ratio", gen.boundary_ratio)):
        if given is not None and not two_experts:
            raise InvalidJobError(
                f"generate.{field}: only for two-expert models (transformer_2 and a "
                "boundary_ratio); this model has one"
            )
    if gen.flow_shift is not None and info.shift_key is None:
        raise InvalidJobError("generate.flow_shift: this model's scheduler has no flow shift")
    check_inputs(gen, info, settings)


def check_inputs(gen: GenerateSpec, info: ModelInfo, settings: Settings) -> None:
    """The image and the LoRAs against what the model can take."""
    if gen.image is not None and info.image_input == "none":
        raise InvalidJobError(
            f"generate.image: {info.path.name} is a text-to-video model ({info.pipeline} "
            "without image conditioning); use an image-to-video or TI2V model, or drop the image")
    if gen.image is None and info.pipeline == "WanImageToVideoPipeline":
        raise InvalidJobError(f"generate.image: {info.path.name} is an image-to-video model "
                              "(WanImageToVideoPipeline): give the first frame")
    if gen.last_image is not None and not info.last_frame:
        raise InvalidJobError(
            f"generate.last_image: {info.path.name} takes no last frame (Wan2.2 I2V A14B and "
            "Wan2.1 FLF2V do; TI2V and Wan2.1 I2V condition on the first only)")
    if len(gen.loras) > settings.max_loras:
        raise InvalidJobError(f"generate.loras: {len(gen.loras)} adapters, over the limit of "
                              f"{settings.max_loras} (FRAMEFLEET_MAX_LORAS)")
    for i, lora in enumerate(gen.loras):
        if lora.expert != "both" and info.experts < 2:
            raise InvalidJobError(f"generate.loras[{i}].expert: {lora.expert} is for two-expert "
                                  "models; this model has one transformer (use both)")
