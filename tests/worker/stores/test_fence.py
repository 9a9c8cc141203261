"""Fenced writes against a real SeaweedFS and a real folder: a write of a run that lost its
lease lands nowhere, not even half, and the S3 client's sockets are the ones the bound needs."""

from __future__ import annotations

import socket
import struct
import threading
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from producer.errors import LeaseLost
from producer.settings import Settings
from tests.services import S3Server
from worker.stores import storage
from worker.stores.fence import S3_SEND_BUFFER, FencedBody, check_current, fenced
from worker.stores.storage import JobOutput

pytestmark = pytest.mark.usefixtures("file_roots")


class ScriptedFence:
    """A fence that lets ``allow`` checks pass, then says the lease was lost."""

    def __init__(self, allow: int) -> None:
        self.allow, self.checks = allow, []  # type: ignore[var-annotated]

    def check(self, what: str) -> None:
        self.checks.append(what)
        if len(self.checks) > self.allow:
            raise LeaseLost(f"{what} not written: lost (scripted)")


def _settings(s3: S3Server) -> Settings:
    return Settings(s3_endpoint_url=s3.endpoint_url, s3_region=s3.region)


@pytest.fixture(autouse=True)
def _s3_keys(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)


def _exists(s3: S3Server, bucket: str, key: str) -> bool:
    try:
        s3.client().head_object(Bucket=bucket, Key=key)
        return True
    except ClientError:
        return False


def test_a_fenced_write_lands_while_the_fence_holds(s3: S3Server, s3_bucket: str,
                                                    tmp_path: Path) -> None:
    out = JobOutput(f"s3://{s3_bucket}/out/t/j", _settings(s3), fence=ScriptedFence(10**6))
    seg = tmp_path / "seg.mp4"
    seg.write_bytes(b"\x00" * 300_000)
    out.put_file("segment-00000.mp4", seg)
    out.put_bytes("manifest.json", b"{}")
    got = s3.client().get_object(Bucket=s3_bucket, Key="out/t/j/segment-00000.mp4")["Body"]
    assert got.read() == seg.read_bytes()
    assert _exists(s3, s3_bucket, "out/t/j/manifest.json")


def test_a_write_whose_run_lost_its_lease_lands_nowhere(s3: S3Server, s3_bucket: str) -> None:
    # Given a run whose lease is lost before its write
    out = JobOutput(f"s3://{s3_bucket}/out/t/j", _settings(s3), fence=ScriptedFence(0))
    # When it writes, Then the write is refused naming it, and nothing is stored
    with pytest.raises(LeaseLost, match=r"manifest\.json not written"):
        out.put_bytes("manifest.json", b"{}")
    assert not _exists(s3, s3_bucket, "out/t/j/manifest.json")


def test_a_lease_lost_in_the_middle_of_an_upload_leaves_no_object(
        s3: S3Server, s3_bucket: str, tmp_path: Path) -> None:
    # Given a segment of several body chunks, and a lease lost after the upload started
    seg = tmp_path / "seg.mp4"
    seg.write_bytes(b"\x01" * 2_000_000)
    fence = ScriptedFence(4)  # the write's own check, the request's, and two body chunks
    out = JobOutput(f"s3://{s3_bucket}/out/t/j", _settings(s3), fence=fence)
    # When it uploads, Then the upload stops at the next chunk with LeaseLost ...
    with pytest.raises(LeaseLost):
        out.put_file("segment-00001.mp4", seg)
    assert any("segment-00001.mp4" in c for c in fence.checks[2:]), fence.checks
    # ... and the store holds no object, not even a part of one
    assert not _exists(s3, s3_bucket, "out/t/j/segment-00001.mp4")


def test_a_local_write_of_a_lost_run_leaves_neither_file_nor_temporary(tmp_path: Path) -> None:
    out = JobOutput((tmp_path / "out").as_uri(), Settings(file_roots=str(tmp_path)),
                    fence=ScriptedFence(1))  # the write's check passes, the rename's does not
    with pytest.raises(LeaseLost):
        out.put_bytes("index.m3u8", b"#EXTM3U\n")
    folder = tmp_path / "out"
    assert not folder.exists() or not any(folder.rglob("*")), list(folder.rglob("*"))


def test_reads_are_not_fenced_and_no_fence_outside_a_fenced_block(s3: S3Server,
                                                                   s3_bucket: str) -> None:
    s3.client().put_object(Bucket=s3_bucket, Key="in/x", Body=b"abc")
    store = storage.S3Store(s3_bucket, _settings(s3))
    fence = ScriptedFence(1)
    with fenced(fence, "a read"):
        assert store.get_bytes("in/x", 10) == b"abc"  # GET and HEAD pass unchecked
    assert fence.checks == ["a read"]
    check_current("outside")  # no fence: nothing to check, nothing raised
    body = FencedBody(__import__("io").BytesIO(b"xyz"), "w")
    assert body.read() == b"xyz"


def test_the_s3_sockets_reset_on_close_and_bound_their_send_buffer(s3: S3Server,
                                                                   s3_bucket: str) -> None:
    # Given the worker's S3 client after a write (its connection kept in the pool)
    store = storage.S3Store(s3_bucket, _settings(s3))
    store.put_bytes("probe", b"x", "text/plain")
    pools = store.client._endpoint.http_session._manager.pools
    socks = [conn.sock for key in pools.keys() for conn in list(pools[key].pool.queue)
             if conn is not None and conn.sock is not None]
    assert socks, "no pooled connection to inspect"
    for sock in socks:
        # Then a close resets it (unsent bytes dropped, no request finished after a heal) ...
        onoff, linger = struct.unpack("ii", sock.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                            8))
        assert (onoff, linger) == (1, 0)
        # ... and its send buffer is the bounded one (Linux doubles what was asked)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 2 * S3_SEND_BUFFER


def test_the_fence_is_per_thread(s3: S3Server, s3_bucket: str) -> None:
    # A fence set on one thread (a run's writer) does not check another thread's writes
    store = storage.S3Store(s3_bucket, _settings(s3))
    seen: list[BaseException] = []

    def other() -> None:
        try:
            store.put_bytes("other", b"y", "text/plain")
        except BaseException as e:  # noqa: BLE001
            seen.append(e)

    with fenced(ScriptedFence(1), "this thread"):
        t = threading.Thread(target=other)
        t.start()
        t.join(30)
    assert not seen and _exists(s3, s3_bucket, "other")
