"""A checkpoint read or written under another layout (SPEC 11.3).

- :mod:`~shardspec.reshard.plan`: which source pieces each target rank's pieces come from;
- :mod:`~shardspec.reshard.boxes`: a box of a source piece as byte runs, read coalesced;
- :mod:`~shardspec.reshard.load`: one target rank's tensors, reading only the overlapping
  bytes (``Checkpoint.load_rank(layout=...)``);
- :mod:`~shardspec.reshard.write`: a whole resharded checkpoint, one target rank at a time.

Imports :mod:`shardspec.format`, :mod:`shardspec.storage`, :mod:`shardspec.load` and
:mod:`shardspec.write`. ``reshard``, ``load_resharded`` and ``Resharder`` are loaded on first
use, so that importing the plan alone does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .load import load_resharded
    from .plan import Resharder
    from .write import reshard

__all__ = ["Resharder", "load_resharded", "reshard"]

_LAZY = {"Resharder": "plan", "load_resharded": "load", "reshard": "write"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
