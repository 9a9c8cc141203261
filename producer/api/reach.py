"""How far a model of the map reaches, read from its folder where this host has it.

The gateway checks a request against the model's positional range
(``producer.wire.reach``) before anything is queued, so a size the model cannot take is a
400 naming the field, not a job that fails on its worker. The map names each model's folder
on the workers; a gateway that shares it (a mounted volume, one host) reads the transformer's
and the VAE's ``config.json`` there: two small JSON files, bounded, no weights, no torch.
Where the folder is not here, or its configs do not parse, there is nothing to check against:
the worker checks the same rule before its model loads, and refuses with ``invalid_job``.

A folder's answer is kept until either file changes (their modification times), so a request
costs two ``stat`` calls.

The same folder says whether its weights are random (:func:`folder_random`): the label
``framefleet models tiny`` leaves, which the workers read too. A running job's video object
says "random weights" from it, before its result does.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from urllib.parse import unquote, urlparse

from producer.wire.layouts import read_json
from producer.wire.reach import Reach, reach

_FILES = ("transformer/config.json", "vae/config.json")
#: The label of a folder of random weights (``worker/generate/model/tiny.py`` writes it, as
#: ``{"random_weights": true, ...}``; ``worker/generate/request/folder.py`` reads it).
RANDOM_MARKER = "framefleet_random_weights.json"
_lock = threading.Lock()
_known: dict[str, tuple[tuple[int, ...], Reach | None]] = {}
_random: dict[str, tuple[tuple[int, ...], bool]] = {}


def _root(folder: str) -> Path:
    return Path(unquote(urlparse(folder).path) if folder.startswith("file://") else folder)


def folder_random(folder: str) -> bool | None:
    """Whether the model in ``folder`` is labelled random weights (its videos are noise), as
    the workers read the label; None where this host does not have the folder."""
    root = _root(folder)
    marker = root / RANDOM_MARKER
    try:
        st = os.stat(marker)
    except FileNotFoundError:
        return False if root.is_dir() else None
    except OSError:
        return None
    stamp = (st.st_mtime_ns, st.st_size)
    with _lock:
        known = _random.get(str(root))
    if known is not None and known[0] == stamp:
        return known[1]
    try:
        found = read_json(marker).get("random_weights") is True
    except (OSError, ValueError, RecursionError):
        found = False  # the workers refuse such a folder: its jobs make no video at all
    with _lock:
        _random[str(root)] = (stamp, found)
    return found


def folder_reach(folder: str) -> Reach | None:
    """The reach of the model in ``folder`` (a ``file://`` URI or a path), or None where this
    host cannot tell (no such folder here, or configs that do not parse)."""
    root = _root(folder)
    paths = [root / name for name in _FILES]
    try:
        stamp = tuple(n for p in paths for n in (os.stat(p).st_mtime_ns, os.stat(p).st_size))
    except OSError:
        return None
    with _lock:
        known = _known.get(str(root))
    if known is not None and known[0] == stamp:
        return known[1]
    try:
        found: Reach | None = reach(read_json(paths[0]), read_json(paths[1]))
    except (OSError, ValueError, TypeError, RecursionError):
        found = None
    with _lock:
        _known[str(root)] = (stamp, found)
    return found
