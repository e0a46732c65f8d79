"""The conformance vectors (conformance/vectors/) against the reference implementation.

Every vector is described by a vector.json that follows conformance/vector.schema.json. Invalid
vectors are refused by the validator and the reader with exactly their expected finding code;
valid ones validate (checksums included) and every rank loads exactly the expected tensors.
Regenerating the vectors gives the committed bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from jsonschema import Draft202012Validator

import shardspec
from shardspec.format.dtypes import DTYPES, torch_layout
from shardspec.format.errors import (
    CODES,
    QuantizationError,
    RequestError,
    ShardspecError,
    StorageError,
)
from shardspec.format.manifest import Alias, TensorRecord

REPO = Path(__file__).resolve().parents[2]
CONFORMANCE = REPO / "conformance"
VECTORS = CONFORMANCE / "vectors"
sys.path.insert(0, str(CONFORMANCE))

from materialize import materialize  # noqa: E402
from vectorgen.raw import st_tensors  # noqa: E402

#: Error codes about the caller's request (a rank, a device, a quantization, a target layout),
#: not the checkpoint: no vector can trigger them.
REQUEST_CODES = {code for code, c in CODES.items()
                 if issubclass(c.error, (RequestError, QuantizationError))}
#: Error codes about object storage's answers (refusals, failures, an object replaced while
#: read): tests/storage/test_remote.py triggers them against an S3 server; a directory of files
#: cannot.
STORAGE_CODES = {code for code, c in CODES.items() if issubclass(c.error, StorageError)} | {
    "object-changed"}
CHECKPOINT_CODES = ({code for code, c in CODES.items() if c.severity == "error"}
                    - REQUEST_CODES - STORAGE_CODES)
#: Warning codes only a validator reports. SPEC 3.1: they are about informative metadata (the
#: DCP objects index); readers ignore it, so no vector can ask a reader for them (a valid
#: vector's warnings are what validate *and* shardspec.open report).
#: tests/integrations/dcp/test_dcp_hostile.py
#: triggers them through validate.
VALIDATOR_ONLY_WARNINGS = {"objects-index", "objects-pickled"}
#: Warning codes a reader reports: the "warnings" of vector.schema.json, each in some vector.
READER_WARNINGS = ({code for code, c in CODES.items() if c.severity == "warning"}
                   - VALIDATOR_ONLY_WARNINGS)

VECTOR_DIRS = sorted(p.parent for p in VECTORS.glob("*/vector.json"))


@cache
def vector(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / "vector.json").read_text(encoding="utf-8"))
    return data


def of_kind(valid: bool) -> list[Any]:
    return [pytest.param(d, id=d.name) for d in VECTOR_DIRS if vector(d)["valid"] is valid]


@cache
def schema_validator() -> Draft202012Validator:
    schema = json.loads((CONFORMANCE / "vector.schema.json").read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


@pytest.mark.parametrize("directory", [pytest.param(d, id=d.name) for d in VECTOR_DIRS])
def test_vector_json_follows_the_schema(directory: Path) -> None:
    data = vector(directory)
    errors = [e.message for e in schema_validator().iter_errors(data)]
    assert not errors
    assert data["id"] == directory.name
    assert (directory / "checkpoint").is_dir()
    expected = sorted(p.name for p in (directory / "expected").glob("*"))
    if data["valid"]:
        assert expected == sorted(f"rank-{r}.safetensors" for r in data["ranks"])
    else:
        assert not (directory / "expected").exists()
        assert data["id"].startswith(data["expected_code"] + "-")


def test_vector_schema_lists_every_code() -> None:
    schema = json.loads((CONFORMANCE / "vector.schema.json").read_text(encoding="utf-8"))
    assert {c for c in VALIDATOR_ONLY_WARNINGS if CODES[c].severity == "warning"} == (
        VALIDATOR_ONLY_WARNINGS)
    assert set(schema["properties"]["expected_code"]["enum"]) == CHECKPOINT_CODES
    assert set(schema["properties"]["warnings"]["items"]["enum"]) == READER_WARNINGS


def test_corpus_size_and_coverage() -> None:
    data = [vector(d) for d in VECTOR_DIRS]
    invalid = [v for v in data if not v["valid"]]
    assert len(invalid) >= 40
    assert sum(v["valid"] for v in data) >= 12
    covered = {v["expected_code"] for v in invalid}
    assert covered >= CHECKPOINT_CODES, sorted(CHECKPOINT_CODES - covered)
    assert not covered & (REQUEST_CODES | STORAGE_CODES)
    warned = {w for v in data for w in v.get("warnings", [])}
    assert warned == READER_WARNINGS


@pytest.fixture
def checkpoint_of(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """The checkpoint to test for a vector, materialized where it says so (and removed after:
    one vector materializes a 256 MiB manifest)."""
    dest = tmp_path / "materialized"
    yield lambda directory: materialize(directory, dest)
    shutil.rmtree(dest, ignore_errors=True)


@pytest.mark.parametrize("directory", of_kind(False))
def test_invalid_vector_is_refused_with_its_code(
    directory: Path, checkpoint_of: Callable[[Path], Path]
) -> None:
    data = vector(directory)
    code, verify = data["expected_code"], data.get("verify", False)
    root = checkpoint_of(directory)
    report = shardspec.validate(root, checksums=verify)
    codes = [f.code for f in report.errors]
    assert code in codes, [str(f) for f in report.findings]
    assert set(codes) == {code, *data.get("validator_also", [])}, [str(f) for f in report.errors]
    for rank in data["ranks"]:
        with pytest.raises(ShardspecError) as caught:
            shardspec.open(root).load_rank(rank, "cpu", verify=verify)
        assert caught.value.code == code, str(caught.value)
    try:
        checkpoint = shardspec.open(root)
    except ShardspecError:
        return
    for rank in set(range(checkpoint.world_size)) - set(data["ranks"]):
        checkpoint.load_rank(rank, "cpu", verify=verify)  # the defect is not in its files


def loaded_tensors(
    checkpoint: shardspec.Checkpoint, rank: int, tensors: dict[str, torch.Tensor]
) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """What ``rank`` loaded as (spec dtype, spec shape, bytes); the manifest gives the spec
    dtype and element shape, since F4 and F6 come back packed."""
    out = {}
    for name, tensor in tensors.items():
        record = checkpoint.manifest.tensors[name]
        if isinstance(record, Alias):
            assert tensors[name] is tensors[record.alias_of], "an alias shares its target"
            record = checkpoint.manifest.tensors[record.alias_of]
        assert isinstance(record, TensorRecord)
        shape = record.shape_on(rank)
        assert shape is not None
        dtype, held = torch_layout(DTYPES[record.dtype], shape)
        assert (tensor.dtype, tuple(tensor.shape)) == (dtype, held), name
        flat = tensor.contiguous().reshape(-1).view(torch.uint8)
        out[name] = (record.dtype, shape, flat.numpy().tobytes())
    return out


@pytest.mark.parametrize("directory", of_kind(True))
def test_valid_vector_loads_the_expected_tensors(
    directory: Path, checkpoint_of: Callable[[Path], Path]
) -> None:
    data = vector(directory)
    ignore = data.get("ignore_extensions", [])
    warnings = set(data.get("warnings", []))
    root = checkpoint_of(directory)
    report = shardspec.validate(root, checksums=True, ignore_extensions=ignore)
    assert report.ok, [str(f) for f in report.errors]
    assert {f.code for f in report.warnings} == warnings
    checkpoint = shardspec.open(root, ignore_extensions=ignore)
    assert {f.code for f in checkpoint.warnings} == warnings
    assert data["ranks"] == list(range(checkpoint.world_size))
    for rank in data["ranks"]:
        tensors = checkpoint.load_rank(rank, "cpu", verify=True)
        expected = st_tensors((directory / "expected" / f"rank-{rank}.safetensors").read_bytes())
        assert loaded_tensors(checkpoint, rank, tensors) == expected


def test_materialize_leaves_the_committed_tree_alone(tmp_path: Path) -> None:
    for directory in VECTOR_DIRS:
        if vector(directory).get("materialize") in ("fifo", "symlink-outside"):
            before = sorted(p.name for p in (directory / "checkpoint").rglob("*"))
            root = materialize(directory, tmp_path / directory.name)
            assert root != directory / "checkpoint"
            assert sorted(p.name for p in (directory / "checkpoint").rglob("*")) == before


def test_regenerating_gives_identical_bytes() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO / "reference"), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, str(CONFORMANCE / "make_vectors.py"), "--check"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
