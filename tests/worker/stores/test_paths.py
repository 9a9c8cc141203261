"""Local paths of jobs: confined to FRAMEFLEET_FILE_ROOTS, no existence oracle, bounded reads,
named OS errors, no folder made outside the roots."""

from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from producer.errors import (
    FatalJobError,
    InputNotFoundError,
    InvalidJobError,
    PathRefusedError,
    SettingsError,
)
from producer.settings import Settings
from producer.wire.spec import DecoderSpec, InputSpec
from worker.inputs.latents import load_latents
from worker.inputs.weights import resolve_weights
from worker.stores.paths import file_roots, local_folder, os_error, read_bounded, read_local
from worker.stores.storage import FileStore, JobOutput

MiB = 1024**2


def roots(*folders: Path | str, **kw: object) -> Settings:
    return Settings(file_roots=":".join(str(f) for f in folders), **kw)  # type: ignore[arg-type]


def _refusal(path: Path, settings: Settings) -> str:
    with pytest.raises(PathRefusedError) as info:
        load_latents(InputSpec(uri=path.as_uri()), 16, settings)
    return str(info.value)


def rss() -> int:
    return int(psutil.Process().memory_info().rss)


# --- which folders ----------------------------------------------------------------------------


def test_default_roots_embedded_folder_only_and_none_on_a_real_broker(tmp_path: Path) -> None:
    data = tmp_path / "demo-out" / ".framefleet"
    embedded = Settings(broker_url="filesystem://", data_dir=str(data))
    assert file_roots(embedded) == (Path(os.path.realpath(tmp_path / "demo-out")),)
    assert file_roots(Settings(broker_url="redis://127.0.0.1:6379/0")) == ()
    # Set but empty: none, even in the embedded mode
    assert file_roots(Settings(broker_url="filesystem://", file_roots="")) == ()
    assert file_roots(roots("/data/in", "/data/out")) == (Path("/data/in"), Path("/data/out"))


@pytest.mark.parametrize("value", ["data/in", "/data/../etc", "/ok:relative"])
def test_roots_must_be_absolute(value: str) -> None:
    with pytest.raises(SettingsError, match="FRAMEFLEET_FILE_ROOTS"):
        Settings(file_roots=value)


def test_real_broker_without_roots_refuses_every_local_input(tmp_path: Path) -> None:
    np.save(tmp_path / "z.npy", np.zeros((16, 1, 2, 2), np.float32))
    with pytest.raises(PathRefusedError, match=r"input.uri: .*z.npy is outside"):
        load_latents(InputSpec(uri=(tmp_path / "z.npy").as_uri()), 16,
                     Settings(broker_url="redis://127.0.0.1:6379/0"))


# --- no oracle --------------------------------------------------------------------------------


