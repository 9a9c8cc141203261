"""The durable job and cost ledger: where its records lie, and reading them back.

Every job that ends (success, failure, cancel) leaves one ``LedgerRecord``
(``producer.wire.results``), written once by the worker that ended it (``worker/sinks/ledger.py``),
under ``FRAMEFLEET_LEDGER_URI`` (``s3://bucket/prefix`` or ``file:///folder``)::

    {ledger}/day=2026-12-01/tenant=acme/221430123-clip-42-3f2a1b9c.json

- **Partitioned by day (UTC, of the end) and tenant**, in Hive's ``key=value`` form: a month's
  report lists one prefix (``day=2026-12-``), and DuckDB (``hive_partitioning``) and Athena
  (partition projection) read ``day`` and ``tenant`` as columns.
- **One JSON object per file, on one line.** An object store cannot append, and a record
  written once is never rewritten, so a job end costs one PUT and no two workers ever write
  the same object; a one-line object is also valid JSON Lines, which both tools read.
- The name starts with the end's time (``HHMMSSmmm``), then the job_id and a random token:
  listings come in time order within a partition, and a job's records are found by name.

The job's own folder links to its records: ``{output}/{tenant}/{job_id}/ledger.json``
(``LEDGER_LINK``). Redis can lose its data; the ledger keeps the history.

Reading needs boto3 for an ``s3://`` ledger (the ``ops`` extra); it is imported only then.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from producer.errors import LedgerError
from producer.settings import Settings
from producer.wire.base import decode_uri
from producer.wire.results import LedgerRecord

#: The file in a job's folder that names its ledger records.
LEDGER_LINK = "ledger.json"
#: ``HHMMSSmmm-{job_id}-{token}.json``.
NAME_RE = re.compile(r"^(?P<time>\d{9})-(?P<job_id>.+)-(?P<token>[0-9a-f]{8})\.json$")
#: GETs in flight when reading many records from S3.
READ_THREADS = 16


def _utc(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC)


def record_name(record: LedgerRecord, token: str) -> str:
    """The record's path under the ledger's prefix."""
    when = _utc(record.finished_at)
    stamp = when.strftime("%H%M%S") + f"{when.microsecond // 1000:03d}"
    return (f"day={when:%Y-%m-%d}/tenant={record.tenant}/"
            f"{stamp}-{record.job_id}-{token}.json")


def day_prefixes(since: float, until: float) -> list[str]:
    """``day=YYYY-MM-DD/`` of every UTC day from ``since`` to ``until``."""
    first, last = _utc(since).date(), _utc(until).date()
    days = (last - first).days
    return [f"day={first + dt.timedelta(days=i):%Y-%m-%d}/" for i in range(days + 1)]


class LedgerReader:
    """Lists and reads the records under one ledger URI."""

    def __init__(self, uri: str, settings: Settings) -> None:
        try:  # decoded once, as the writing worker's store decodes it
            loc = decode_uri(uri, field="FRAMEFLEET_LEDGER_URI")
        except ValueError as e:
            raise LedgerError(str(e)) from None
        self.uri = uri.rstrip("/")
        self.scheme = loc.scheme
        if loc.scheme == "file":
            self.root = Path(loc.path)
        else:
            self.bucket = loc.bucket
            self.prefix = loc.key
            self.client = _s3_client(settings)

    # --- listing --------------------------------------------------------------------------

    def _list(self, prefix: str) -> Iterator[str]:
        """Record paths (relative to the ledger) under ``prefix``."""
        if self.scheme == "file":
            base = self.root / prefix
            folder = base if prefix.endswith("/") or not prefix else base.parent
            if not folder.is_dir():
                return
            for path in sorted(folder.rglob("*.json")):
                rel = path.relative_to(self.root).as_posix()
                if rel.startswith(prefix):
                    yield rel
            return
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full)
            for page in pages:
                for item in page.get("Contents", ()):
                    yield str(item["Key"])[len(self.prefix) + 1 if self.prefix else 0:]
        except Exception as e:
            raise _s3_error(e, f"s3://{self.bucket}/{full}") from e

    def names(self, since: float | None, until: float | None,
              tenant: str | None = None) -> Iterator[str]:
        """Record paths ended in [since, until] (by day; the records' times filter finer),
        of ``tenant`` when given, oldest day first."""
        if since is None:
            prefixes: Iterable[str] = ["day="]
        else:
            prefixes = day_prefixes(since, until if until is not None else _now())
        for prefix in prefixes:
            for name in self._list(prefix):
                if tenant is None or f"/tenant={tenant}/" in f"/{name}":
                    yield name

    # --- reading --------------------------------------------------------------------------

    def read(self, name: str) -> LedgerRecord | None:
        """One record, or None when it does not validate (logged by the caller's count)."""
        if self.scheme == "file":
            data = (self.root / name).read_bytes()
        else:
            key = f"{self.prefix}/{name}" if self.prefix else name
            try:
                data = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            except Exception as e:
                raise _s3_error(e, f"s3://{self.bucket}/{key}") from e
        try:
            return LedgerRecord.model_validate_json(data)
        except ValidationError:
            return None

    def records(self, since: float | None = None, until: float | None = None,
                tenant: str | None = None, job_id: str | None = None) -> list[LedgerRecord]:
        """Records that ended in [since, until], oldest first; ``job_id`` picks one job's."""
        names = [n for n in self.names(since, until, tenant)
                 if job_id is None or _job_of(n) == job_id]
        with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
            found = [r for r in pool.map(self.read, names) if r is not None]
        return sorted((r for r in found if (since is None or r.finished_at >= since)
                       and (until is None or r.finished_at <= until)),
                      key=lambda r: r.finished_at)


def _job_of(name: str) -> str | None:
    match = NAME_RE.match(name.rsplit("/", 1)[-1])
    return None if match is None else match.group("job_id")


def _now() -> float:
    return dt.datetime.now(tz=dt.UTC).timestamp()


def _s3_client(settings: Settings) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError as e:
        raise LedgerError("reading an s3:// ledger needs boto3: pip install "
                          "'framefleet[ops]'") from e
    return boto3.client(
        "s3", endpoint_url=settings.s3_endpoint_url, region_name=settings.s3_region,
        config=Config(retries={"max_attempts": settings.s3_max_attempts, "mode": "standard"},
                      signature_version="s3v4", connect_timeout=5, read_timeout=60))


def _s3_error(e: Exception, where: str) -> LedgerError:
    """botocore's error as one line naming the object (no retry: botocore retried)."""
    return LedgerError(f"ledger {where}: {type(e).__name__}: {e}")


def open_ledger(settings: Settings, uri: str | None = None) -> LedgerReader | None:
    """The reader of ``uri`` (default ``FRAMEFLEET_LEDGER_URI``); None when neither is set."""
    uri = uri or settings.ledger_uri
    if uri is None:
        return None
    return LedgerReader(uri, settings)
