"""shardspec: pre-sharded model checkpoints with a manifest, for per-rank loading.

The data flows one way, one module a step: bytes on disk (:mod:`~shardspec.parse`,
:mod:`~shardspec.safetensors_header`) -> a checked manifest (:mod:`~shardspec.manifest`,
:mod:`~shardspec.checks`) -> a plan of reads for a rank (:mod:`~shardspec.plan`) -> tensors on a
device (:mod:`~shardspec.load`). :mod:`~shardspec.writer` goes the other way.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import (
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
    TensorRecordError,
    VersionError,
)
from .manifest import Layout, Logical, Manifest, Quantization, format_version
from .reader import Checkpoint, load_rank
from .reader import open_checkpoint as open
from .validate import Report, validate
from .writer import Shard, data_file_name, save, split

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
    "TensorRecordError",
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
