"""Object stores: ``file://`` and ``s3://`` (boto3; S3-compatible via FRAMEFLEET_S3_ENDPOINT_URL).

Keys a job writes are confined under ``{prefix}/{tenant}/{job_id}/`` by :class:`JobOutput`,
which accepts plain file names only. Errors map onto the error tree: missing object → fatal
``InputNotFoundError``; throttling, 5xx and connection loss → retryable ``StorageError``;
configuration errors (no credentials, wrong keys, access denied, no such bucket) → fatal
``StorageConfigError`` at once: a retry would meet the same configuration. ``file://`` paths are
confined to FRAMEFLEET_FILE_ROOTS and read with a byte bound (``worker/stores/paths.py``).
"""

from __future__ import annotations

import io
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any, Protocol

from producer.errors import (
    FatalJobError,
    InputNotFoundError,
    InputTooLarge,
    InvalidJobError,
    StorageConfigError,
    StorageError,
)
from producer.settings import Settings, get_settings
from producer.wire.base import Location, decode_uri
from worker.stores.fence import S3_OP_TIMEOUT_S, Fence, FencedBody, check_current, fenced, harden
from worker.stores.paths import confine, os_error, read_local, writable_target

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: The folders of a job's output (beside its top-level files): ``previews/step-0005.mp4``.
OUTPUT_FOLDERS = ("previews",)
#: Never in a key a store is handed (the same rule as ``producer.wire.base.decode_uri``).
UNSAFE_KEY = re.compile(r"[\x00-\x1f\x7f\\%?#]")
RETRYABLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                   "InternalError", "ServiceUnavailable", "RequestTimeTooSkewed"}
#: S3 error codes that mean the fleet's configuration is wrong: keys, policy, bucket.
CONFIG_CODES = {
    "AccessDenied": "access denied", "403": "access denied",
    "InvalidAccessKeyId": "the access key is not known to the store",
    "SignatureDoesNotMatch": "the secret key does not match the access key",
    "InvalidClientTokenId": "the access key is not known to the store",
    "ExpiredToken": "the credentials have expired",
    "AllAccessDisabled": "access to the bucket is disabled",
    "NoSuchBucket": "no such bucket", "InvalidBucketName": "invalid bucket name",
}


def plain_key(key: str, uri: str, field: str) -> str:
    """``key`` if it is a plain path of names (a second line of defence behind ``locate``: a
    key is built from a decoded prefix and fixed names); else ``InvalidJobError``."""
    if key and (any(p in {"", ".", ".."} for p in key.split("/")) or UNSAFE_KEY.search(key)):
        raise InvalidJobError(f"{field}: {uri!r} is not a plain key: no '.' or '..' segment, "
                              "'//', leading '/', control character, '\\', '%', '?' or '#'")
    return key


class Store(Protocol):
    """A flat key space under one root URI."""

    def uri(self, key: str) -> str: ...
    def put_file(self, key: str, path: Path, content_type: str) -> int:
        """Upload; returns the number of PUT requests it took."""
        ...
    def put_bytes(self, key: str, data: bytes, content_type: str,
                  cache_control: str | None = None) -> int:
        """Upload ``data``; ``cache_control`` is the object's Cache-Control (HTTP readers)."""
        ...
    def get_bytes(self, key: str, max_bytes: int) -> bytes: ...
    def exists(self, key: str) -> bool: ...


class FileStore:
    """A folder. Writes go to a temporary file renamed into place: readers never see halves.

    Every path is confined to FRAMEFLEET_FILE_ROOTS (``worker/stores/paths.py``): a key that
    resolves outside them is refused before any folder is made or any byte read.
    """

    def __init__(self, root: Path, settings: Settings | None = None, field: str = "uri") -> None:
        self.root = root
        self.settings = settings or get_settings()
        self.field = field

    def _path(self, key: str) -> Path:
        return self.root / plain_key(key, f"{self.root.as_uri().rstrip('/')}/{key}", self.field)

    def confined(self, key: str) -> Path:
        """The resolved path of ``key``, or PathRefusedError (same text, exists or not)."""
        return confine(self._path(key), self.settings, field=self.field, uri=self.uri(key))

    def uri(self, key: str) -> str:
        return self._path(key).as_uri()

    def put_file(self, key: str, path: Path, content_type: str) -> int:
        return self.put_bytes(key, path.read_bytes(), content_type)

    def put_bytes(self, key: str, data: bytes, content_type: str,
                  cache_control: str | None = None) -> int:
        # A folder has no headers: cache_control is for stores that serve HTTP.
        uri = self.uri(key)
        target = writable_target(self._path(key), self.settings, field=self.field, uri=uri)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            # The folders exist now: make sure no link among them leads out of the roots.
            target = writable_target(self._path(key), self.settings, field=self.field, uri=uri)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        except OSError as e:
            raise os_error(e, self.field, uri) from None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            check_current(uri)  # the rename is the landing: a fenced write checks right before
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return 1

    def get_bytes(self, key: str, max_bytes: int) -> bytes:
        return read_local(self._path(key), max_bytes, self.settings, field=self.field,
                          uri=self.uri(key))

    def exists(self, key: str) -> bool:
        return self.confined(key).is_file()


