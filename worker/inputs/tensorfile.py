"""The one rule for weights a worker loads: safetensors only, judged by the content.

Decoder weights (``worker/inputs/weights.py``), the files of a generate model folder
(``worker/generate/request/loader.py``) and LoRA adapters
(``worker/generate/conditions/adapters.py``) all go through :func:`check_head`: a pickle or a zip
checkpoint (what ``torch.save`` writes) is refused whatever its name, and a file that claims to be
safetensors must start like one (an 8-byte little-endian header length that fits the file, then a
JSON object). Unpickling a file can run code; nothing here ever does.
"""

from __future__ import annotations

from producer.errors import InvalidJobError

#: Names of weight files that torch's loaders would unpickle.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
#: safetensors' own cap on the header (it refuses longer ones itself).
MAX_HEADER = 100_000_000
#: Bytes of a file :func:`check_head` needs to judge it.
HEAD = 9


def is_pickle_or_zip(head: bytes) -> bool:
    """Pickle protocol 2+ (``\\x80`` then the protocol) or a zip archive (torch.save)."""
    return (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5) or \
        head[:4] in (b"PK\x03\x04", b"PK\x05\x06")


def pickle_refused(field: str, shown: str) -> InvalidJobError:
    return InvalidJobError(f"{field}: {shown} is a pickle or zip checkpoint (judged by its "
                           "content), refused: only safetensors weights are loaded")


def is_safetensors_head(head: bytes, size: int) -> bool:
    """Whether ``head`` starts like a safetensors file of ``size`` bytes: a header length that
    fits, then its JSON. A length whose low bytes read ``\x80\x02``..``\x80\x05`` (a header
    of 640 bytes, say) looks like a pickle's first two bytes too, and is a safetensors file."""
    header = int.from_bytes(head[:8], "little") if len(head) >= 8 else 0
    return 2 <= header <= min(size - 8, MAX_HEADER) and head[8:9] == b"{"


def check_head(head: bytes, size: int, field: str, shown: str) -> None:
    """``head`` (the first :data:`HEAD` bytes or more) of a ``.safetensors`` file of ``size``
    bytes: refused unless it starts like a safetensors file."""
    if is_safetensors_head(head, size):
        return
    if is_pickle_or_zip(head):
        raise pickle_refused(field, shown)
    raise InvalidJobError(f"{field}: {shown} is not a safetensors file (judged by its "
                          "content): only safetensors weights are loaded")


def check_name(name: str, field: str, shown: str) -> None:
    """A weight file in another format than safetensors, refused by its name."""
    if name.lower().endswith(PICKLE_SUFFIXES):
        raise InvalidJobError(f"{field}: {shown}: only safetensors weights are loaded, not "
                              f"{name.rsplit('.', 1)[-1]} files")
