"""Hostile input, round two (issue 20): each way the reader and the CLI broke, as a test.

Every test here failed before its fix: a crash (a plain Python exception, or "internal error"
on the command line), a wrong code, a hang, a file outside the checkpoint read, or a digest
left unchecked. Time and memory bounds on large adversarial manifests are benchmarks
(benchmarks/hostile/bench_hostile.py), not tests.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import shardspec
from checkpoints import (
    assert_same_tensor,
    make_tiny,
    manifest_bytes,
    rewrite_manifest,
    tp_states,
)
from shardspec.cli import app
from shardspec.convert import import_vllm
from shardspec.convert.hf import HFError
from shardspec.format import schema
from shardspec.format.errors import ShardspecError
from shardspec.format.limits import SUPPORTED_MINOR
from shardspec.format.manifest import Alias, TensorRecord
from shardspec.format.overlap import Box, first_overlap
from shardspec.format.parse import parse_manifest
from shardspec.storage import paths
from shardspec.testing.adversarial import (
    floats_in_config,
    many_unknown_members,
    split_ways,
    staircase,
)

runner = CliRunner()


def codes(data: bytes) -> list[str]:
    return [f.code for f in parse_manifest(data).findings]


def cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout + result.stderr


# --- 1. a non-string format_version ------------------------------------------------------------


@pytest.mark.parametrize("version", [[], {}, [1, 2], {"a": 1}])
def test_a_format_version_that_is_not_a_string_is_schema(
        manifest_dict: dict[str, Any], version: Any, tmp_path: Path) -> None:
    """SPEC 4.2 rule 1: a malformed version is left to the schema: `schema`, never a crash."""
    assert set(codes(json.dumps({"format_version": version}).encode())) == {"schema"}
    manifest_dict["format_version"] = version
    assert "schema" in codes(manifest_bytes(manifest_dict))
    tiny = make_tiny(tmp_path / "ck")
    rewrite_manifest(tiny.path, lambda d: d.update(format_version=version))
    with pytest.raises(ShardspecError) as caught:
        shardspec.open(tiny.path)
    assert caught.value.code == "schema"
    assert {f.code for f in shardspec.validate(tiny.path).errors} == {"schema"}
    for command in (["validate"], ["inspect"], ["files", "--rank", "0"]):
        code, text = cli(*command, str(tiny.path))
        assert code == 1 and "schema" in text and "internal error" not in text, text


# --- 8. integers of over 4300 digits -----------------------------------------------------------


@pytest.mark.parametrize("digits", [309, 4300, 4301, 20_000])
def test_an_integer_past_binary64_is_nonfinite_however_long(
        manifest_dict: dict[str, Any], digits: int) -> None:
    """SPEC 3.3 rule 2: json-nonfinite for any integer of 2^1024 or more (309 digits of 9s
    are past it), without Python's int_max_str_digits message."""
    manifest_dict["quantization"] = {"method": "gptq", "config": {"x": "@@"}}
    data = manifest_bytes(manifest_dict).replace(b'"@@"', b"9" * digits)
    findings = parse_manifest(data).findings
    assert [f.code for f in findings] == ["json-nonfinite"]
    assert "int_max_str_digits" not in findings[0].message
    assert f"{digits} digits" in findings[0].message


# --- 3. every listed digest is checked on load -------------------------------------------------


def _wrong_blake2b(root: Path, path: str) -> None:
    """List a blake2b digest for ``path`` that is not its own; sha256 stays right."""
    def edit(data: dict[str, Any]) -> None:
        for rank in data["ranks"]:
            for record in rank["files"]:
                if record["path"] == path:
                    record["checksums"]["blake2b"] = hashlib.blake2b(b"other").hexdigest()
    rewrite_manifest(root, edit)