_clients: dict[tuple[str | None, str], Any] = {}
_clients_lock = threading.Lock()


def _forget_clients() -> None:
    """In a forked child (a Celery pool process): no client of the parent (its connections
    are the parent's sockets), and a lock no thread of the parent can hold."""
    global _clients_lock
    _clients.clear()
    _clients_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_clients)


def load_s3() -> None:
    """Import boto3 now, in the caller's thread. A thread of the worker's main process that
    imported it lazily while Celery forks a pool process would leave the child a half
    imported ``boto3`` for good ("partially initialized module")."""
    import boto3  # noqa: F401
    import botocore.config  # noqa: F401


def s3_client(settings: Settings) -> Any:
    """One boto3 client per endpoint and process (clients are thread-safe, sessions are not).

    A client made while no credentials could be found is not kept: botocore looks for them
    once, when it makes the client, so a kept one would fail every later job of the process
    with "Unable to locate credentials" after they appeared (a role or a token file mounted
    late, a test that sets them).

    Its writes can be fenced (``worker.stores.fence``): short socket timeouts, sockets that
    close with a reset, and a check of the calling thread's fence before every request."""
    import boto3
    from botocore.config import Config

    key = (settings.s3_endpoint_url, settings.s3_region)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            session = boto3.session.Session()
            client = session.client(
                "s3", endpoint_url=settings.s3_endpoint_url, region_name=settings.s3_region,
                config=Config(
                    retries={"max_attempts": settings.s3_max_attempts, "mode": "standard"},
                    signature_version="s3v4", connect_timeout=S3_OP_TIMEOUT_S,
                    read_timeout=S3_OP_TIMEOUT_S,
                ),
            )
            harden(client)
            if session.get_credentials() is not None:  # what the client found, not a new look
                _clients[key] = client
        return client


def map_s3_error(e: Exception, what: str) -> Exception:
    """botocore exception → the error tree (retryable or fatal), naming the object."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        NoCredentialsError,
        PartialCredentialsError,
        ProfileNotFound,
    )

    if isinstance(e, ClientError):
        code = str(e.response.get("Error", {}).get("Code", ""))
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in {"NoSuchKey", "404", "NotFound"}:
            return InputNotFoundError(f"no such object: {what}")
        if code in CONFIG_CODES:
            return StorageConfigError(f"S3 {code} on {what}: {CONFIG_CODES[code]}")
        if code in RETRYABLE_CODES or status >= 500 or status == 429:
            return StorageError(f"S3 {code or status} on {what}")
        return FatalJobError(f"S3 {code or status} on {what}: {e}")
    if isinstance(e, (NoCredentialsError, PartialCredentialsError, ProfileNotFound)):
        return StorageConfigError(
            f"S3 on {what}: {e} (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, "
            "or an instance role)"
        )
    if isinstance(e, BotoCoreError):
        return StorageError(f"S3 unreachable for {what}: {e}")
    return e


class S3Store:
    """A bucket and key prefix, uploads through boto3's managed transfer (multipart if large)."""

    MULTIPART_THRESHOLD = 64 * 1024**2

    def __init__(self, bucket: str, settings: Settings | None = None, field: str = "uri") -> None:
        self.bucket = bucket
        self.field = field
        try:
            self.client = s3_client(settings or get_settings())
        except Exception as e:  # a profile that is not there, say: the store's configuration
            err = map_s3_error(e, f"s3://{bucket}")
            if err is e:
                raise
            raise err from e

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def _key(self, key: str) -> str:
        """The key boto3 is sent: the decoded one, plain (``plain_key``), never empty."""
        if not key:
            raise InvalidJobError(f"{self.field}: s3://{self.bucket}/ names no object")
        return plain_key(key, self.uri(key), self.field)

    def put_file(self, key: str, path: Path, content_type: str) -> int:
        from boto3.s3.transfer import TransferConfig

        size = path.stat().st_size
        # In the calling thread (no transfer threads): its fence checks every request.
        config = TransferConfig(multipart_threshold=self.MULTIPART_THRESHOLD,
                                multipart_chunksize=self.MULTIPART_THRESHOLD, use_threads=False)
        try:
            with FencedBody(path.open("rb"), self.uri(key)) as body:
                if size < self.MULTIPART_THRESHOLD:  # streamed from the body, chunk by chunk
                    self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=body,
                                           ContentType=content_type)
                else:  # parts land only with the last request, checked before it is sent
                    self.client.upload_fileobj(body, self.bucket, self._key(key), Config=config,
                                               ExtraArgs={"ContentType": content_type})
        except Exception as e:
            raise map_s3_error(e, self.uri(key)) from e
        if size < self.MULTIPART_THRESHOLD:
            return 1
        return -(-size // self.MULTIPART_THRESHOLD) + 2  # parts + create + complete

    def put_bytes(self, key: str, data: bytes, content_type: str,
                  cache_control: str | None = None) -> int:
        extra = {"CacheControl": cache_control} if cache_control else {}
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key),
                                   Body=FencedBody(io.BytesIO(data), self.uri(key)),
                                   ContentType=content_type, **extra)
        except Exception as e:
            raise map_s3_error(e, self.uri(key)) from e
        return 1

    def get_bytes(self, key: str, max_bytes: int) -> bytes:
        key = self._key(key)
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key)
            if int(head["ContentLength"]) > max_bytes:
                raise InputTooLarge(
                    f"{self.uri(key)} is {head['ContentLength']} bytes, over {max_bytes}"
                )
            if int(head["ContentLength"]) == 0:
                return b""  # a range of an empty object is a 416
            # The object may be replaced between the HEAD and the GET: the GET asks for one
            # byte past the limit at most, and the read is bounded the same way.
            body: bytes = self.client.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes=0-{max_bytes}")["Body"].read(
                    max_bytes + 1)
            if len(body) > max_bytes:
                raise InputTooLarge(f"{self.uri(key)} is over {max_bytes} bytes")
            return body
        except InvalidJobError:
            raise
        except Exception as e:
            raise map_s3_error(e, self.uri(key)) from e

    def exists(self, key: str) -> bool:
        """HEAD the key. A 403 counts as absent: without s3:ListBucket (the fleet's role has
        none, by design) S3 answers 403, not 404, for a missing key."""
        from botocore.exceptions import ClientError

        key = self._key(key)
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
            return True
        except ClientError as e:
            if str(e.response.get("Error", {}).get("Code", "")) in {"403", "AccessDenied"}:
                return False
            err = map_s3_error(e, self.uri(key))
            if isinstance(err, InputNotFoundError):
                return False
            raise err from e
        except Exception as e:
            raise map_s3_error(e, self.uri(key)) from e


