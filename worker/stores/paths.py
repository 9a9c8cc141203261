"""Local paths a job names (``file://``): confined to configured folders, read with a bound.

A job may only touch local files under ``FRAMEFLEET_FILE_ROOTS``. Unset, the embedded mode
(``filesystem://`` broker) allows the folder that holds its data folder (what ``framefleet
demo`` writes into) and a worker on a real broker allows none. Every check runs on the path
with its symlinks resolved (``realpath``), so a link inside a root cannot point out of it.

A path outside the roots is refused with one message that depends only on the URI as sent,
never on whether the path exists or what it is: the error text is no oracle for the worker's
file system. Inside the roots, the OS errors are named (missing, a directory, not a regular
file, permission denied), as fatal errors of the job.

Reads open the file without following a last symlink and without blocking (a FIFO would block
``open`` until a writer came), refuse anything but a regular file, and count the bytes they
read against the limit: ``st_size`` is 0 for devices, pipes and ``/proc`` files.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from producer.errors import (
    FatalJobError,
    InputNotFoundError,
    InputTooLarge,
    InvalidJobError,
    PathRefusedError,
)
from producer.settings import Settings

CHUNK = 1024**2


def file_roots(settings: Settings) -> tuple[Path, ...]:
    """The folders jobs may read and write, symlinks resolved (empty: no local path at all)."""
    if settings.file_roots is not None:
        roots = [Path(r) for r in settings.file_root_list]
    elif settings.broker_url.startswith("filesystem://"):
        roots = [Path(settings.data_dir).absolute().parent]
    else:
        roots = []
    return tuple(Path(os.path.realpath(r)) for r in roots)


def refused(field: str, uri: str) -> PathRefusedError:
    return PathRefusedError(
        f"{field}: {uri} is outside the folders this worker may use (FRAMEFLEET_FILE_ROOTS)"
    )


def _under(path: Path, roots: tuple[Path, ...]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def confine(path: str | os.PathLike[str], settings: Settings, *, field: str,
            uri: str | None = None) -> Path:
    """``path`` with its symlinks resolved, if that lies under a root; else PathRefusedError.

    ``uri`` is what the job sent (the message names it, never the resolved path).
    """
    real = Path(os.path.realpath(path))
    if not _under(real, file_roots(settings)):
        raise refused(field, uri or Path(path).as_uri())
    return real


def os_error(e: OSError, field: str, uri: str) -> FatalJobError:
    """An OS error on a path inside the roots → a fatal error naming the field and file."""
    if isinstance(e, FileNotFoundError):
        return InputNotFoundError(f"{field}: no such file: {uri}")
    if isinstance(e, IsADirectoryError):
        return InvalidJobError(f"{field}: {uri} is a directory")
    if isinstance(e, NotADirectoryError):
        return InvalidJobError(f"{field}: {uri}: a parent of it is not a directory")
    if isinstance(e, PermissionError):
        return InvalidJobError(f"{field}: {uri}: permission denied")
    if e.errno == errno.ELOOP:
        return InvalidJobError(f"{field}: {uri} is a symbolic link")
    return InvalidJobError(f"{field}: {uri}: {os.strerror(e.errno or 0) or e}")


def _check_fd(fd: int, settings: Settings, field: str, uri: str) -> os.stat_result:
    info = os.fstat(fd)
    # What was opened, not what was checked: a parent swapped for a link in between is seen.
    opened = f"/proc/self/fd/{fd}"
    if os.path.exists(opened) and not _under(Path(os.path.realpath(opened)),
                                             file_roots(settings)):
        raise refused(field, uri)
    if stat.S_ISDIR(info.st_mode):
        raise InvalidJobError(f"{field}: {uri} is a directory")
    if not stat.S_ISREG(info.st_mode):
        raise InvalidJobError(f"{field}: {uri} is not a regular file")
    return info


def read_bounded(fd: int, max_bytes: int, field: str, uri: str) -> bytes:
    """Read ``fd`` to its end, refusing more than ``max_bytes`` (counted, not stat'ed)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, min(CHUNK, max_bytes + 1 - total))
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > max_bytes:
            raise InputTooLarge(f"{field}: {uri} is over the {max_bytes} byte limit")
        chunks.append(chunk)


def read_local(path: str | os.PathLike[str], max_bytes: int, settings: Settings, *,
               field: str, uri: str) -> bytes:
    """The bytes of a regular file under the roots, at most ``max_bytes`` of them."""
    real = confine(path, settings, field=field, uri=uri)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise os_error(e, field, uri) from None
    try:
        info = _check_fd(fd, settings, field, uri)
        if info.st_size > max_bytes:
            raise InputTooLarge(f"{field}: {uri} is {info.st_size} bytes, over the "
                                f"{max_bytes} byte limit")
        try:
            return read_bounded(fd, max_bytes, field, uri)
        except OSError as e:
            raise os_error(e, field, uri) from None
    finally:
        os.close(fd)


def local_folder(path: str | os.PathLike[str], settings: Settings, *, field: str,
                 uri: str | None = None) -> Path:
    """A folder under the roots (model weights, a generation job's model folder), resolved."""
    shown = uri or Path(path).as_uri()
    real = confine(path, settings, field=field, uri=shown)
    try:
        info = os.stat(real)
    except FileNotFoundError:
        raise InvalidJobError(f"{field}: no such folder: {shown}") from None
    except OSError as e:
        raise os_error(e, field, shown) from None
    if not stat.S_ISDIR(info.st_mode):
        raise InvalidJobError(f"{field}: not a folder: {shown}")
    return real


def writable_target(path: str | os.PathLike[str], settings: Settings, *, field: str,
                    uri: str) -> Path:
    """Where a write to ``path`` may go, resolved; checked before any folder is made.

    The root itself must exist: making the missing folders of ``path`` then creates nothing
    outside it (a missing root would have its own parents created).
    """
    real = confine(path, settings, field=field, uri=uri)
    if not any(real.is_relative_to(root) and root.is_dir() for root in file_roots(settings)):
        raise InvalidJobError(f"{field}: {uri}: its allowed folder does not exist on this worker")
    return real
