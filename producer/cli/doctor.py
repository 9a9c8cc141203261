"""``framefleet doctor``: a deployment's settings and services, checked one line each.

Each check is a small function of the settings (and of a service it reads) returning a
:class:`Check` with OK, WARN or FAIL; :func:`run_checks` runs them all. FAIL means jobs will be
lost, run twice or refused; WARN means a weaker guarantee than the README's. The command exits
non-zero on any FAIL. Light on purpose: no torch and no worker code (boto3 only for S3).

A development Redis without an append-only file FAILs the persistence check on purpose (a
restart loses the queue); the line says so, and how to make it OK.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import redis

from producer.settings import Settings
from producer.state.broker import Persistence, check_broker_url, same_server

Status = Literal["OK", "WARN", "FAIL"]
#: worker/concerns/lease.py: a job's lease lives this long unless its run renews it.
LEASE_TTL_S = 10
#: A host's job must run again within this long (the README's promise).
RECOVERY_TARGET_S = 15
#: Roots that hand a job most of the machine.
BROAD_ROOTS = {"/", "/etc", "/root", "/home", "/proc", "/sys", "/dev", "/var", "/usr", "/tmp"}


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str


def check_visibility(s: Settings) -> Check:
    """A running job must not be delivered again: the timeout exceeds the hard time limit."""
    hard = s.max_time_limit_s + s.hard_limit_after_s
    if s.visibility_timeout > hard:
        return Check("visibility timeout", "OK",
                     f"{s.visibility_timeout} s > hard time limit {hard} s")
    return Check("visibility timeout", "FAIL",
                 f"{s.visibility_timeout} s <= the longest job's hard limit {hard} s "
                 "(max_time_limit_s + 60): Redis delivers running jobs a second time")


def check_backoff(s: Settings) -> Check:
    """A retry waits in the worker unacknowledged: longer than the timeout, it runs twice."""
    if s.retry_backoff_max_s < s.visibility_timeout:
        return Check("retry back-off", "OK",
                     f"longest retry wait {s.retry_backoff_max_s:g} s < visibility timeout "
                     f"{s.visibility_timeout} s")
    return Check("retry back-off", "FAIL",
                 f"retry_backoff_max_s {s.retry_backoff_max_s:g} s >= visibility timeout "
                 f"{s.visibility_timeout} s: a waiting retry is delivered a second time")


def check_recovery(s: Settings) -> Check:
    """How soon a job of a host that vanished runs again."""
    if s.recovery_period_s == 0:
        return Check("host-loss recovery", "WARN",
                     f"off: a lost host's jobs come back after the visibility timeout "
                     f"({s.visibility_timeout} s)")
    if s.broker_url.startswith("filesystem://"):
        return Check("host-loss recovery", "OK", "embedded mode: one host, nothing to recover")
    if not same_server(s.broker_url, s.backend_url):
        return Check("host-loss recovery", "WARN",
                     "broker and result backend on different Redis servers: no sweep; a lost "
                     f"host's jobs come back after the visibility timeout ({s.visibility_timeout}"
                     " s)")
    bound = max(s.recovery_grace_s, LEASE_TTL_S) + s.recovery_period_s
    status: Status = "OK" if bound <= RECOVERY_TARGET_S else "WARN"
    return Check("host-loss recovery", status,
                 f"a lost host's job is requeued within about {bound:.0f} s (grace "
                 f"{s.recovery_grace_s:g} s, sweep every {s.recovery_period_s:g} s, lease "
                 f"{LEASE_TTL_S} s)")


def in_container() -> bool:
    return Path("/.dockerenv").exists() or Path("/run/.containerenv").exists()


def check_bind(s: Settings, container: bool | None = None) -> Check:
    """/metrics is unauthenticated: loopback unless a container network is in front."""
    addr = s.metrics_addr
    container = in_container() if container is None else container
    where = f"/metrics and the exporter listen on {addr}"
    if addr.is_loopback:
        return Check("bind addresses", "OK", f"{where} (loopback)")
    if container:
        return Check("bind addresses", "OK", f"{where}, inside a container (published ports "
                     "decide who reaches it)")
    return Check("bind addresses", "WARN", f"{where}, outside a container: anyone who reaches "
                 "this host reads them; bind 127.0.0.1 or firewall the ports")


def check_compile_cache(s: Settings) -> Check:
    """The compiled decode graphs' cache folder must be writable when it is set."""
    folder = getattr(s, "compile_cache_dir", None)
    if not folder:
        return Check("compile cache", "OK", "not set (each worker compiles into its own tmp)")
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".doctor-"):
            pass
    except OSError as e:
        return Check("compile cache", "FAIL", f"{folder} is not writable: {e}")
    return Check("compile cache", "OK", f"{folder} is writable")


def check_file_roots(s: Settings) -> Check:
    """Local paths jobs may use: configured roots must exist and not hand out the machine."""
    if s.file_roots is None:
        if s.broker_url.startswith("filesystem://"):
            root = Path(s.data_dir).absolute().parent
            return Check("file roots", "OK", f"embedded mode: {root} (the demo's folder)")
        return Check("file roots", "OK", "none: file:// inputs and outputs are refused")
    roots = s.file_root_list
    if not roots:
        return Check("file roots", "OK", "none: file:// inputs and outputs are refused")
    missing = [r for r in roots if not Path(r).is_dir()]
    if missing:
        return Check("file roots", "FAIL", f"not a folder on this host: {', '.join(missing)}")
    broad = [r for r in roots if os.path.realpath(r) in BROAD_ROOTS]
    if broad:
        return Check("file roots", "WARN", f"{', '.join(broad)}: jobs may read and write "
                     "most of this machine")
    return Check("file roots", "OK", ", ".join(roots))


