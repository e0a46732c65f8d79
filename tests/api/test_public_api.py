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
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2] / "reference")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# --- the documented submodules -----------------------------------------------------------------

#: What each documented submodule exports, as of the package layout along the data path.
SUBMODULES = {
    "shardspec.convert": ["EMBEDDING_NAMES", "Imported", "LM_HEAD", "NAME_STYLES", "Progress",
                          "convert", "hf_extra_files", "import_directory",
                          "import_hf_distributed", "import_vllm", "merge"],
    "shardspec.reshard": ["Resharder", "load_resharded", "reshard"],
    "shardspec.integrations.dcp": ["OBJECTS_KEY", "Reader", "Writer"],
    "shardspec.distributed": ["DEFAULT_TIMEOUT", "DistributedError", "DistributedLoadError",
                              "DistributedSaveError", "load", "save"],
    "shardspec.testing": [
        "CheckResult", "CheckpointSpec", "CommandReader", "DEFAULT_TIMEOUT", "GeneratedCheckpoint",
        "IGNORE_EXTENSIONS_ENV", "Mutation", "Outcome", "PROFILE_ENV", "PythonReader",
        "RankTensors", "Reader", "SuiteResult", "TensorData", "broken_checkpoints",
        "checkpoint_specs", "checkpoints", "diagnose", "find_vectors", "judge_load",
        "judge_refusal", "load_profile", "mutation_kinds", "print_report", "read_output",
        "reference_load", "reference_read", "run_suite", "write_junit", "write_output",
    ],
}


def test_documented_submodules_export_exactly_their_names() -> None:
    import importlib

    for module_name, names in SUBMODULES.items():
        module = importlib.import_module(module_name)
        assert sorted(module.__all__) == sorted(names), module_name
        for name in names:
            assert getattr(module, name) is not None, f"{module_name}.{name}"


def test_every_api_page_directive_names_an_importable_object() -> None:
    """docs/api.md's ``::: path`` lines (mkdocstrings) resolve: a documented path that moved
    fails here, not only in the docs build."""
    import importlib
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text(encoding="utf-8")
    paths = re.findall(r"^::: ([\w.]+)$", page, flags=re.M)
    assert len(paths) > 30
    for path in paths:
        module_name, _, attribute = path.rpartition(".")
        try:
            module = importlib.import_module(path)
            continue
        except ImportError:
            module = importlib.import_module(module_name)
        assert hasattr(module, attribute), path


def test_the_command_line_entry_point_is_shardspec_cli_main() -> None:
    from pathlib import Path

    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml")
                            .read_text(encoding="utf-8"))
    assert project["project"]["scripts"] == {"shardspec": "shardspec.cli:main"}
    from shardspec.cli import app, main

    assert callable(main) and app.info.name == "shardspec"