def locate(uri: str, field: str = "uri") -> Location:
    """``uri`` decoded once (``producer.wire.base.decode_uri``), or ``InvalidJobError`` naming
    ``field``: every store opens the decoded form that the checks saw, never a second decode."""
    try:
        return decode_uri(uri, field=field)
    except ValueError as e:
        raise InvalidJobError(str(e)) from None


def open_uri(uri: str, settings: Settings | None = None,
             field: str = "uri") -> tuple[Store, str]:
    """(store, key) for ``s3://bucket/key`` or ``file:///path`` (key relative to the store).

    The key is the decoded one (``locate``): what boto3 is sent and what the file roots judge.
    """
    loc = locate(uri, field)
    if loc.scheme == "s3":
        return S3Store(loc.bucket, settings, field), loc.key
    store = FileStore(Path("/"), settings, field)
    store.confined(loc.key)  # refused at once, before any work is done
    return store, loc.key


def read_uri(uri: str, max_bytes: int, settings: Settings | None = None,
             field: str = "input.uri") -> bytes:
    store, key = open_uri(uri, settings, field)
    return store.get_bytes(key, max_bytes)


class JobOutput:
    """The only way a job writes: plain names under ``{output}/{tenant}/{job_id}/``, or in one
    of its :data:`OUTPUT_FOLDERS` there. With a ``fence`` (the run's lease), every write lands
    only while the run holds the job's lease (``worker.stores.fence``)."""

    def __init__(self, prefix_uri: str, settings: Settings | None = None,
                 fence: Fence | None = None) -> None:
        self.store, self.prefix = open_uri(prefix_uri, settings, "output.uri")
        self.fence = fence
        self.puts = 0
        self._lock = threading.Lock()  # segments upload from several encoder threads

    def key(self, name: str) -> str:
        folder, slash, base = name.rpartition("/")
        if (slash and folder not in OUTPUT_FOLDERS) or not NAME_RE.fullmatch(base) or (
                ".." in base):
            raise InvalidJobError(f"output name {name!r} is not a plain file name")
        return f"{self.prefix}/{name}" if self.prefix else name

    def uri(self, name: str) -> str:
        return self.store.uri(self.key(name))

    def put_file(self, name: str, path: Path, content_type: str = "video/mp4") -> str:
        with fenced(self.fence, self.uri(name)):
            puts = self.store.put_file(self.key(name), path, content_type)
        with self._lock:
            self.puts += puts
        return self.uri(name)

    def put_bytes(self, name: str, data: bytes, content_type: str = "application/json",
                  cache_control: str | None = None) -> str:
        with fenced(self.fence, self.uri(name)):
            puts = self.store.put_bytes(self.key(name), data, content_type, cache_control)
        with self._lock:
            self.puts += puts
        return self.uri(name)

    def get_bytes(self, name: str, max_bytes: int = 64 * 1024**2) -> bytes:
        return self.store.get_bytes(self.key(name), max_bytes)

    def exists(self, name: str) -> bool:
        return self.store.exists(self.key(name))
