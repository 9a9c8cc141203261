"""Writing the durable job and cost ledger (``producer.state.ledger``: its layout, the reader).

One record per ended job, written once through the store code of this package (``file://``
confined to ``FRAMEFLEET_FILE_ROOTS``, ``s3://`` through boto3), then named in the job's own
folder (``ledger.json``: the records of each of its ends, newest last).
"""

from __future__ import annotations

import json
import secrets

from producer.errors import InputNotFoundError
from producer.settings import Settings
from producer.state.ledger import LEDGER_LINK, record_name
from producer.wire.results import LedgerRecord
from worker.stores.fence import Fence, fenced
from worker.stores.storage import JobOutput, open_uri

#: How much of an existing link file is read back (it lists one line per end of the job).
MAX_LINK_BYTES = 1024**2


def record_uri(record: LedgerRecord, settings: Settings) -> str:
    """Where ``record`` goes under ``FRAMEFLEET_LEDGER_URI``: a name of its own (a run marks
    it before it writes it: ``worker.concerns.ledger``)."""
    assert settings.ledger_uri is not None
    store, prefix = open_uri(settings.ledger_uri, settings, "FRAMEFLEET_LEDGER_URI")
    name = record_name(record, secrets.token_hex(4))
    return store.uri(f"{prefix.rstrip('/')}/{name}" if prefix.strip("/") else name)


def write_record(record: LedgerRecord, settings: Settings, fence: Fence | None = None,
                 uri: str | None = None) -> str:
    """Store ``record`` at ``uri`` (default: a new ``record_uri``), fenced by the run's
    lease when given; its URI. Raises the store's errors."""
    uri = uri or record_uri(record, settings)
    store, key = open_uri(uri, settings, "FRAMEFLEET_LEDGER_URI")
    # One line: the object is one JSON document and also valid JSON Lines (Athena, DuckDB).
    with fenced(fence, uri):
        store.put_bytes(key, record.model_dump_json().encode() + b"\n", "application/json")
    return uri


def record_landed(uri: str, settings: Settings) -> bool:
    """Whether the record at ``uri`` is stored (a run that marked it may have been lost
    before it wrote it); True when the store cannot tell: a second record is not made then."""
    try:
        store, key = open_uri(uri, settings, "FRAMEFLEET_LEDGER_URI")
        return store.exists(key)
    except Exception:  # noqa: BLE001 - unknown: assume it is there
        return True


def link_record(record: LedgerRecord, uri: str, output_prefix: str, settings: Settings,
                fence: Fence | None = None) -> str:
    """Add ``uri`` to the job folder's ``ledger.json`` (read, append, write: one run of a job
    at a time holds its lease, ``fence``); the link's URI."""
    out = JobOutput(output_prefix, settings, fence)
    entries: list[dict[str, object]] = []
    try:
        entries = list(json.loads(out.get_bytes(LEDGER_LINK, MAX_LINK_BYTES)).get("records", []))
    except (InputNotFoundError, FileNotFoundError, ValueError, AttributeError):
        entries = []  # the first end of this job (or a link nobody can read: start again)
    entries.append({"uri": uri, "status": record.status, "finished_at": record.finished_at})
    body = json.dumps({"key": record.key, "records": entries}, indent=2).encode()
    return out.put_bytes(LEDGER_LINK, body)
