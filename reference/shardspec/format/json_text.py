"""JSON from outside a manifest (config.json, a safetensors index, a plan or stages file, the
CLI's storage options, a file's ``__metadata__`` entry), parsed under one rule: nesting deeper
than :data:`.limits.MAX_JSON_DEPTH` (the manifest's own bound, SPEC 3.4) is a ``ValueError``
like any other bad JSON, never a ``RecursionError`` from the parser or from code walking the
value later. No real configuration nests past a handful of levels."""

from __future__ import annotations

import json
from typing import Any

from .limits import MAX_JSON_DEPTH

__all__ = ["load_json"]


def load_json(text: str | bytes) -> Any:
    """``json.loads(text)``; ``ValueError`` where it is not JSON or nests too deeply."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def _depth(value: Any) -> int:
    """How deep arrays and objects nest in ``value`` (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(
            item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_JSON_DEPTH:  # past the bound the answer is already known
            stack.extend((child, level + 1) for child in children)
    return deepest
