"""The public API: what ``import shardspec`` offers, and nothing by accident."""

from __future__ import annotations

import shardspec

PUBLIC = [
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
    "Quantization",
    "QuantizationError",
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


def test_all_is_exactly_the_public_names() -> None:
    assert sorted(shardspec.__all__) == PUBLIC
    assert len(set(shardspec.__all__)) == len(shardspec.__all__)


def test_every_public_name_exists() -> None:
    for name in shardspec.__all__:
        assert hasattr(shardspec, name), name


def test_open_is_open_checkpoint() -> None:
    from shardspec.reader import open_checkpoint

    assert shardspec.open is open_checkpoint


def test_every_error_class_is_a_shardspec_error() -> None:
    errors = [getattr(shardspec, n) for n in PUBLIC if n.endswith("Error")]
    assert all(issubclass(e, shardspec.ShardspecError) for e in errors)
    assert issubclass(shardspec.RequestError, ValueError)


def test_validating_and_the_command_line_do_not_import_torch() -> None:
    """Publishers validate in CI: start-up must not pay for torch until tensors are made."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, shardspec, shardspec.cli; assert 'torch' not in sys.modules; "
            "shardspec.split; assert 'torch' in sys.modules")
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "reference")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
