"""Every file of a local folder, listed and checked before a loader opens any of them.

Model folders are opened by libraries (diffusers, transformers, tokenizers) that follow
symlinks, block on a FIFO and read a device to its end. :func:`walk` lists the whole tree
first, with a bound on the number of entries and on the depth, and resolves each entry
(``realpath``): with roots given, an entry that resolves outside them (a file or a folder
symlink) gets the one refusal of ``worker.stores.paths`` whether or not its target exists;
anything but a folder or a regular file (FIFO, device, socket, a dangling link) is refused,
naming the file. Folder symlinks inside the roots are followed (each real folder once).

Folders whose name starts with a dot (``.git``, ``.cache``, ``.huggingface``) are skipped,
neither counted nor read: a ``git clone`` of a model keeps a second copy of every LFS weight
under ``.git/``, and no loader opens them (a file a loader reads is one the walk listed: a
component, weight shard or tokenizer file inside a dot-folder is missing to the checks).

:func:`read_entry` and :func:`read_head` open a listed file the way ``read_local`` does (no
last symlink followed, never blocking, the opened file checked again) and count the bytes
they read: what was listed is what is read.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from producer.errors import InvalidJobError
from worker.stores.paths import os_error, read_bounded, refused

#: Folders below the top one a walk descends into (diffusers' layout uses one or two).
MAX_DEPTH = 8


@dataclass(frozen=True)
class Entry:
    """One regular file of a walked folder."""

    rel: str  # its path inside the folder as listed ("vae/config.json")
    real: Path  # symlinks resolved
    size: int

    def shown(self, base: str) -> str:
        """How messages name it: the folder as the job sent it, then ``rel``."""
        return f"{base.rstrip('/')}/{self.rel}"


def _under(path: Path, roots: tuple[Path, ...]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def _is_folder(path: Path) -> bool:
    """A folder itself, not a link to one (a link is resolved and confined first: whether its
    target exists outside the roots must not change the verdict)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def walk(folder: Path, roots: tuple[Path, ...] | None, *, field: str, base: str,
         max_entries: int) -> list[Entry]:
    """The regular files under ``folder`` (its own path resolved), checked as above.

    ``roots`` None: no confinement (an operator's folder), every other check still applies.
    ``base`` names the folder in messages (the URI as sent).
    """
    files: list[Entry] = []
    seen = {folder}
    stack: list[tuple[Path, str, int]] = [(folder, "", 0)]
    count = 0
    while stack:
        where, prefix, depth = stack.pop()
        try:
            names = sorted(os.listdir(where))
        except OSError as e:
            raise os_error(e, field, f"{base.rstrip('/')}/{prefix}") from None
        for name in names:
            dot = name.startswith(".")
            if dot and _is_folder(where / name):
                continue  # a clone's .git/, a download's .cache/: never read by a loader
            count += 1
            rel = prefix + name
            shown = f"{base.rstrip('/')}/{rel}"
            if count > max_entries:
                raise InvalidJobError(f"{field}: {base} holds more than {max_entries} files and "
                                      "folders (FRAMEFLEET_MAX_MODEL_FILES)")
            real = Path(os.path.realpath(where / name))
            if roots is not None and not _under(real, roots):
                raise refused(field, shown)
            try:
                info = os.stat(real)
            except OSError as e:
                raise os_error(e, field, shown) from None
            if stat.S_ISDIR(info.st_mode):
                if dot:  # a link to a dot-folder: skipped too, once confined like any link
                    continue
                if depth >= MAX_DEPTH:
                    raise InvalidJobError(f"{field}: {shown} is nested more than {MAX_DEPTH} "
                                          "folders deep")
                if real not in seen:
                    seen.add(real)
                    stack.append((real, rel + "/", depth + 1))
            elif stat.S_ISREG(info.st_mode):
                files.append(Entry(rel, real, info.st_size))
            else:
                raise InvalidJobError(f"{field}: {shown} is not a regular file (a FIFO, device "
                                      "or socket is never read)")
    return files


def _open(entry: Entry, field: str, shown: str) -> int:
    try:
        fd = os.open(entry.real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise os_error(e, field, shown) from None
    info = os.fstat(fd)
    opened = f"/proc/self/fd/{fd}"
    moved = os.path.exists(opened) and Path(os.path.realpath(opened)) != entry.real
    if moved or not stat.S_ISREG(info.st_mode):
        os.close(fd)  # swapped since it was listed: the walk's verdict no longer holds
        raise InvalidJobError(f"{field}: {shown} changed while it was checked, or is not a "
                              "regular file")
    return fd


def read_entry(entry: Entry, max_bytes: int, field: str, base: str, setting: str) -> bytes:
    """The whole file, at most ``max_bytes`` (``setting`` names the limit in the message)."""
    shown = entry.shown(base)
    fd = _open(entry, field, shown)
    try:
        if os.fstat(fd).st_size > max_bytes:
            raise InvalidJobError(f"{field}: {shown} is over the {max_bytes} byte limit "
                                  f"({setting})")
        try:
            return read_bounded(fd, max_bytes, field, f"{shown} ({setting})")
        except OSError as e:
            raise os_error(e, field, shown) from None
    finally:
        os.close(fd)


def read_head(entry: Entry, n: int, field: str, base: str) -> bytes:
    """The first ``n`` bytes of the file (fewer if it is shorter)."""
    shown = entry.shown(base)
    fd = _open(entry, field, shown)
    try:
        return os.read(fd, n)
    except OSError as e:
        raise os_error(e, field, shown) from None
    finally:
        os.close(fd)
