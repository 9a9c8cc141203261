"""The check of everything a generate model folder holds, before diffusers opens any of it.

:func:`scan_model` walks the whole folder (``worker.inputs.tree``: at most
``FRAMEFLEET_MAX_MODEL_FILES`` entries, every one resolved; with roots, each must lie under
``FRAMEFLEET_FILE_ROOTS``, folder symlinks included; only folders and regular files), then:

- every file: no pickle or zip checkpoint by content, whatever its name, and no
  ``.bin``/``.pt``/``.ckpt``… by name (``worker.inputs.tensorfile``, the decoder weights' rule);
  ``.safetensors`` files must start like one; other files are at most
  ``FRAMEFLEET_MAX_MODEL_FILE_BYTES``;
- the JSON configs (``model_index.json``, each component's config, the scheduler's, weight
  indexes) are read without blocking and counted against ``FRAMEFLEET_MAX_MODEL_CONFIG_BYTES``;
- each model component has safetensors weights (one file or a sharded index whose shards are
  plain names inside its folder, with no ``.safetensors`` file beside them it does not
  name), and its config is within the limits of ``worker.generate.request.limits``; every other
  component ``model_index.json`` names has its folder (the tokenizer's with
  ``tokenizer.json`` or ``spiece.model``), so a missing one is named.

Folders whose name starts with a dot (a clone's ``.git/``) are skipped by the walk.

Every refusal is an ``InvalidJobError`` naming ``generate.model`` and the file. The folder a job
was checked with is remembered (:func:`approve`); ``ModelCache`` checks it again with the same
roots and limits right before ``from_pretrained`` (:func:`recheck`), which loads with
``use_safetensors=True``.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

from producer.errors import InvalidJobError
from producer.settings import Settings, get_settings
from worker.generate.request.limits import KINDS, check_config
from worker.inputs.tensorfile import (
    HEAD,
    check_head,
    check_name,
    is_pickle_or_zip,
    is_safetensors_head,
    pickle_refused,
)
from worker.inputs.tree import Entry, read_entry, read_head, walk

FIELD = "generate.model"
#: JSON files read and parsed here (the rest is read by tokenizers / transformers).
CONFIG_NAMES = ("config.json", "scheduler_config.json", "preprocessor_config.json",
                "tokenizer_config.json", "model_index.json")
#: Weight file names per library: one file, or the index of a sharded checkpoint.
WEIGHTS = {"diffusers": "diffusion_pytorch_model.safetensors",
           "transformers": "model.safetensors"}
COMPONENT_RE = re.compile(r"[A-Za-z0-9_]+")
#: Components that are no model (read by their library, not built from a config), and the
#: files their folder needs (any one): without them transformers fails with a generic
#: "Couldn't instantiate the backend tokenizer".
NEEDS = {"tokenizer": ("tokenizer.json", "spiece.model"),
         "image_processor": ("preprocessor_config.json",)}

Roots = tuple[Path, ...] | None
_approved: dict[str, tuple[Roots, Settings, str]] = {}
#: Folders whose pipeline was built in this process and adopted by a model cache (benchmarks):
#: jobs naming them run that resident pipeline, so their folder holds configs only.
_adopted: set[str] = set()
_lock = threading.Lock()


def _is_config(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return rel.count("/") <= 1 and (name in CONFIG_NAMES or name.endswith(".index.json"))


def _check_file(entry: Entry, settings: Settings, base: str) -> None:
    shown = entry.shown(base)
    name = entry.rel.rsplit("/", 1)[-1]
    head = read_head(entry, HEAD, FIELD, base)
    weights = name.endswith(".safetensors")
    if is_pickle_or_zip(head) and not (weights and is_safetensors_head(head, entry.size)):
        raise pickle_refused(FIELD, shown)
    check_name(name, FIELD, shown)
    if weights:
        check_head(head, entry.size, FIELD, shown)
    elif entry.size > settings.max_model_file_bytes:
        raise InvalidJobError(f"{FIELD}: {shown} is {entry.size} bytes, over the "
                              f"{settings.max_model_file_bytes} byte limit "
                              "(FRAMEFLEET_MAX_MODEL_FILE_BYTES)")


def read_config(entry: Entry, settings: Settings, base: str) -> dict[str, Any]:
    """A JSON object, read bounded and without blocking."""
    data = read_entry(entry, settings.max_model_config_bytes, FIELD, base,
                      "FRAMEFLEET_MAX_MODEL_CONFIG_BYTES")
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise InvalidJobError(f"{FIELD}: {entry.shown(base)} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise InvalidJobError(f"{FIELD}: {entry.shown(base)} is not a JSON object")
    return value


def _weights(name: str, library: str, files: dict[str, Entry], configs: dict[str, Any],
             base: str) -> None:
    single = WEIGHTS[library]
    index = f"{name}/{single}.index.json"
    if f"{name}/{single}" in files:
        return
    if index not in files:
        raise InvalidJobError(f"{FIELD}: {base.rstrip('/')}/{name} has no {single} "
                              "(safetensors only)")
    shards = configs[index].get("weight_map")
    if not isinstance(shards, dict) or not shards:
        raise InvalidJobError(f"{FIELD}: {files[index].shown(base)} has no weight_map")
    named = set(shards.values())
    for shard in named:
        if not isinstance(shard, str) or f"{name}/{shard}" not in files or \
                not shard.endswith(".safetensors"):
            raise InvalidJobError(f"{FIELD}: {files[index].shown(base)} names a shard that is "
                                  f"not a .safetensors file of {name}/: {shard!r}")
    # A shard beside them that the index does not name: a mixed or half-replaced download,
    # which diffusers would silently skip (or another loader read).
    for rel, entry in files.items():
        folder, _, shard = rel.rpartition("/")
        if folder == name and shard.endswith(".safetensors") and shard not in named:
            raise InvalidJobError(f"{FIELD}: {entry.shown(base)} is a weights file that "
                                  f"{files[index].shown(base)} does not name")


def _no_model(name: str, files: dict[str, Entry], base: str) -> None:
    """A component that is no model (the tokenizer, say): its folder is there, with what its
    library reads."""
    inside = {rel.split("/", 1)[1] for rel in files if rel.startswith(f"{name}/")}
    if not inside:
        raise InvalidJobError(f"{FIELD}: {base} has no {name} ({name}/ missing; "
                              "model_index.json names it)")
    needed = NEEDS.get(name, ())
    if needed and not inside.intersection(needed):
        raise InvalidJobError(f"{FIELD}: {base.rstrip('/')}/{name} has no "
                              f"{' or '.join(needed)}")


def _components(files: dict[str, Entry], configs: dict[str, Any], settings: Settings,
                base: str) -> None:
    index = configs["model_index.json"]
    for name, value in index.items():
        if name.startswith("_") or not isinstance(value, list) or len(value) != 2 or \
                value[0] is None:
            continue
        if not COMPONENT_RE.fullmatch(name):
            raise InvalidJobError(f"{FIELD}: {base.rstrip('/')}/model_index.json names a "
                                  f"component {name!r} that is not a plain folder name")
        kind = KINDS.get(name)
        if kind is None:
            _no_model(name, files, base)
            continue
        config_name = "scheduler_config.json" if kind == "scheduler" else "config.json"
        rel = f"{name}/{config_name}"
        if rel not in configs:
            raise InvalidJobError(f"{FIELD}: {base} has no {name} ({rel} missing)")
        check_config(kind, configs[rel], settings, f"{FIELD}: {files[rel].shown(base)}")
        if kind != "scheduler":
            library = "transformers" if value[0] == "transformers" else "diffusers"
            _weights(name, library, files, configs, base)


def scan_model(folder: Path, roots: Roots, settings: Settings, base: str,
               weights: bool = True) -> dict[str, dict[str, Any]]:
    """Check ``folder`` (resolved) as the module says; returns its parsed configs by path.

    ``weights`` False: a folder of configs only (benchmarks adopt a built pipeline for it)."""
    files = {e.rel: e for e in walk(folder, roots, field=FIELD, base=base,
                                    max_entries=settings.max_model_files)}
    for entry in files.values():
        _check_file(entry, settings, base)
    configs = {rel: read_config(e, settings, base) for rel, e in files.items() if _is_config(rel)}
    if "model_index.json" not in configs:
        raise InvalidJobError(f"{FIELD}: {base} has no model_index.json (not a diffusers "
                              "pipeline folder)")
    if weights:
        _components(files, configs, settings, base)
    else:
        for rel, config in configs.items():
            kind = KINDS.get(rel.split("/")[0]) if "/" in rel else None
            if kind is not None and not rel.endswith(".index.json"):
                check_config(kind, config, settings, f"{FIELD}: {files[rel].shown(base)}")
    return configs


def approve(folder: Path, roots: Roots, settings: Settings | None, base: str) -> None:
    """Check ``folder`` and remember how, for :func:`recheck` before it is loaded."""
    settings = settings or get_settings()
    with _lock:
        adopted = str(Path(os.path.realpath(folder))) in _adopted
    scan_model(folder, roots, settings, base, weights=not adopted)
    with _lock:
        _approved[str(folder)] = (roots, settings, base)


def adopted(folder: Path) -> None:
    """Note that ``folder``'s pipeline is resident, built in-process: its weights are not read."""
    with _lock:
        _adopted.add(str(Path(os.path.realpath(folder))))


def recheck(folder: Path) -> None:
    """Check ``folder`` again as it was approved (not approved: no roots, the process's
    settings): what diffusers is about to open is what was checked."""
    with _lock:
        roots, settings, base = _approved.get(str(folder), (None, get_settings(),
                                                            folder.as_uri()))
    scan_model(Path(os.path.realpath(folder)), roots, settings, base)
