"""What a compile artifact covers, and the ``index.json`` beside the artifacts.

A compile artifact is the bytes of ``torch.compiler.save_cache_artifacts()`` ("Mega-Cache":
inductor's FX graph cache, the AOTAutograd cache, Triton's kernels and the autotuning results)
after one tier of one model was compiled at some sizes. It is valid only for what produced it,
its ``Stamp``: the model's config digest (the transformer's architecture: weights do not enter
the compiled code), the tier, the torch and Triton versions and the device's name (a GPU's
name, ``cpu`` on the CPU). There is one artifact per stamp; its index entry adds the sizes of
the transformer it covers, the decoder graphs it covers (``steady 48x44x80``, ``first
48x44x80``: see ``worker.generate.model.graphs``; an index written before they were recorded
has none), when it was made, its length and sha256.

No torch here: the index is plain JSON, checked field by field when it is read.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

INDEX = "index.json"
SCHEMA = 1
#: The stamp's fields, in the order a miss names the first that differs.
STAMP_FIELDS = ("config", "tier", "torch", "triton", "device")
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}\.artifact$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_SIZE = re.compile(r"^[0-9]{1,5}x[0-9]{1,5}x[0-9]{1,5}$")
_GRAPH = re.compile(r"^(steady|first) [0-9]{1,4}x[0-9]{1,5}x[0-9]{1,5}$")


@dataclass(frozen=True)
class Stamp:
    """What an artifact is valid for (see the module's docstring)."""

    config: str
    tier: str
    torch: str
    triton: str
    device: str

    def file_name(self) -> str:
        """The artifact's file name: one per stamp, readable, no separator in it."""
        parts = (self.tier, self.config[:16], f"torch{self.torch}", f"triton{self.triton}",
                 self.device)
        return "-".join(re.sub(r"[^A-Za-z0-9.]+", "_", p) for p in parts) + ".artifact"

    def differs(self, other: Stamp) -> str | None:
        """Why an artifact of ``other`` is not one for this stamp (the first field that
        differs, both values named), or None when it is."""
        for name in STAMP_FIELDS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                what = "model config" if name == "config" else name
                return f"{what} {theirs[:16] if name == 'config' else theirs} in the artifact, " \
                       f"{mine[:16] if name == 'config' else mine} here"
        return None


@dataclass
class Entry:
    """One artifact of the index."""

    stamp: Stamp
    file: str
    sizes: list[str] = field(default_factory=list)  # "HxWxF", sorted
    created: str = ""
    bytes: int = 0
    sha256: str = ""
    graphs: list[str] = field(default_factory=list)  # the decoder's graphs, sorted

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self.stamp), "file": self.file, "sizes": sorted(self.sizes),
                "graphs": sorted(self.graphs), "created": self.created, "bytes": self.bytes,
                "sha256": self.sha256}


def _entry(item: Any, where: str) -> Entry:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: not an object")
    for name in (*STAMP_FIELDS, "file", "created", "sha256"):
        if not isinstance(item.get(name), str):
            raise ValueError(f"{where}.{name}: missing or not a string")
    if not _NAME.match(item["file"]):
        raise ValueError(f"{where}.file: {item['file'][:80]!r} is not a plain *.artifact name")
    if not _HEX64.match(item["sha256"]):
        raise ValueError(f"{where}.sha256: not 64 lowercase hex digits")
    size = item.get("bytes")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise ValueError(f"{where}.bytes: not a positive integer")
    sizes = item.get("sizes")
    if not isinstance(sizes, list) or not all(isinstance(s, str) and _SIZE.match(s)
                                              for s in sizes):
        raise ValueError(f"{where}.sizes: not a list of HxWxF")
    graphs = item.get("graphs", [])
    if not isinstance(graphs, list) or not all(isinstance(g, str) and _GRAPH.match(g)
                                               for g in graphs):
        raise ValueError(f"{where}.graphs: not a list of 'steady|first CxHxW'")
    stamp = Stamp(*(item[name] for name in STAMP_FIELDS))
    return Entry(stamp, item["file"], sorted(sizes), item["created"], size, item["sha256"],
                 sorted(graphs))


def parse_index(data: bytes, where: str = INDEX) -> list[Entry]:
    """The entries of an index's bytes; ``ValueError`` naming the field that is wrong."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{where}: not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{where}: schema is not {SCHEMA}")
    items = doc.get("artifacts")
    if not isinstance(items, list):
        raise ValueError(f"{where}: artifacts is not a list")
    return [_entry(item, f"{where}: artifacts[{i}]") for i, item in enumerate(items)]


def dump_index(entries: list[Entry]) -> bytes:
    doc = {"schema": SCHEMA, "artifacts": [e.as_json() for e in entries]}
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def better(new: Entry, old: Entry | None) -> bool:
    """Whether ``new`` may replace ``old`` (same stamp): only an artifact that covers every
    size and decoder graph the old one did, and more. A worse or equal one never overwrites a
    good one."""
    if old is None:
        return True
    sizes, graphs = (set(new.sizes), set(old.sizes)), (set(new.graphs), set(old.graphs))
    return sizes[0] >= sizes[1] and graphs[0] >= graphs[1] and \
        (sizes[0] > sizes[1] or graphs[0] > graphs[1])


def merged(entries: list[Entry], new: Entry) -> list[Entry] | None:
    """The index with ``new`` in place of its stamp's entry, or None when it is no better."""
    old = next((e for e in entries if e.stamp == new.stamp), None)
    if not better(new, old):
        return None
    return [e for e in entries if e.stamp != new.stamp] + [new]


def match(entries: list[Entry], stamp: Stamp) -> tuple[Entry | None, str]:
    """The entry for ``stamp``, or None and why none fits: "no artifact" for this model and
    tier, else what the nearest one (same model and tier) differs in."""
    for entry in entries:
        if entry.stamp == stamp:
            return entry, ""
    near = [e for e in entries if e.stamp.config == stamp.config and e.stamp.tier == stamp.tier]
    if near:
        return None, stamp.differs(near[0].stamp) or "no artifact"
    same_tier = [e for e in entries if e.stamp.tier == stamp.tier]
    if same_tier:
        return None, stamp.differs(same_tier[0].stamp) or "no artifact"
    return None, f"no artifact for tier {stamp.tier}"
