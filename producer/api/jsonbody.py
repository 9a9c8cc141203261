"""Request bodies as JSON, bounded in depth as well as in size (``bodylimit``).

A JobSpec is four levels deep. A body of ``[`` × 2000 is 2 KB, well under the size limit,
and made ``json.loads`` raise ``RecursionError``, which no handler took: a plain-text 500, and
the connection closed. Here any body nested past ``MAX_DEPTH`` is a 400 naming the body,
whether the parser gave up on it or parsed it: nothing after this reads a deep structure.
"""

from __future__ import annotations

import json
from typing import Any

from producer.errors import ApiRequestError

#: Deepest nesting of arrays and objects a request body may have (a JobSpec needs 4).
MAX_DEPTH = 32


def _bad(message: str) -> ApiRequestError:
    return ApiRequestError(400, "invalid_json", f"body: {message}", "body")


def _depth(data: Any) -> int:
    """How deep ``data`` nests (a scalar: 0), without recursion."""
    deepest, todo = 0, [(data, 0)]
    while todo:
        node, level = todo.pop()
        if isinstance(node, dict | list):
            level += 1
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                return level  # enough to refuse it
            todo.extend((child, level) for child in
                        (node.values() if isinstance(node, dict) else node))
    return deepest


def parse_json(raw: bytes) -> Any:
    """The body as JSON (an empty body: None), or a 400 naming the body."""
    try:
        data = json.loads(raw or b"null")
    except RecursionError:
        raise _bad(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:  # JSONDecodeError, and UnicodeDecodeError of a non-UTF body
        where = f" (line {e.lineno}, column {e.colno})" if isinstance(e, json.JSONDecodeError) \
            else ""
        raise _bad(f"not JSON{where}") from None
    if _depth(data) > MAX_DEPTH:
        raise _bad(f"nested deeper than {MAX_DEPTH} levels")
    return data
