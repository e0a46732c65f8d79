"""The validator: every finding of a checkpoint in one pass, sharing the reader's rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import shardspec
from checkpoints import Tiny, make_tiny, rewrite_manifest


def flip_last_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_valid_checkpoint(tiny: Tiny) -> None:
    report = shardspec.validate(tiny.path)
    assert report.ok and report.findings == [] and report.errors == []
    assert report.files_checked == 2 and report.checksums_verified == 0
    assert report.manifest == tiny.manifest


def test_checksums_are_verified_for_every_file(tmp_path: Path) -> None:
    extra = tmp_path / "config.json"
    extra.write_text("{}")
    tiny = make_tiny(tmp_path / "c", extra_files=[extra])
    report = shardspec.validate(tiny.path, checksums=True)
    assert report.ok
    assert report.files_checked == 3 and report.checksums_verified == 3


def test_progress_reports_every_byte_hashed(tiny: Tiny) -> None:
    seen: list[int] = []
    shardspec.validate(tiny.path, checksums=True, progress=seen.append)
    assert sum(seen) == sum(f.size for r in tiny.manifest.ranks for f in r.files)


def test_reports_all_findings_in_one_pass(tiny: Tiny) -> None:
    rank0, rank1 = tiny.data_file(0), tiny.data_file(1)
    rank0.write_bytes(rank0.read_bytes()[:-4])  # truncated
    flip_last_byte(rank1)  # same size, other bytes
    report = shardspec.validate(tiny.path, checksums=True)
    assert not report.ok
    assert [(f.code, f.file) for f in report.findings] == [
        ("file-size", rank0.name), ("checksum-mismatch", rank1.name)]


def test_manifest_and_file_findings_are_reported_together(tiny: Tiny) -> None:
    rewrite_manifest(tiny.path, lambda d: d["tensors"]["layers.0.col.weight"]["pieces"][1]
                     .update(offset=[5, 0]))
    tiny.data_file(0).unlink()
    report = shardspec.validate(tiny.path)
    codes = [f.code for f in report.findings]
    assert "piece-bounds" in codes and "file-missing" in codes


def test_header_problems_in_several_files(tiny: Tiny) -> None:
    for rank in range(2):
        path = tiny.data_file(rank)
        raw = bytearray(path.read_bytes())
        raw[8] = ord(" ")
        path.write_bytes(bytes(raw))
    report = shardspec.validate(tiny.path)
    assert [f.code for f in report.findings] == ["st-header-json", "st-header-json"]
    assert {f.file for f in report.findings} == {tiny.data_file(0).name, tiny.data_file(1).name}


def test_rank_limits_the_check_to_that_ranks_files(tiny: Tiny) -> None:
    tiny.data_file(0).unlink()
    report = shardspec.validate(tiny.path, rank=1, checksums=True)
    assert report.ok and report.files_checked == 1 and report.checksums_verified == 1
    report = shardspec.validate(tiny.path, rank=0)
    assert [f.code for f in report.findings] == ["file-missing"]


def test_rank_limit_still_checks_extra_files(tmp_path: Path) -> None:
    extra = tmp_path / "config.json"
    extra.write_text("{}")
    tiny = make_tiny(tmp_path / "c", extra_files=[extra])
    (tiny.path / "config.json").write_text("{ }")
    report = shardspec.validate(tiny.path, rank=1)
    assert [(f.code, f.file) for f in report.findings] == [("file-size", "config.json")]


@pytest.mark.parametrize("rank", [2, -1])
def test_rank_out_of_range_is_a_finding(tiny: Tiny, rank: int) -> None:
    report = shardspec.validate(tiny.path, rank=rank)
    assert [f.code for f in report.findings] == ["rank-out-of-range"]


def test_not_committed(tmp_path: Path) -> None:
    report = shardspec.validate(tmp_path)
    assert [f.code for f in report.findings] == ["not-committed"]
    assert report.manifest is None and not report.ok


def test_layout_errors_stop_before_file_checks(tiny: Tiny) -> None:
    rewrite_manifest(tiny.path, lambda d: d["layout"].update(world_size=3))
    tiny.data_file(0).unlink()
    report = shardspec.validate(tiny.path)
    assert {f.code for f in report.findings} == {"layout-world-size"}
    assert report.files_checked == 0


def test_warnings_do_not_make_a_checkpoint_invalid(tiny: Tiny) -> None:
    rewrite_manifest(tiny.path, lambda d: d.update(
        extensions={"org.example.hint": {"must_understand": False}}))
    report = shardspec.validate(tiny.path)
    assert report.ok and [f.code for f in report.warnings] == ["extension-ignored"]


def test_missing_and_corrupt_extra_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text("[1]")
    b.write_text("[2]")
    tiny = make_tiny(tmp_path / "c", extra_files=[a, b])
    (tiny.path / "a.json").unlink()
    (tiny.path / "b.json").write_text("[3]")
    report = shardspec.validate(tiny.path, checksums=True)
    assert [(f.code, f.file) for f in report.findings] == [
        ("file-missing", "a.json"), ("checksum-mismatch", "b.json")]


def test_report_to_dict_is_json_ready(tiny: Tiny) -> None:
    tiny.data_file(1).unlink()
    data = json.loads(json.dumps(shardspec.validate(tiny.path).to_dict()))
    assert data["valid"] is False and data["path"] == str(tiny.path)
    assert data["errors"] == 1 and data["warnings"] == 0
    (finding,) = data["findings"]
    assert finding["code"] == "file-missing" and finding["section"] == "2.1"
    assert finding["severity"] == "error" and finding["file"] == tiny.data_file(1).name
