"""Placement plans kept between starts, so that a second start of the same engine on the same
checkpoint skips the recording.

A plan is a pure function of what :func:`plan_key` hashes: the vLLM and shardspec versions,
the model class, its config, its parameters' names, shapes and dtypes, the worker's place in
the engine's layout, and the manifest's bytes. The cache is a directory of
``<key>.json`` files (written whole, then renamed into place), by default
``$SHARDSPEC_CACHE_DIR/vllm-plans`` or ``~/.cache/shardspec/vllm-plans``; never the checkpoint
unless the user names it. A file that cannot be read back as a plan is recorded again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .placements import PLAN_VERSION, PlacementPlan

__all__ = ["default_cache_dir", "load_plan", "plan_key", "store_plan"]


def default_cache_dir() -> Path:
    root = os.environ.get("SHARDSPEC_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "shardspec"
    return base / "vllm-plans"


def plan_key(parts: Mapping[str, Any]) -> str:
    """SHA-256 of ``parts`` (JSON-able) as canonical JSON, with the plan format's version."""
    text = json.dumps({"plan_version": PLAN_VERSION, **parts}, sort_keys=True, default=str,
                      separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def load_plan(directory: Path, key: str) -> PlacementPlan | None:
    """The plan stored under ``key``, or None (absent, unreadable, or not a plan)."""
    try:
        data = json.loads((directory / f"{key}.json").read_text())
        if data.get("key") != key:
            return None
        return PlacementPlan.from_dict(data["plan"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def store_plan(directory: Path, key: str, plan: PlacementPlan) -> Path | None:
    """Write ``plan`` under ``key``; None where the directory cannot be written (the load goes
    on without a cache: it is an optimisation, never a requirement)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{key}.", suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            json.dump({"key": key, "plan": plan.to_dict()}, out, separators=(",", ":"))
        final = directory / f"{key}.json"
        os.replace(temporary, final)
        return final
    except OSError:
        return None
