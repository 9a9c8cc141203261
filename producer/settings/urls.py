"""The broker and result-backend URLs: which schemes the fleet runs on, checked before use.

A URL Celery cannot use must fail as one line naming the variable, not as a traceback from
deep inside kombu (``No module named '127'`` for ``127.0.0.1:6379``, ``Unknown result
backend: 'http'``) or a worker that restarts for ever. Passwords never appear in a message:
``mask`` replaces them first.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

#: Schemes a broker URL may have: Redis (plain, TLS, behind Sentinel) and the embedded mode.
BROKER_SCHEMES = ("redis", "rediss", "sentinel", "filesystem")
#: Schemes a result backend URL may have (``db+sqlite`` is the embedded mode's).
BACKEND_SCHEMES = ("redis", "rediss", "sentinel", "db+sqlite")
#: The Redis schemes: a host is required, the path is a database number.
REDIS_LIKE = ("redis", "rediss", "sentinel")
#: ``sentinel://h1:26379;sentinel://h2:26379``: one URL per Sentinel, kombu's and Celery's form.
SENTINEL_SEPARATOR = ";"
DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "sentinel": 26379}

_USERINFO = re.compile(r"^(?P<head>(?:[A-Za-z][A-Za-z0-9+.-]*://)?[^/@;]*?:)[^/@;]*@")


def mask(url: str) -> str:
    """``url`` with every password replaced by ``***`` (each ``;``-separated part)."""
    return SENTINEL_SEPARATOR.join(
        _USERINFO.sub(lambda m: m.group("head") + "***@", part)
        for part in url.split(SENTINEL_SEPARATOR)
    )


def _hint(url: str) -> str:
    """What to write instead of a URL without a scheme."""
    host = url.rsplit("@", 1)[-1].split("/", 1)[0]
    if re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+:\d+|[A-Za-z0-9.\-]+", host or "-"):
        return f"no scheme: did you mean redis://{host}/0 ?"
    return "no scheme: write redis://HOST:PORT/DB (or rediss://, sentinel://)"


def _check_redis_part(part: str, scheme: str) -> str | None:
    try:
        split = urlsplit(part)
        port = split.port
    except ValueError as e:
        return f"not a valid URL ({e})"
    if not split.hostname:
        return f"no host: write {scheme}://HOST:{DEFAULT_PORTS[scheme]}/0"
    if port == 0:
        return "port 0 is not a port"
    db = split.path.strip("/")
    if db and not db.isdigit():
        return f"the path must be a database number (/0), not /{db}"
    return None


def url_problem(url: str, schemes: tuple[str, ...], sentinel_master: str | None) -> str | None:
    """Why ``url`` cannot serve (a short phrase), or None when it can."""
    if not url.strip():
        return "empty"
    if "://" not in url:
        return _hint(url)
    scheme = url.split("://", 1)[0].lower()
    if scheme not in schemes:
        allowed = ", ".join(f"{s}://" for s in schemes)
        return f"scheme {scheme}:// is not supported (use one of {allowed})"
    if scheme not in REDIS_LIKE:
        return None
    parts = url.split(SENTINEL_SEPARATOR)
    if scheme != "sentinel" and len(parts) > 1:
        return "';' separates Sentinels: only sentinel:// URLs may list several"
    for part in parts:
        if part.split("://", 1)[0].lower() != scheme:
            return f"every ';'-separated part must be a {scheme}:// URL"
        problem = _check_redis_part(part, scheme)
        if problem:
            return problem
    if scheme == "sentinel" and not sentinel_master:
        return ("a sentinel:// URL needs FRAMEFLEET_SENTINEL_MASTER, the name the Sentinels "
                "monitor the primary under")
    return None


def check_urls(broker_url: str, result_backend: str | None,
               sentinel_master: str | None) -> None:
    """Raise ``ValueError`` naming the variable, its masked value and the problem."""
    checks = [("FRAMEFLEET_BROKER_URL", broker_url, BROKER_SCHEMES)]
    if result_backend is not None:
        checks.append(("FRAMEFLEET_RESULT_BACKEND", result_backend, BACKEND_SCHEMES))
    for name, url, schemes in checks:
        problem = url_problem(url, schemes, sentinel_master)
        if problem:
            raise ValueError(f"{name}={mask(url)!r}: {problem}")