def _right_blake2b(root: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        for rank in data["ranks"]:
            for record in rank["files"]:
                digest = hashlib.blake2b((root / record["path"]).read_bytes()).hexdigest()
                record["checksums"]["blake2b"] = digest
    rewrite_manifest(root, edit)


def _load_modes(root: Path | str) -> list[tuple[str, Any]]:
    checkpoint = shardspec.open(root)
    resharded = shardspec.Layout(tp_size=1)
    modes: list[tuple[str, Any]] = [
        ("copy", lambda: checkpoint.load_rank(0, "cpu", verify=True)),
        ("reshard", lambda: checkpoint.load_rank(0, "cpu", verify=True, layout=resharded)),
    ]
    if not checkpoint.is_remote:
        modes.append(("mmap", lambda: checkpoint.load_rank(0, "cpu", verify=True, mmap=True)))
    return modes


def global_checkpoint(path: Path) -> tuple[shardspec.Manifest, dict[int, dict[str, Any]]]:
    """A TP=2 checkpoint of global tensors only (resharding refuses rank-local ones)."""
    gen = torch.Generator().manual_seed(3)
    states, sharding = tp_states({
        "col.weight": (torch.randn(8, 4, generator=gen), 0),
        "row.weight": (torch.randn(4, 6, generator=gen), 1),
        "norm.weight": (torch.randn(4, generator=gen), None),
    }, 2)
    manifest = shardspec.save(states, path, layout=shardspec.Layout(tp_size=2),
                              sharding=sharding)
    return manifest, states


def test_load_rank_verify_checks_blake2b_in_every_mode(tmp_path: Path) -> None:
    """SPEC 9.2 rule 5: a right sha256 and a wrong blake2b is checksum-mismatch, as validate
    says, in the copy, mmap and resharding reads (object storage: the next test)."""
    root = tmp_path / "ck"
    manifest, _ = global_checkpoint(root)
    _right_blake2b(root)
    for mode, load in _load_modes(root):  # both digests right: loads
        assert load(), mode
    first = manifest.ranks[0].files[0].path
    _wrong_blake2b(root, first)
    assert [f.code for f in shardspec.validate(root, checksums=True).errors] == [
        "checksum-mismatch"]
    for mode, load in _load_modes(root):
        with pytest.raises(ShardspecError) as caught:
            load()
        assert caught.value.code == "checksum-mismatch", mode
        assert "blake2b" in caught.value.finding.message and first == caught.value.finding.file


def test_load_rank_verify_checks_blake2b_in_object_storage(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    root = tmp_path / "ck"
    manifest, _ = global_checkpoint(root)
    first = manifest.ranks[0].files[0].path
    _wrong_blake2b(root, first)
    url = f"memory://shardspec-hostile-{os.getpid()}"
    fs, prefix = fsspec.core.url_to_fs(url)
    try:
        for path in sorted(root.rglob("*")):
            if path.is_file():
                fs.pipe_file(f"{prefix}/{path.relative_to(root).as_posix()}",
                             path.read_bytes())
        for mode, load in _load_modes(url):
            with pytest.raises(ShardspecError) as caught:
                load()
            assert caught.value.code == "checksum-mismatch", mode
            assert "blake2b" in caught.value.finding.message
    finally:
        fs.rm(prefix, recursive=True)


# --- 9. import-vllm on a hostile directory -----------------------------------------------------


def _vllm_dir(root: Path) -> Path:
    from safetensors.torch import save_file
    root.mkdir()
    for rank in range(2):
        save_file({"w": torch.full((2, 2), float(rank))},
                  str(root / f"model-rank-{rank}-part-0.safetensors"))
    return root


def test_import_vllm_refuses_a_fifo_without_hanging(tmp_path: Path) -> None:
    """A FIFO named like a data file is refused at once (run in a child, so a hang is a
    timeout, not a stuck test run)."""
    root = _vllm_dir(tmp_path / "vllm")
    (root / "model-rank-1-part-0.safetensors").unlink()
    os.mkfifo(root / "model-rank-1-part-0.safetensors")
    code = ("import sys; from shardspec.convert import import_vllm\n"
            "from shardspec.convert.hf import HFError\n"
            "try:\n    import_vllm(sys.argv[1])\n"
            "except HFError as exc:\n    print('refused:', exc)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(shardspec.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True,
                          text=True, timeout=60, env=env)
    assert "refused:" in done.stdout and "not a regular file" in done.stdout, done
    assert not (root / "shardspec.json").exists()


def test_import_vllm_does_not_read_a_file_through_a_link_out(tmp_path: Path) -> None:
    root = _vllm_dir(tmp_path / "vllm")
    outside = tmp_path / "outside.safetensors"
    shutil.move(root / "model-rank-1-part-0.safetensors", outside)
    (root / "model-rank-1-part-0.safetensors").symlink_to(outside)
    with pytest.raises(HFError, match="outside the checkpoint"):
        import_vllm(root)
    assert not (root / "shardspec.json").exists()


def test_import_vllm_a_huge_rank_number_costs_nothing(tmp_path: Path) -> None:
    """A gap up to rank 10^8 is reported in bounded memory (it built set(range(10^8 + 1)))."""
    root = _vllm_dir(tmp_path / "vllm")
    shutil.copy(root / "model-rank-1-part-0.safetensors",
                root / "model-rank-100000000-part-0.safetensors")
    tracemalloc.start()
    try:
        with pytest.raises(HFError, match=r"ranks \[2\] have no files"):
            import_vllm(root)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, peak


# --- 10. numeric arguments the CLI cannot use --------------------------------------------------


@pytest.mark.parametrize("size", ["9" * 400, "9" * 400 + ".5GB", "9223372036854775808",
                                  "1e5", "-1", "0"])
def test_sizes_out_of_range_are_bad_arguments(tmp_path: Path, size: str) -> None:
    tiny = make_tiny(tmp_path / "ck")
    for args in (["convert", str(tmp_path / "no-hf"), str(tmp_path / "out"), "--tp", "1",
                  "--max-file-size", size],
                 ["merge", str(tiny.path), str(tmp_path / "merged"), "--max-shard-size", size]):
        code, text = cli(*args)
        assert code == 2 and "internal error" not in text, text
        assert "size" in text
    assert not (tmp_path / "out").exists() and not (tmp_path / "merged").exists()


def test_exact_sizes(tmp_path: Path) -> None:
    from shardspec.cli.convert import parse_size
    assert parse_size("0.1GB") == 10**8 and parse_size("1.5KiB") == 1536
    assert parse_size("9223372036854775807") == 2**63 - 1


# --- 11. a file truncated after its size was taken ---------------------------------------------


def _truncate_after_open(monkeypatch: pytest.MonkeyPatch, module: Any, keep: int) -> None:
    """Truncate each data file to ``keep`` bytes right after it is opened and sized."""
    real = module.open_inside

    def opened(root: Path, relative: str) -> Any:
        handle, size = real(root, relative)
        if relative.endswith(".safetensors"):
            os.truncate(os.path.join(root, relative), min(keep, size))
        return handle, size

    monkeypatch.setattr(module, "open_inside", opened)


@pytest.mark.parametrize(("keep", "code"), [(0, "st-header-length"), (5, "st-header-length"),
                                            (200, "st-header-length"), (-1, "st-offsets")])
@pytest.mark.parametrize("mode", ["copy", "mmap", "reshard"])
def test_a_file_truncated_after_the_size_check_is_a_finding(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: int, code: str,
        mode: str) -> None:
    from shardspec.load import execute
    from shardspec.reshard import load as reshard_load
    root = tmp_path / "ck"
    manifest, _ = global_checkpoint(root)
    first = root / manifest.ranks[0].files[0].path
    if keep < 0:  # inside the data region: the header is whole, the data is not
        keep = first.stat().st_size - 4
    checkpoint = shardspec.open(root)
    _truncate_after_open(monkeypatch, reshard_load if mode == "reshard" else execute, keep)
    with pytest.raises(ShardspecError) as caught:
        if mode == "reshard":
            checkpoint.load_rank(0, "cpu", layout=shardspec.Layout(tp_size=1))
        else:
            checkpoint.load_rank(0, "cpu", mmap=mode == "mmap")
    assert caught.value.code == code, caught.value


@pytest.mark.parametrize("keep", [0, 5])
def test_validate_reports_a_file_truncated_after_the_size_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: int) -> None:
    validate_module = importlib.import_module("shardspec.validate")
    tiny = make_tiny(tmp_path / "ck")
    _truncate_after_open(monkeypatch, validate_module, keep)
    report = shardspec.validate(tiny.path)
    assert "st-header-length" in [f.code for f in report.errors]


def test_a_read_error_is_a_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An OSError from a read (EIO on a failing disk) is a finding too."""
    from shardspec.load import execute
    tiny = make_tiny(tmp_path / "ck")
    real = execute.open_inside

    class Failing:
        def __init__(self, handle: Any) -> None:
            self.handle = handle

        def __getattr__(self, name: str) -> Any:
            return getattr(self.handle, name)

        def read(self, *args: Any) -> bytes:
            raise OSError(5, "Input/output error")

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *args: Any) -> None:
            self.handle.close()

    def failing(root: Path, relative: str) -> tuple[Failing, int]:
        handle, size = real(root, relative)
        return Failing(handle), size

    monkeypatch.setattr(execute, "open_inside", failing)
    with pytest.raises(ShardspecError) as caught:
        shardspec.load_rank(tiny.path, 0, "cpu")
    assert caught.value.code == "st-header-length"
    assert "Input/output error" in caught.value.finding.message


# --- 12. a directory swapped for a symlink after the path check --------------------------------


def test_a_directory_swapped_for_a_link_out_is_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC 2.2 rule 5: the path is checked, then its directory becomes a link to a copy
    outside with other values; the reader must not return them."""
    tiny = make_tiny(tmp_path / "ck")
    root = tiny.path
    (root / "data").mkdir()
    moved = {}
    for rank in tiny.manifest.ranks:
        for record in rank.files:
            shutil.move(root / record.path, root / "data" / record.path)
            moved[record.path] = f"data/{record.path}"
    text = (root / "shardspec.json").read_text()
    for old, new in moved.items():
        text = text.replace(f'"{old}"', f'"{new}"')
    (root / "shardspec.json").write_text(text)
    expected = shardspec.load_rank(root, 0, "cpu")
    outside = tmp_path / "outside"
    shutil.copytree(root / "data", outside)
    for path in outside.iterdir():  # same sizes and headers, other values
        blob = bytearray(path.read_bytes())
        blob[-8:] = b"\x7f" * 8
        path.write_bytes(bytes(blob))
    checkpoint = shardspec.open(root)
    real = paths.resolve_inside

    def swapped(checkpoint_root: Path, relative: str) -> Path:
        resolved = real(checkpoint_root, relative)
        if (root / "data").is_dir() and not (root / "data").is_symlink():
            shutil.rmtree(root / "data")
            (root / "data").symlink_to(outside, target_is_directory=True)
        return resolved

    monkeypatch.setattr(paths, "resolve_inside", swapped)
    with pytest.raises(ShardspecError) as caught:
        loaded = checkpoint.load_rank(0, "cpu")
        for name, tensor in expected.items():  # reached only if the link was followed
            assert_same_tensor(loaded[name], tensor)
    assert caught.value.code == "path-escapes"


def test_links_inside_the_checkpoint_still_work(tmp_path: Path) -> None:
    """SPEC 2.2 rule 5 follows links that stay inside: opening component by component
    opens what they resolve to."""
    tiny = make_tiny(tmp_path / "ck")
    root = tiny.path
    (root / "real").mkdir()
    name = tiny.manifest.ranks[1].files[0].path
    shutil.move(root / name, root / "real" / name)
    (root / "alias").symlink_to("real", target_is_directory=True)
    (root / name).symlink_to(f"alias/{name}")
    loaded = shardspec.load_rank(root, 1, "cpu")
    for tensor_name, tensor in tiny.expected[1].items():
        assert_same_tensor(loaded[tensor_name], tensor)


# --- also: mmap with a new layout --------------------------------------------------------------


def test_mmap_with_a_new_layout_is_a_request_error(tmp_path: Path) -> None:
    tiny = make_tiny(tmp_path / "ck")
    with pytest.raises(shardspec.RequestError) as caught:
        shardspec.load_rank(tiny.path, 0, "cpu", mmap=True, layout=shardspec.Layout(tp_size=1))
    assert caught.value.code == "reshard-unsupported"



# --- 2. a record's kind, decided once ----------------------------------------------------------


#: A minor version newer than the reader's (SPEC 4.2 rule 3).
NEWER = f"1.{SUPPORTED_MINOR + 1}"


def _newer(manifest_dict: dict[str, Any], name: str, record: dict[str, Any]) -> bytes:
    data = copy.deepcopy(manifest_dict)
    data["format_version"] = NEWER
    data["tensors"][name] = record
    return manifest_bytes(data)


def _local_pieces(manifest_dict: dict[str, Any]) -> list[dict[str, Any]]:
    return copy.deepcopy(manifest_dict["tensors"]["layers.0.qkv.weight"]["pieces"])


def _global(manifest_dict: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(manifest_dict["tensors"]["layers.0.col.weight"])


@pytest.mark.parametrize("extra", [{"tied_to": "x"}, {"tied_to": {}},
                                   {"tied_to": {"tensor": "w", "block": 5}}])
def test_unknown_members_of_a_rank_local_record_are_ignored(
        manifest_dict: dict[str, Any], extra: dict[str, Any]) -> None:
    """SPEC 4.3: in a newer minor version, a member the record's kind does not define is an
    unknown field (a warning), whatever its value; it crashed the reader."""
    record = {**manifest_dict["tensors"]["layers.0.qkv.weight"], **extra}
    parsed = parse_manifest(_newer(manifest_dict, "layers.0.qkv.weight", record))
    assert [f.code for f in parsed.findings] == ["version-newer-minor", "unknown-field"]
    assert parsed.manifest is not None
    assert parsed.manifest.tensors["layers.0.qkv.weight"].tied_to is None  # type: ignore[union-attr]


def test_a_rank_local_piece_with_an_offset_ignores_it(manifest_dict: dict[str, Any]) -> None:
    pieces = _local_pieces(manifest_dict)
    pieces[0]["offset"] = [[1]]
    record = {**manifest_dict["tensors"]["layers.0.qkv.weight"], "pieces": pieces}
    parsed = parse_manifest(_newer(manifest_dict, "layers.0.qkv.weight", record))
    assert [f.code for f in parsed.findings] == ["version-newer-minor", "unknown-field"]
    assert parsed.manifest is not None
    local = parsed.manifest.tensors["layers.0.qkv.weight"]
    assert all(p.offset is None for p in local.pieces)  # type: ignore[union-attr]


def test_a_record_with_alias_of_is_an_alias(manifest_dict: dict[str, Any]) -> None:
    """`alias_of: []` on a global tensor is a bad alias (`schema`), not a crash; a rank-local
    record that also has alias_of is an alias, its other members unknown fields."""
    broken = {**_global(manifest_dict), "alias_of": []}
    for data in (_newer(manifest_dict, "layers.0.col.weight", broken),
                 manifest_bytes({**manifest_dict,
                                 "tensors": {**manifest_dict["tensors"],
                                             "layers.0.col.weight": broken}})):
        parsed = parse_manifest(data)
        assert parsed.manifest is None and "schema" in [f.code for f in parsed.errors]
    record = {**manifest_dict["tensors"]["layers.0.qkv.weight"],
              "alias_of": "layers.0.col.weight"}
    parsed = parse_manifest(_newer(manifest_dict, "extra.alias", record))
    assert [f.code for f in parsed.findings] == ["version-newer-minor", "unknown-field"]
    assert parsed.manifest is not None
    assert parsed.manifest.tensors["extra.alias"] == Alias(alias_of="layers.0.col.weight")
    alias = {**_global(manifest_dict), "alias_of": "layers.0.col.weight"}
    parsed = parse_manifest(_newer(manifest_dict, "extra.alias", alias))
    assert [f.code for f in parsed.errors] == []
    assert parsed.manifest is not None and isinstance(parsed.manifest.tensors["extra.alias"],
                                                      Alias)


def test_a_rank_local_record_with_a_shape_ignores_it(manifest_dict: dict[str, Any]) -> None:
    pieces = _local_pieces(manifest_dict)
    for piece in pieces:
        piece["offset"] = [0, 0]
    record = {**manifest_dict["tensors"]["layers.0.qkv.weight"], "shape": [7, 4],
              "pieces": pieces}
    parsed = parse_manifest(_newer(manifest_dict, "layers.0.qkv.weight", record))
    assert [f.code for f in parsed.errors] == []
    assert parsed.manifest is not None
    local = parsed.manifest.tensors["layers.0.qkv.weight"]
    assert isinstance(local, TensorRecord) and local.rank_local


@pytest.mark.parametrize("version", [f"1.{SUPPORTED_MINOR}", NEWER])
def test_rank_local_must_be_true(manifest_dict: dict[str, Any], version: str,
                                 tmp_path: Path) -> None:
    """A global tensor with `rank_local: 1` and overlapping pieces was built as rank-local, so
    bounds and coverage went unchecked and load_rank returned it: it is `schema` now."""
    record = _global(manifest_dict)
    record["rank_local"] = 1
    for piece in record["pieces"]:
        piece["offset"] = [0, 0]  # both ranks' halves at the top: overlapping, half uncovered
    data = copy.deepcopy(manifest_dict)
    data["format_version"] = version
    data["tensors"]["layers.0.col.weight"] = record
    parsed = parse_manifest(manifest_bytes(data))
    assert parsed.manifest is None
    assert {f.code for f in parsed.errors} == {"schema"}
    assert "$.tensors.layers.0.col.weight.rank_local" in [f.json_path for f in parsed.errors]
    if version == NEWER:  # shape and offsets: unknown fields of a rank-local record, ignored
        assert len(parsed.errors) == 1


# --- 4. the overlap check in n log n -----------------------------------------------------------


def _brute_overlap(boxes: list[Box]) -> bool:
    return any(all(max(a[0][d], b[0][d]) < min(a[0][d] + a[1][d], b[0][d] + b[1][d])
                   for d in range(len(a[0])))
               for i, a in enumerate(boxes) for b in boxes[:i])


@st.composite
def box_sets(draw: st.DrawFn) -> list[Box]:
    ndim = draw(st.integers(0, 4))
    boxes = []
    for _ in range(draw(st.integers(0, 12))):
        offset = tuple(draw(st.integers(0, 6)) for _ in range(ndim))
        shape = tuple(draw(st.integers(1, 4)) for _ in range(ndim))
        boxes.append((offset, shape))
    return boxes


@settings(max_examples=300, deadline=None)
@given(box_sets())
def test_first_overlap_answers_like_comparing_every_pair(boxes: list[Box]) -> None:
    found = first_overlap(boxes)
    assert (found is not None) == _brute_overlap(boxes)
    if found is not None:
        assert found[0] != found[1] and _brute_overlap([boxes[found[0]], boxes[found[1]]])


@pytest.mark.timeout(120)
def test_a_staircase_opens_without_quadratic_work() -> None:
    """2n - 1 pieces cut in both dimensions: 8 minutes at n = 16384 with the pairwise sweep.
    The timeout guards against a return to quadratic work; the bound is a benchmark's
    (benchmarks/hostile/bench_hostile.py)."""
    parsed = parse_manifest(staircase(16384))
    assert parsed.findings == [] and parsed.manifest is not None
    broken = parse_manifest(staircase(16384, overlap=True))
    assert [f.code for f in broken.findings] == ["coverage-overlap"]
    assert "ranks 32765 and 32766 overlap" in broken.findings[0].message


# --- 6. inspect in time linear in the pieces ---------------------------------------------------


@pytest.mark.timeout(120)
def test_inspect_a_tensor_split_32768_ways(tmp_path: Path) -> None:
    """Counting each rank's tensors asked every tensor about every rank (ranks x pieces), and
    rich drew a 32,768-row table: minutes. The timeout guards against that; the bound is a
    benchmark's (benchmarks/hostile/bench_hostile.py)."""
    (tmp_path / "shardspec.json").write_bytes(split_ways(32768))
    code, text = cli("inspect", str(tmp_path), "--json")
    assert code == 0, text
    info = json.loads(text)
    assert len(info["ranks"]) == 32768 and {r["tensors"] for r in info["ranks"]} == {1}
    code, text = cli("inspect", str(tmp_path))
    assert code == 0 and "... and 32512 more ranks (--json lists every one)" in text
    assert text.count("r327") < 10  # the table stops after MAX_ROWS ranks
    code, text = cli("inspect", str(tmp_path), "--tensor", "w")
    assert code == 0 and "... and 32512 more pieces" in text


# --- 5. many schema errors: bounded findings, bounded memory -----------------------------------


@pytest.mark.parametrize("fast", [True, False])
def test_schema_errors_past_the_bound_are_counted(monkeypatch: pytest.MonkeyPatch,
                                                  fast: bool) -> None:
    """5,000 pieces each with an unknown member: the first MAX_SCHEMA_FINDINGS are explained,
    the rest counted in one finding (each of 85,000 collected took 40 s and 2.2 GB); the same
    with or without jsonschema-rs."""
    if not fast:
        monkeypatch.setattr(schema, "_fast_validator", lambda: None)
        monkeypatch.setattr(schema, "_open_fast_validator", lambda: None)
    data = json.loads(many_unknown_members(5000))
    data["layout"]["tp_size"] = 0  # an error outside the tensors is never left out
    findings = parse_manifest(json.dumps(data).encode()).findings
    assert [f.code for f in findings] == ["schema"] * (schema.MAX_SCHEMA_FINDINGS + 1)
    assert findings[0].json_path == "$.layout.tp_size"
    explained = [f.tensor for f in findings[1:-1]]
    assert len(set(explained)) == 99 and set(explained) <= {f"t{i}" for i in range(5000)}
    assert findings[-1].message.startswith("4901 more schema error(s) not listed")


def test_unknown_fields_past_the_bound_are_counted(manifest_dict: dict[str, Any]) -> None:
    data = json.loads(many_unknown_members(500))
    data["format_version"] = NEWER
    findings = parse_manifest(json.dumps(data).encode()).findings
    assert [f.code for f in findings] == (["version-newer-minor"]
                                          + ["unknown-field"] * (schema.MAX_SCHEMA_FINDINGS + 1))
    assert findings[-1].message == "ignored 400 more unknown field(s), not listed"
    data["layout"]["tp_size"] = 0  # a real error among them: only errors are listed
    findings = parse_manifest(json.dumps(data).encode()).findings
    assert [(f.code, f.json_path) for f in findings] == [
        ("version-newer-minor", "$.format_version"), ("schema", "$.layout.tp_size")]


def test_validate_prints_a_bounded_number_of_findings_of_one_code(tmp_path: Path) -> None:
    """300 missing files: 50 printed, the rest counted (every one was drawn by rich: 32,768
    of them took longer than validating); --json lists them all."""
    (tmp_path / "shardspec.json").write_bytes(split_ways(300))
    code, text = cli("validate", str(tmp_path))
    assert code == 1 and text.count("[file-missing]") == 51, text[-500:]
    assert "... and 250 more [file-missing] findings (--json lists every one)" in text
    code, text = cli("validate", str(tmp_path), "--json")
    assert len(json.loads(text)["findings"]) == 300


def test_floats_and_schema_errors_are_located_at_c_speed_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A float in the config and schema errors: jsonschema-rs locates the errors on a copy
    whose stray floats are marked (it takes 4.0 for an integer), and the answer is the
    reference validator's alone (the whole 10 MB manifest walked in Python took 32 s)."""
    data = json.loads(floats_in_config(2000))
    data["tensors"]["model.layers.3.w1.weight"]["pieces"][0]["shape"] = [1.0]
    data["tensors"]["model.layers.5.w2.weight"]["x"] = 1
    data["metadata"] = {"note": 2.5}
    blob = json.dumps(data).encode()
    located = parse_manifest(blob).findings
    monkeypatch.setattr(schema, "_fast_validator", lambda: None)
    monkeypatch.setattr(schema, "_open_fast_validator", lambda: None)
    assert parse_manifest(blob).findings == located
    assert [(f.code, f.json_path) for f in located] == [
        ("schema", "$.metadata.note"),
        ("schema", "$.tensors.model.layers.3.w1.weight.pieces[0].shape[0]"),
        ("schema", "$.tensors.model.layers.5.w2.weight")]