PERSISTENCE_STATUS: dict[str, Status] = {"aof": "OK", "rdb": "WARN", "none": "FAIL",
                                         "unknown": "WARN"}
PersistenceProbe = Callable[[str], Persistence | None]
#: What a FAIL of persistence means on a laptop, said on the line itself.
DEV_REDIS = ("; expected on a development Redis (redis-server --appendonly yes makes this OK), "
             "never acceptable in production")
WorkersProbe = Callable[[Settings], list[str]]
#: How long the live-workers check waits for pings.
PING_TIMEOUT_S = 2.0


def ping_workers(s: Settings) -> list[str]:
    """The node names of the workers that answer a ping on the settings' broker."""
    from producer.client import Client
    from producer.client.handle import _io
    from producer.client.hints import ping_workers as ping

    client = Client(settings=s)
    try:
        with _io(client.app):
            return list(ping(client.app, PING_TIMEOUT_S))
    finally:
        client.app.close()


def check_workers(s: Settings, probe: WorkersProbe = ping_workers) -> Check:
    """Live workers: who answers a ping now (none: jobs wait in the queue)."""
    if s.broker_url.startswith("filesystem://"):
        return Check("live workers", "OK", "embedded mode: `framefleet demo` starts its own")
    try:
        names = probe(s)
    except Exception as e:  # noqa: BLE001 - the broker check names the cause in detail
        return Check("live workers", "FAIL", f"could not ask: {' '.join(str(e).split())}")
    if not names:
        return Check("live workers", "WARN", f"none answered a ping within {PING_TIMEOUT_S:g} "
                     "s: jobs wait in the queue until one starts (framefleet worker)")
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return Check("live workers", "OK", f"{len(names)} answered a ping: {shown}")


def check_ledger(s: Settings) -> Check:
    """Where the job and cost history is kept beyond Redis."""
    if s.ledger_uri is None:
        return Check("ledger", "WARN", "FRAMEFLEET_LEDGER_URI unset: the job and cost history "
                     "lives in Redis only, and goes with its data and after "
                     "FRAMEFLEET_RESULT_EXPIRES_S")
    return Check("ledger", "OK", f"{s.ledger_uri} (set it on the workers too)")


def check_broker(s: Settings, probe: PersistenceProbe = check_broker_url) -> Check:
    """Redis is the queue: without an append-only file a restart loses queued jobs."""
    try:
        found = probe(s.broker_url)
    except redis.RedisError as e:
        return Check("broker persistence", "FAIL", f"broker unreachable: {e}")
    if found is None:
        return Check("broker persistence", "OK", f"embedded mode: files under {s.data_dir}")
    dev = DEV_REDIS if found.level == "none" else ""
    return Check("broker persistence", PERSISTENCE_STATUS[found.level], found.detail + dev)


def check_s3(s: Settings, output: str | None, client: Any = None) -> Check:
    """Credentials and the output bucket: a probe object is written and read back (the fleet's
    role may Get/PutObject under its prefix, and has no ListBucket)."""
    output = output or getattr(s, "output_prefix", None)
    if not output or not str(output).startswith("s3://"):
        if s.s3_endpoint_url:
            return Check("s3", "WARN", f"endpoint {s.s3_endpoint_url} set, no output prefix to "
                         "probe (pass --output s3://bucket/prefix)")
        return Check("s3", "OK", "not configured")
    bucket, _, prefix = str(output).removeprefix("s3://").partition("/")
    key = f"{prefix.rstrip('/')}/.framefleet-doctor" if prefix else ".framefleet-doctor"
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        return Check("s3", "WARN", "boto3 is not installed here: not checked")
    if client is None:
        if boto3.session.Session().get_credentials() is None:
            return Check("s3", "FAIL", "no AWS credentials found (environment, profile, role)")
        client = boto3.client("s3", endpoint_url=s.s3_endpoint_url, region_name=s.s3_region)
    try:
        client.put_object(Bucket=bucket, Key=key, Body=b"ok")
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "?")
        return Check("s3", "FAIL", f"s3://{bucket}/{key}: {code}: {e}")
    except BotoCoreError as e:
        return Check("s3", "FAIL", f"s3://{bucket}: unreachable: {e}")
    if body != b"ok":
        return Check("s3", "FAIL", f"s3://{bucket}/{key} read back {body!r}")
    return Check("s3", "OK", f"credentials work; wrote and read s3://{bucket}/{key}")


def run_checks(s: Settings, output: str | None = None, *,
               probe: PersistenceProbe = check_broker_url, s3_client: Any = None,
               container: bool | None = None,
               workers: WorkersProbe = ping_workers) -> list[Check]:
    """Every check, in a fixed order."""
    broker = check_broker(s, probe)
    return [
        broker,
        # No ping through a broker that does not answer: its line says why already.
        check_workers(s, workers) if "unreachable" not in broker.detail
        else Check("live workers", "FAIL", "not asked: the broker does not answer"),
        check_visibility(s),
        check_backoff(s),
        check_recovery(s),
        check_s3(s, output, s3_client),
        check_bind(s, container),
        check_compile_cache(s),
        check_file_roots(s),
        check_ledger(s),
    ]


def render(checks: Sequence[Check]) -> str:
    return "\n".join(f"{c.status:<4} {c.name}: {c.detail}" for c in checks)


def to_json(checks: Sequence[Check]) -> str:
    return json.dumps({"ok": exit_code(checks) == 0, "checks": [asdict(c) for c in checks]},
                      indent=2)


def exit_code(checks: Sequence[Check]) -> int:
    return 1 if any(c.status == "FAIL" for c in checks) else 0
