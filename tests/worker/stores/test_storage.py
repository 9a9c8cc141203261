"""Object stores: a real folder, and a real SeaweedFS S3 endpoint with SigV4 on loopback.

The rule under test throughout: every store error lands on the error tree, so the task knows
whether to retry (throttling, 5xx, no connection) or to fail at once (missing input, denied).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    ProfileNotFound,
)

from producer.errors import (
    FatalJobError,
    InputNotFoundError,
    InputTooLarge,
    InvalidJobError,
    RetryableError,
    StorageConfigError,
    StorageError,
)
from producer.settings import Settings
from tests.services import S3Server, free_port
from worker.sinks.hls import CACHE_CONTROL, CONTENT_TYPE
from worker.stores import storage
from worker.stores.storage import FileStore, JobOutput, S3Store, map_s3_error, open_uri, read_uri

# file:// paths are confined to FRAMEFLEET_FILE_ROOTS: the test's own folder is one.
pytestmark = pytest.mark.usefixtures("file_roots")

# --- file:// ----------------------------------------------------------------------------------


def test_file_store_round_trip_leaves_no_temporary_file(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    assert store.put_bytes("a/b/seg.mp4", b"data", "video/mp4") == 1
    assert store.get_bytes("a/b/seg.mp4", max_bytes=4) == b"data"
    assert store.exists("a/b/seg.mp4") and not store.exists("a/b/other.mp4")
    # Written by rename: only the final file is in the folder, never a half-written one.
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["seg.mp4"]
    assert store.uri("a/b/seg.mp4") == (tmp_path / "a" / "b" / "seg.mp4").as_uri()


def test_file_store_missing_and_oversized_files(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    with pytest.raises(InputNotFoundError, match="no such file: file://") as missing:
        store.get_bytes("absent.npy", max_bytes=10)
    assert isinstance(missing.value, FileNotFoundError)  # builtin kept for plain callers
    (tmp_path / "big.npy").write_bytes(b"x" * 11)
    with pytest.raises(InvalidJobError, match=r"big\.npy is 11 bytes, over the 10 byte limit"):
        store.get_bytes("big.npy", max_bytes=10)


def test_open_uri_picks_the_store_and_refuses_other_schemes(tmp_path: Path) -> None:
    store, key = open_uri((tmp_path / "in put.npy").as_uri())
    assert isinstance(store, FileStore) and "/" + key == str(tmp_path / "in put.npy")
    (tmp_path / "in put.npy").write_bytes(b"latents")
    assert read_uri((tmp_path / "in put.npy").as_uri(), max_bytes=100) == b"latents"
    for uri in ("http://127.0.0.1/x.npy", "ftp://host/x", "relative/path.npy"):
        with pytest.raises(InvalidJobError, match="^uri: scheme must be s3:// or file://"):
            open_uri(uri)


@pytest.mark.parametrize("name", ["../up", "a/b.mp4", "..", "a..b", ".hidden", "", "x" * 129,
                                  "previews/../up", "previews//x.mp4", "previews/", "/x.mp4",
                                  "previews/a/b.mp4", "previews/.hidden", "segments/x.mp4",
                                  "previews/..", "previews/%2e%2e"])
def test_job_output_accepts_plain_names_only(tmp_path: Path, name: str) -> None:
    out = JobOutput((tmp_path / "out" / "acme" / "j1").as_uri())
    with pytest.raises(InvalidJobError, match="is not a plain file name"):
        out.put_bytes(name, b"x")
    assert not (tmp_path / "out").exists()  # nothing was written anywhere


def test_job_output_writes_previews_in_their_folder(tmp_path: Path) -> None:
    out = JobOutput((tmp_path / "out" / "acme" / "j1").as_uri())
    uri = out.put_bytes("previews/step-0005.mp4", b"clip", "video/mp4")
    assert uri == (tmp_path / "out" / "acme" / "j1" / "previews" / "step-0005.mp4").as_uri()
    out.put_bytes("previews/latest.mp4", b"one", "video/mp4")
    out.put_bytes("previews/latest.mp4", b"two", "video/mp4")  # replaced whole
    assert out.get_bytes("previews/latest.mp4") == b"two" and out.puts == 3
    assert sorted(p.name for p in (tmp_path / "out" / "acme" / "j1" / "previews").iterdir()) == [
        "latest.mp4", "step-0005.mp4"]  # no temporary file left behind


def test_job_output_writes_under_its_prefix_and_counts_puts(tmp_path: Path) -> None:
    out = JobOutput((tmp_path / "out" / "acme" / "j1").as_uri())
    segment = tmp_path / "seg.mp4"
    segment.write_bytes(b"mp4")
    uri = out.put_file("segment-00000.mp4", segment)
    out.put_bytes("manifest.json", b"{}")
    assert uri == (tmp_path / "out" / "acme" / "j1" / "segment-00000.mp4").as_uri()
    assert (tmp_path / "out" / "acme" / "j1" / "manifest.json").read_bytes() == b"{}"
    assert out.exists("manifest.json") and not out.exists("full.mp4")
    assert out.get_bytes("segment-00000.mp4") == b"mp4"
    assert out.puts == 2


# --- S3 errors onto the error tree -------------------------------------------------------------


def _client_error(code: str, status: int) -> ClientError:
    response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "GetObject")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("NoSuchKey", 404, InputNotFoundError),
        ("404", 404, InputNotFoundError),
        ("SlowDown", 503, StorageError),
        ("RequestTimeout", 400, StorageError),
        ("", 500, StorageError),
        ("TooManyRequests", 429, StorageError),
        ("AccessDenied", 403, StorageConfigError),
        ("NoSuchBucket", 404, StorageConfigError),
        ("InvalidAccessKeyId", 403, StorageConfigError),
        ("SignatureDoesNotMatch", 403, StorageConfigError),
        ("MalformedXML", 400, FatalJobError),
    ],
)
def test_s3_errors_map_onto_the_tree(code: str, status: int, kind: type[Exception]) -> None:
    mapped = map_s3_error(_client_error(code, status), "s3://b/k")
    assert type(mapped) is kind
    assert "s3://b/k" in str(mapped)
    assert isinstance(mapped, RetryableError) == (kind is StorageError)


def test_connection_errors_are_retryable_and_others_pass_through() -> None:
    lost = map_s3_error(EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), "s3://b/k")
    assert isinstance(lost, StorageError) and "unreachable" in str(lost)
    bug = KeyError("not a store error")
    assert map_s3_error(bug, "s3://b/k") is bug


def test_missing_credentials_are_a_configuration_error_not_a_transient_one() -> None:
    mapped = map_s3_error(NoCredentialsError(), "s3://b/k")
    assert isinstance(mapped, StorageConfigError) and not isinstance(mapped, RetryableError)
    assert "s3://b/k" in str(mapped) and "AWS_ACCESS_KEY_ID" in str(mapped)
    assert isinstance(map_s3_error(ProfileNotFound(profile="gone"), "s3://b/k"),
                      StorageConfigError)


# --- s3:// against SeaweedFS -------------------------------------------------------------------

StoreFactory = Callable[..., S3Store]


@pytest.fixture
def s3_store(
    s3: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[StoreFactory]:
    """``make(secret_key=None, endpoint=None)``: an S3Store on the test bucket, built the way a
    worker builds it (settings and the AWS_* environment), with a fresh client cache."""
    monkeypatch.setattr(storage, "_clients", {})

    def make(secret_key: str | None = None, endpoint: str | None = None,
             access_key: str | None = None, bucket: str | None = None,
             attempts: int = 1) -> S3Store:
        storage._clients.clear()
        # boto3's default session keeps the credentials it resolved first: start a new one.
        monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", access_key or s3.access_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret_key or s3.secret_key)
        settings = Settings(
            s3_endpoint_url=endpoint or s3.endpoint_url, s3_region=s3.region,
            s3_max_attempts=attempts,
        )
        return S3Store(bucket or s3_bucket, settings)

    yield make


def test_s3_round_trip_through_settings(s3_store: StoreFactory, s3: S3Server) -> None:
    store = s3_store()
    assert store.put_bytes("out/acme/j1/manifest.json", b'{"a": 1}', "application/json") == 1
    assert store.exists("out/acme/j1/manifest.json")
    assert store.get_bytes("out/acme/j1/manifest.json", max_bytes=8) == b'{"a": 1}'
    head = s3.client().head_object(Bucket=store.bucket, Key="out/acme/j1/manifest.json")
    assert head["ContentType"] == "application/json"
    assert "CacheControl" not in head
    assert store.uri("k") == f"s3://{store.bucket}/k"
    # The live playlist's header (a CDN in front of the bucket must revalidate it)
    store.put_bytes("out/acme/j1/index.m3u8", b"#EXTM3U\n", CONTENT_TYPE, CACHE_CONTROL)
    head = s3.client().head_object(Bucket=store.bucket, Key="out/acme/j1/index.m3u8")
    assert (head["ContentType"], head["CacheControl"]) == (CONTENT_TYPE, "no-cache")


def test_s3_missing_key_is_absent_and_a_missing_input(s3_store: StoreFactory) -> None:
    store = s3_store()
    assert not store.exists("no/such/key")
    with pytest.raises(InputNotFoundError, match=r"no such object: s3://.*/no/such/key"):
        store.get_bytes("no/such/key", max_bytes=10)


def test_s3_oversized_object_is_refused_before_it_is_read(s3_store: StoreFactory) -> None:
    store = s3_store()
    store.put_bytes("big.npy", b"x" * 2048, "application/octet-stream")
    with pytest.raises(InvalidJobError, match="is 2048 bytes, over 1024"):
        store.get_bytes("big.npy", max_bytes=1024)


def test_s3_read_is_bounded_even_when_the_object_grows_after_its_head(
    s3_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an object replaced by a bigger one between the HEAD and the GET (the HEAD's answer
    # is the old object's), and an empty object
    store = s3_store()
    store.put_bytes("grown.npy", b"x" * 4096, "application/octet-stream")
    store.put_bytes("empty.npy", b"", "application/octet-stream")
    head = store.client.head_object
    monkeypatch.setattr(store.client, "head_object",
                        lambda **kw: {**head(**kw), "ContentLength": 10}
                        if kw["Key"] == "grown.npy" else head(**kw))
    # Then the GET reads one byte past the limit at most, and refuses
    with pytest.raises(InputTooLarge, match="grown.npy is over 1024 bytes"):
        store.get_bytes("grown.npy", max_bytes=1024)
    # and an empty object reads as empty (a range of it would be a 416)
    assert store.get_bytes("empty.npy", max_bytes=1024) == b""


def test_s3_403_on_head_means_absent(s3_store: StoreFactory, s3: S3Server) -> None:
    # S3 answers a HEAD of a missing key with 403, not 404, to a role without s3:ListBucket
    # (the fleet's role, by design). A HEAD has no body, so botocore's code is just "403";
    # SeaweedFS gives the same bare 403 to a request it refuses, as here to a wrong key.
    s3.client().put_object(Bucket=s3_store().bucket, Key="kept.mp4", Body=b"x")
    refused = s3_store(secret_key="not-the-secret")
    with pytest.raises(ClientError) as raw:
        refused.client.head_object(Bucket=refused.bucket, Key="kept.mp4")
    assert raw.value.response["Error"]["Code"] == "403"
    # Then exists() says "absent" (the job runs rather than reusing) ...
    assert refused.exists("kept.mp4") is False
    # ... but reading or writing with that 403 fails the job at once, with no retry loop.
    with pytest.raises(FatalJobError, match="S3 403") as read:
        refused.get_bytes("kept.mp4", max_bytes=10)
    assert not isinstance(read.value, RetryableError)
    with pytest.raises(StorageConfigError, match="SignatureDoesNotMatch"):
        refused.put_bytes("new.json", b"{}", "application/json")


def _fails_at_once(call: Callable[[], object]) -> StorageConfigError:
    """``call`` raises StorageConfigError (fatal, not retryable) within two seconds, even
    with botocore allowed five attempts."""
    t0 = time.monotonic()
    with pytest.raises(StorageConfigError) as info:
        call()
    assert time.monotonic() - t0 < 2.0
    assert not isinstance(info.value, RetryableError)
    return info.value


def test_s3_configuration_errors_are_fatal_at_once(
    s3_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A key the store does not know
    unknown = s3_store(access_key="AKIANOTAKEY000000000", attempts=5)
    err = _fails_at_once(lambda: unknown.put_bytes("k.json", b"{}", "application/json"))
    assert "InvalidAccessKeyId" in str(err) or "access denied" in str(err)
    # A bucket that does not exist, as SeaweedFS answers a GET there (an admin's PUT would
    # create the bucket on SeaweedFS; AWS answers it NoSuchBucket, as the table above maps)
    missing = s3_store(bucket="ff-no-such-bucket", attempts=5)

    def get_from_missing_bucket() -> None:
        try:
            missing.client.get_object(Bucket=missing.bucket, Key="k.npy")
        except ClientError as e:
            raise map_s3_error(e, missing.uri("k.npy")) from e

    err = _fails_at_once(get_from_missing_bucket)
    assert "NoSuchBucket" in str(err) and "s3://ff-no-such-bucket/k.npy" in str(err)
    assert "no such bucket" in str(err)
    # No credentials at all (and no metadata service to ask: nothing leaves loopback)
    s3_store()
    storage._clients.clear()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    anonymous = S3Store(unknown.bucket, Settings(
        s3_endpoint_url=unknown.client.meta.endpoint_url, s3_region="us-east-1",
        s3_max_attempts=5))
    err = _fails_at_once(lambda: anonymous.put_bytes("k.json", b"{}", "application/json"))
    assert "Unable to locate credentials" in str(err)


def test_s3_put_file_counts_multipart_requests(
    s3_store: StoreFactory, s3: S3Server, tmp_path: Path
) -> None:
    store = s3_store()
    store.MULTIPART_THRESHOLD = 5 * 1024**2  # S3's smallest part, so the test stays small
    body = os.urandom(11 * 1024**2)
    path = tmp_path / "segment.mp4"
    path.write_bytes(body)
    # Three parts, plus CreateMultipartUpload and CompleteMultipartUpload: five billed PUTs.
    assert store.put_file("big/segment.mp4", path, "video/mp4") == 5
    got = s3.client().get_object(Bucket=store.bucket, Key="big/segment.mp4")
    assert got["ContentType"] == "video/mp4" and got["Body"].read() == body
    small = tmp_path / "small.mp4"
    small.write_bytes(b"mp4")
    assert store.put_file("small.mp4", small, "video/mp4") == 1


def test_s3_unreachable_endpoint_is_retryable(s3_store: StoreFactory) -> None:
    # Nothing listens on a fresh free loopback port: the connection is refused at once.
    store = s3_store(endpoint=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(StorageError, match="S3 unreachable"):
        store.put_bytes("k", b"x", "application/json")
    with pytest.raises(StorageError, match="S3 unreachable"):
        store.exists("k")


def test_s3_client_is_one_per_endpoint_and_region(s3_store: StoreFactory, s3: S3Server) -> None:
    s3_store()  # credentials for this server
    storage._clients.clear()
    settings = Settings(s3_endpoint_url=s3.endpoint_url, s3_region=s3.region, s3_max_attempts=3)
    first = storage.s3_client(settings)
    assert storage.s3_client(settings.model_copy(update={"s3_max_attempts": 7})) is first
    other = storage.s3_client(settings.model_copy(update={"s3_region": "eu-west-1"}))
    assert other is not first and other.meta.region_name == "eu-west-1"
    # botocore counts the first try too: 3 retries are 4 attempts in all.
    assert first.meta.config.retries == {"mode": "standard", "total_max_attempts": 4}


def test_a_forked_child_makes_its_own_s3_client(
        s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Celery pool process is forked from the worker's main process: it must not use the
    parent's client (its connections are the parent's sockets), nor a lock the parent held."""
    monkeypatch.setattr(storage, "_clients", {})
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)  # a client without them is not kept
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
    settings = Settings(s3_endpoint_url=s3.endpoint_url, s3_region=s3.region)
    parent = storage.s3_client(settings)
    read, write = os.pipe()
    with storage._clients_lock:  # held by a thread of the parent at the fork
        pid = os.fork()
    if pid == 0:  # the child: a fresh lock and a client of its own
        try:
            ok = storage.s3_client(settings) is not parent and not storage._clients_lock.locked()
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    assert storage.s3_client(settings) is parent


def test_a_client_made_before_there_were_credentials_is_not_kept(
        s3: S3Server, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore looks for credentials once, when it makes a client: a kept client made without
    them failed every later job of the process (a test in the same process: CI failure)."""
    monkeypatch.setattr(storage, "_clients", {})
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role looked for
    settings = Settings(s3_endpoint_url=s3.endpoint_url, s3_region=s3.region, s3_max_attempts=1)
    # Given a store used while the process has no credentials
    with pytest.raises(StorageConfigError, match="AWS_ACCESS_KEY_ID"):
        S3Store(s3_bucket, settings).put_bytes("k", b"x", "text/plain")
    # When they appear, the next store of the same endpoint uses them
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
    assert S3Store(s3_bucket, settings).put_bytes("k", b"x", "text/plain") == 1
    assert storage.s3_client(settings) is storage.s3_client(settings)  # and it is kept
