"""The published Wan model folders (the ``-Diffusers`` repositories), copied at tiny sizes.

What a user downloads differs from what ``save_pretrained`` of a tiny pipeline writes, and the
loader must take it as it is:

- the weights of big components are sharded, ``{stem}-0000i-of-0000n.safetensors`` with a
  ``{stem}.safetensors.index.json`` (``metadata.total_size`` and a ``weight_map`` of every
  tensor to its shard), in the shard counts the real folders have;
- the transformers are stored in float32 (a bfloat16 job casts every one of them); the Wan2.1
  UMT5 text encoders are float32 too, the Wan2.2 ones bfloat16;
- ``model_index.json`` names the published classes (``T5TokenizerFast``, ``UMT5EncoderModel``,
  ``CLIPVisionModel``...), and absent components as ``[null, null]``;
- the tokenizer folder holds what google/umt5-xxl ships: ``spiece.model`` (a SentencePiece
  model), ``tokenizer.json`` (its Unigram form, what the fast tokenizer reads),
  ``tokenizer_config.json`` and ``special_tokens_map.json``; both are built here, tiny.

Each layout is a preset of ``worker.generate.model.presets`` (the architecture in miniature) with
the published file structure around it. Nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from worker.generate.model.presets import build_pipeline

F32, BF16 = torch.float32, torch.bfloat16
#: Weight file stems per library.
STEMS = {"diffusers": "diffusion_pytorch_model", "transformers": "model"}
#: Published class names per component (what the Wan-AI ``-Diffusers`` folders name).
CLASSES = {"scheduler": ["diffusers", "UniPCMultistepScheduler"],
           "text_encoder": ["transformers", "UMT5EncoderModel"],
           "tokenizer": ["transformers", "T5TokenizerFast"],
           "transformer": ["diffusers", "WanTransformer3DModel"],
           "transformer_2": ["diffusers", "WanTransformer3DModel"],
           "vae": ["diffusers", "AutoencoderKLWan"],
           "image_encoder": ["transformers", "CLIPVisionModel"],
           "image_processor": ["transformers", "CLIPImageProcessor"]}


@dataclass(frozen=True)
class Layout:
    """One published folder: its preset in miniature, shard counts and stored dtypes."""

    preset: str
    pipeline: str
    shards: dict[str, int]  # component → shard count (1: one unsharded file)
    dtypes: dict[str, torch.dtype]  # component → stored dtype
    extra: dict[str, Any] = field(default_factory=dict)  # model_index.json's other keys

    @property
    def components(self) -> list[str]:
        return list(self.shards)


_WAN21 = {"text_encoder": 5, "vae": 1}
_WAN21_DT = {"transformer": F32, "text_encoder": F32, "vae": F32}
_WAN22 = {"text_encoder": 3, "vae": 1}
_WAN22_DT = {"transformer": F32, "transformer_2": F32, "text_encoder": BF16, "vae": F32}
PUBLISHED: dict[str, Layout] = {
    "Wan2.1-T2V-1.3B": Layout("tiny", "WanPipeline", {"transformer": 2, **_WAN21}, _WAN21_DT),
    "Wan2.1-T2V-14B": Layout("tiny", "WanPipeline", {"transformer": 12, **_WAN21}, _WAN21_DT),
    "Wan2.1-I2V-14B-480P": Layout(
        "tiny-i2v", "WanImageToVideoPipeline",
        {"transformer": 14, **_WAN21, "image_encoder": 1}, {**_WAN21_DT, "image_encoder": F32}),
    "Wan2.1-I2V-14B-720P": Layout(
        "tiny-i2v", "WanImageToVideoPipeline",
        {"transformer": 14, **_WAN21, "image_encoder": 1}, {**_WAN21_DT, "image_encoder": F32}),
    "Wan2.2-TI2V-5B": Layout(
        "tiny-ti2v", "WanPipeline", {"transformer": 5, **_WAN22}, _WAN22_DT,
        {"boundary_ratio": None, "expand_timesteps": True, "transformer_2": [None, None]}),
    "Wan2.2-T2V-A14B": Layout(
        "tiny-a14b", "WanPipeline", {"transformer": 12, "transformer_2": 12, **_WAN22},
        _WAN22_DT, {"boundary_ratio": 0.875, "expand_timesteps": False}),
    "Wan2.2-I2V-A14B": Layout(
        "tiny-i2v-a14b", "WanImageToVideoPipeline",
        {"transformer": 12, "transformer_2": 12, **_WAN22}, _WAN22_DT,
        {"boundary_ratio": 0.9, "expand_timesteps": False, "image_encoder": [None, None],
         "image_processor": [None, None]}),
}


def shard_names(stem: str, count: int) -> list[str]:
    return [f"{stem}-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def write_shards(tensors: dict[str, torch.Tensor], folder: Path, stem: str, count: int) -> None:
    """``tensors`` as ``count`` shards of about equal bytes (tensor order kept) and their
    index, as ``save_pretrained(max_shard_size=...)`` writes them."""
    from safetensors.torch import save_file

    total = sum(t.numel() * t.element_size() for t in tensors.values())
    names = shard_names(stem, count)
    groups: list[dict[str, torch.Tensor]] = [{} for _ in names]
    done = 0
    for key, tensor in tensors.items():
        # the shard this tensor's first byte falls in, at most one shard per tensor left
        i = min(done * count // max(total, 1), count - 1)
        groups[i][key] = tensor
        done += tensor.numel() * tensor.element_size()
    for group in groups:  # a shard left empty takes the last tensor of another
        if not group:
            donor = next(g for g in groups if len(g) > 1)
            key = list(donor)[-1]
            group[key] = donor.pop(key)
    weight_map = {}
    for name, group in zip(names, groups, strict=True):
        save_file({k: v.contiguous() for k, v in group.items()}, str(folder / name),
                  metadata={"format": "pt"})
        weight_map.update({k: name for k in group})
    (folder / f"{stem}.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
        indent=2))


def _restore(component: Path, library: str, count: int, dtype: torch.dtype) -> None:
    """Replace the single weights file ``save_pretrained`` wrote by the published form."""
    from safetensors.torch import load_file, save_file

    stem = STEMS[library]
    single = component / f"{stem}.safetensors"
    tensors = {k: v.to(dtype) if v.is_floating_point() else v
               for k, v in load_file(str(single)).items()}
    single.unlink()
    if count == 1:
        save_file(tensors, str(single), metadata={"format": "pt"})
    else:
        write_shards(tensors, component, stem, count)


def write_published(folder: Path, name: str, seed: int = 0) -> Path:
    """Write the tiny copy of the published folder ``name`` (a key of :data:`PUBLISHED`)."""
    from worker import quiet

    quiet.progress_bars_off()
    layout = PUBLISHED[name]
    pipe = build_pipeline(layout.preset, seed=seed)
    pipe.save_pretrained(folder)
    index = json.loads((folder / "model_index.json").read_text())
    for component, count in layout.shards.items():
        library = CLASSES[component][0]
        _restore(folder / component, library, count, layout.dtypes[component])
    shutil.rmtree(folder / "tokenizer")
    write_tokenizer(folder / "tokenizer", pipe.text_encoder.config.vocab_size)
    published = {k: CLASSES[k] for k in index if k in CLASSES and index[k][0] is not None}
    index = {"_class_name": layout.pipeline, "_diffusers_version": "0.35.0.dev0",
             **published, **layout.extra}
    (folder / "model_index.json").write_text(json.dumps(index, indent=2))
    return folder


#: The tiny vocabulary: SentencePiece's three specials, then word-start pieces and characters.
SPECIALS = ("<pad>", "</s>", "<unk>")


def _pieces(vocab_size: int) -> list[tuple[str, float]]:
    chars = "abcdefghijklmnopqrstuvwxyz0123456789.,!?'-"
    words = ["\u2581" + w for w in ("a", "the", "in", "of", "red", "fox", "snow", "cat")]
    pieces = [(s, 0.0) for s in SPECIALS] + [("\u2581", -2.0)]
    pieces += [(w, -3.0 - i / 10) for i, w in enumerate(words)]
    pieces += [(c, -6.0 - i / 100) for i, c in enumerate(chars)]
    return pieces[:vocab_size]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:  # a length-delimited protobuf field
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value & 0xFFFFFFFFFFFFFFFF)


def spiece_model(pieces: list[tuple[str, float]]) -> bytes:
    """A SentencePiece ``ModelProto`` (unigram) of ``pieces``, in protobuf wire format: what
    ``spiece.model`` is (pad 0, eos 1, unk 2, as T5's)."""
    types = {"<pad>": 3, "</s>": 3, "<unk>": 2}  # CONTROL, UNKNOWN; NORMAL (1) otherwise
    body = b"".join(_field(1, _field(1, p.encode()) + b"\x15" + struct.pack("<f", s)
                           + _int_field(3, types.get(p, 1))) for p, s in pieces)
    trainer = (_int_field(3, 1) + _int_field(4, len(pieces)) + _int_field(40, 2)
               + _int_field(41, -1) + _int_field(42, 1) + _int_field(43, 0))
    normalizer = _field(1, b"identity") + _int_field(3, 1) + _int_field(4, 1) + _int_field(5, 1)
    return body + _field(2, trainer) + _field(3, normalizer)


def write_tokenizer(folder: Path, vocab_size: int) -> Path:
    """UMT5's tokenizer files at ``vocab_size`` pieces at most (no extra ids)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    folder.mkdir(parents=True)
    pieces = _pieces(vocab_size)
    tok = Tokenizer(models.Unigram(pieces, unk_id=2, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.Replace(" {2,}", " "),
                                           normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "spiece.model").write_bytes(spiece_model(pieces))
    specials = {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {**specials, "tokenizer_class": "T5Tokenizer", "extra_ids": 0,
         "additional_special_tokens": [], "model_max_length": 512,
         "clean_up_tokenization_spaces": True, "legacy": True}, indent=2))
    return folder