def test_refusal_is_byte_identical_whether_the_path_exists_or_not(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    settings = roots(root)
    target = tmp_path / "secret.npy"
    np.save(target, np.zeros((16, 1, 2, 2), np.float32))
    existing = _refusal(target, settings)
    target.unlink()
    missing = _refusal(target, settings)
    target.mkdir()
    directory = _refusal(target, settings)
    assert existing == missing == directory
    assert existing.encode() == missing.encode()
    assert "input.uri" in existing and target.as_uri() in existing
    # Outside the roots, a system file and a missing one differ only by the name sent
    etc = _refusal(Path("/etc/passwd"), settings)
    nope = _refusal(Path("/etc/framefleet-no-such-file"), settings)
    assert etc.replace("/etc/passwd", "X") == nope.replace("/etc/framefleet-no-such-file", "X")


def test_symlink_out_of_a_root_is_resolved_and_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside.npy"
    np.save(outside, np.zeros((16, 1, 2, 2), np.float32))
    (root / "link.npy").symlink_to(outside)
    (root / "dangling.npy").symlink_to(tmp_path / "missing.npy")
    settings = roots(root)
    link = _refusal(root / "link.npy", settings)
    dangling = _refusal(root / "dangling.npy", settings)
    assert link.replace("link.npy", "X") == dangling.replace("dangling.npy", "X")
    # A link that stays inside the root is fine
    np.save(root / "in.npy", np.zeros((16, 1, 2, 2), np.float32))
    (root / "alias.npy").symlink_to(root / "in.npy")
    assert load_latents(InputSpec(uri=(root / "alias.npy").as_uri()), 16, settings).shape == (
        16, 1, 2, 2)


# --- named OS errors inside the roots --------------------------------------------------------


def test_os_errors_name_the_field_and_the_file(tmp_path: Path) -> None:
    settings = roots(tmp_path)
    (tmp_path / "d.npy").mkdir()
    (tmp_path / "f").write_bytes(b"x")
    d, gone, child = (tmp_path / "d.npy").as_uri(), (tmp_path / "gone.npy").as_uri(), (
        tmp_path / "f" / "child.npy").as_uri()
    cases = {
        d: (InvalidJobError, f"input.uri: {d} is a directory"),
        gone: (InputNotFoundError, f"input.uri: no such file: {gone}"),
        child: (InvalidJobError, f"input.uri: {child}: a parent of it is not a directory"),
    }
    for uri, (kind, message) in cases.items():
        with pytest.raises(kind) as info:
            load_latents(InputSpec(uri=uri), 16, settings)
        assert str(info.value) == message
        assert isinstance(info.value, FatalJobError)


def test_permission_denied_is_named(tmp_path: Path) -> None:
    # The mapping itself (root reads anything, so chmod cannot provoke it below as root)
    e = os_error(PermissionError(errno.EACCES, "Permission denied"), "input.uri", "file:///a")
    assert isinstance(e, InvalidJobError) and str(e) == "input.uri: file:///a: permission denied"
    if os.geteuid() == 0:
        pytest.skip("running as root: file modes do not deny reads")
    path = tmp_path / "locked.npy"
    np.save(path, np.zeros((16, 1, 2, 2), np.float32))
    path.chmod(0)
    with pytest.raises(InvalidJobError, match="permission denied"):
        load_latents(InputSpec(uri=path.as_uri()), 16, roots(tmp_path))


# --- bounded reads -----------------------------------------------------------------------------


def test_dev_zero_as_npy_fails_fast_with_bounded_memory() -> None:
    spec = InputSpec(uri="file:///dev/zero", format="npy")
    # Outside the roots: the uniform refusal
    with pytest.raises(PathRefusedError):
        load_latents(spec, 16, roots("/data"))
    # Even with /dev allowed: not a regular file, refused before a byte is read
    before, t0 = rss(), time.monotonic()
    with pytest.raises(InvalidJobError, match="input.uri: file:///dev/zero is not a regular file"):
        load_latents(spec, 16, roots("/dev", max_input_bytes=2 * 1024**3))
    assert time.monotonic() - t0 < 1.0
    assert rss() - before < 32 * MiB


def test_fifo_is_refused_without_blocking_or_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.npy"
    os.mkfifo(fifo)
    # A writer that would feed zeros for ever once a reader opens the pipe
    writer = subprocess.Popen(["sh", "-c", f"exec cat /dev/zero > '{fifo}'"])
    try:
        before, t0 = rss(), time.monotonic()
        with pytest.raises(InvalidJobError, match="pipe.npy is not a regular file"):
            load_latents(InputSpec(uri=fifo.as_uri(), format="npy"), 16, roots(tmp_path))
        assert time.monotonic() - t0 < 1.0
        assert rss() - before < 32 * MiB
    finally:
        writer.kill()
        writer.wait(5)


def test_reads_count_bytes_whatever_stat_says(tmp_path: Path) -> None:
    # /proc files are regular files whose st_size is 0
    path = Path("/proc/self/smaps")
    assert path.stat().st_size == 0 and path.is_file()
    with pytest.raises(InvalidJobError, match="over the 1024 byte limit"):
        read_local(path, 1024, roots("/proc"), field="input.uri", uri=path.as_uri())
    # and the reader itself stops at the limit on an endless device
    fd = os.open("/dev/zero", os.O_RDONLY)
    try:
        before = rss()
        with pytest.raises(InvalidJobError, match="over the 8388608 byte limit"):
            read_bounded(fd, 8 * MiB, "input.uri", "file:///dev/zero")
        assert rss() - before < 48 * MiB
    finally:
        os.close(fd)


# --- writes ------------------------------------------------------------------------------------


def test_output_outside_the_roots_creates_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    settings = roots(root)
    outside = tmp_path / "etc-like" / "deep"
    with pytest.raises(PathRefusedError, match="output.uri"):
        JobOutput(outside.as_uri(), settings)
    store = FileStore(Path("/"), settings, "output.uri")
    with pytest.raises(PathRefusedError):
        store.put_bytes(str(outside / "manifest.json").lstrip("/"), b"{}", "application/json")
    # A link inside the root that leads out of it
    (root / "escape").symlink_to(tmp_path / "target", target_is_directory=True)
    with pytest.raises(PathRefusedError):
        JobOutput((root / "escape" / "videos").as_uri(), settings).put_bytes("m.json", b"{}")
    assert not (tmp_path / "etc-like").exists() and not (tmp_path / "target").exists()
    # A root that does not exist is not created, nor are its parents
    with pytest.raises(InvalidJobError, match="allowed folder does not exist"):
        JobOutput((tmp_path / "nope" / "out").as_uri(), roots(tmp_path / "nope")).put_bytes(
            "m.json", b"{}")
    assert not (tmp_path / "nope").exists()
    # Inside: written
    out = JobOutput((root / "videos" / "t" / "j").as_uri(), settings)
    assert out.put_bytes("manifest.json", b"{}") == (root / "videos/t/j/manifest.json").as_uri()
    assert out.get_bytes("manifest.json") == b"{}"


def test_decoder_weights_folder_is_confined(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "wan").mkdir(parents=True)
    (root / "file").write_bytes(b"x")
    settings = roots(root)
    def weights(path: Path) -> str | None:
        return resolve_weights(DecoderSpec(weights=path.as_uri()), settings)

    # (the folder's layout is checked after the roots: tests/worker/run/test_runner.py)
    assert local_folder(root / "wan", settings, field="decoder.weights") == root / "wan"
    with pytest.raises(PathRefusedError, match="decoder.weights"):
        weights(tmp_path)
    with pytest.raises(InvalidJobError, match="decoder.weights: not a folder: .*file"):
        weights(root / "file")
    with pytest.raises(InvalidJobError, match="decoder.weights: no such folder"):
        weights(root / "missing")
