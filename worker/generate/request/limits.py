"""Size limits on a model folder's configs, checked before any model is built.

diffusers builds a model from its config before it reads a weight: a config that asks for
100000 layers or a rope table of 10 million positions costs gigabytes and minutes before
anything fails. Every number that sizes a module is checked here against the
``FRAMEFLEET_MAX_MODEL_*`` / ``FRAMEFLEET_MAX_TEXT_*`` settings, whose defaults admit every
published Wan model (Wan2.1 1.3B/14B T2V and I2V with their CLIP encoder, Wan2.2 TI2V-5B and
A14B, the umT5-XXL text encoder) and nothing a thousand times larger.
"""

from __future__ import annotations

import math
from typing import Any

from producer.errors import InvalidJobError
from producer.settings import Settings

#: Per kind of component: config key → the setting that bounds it.
TABLES: dict[str, dict[str, str]] = {
    "transformer": {
        "num_layers": "max_model_layers", "num_attention_heads": "max_model_heads",
        "attention_head_dim": "max_model_dim", "ffn_dim": "max_model_dim",
        "text_dim": "max_model_dim", "freq_dim": "max_model_dim",
        "in_channels": "max_model_channels", "out_channels": "max_model_channels",
        "image_dim": "max_model_dim",
        "added_kv_proj_dim": "max_model_dim", "patch_size": "max_model_channels",
        "rope_max_seq_len": "max_model_seq_len", "pos_embed_seq_len": "max_model_seq_len",
    },
    "vae": {
        "base_dim": "max_model_dim", "decoder_base_dim": "max_model_dim",
        "z_dim": "max_model_channels",
        "in_channels": "max_model_channels", "out_channels": "max_model_channels",
        "dim_mult": "max_model_channels", "num_res_blocks": "max_model_layers",
        "patch_size": "max_model_channels", "scale_factor_spatial": "max_model_channels",
        "scale_factor_temporal": "max_model_channels",
    },
    "text": {  # umT5 (T5 keys) and CLIP (vision keys)
        "num_layers": "max_text_layers", "num_decoder_layers": "max_text_layers",
        "num_hidden_layers": "max_text_layers", "num_heads": "max_model_heads",
        "num_attention_heads": "max_model_heads", "d_model": "max_model_dim",
        "d_ff": "max_model_dim", "d_kv": "max_model_dim", "hidden_size": "max_model_dim",
        "intermediate_size": "max_model_dim", "projection_dim": "max_model_dim",
        "image_size": "max_model_dim", "patch_size": "max_model_channels",
        "num_channels": "max_model_channels", "vocab_size": "max_text_vocab",
        "relative_attention_num_buckets": "max_model_seq_len",
        "relative_attention_max_distance": "max_model_seq_len",
        "max_position_embeddings": "max_model_seq_len",
    },
    "scheduler": {"num_train_timesteps": "max_scheduler_timesteps"},
}
#: Keys whose zero would divide by zero or build nothing.
POSITIVE = {"num_attention_heads", "attention_head_dim", "num_heads", "patch_size",
            "scale_factor_spatial", "scale_factor_temporal", "num_train_timesteps"}
#: Component folders of a Wan pipeline → the table their config is checked against.
KINDS = {"transformer": "transformer", "transformer_2": "transformer", "vae": "vae",
         "text_encoder": "text", "image_encoder": "text", "scheduler": "scheduler"}


def env_name(setting: str) -> str:
    return "FRAMEFLEET_" + setting.upper()


def _numbers(key: str, value: Any, where: str) -> list[int]:
    values = value if isinstance(value, list) else [value]
    out = []
    for v in values:
        whole = isinstance(v, int) or (isinstance(v, float) and math.isfinite(v) and
                                       v.is_integer())
        if isinstance(v, bool) or not whole:
            raise InvalidJobError(f"{where}: {key} = {value!r} is not a whole number")
        out.append(int(v))
    return out


def _over(key: str, value: Any, limit: int, setting: str, where: str) -> InvalidJobError:
    return InvalidJobError(f"{where}: {key} = {value!r} is over the limit of {limit} "
                           f"({env_name(setting)})")


def check_config(kind: str, config: dict[str, Any], settings: Settings, where: str) -> None:
    """Refuse a config of ``kind`` with a size over its limit (``where``: the field and file,
    for the message). Nested configs (``vision_config``, ``text_config``) are checked too."""
    for key, setting in TABLES[kind].items():
        value = config.get(key)
        if value is None:
            continue
        limit = int(getattr(settings, setting))
        for n in _numbers(key, value, where):
            if n > limit:
                raise _over(key, value, limit, setting, where)
            if n < (1 if key in POSITIVE else 0):
                raise InvalidJobError(f"{where}: {key} = {value!r} must be "
                                      f"{'positive' if key in POSITIVE else 'at least 0'}")
    _products(kind, config, settings, where)
    for nested in ("vision_config", "text_config"):
        if isinstance(config.get(nested), dict):
            check_config(kind, config[nested], settings, where)


def _products(kind: str, config: dict[str, Any], settings: Settings, where: str) -> None:
    """Widths that are products of two checked numbers (a module's real width)."""
    pairs = {"transformer": [("num_attention_heads", "attention_head_dim"),
                             ("in_channels", "patch_size"), ("out_channels", "patch_size")],
             "text": [("num_heads", "d_kv"), ("image_size", "image_size")],
             "vae": [("base_dim", "dim_mult"), ("decoder_base_dim", "dim_mult")]}
    for a, b in pairs.get(kind, []):
        if config.get(a) is None or config.get(b) is None:
            continue
        width = max(_numbers(a, config[a], where)) * math.prod(_numbers(b, config[b], where))
        if kind == "vae":  # dim_mult: the widest level, not the product of levels
            width = max(_numbers(a, config[a], where)) * max(_numbers(b, config[b], where))
        if kind == "text" and a == "image_size":  # patches of a CLIP image: the positions
            patch = max(_numbers("patch_size", config.get("patch_size", 1), where))
            width = (max(_numbers(a, config[a], where)) // patch) ** 2
            if width > settings.max_model_seq_len:
                raise _over("(image_size / patch_size)^2", width, settings.max_model_seq_len,
                            "max_model_seq_len", where)
            continue
        if width > settings.max_model_dim:  # one product's limit: the widest layer
            raise _over(f"{a} x {b}", width, settings.max_model_dim, "max_model_dim", where)
