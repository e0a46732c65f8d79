"""shardspec: pre-sharded model checkpoints with a manifest, for per-rank loading.

The data flows one way, one module a step: bytes on disk (:mod:`~shardspec.format.parse`,
:mod:`~shardspec.format.safetensors_header`) -> a checked manifest
(:mod:`~shardspec.format.manifest`, :mod:`~shardspec.format.checks`) -> a plan of reads for a rank
(:mod:`~shardspec.load.plan`) -> tensors on a device (:mod:`~shardspec.load.execute`).
:mod:`~shardspec.write.save` goes the other way.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .format.errors import (
    ExtensionError,
    Finding,
    IntegrityError,
    LayoutError,
    ManifestSyntaxError,
    NotCommittedError,
    PathError,
    QuantizationError,
    RequestError,
    SafetensorsError,
    SchemaError,
    ShardspecError,
    StorageError,
    TensorRecordError,
    VersionError,
)
from .format.manifest import Layout, Logical, Manifest, Quantization, Tie, format_version
from .validate import Report, validate

if TYPE_CHECKING:
    from .reader import Checkpoint, load_rank
    from .reader import open_checkpoint as open
    from .write.save import Shard, data_file_name, save, split

#: Names whose modules import torch: loaded on first use, so that validating a checkpoint (and
#: the command line's start-up) does not pay for importing torch.
_LAZY = {
    "Checkpoint": ("reader", "Checkpoint"),
    "load_rank": ("reader", "load_rank"),
    "open": ("reader", "open_checkpoint"),
    "Shard": ("write.save", "Shard"),
    "data_file_name": ("write.save", "data_file_name"),
    "save": ("write.save", "save"),
    "split": ("write.save", "split"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'shardspec' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "Checkpoint",
    "ExtensionError",
    "Finding",
    "IntegrityError",
    "Layout",
    "LayoutError",
    "Logical",
    "Manifest",
    "ManifestSyntaxError",
    "NotCommittedError",
    "PathError",
    "QuantizationError",
    "Quantization",
    "Report",
    "RequestError",
    "SafetensorsError",
    "SchemaError",
    "Shard",
    "ShardspecError",
    "StorageError",
    "TensorRecordError",
    "Tie",
    "VersionError",
    "__version__",
    "data_file_name",
    "format_version",
    "load_rank",
    "open",
    "save",
    "split",
    "validate",
]
