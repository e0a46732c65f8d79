"""The ``shardspec`` command line: exit status 0 valid, 1 invalid, 2 could not run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import shardspec
from checkpoints import REPO, SCHEMA_FILE, Tiny, make_tiny
from command import run, runner
from shardspec.cli import app


def test_version() -> None:
    code, out, _ = run("--version")
    assert code == 0 and f"shardspec {shardspec.__version__}" in out
    assert f"format {shardspec.format_version()}" in out


def test_validate_valid(tiny: Tiny) -> None:
    code, out, _ = run("validate", str(tiny.path), "--checksums")
    assert code == 0
    assert out.startswith("valid")
    assert "2 files checked, 2 checksums verified" in " ".join(out.split())


def test_validate_invalid_prints_the_code(tiny: Tiny) -> None:
    tiny.data_file(1).unlink()
    code, out, err = run("validate", str(tiny.path))
    assert code == 1
    assert "[file-missing]" in err and "SPEC 2.1" in err
    assert out.startswith("invalid")


def test_validate_missing_path() -> None:
    code, _, err = run("validate", "/nonexistent/checkpoint")
    assert code == 2 and "no such file" in err


def test_validate_a_file_instead_of_a_directory(tiny: Tiny) -> None:
    code, _, err = run("validate", str(tiny.path / "shardspec.json"))
    assert code == 2 and "not a directory" in err


def test_validate_uncommitted_directory(tmp_path: Path) -> None:
    code, _, err = run("validate", str(tmp_path))
    assert code == 1 and "[not-committed]" in err


def test_validate_json(tiny: Tiny) -> None:
    path = tiny.data_file(0)
    path.write_bytes(path.read_bytes()[:-1])
    code, out, _ = run("validate", str(tiny.path), "--json")
    assert code == 1
    report = json.loads(out)
    assert report["path"] == str(tiny.path) and report["valid"] is False
    assert [(f["code"], f["section"]) for f in report["findings"]] == [("file-size", "9.1")]


def test_validate_json_valid_with_checksums(tiny: Tiny) -> None:
    code, out, _ = run("validate", str(tiny.path), "--json", "--checksums")
    report = json.loads(out)
    assert code == 0 and report["valid"] is True and report["findings"] == []
    assert report["checksums_verified"] == 2


def test_validate_rank(tiny: Tiny) -> None:
    tiny.data_file(0).unlink()
    assert run("validate", str(tiny.path), "--rank", "1")[0] == 0
    assert run("validate", str(tiny.path), "--rank", "0")[0] == 1


def test_validate_ignore_extension(tiny: Tiny) -> None:
    from checkpoints import rewrite_manifest

    rewrite_manifest(tiny.path, lambda d: d.update(
        extensions={"org.example.x": {"must_understand": True}}))
    code, _, err = run("validate", str(tiny.path))
    assert code == 1 and "[extension-unsupported]" in err
    assert run("validate", str(tiny.path), "--ignore-extension", "org.example.x")[0] == 0


def test_inspect_text(tiny: Tiny) -> None:
    code, out, _ = run("inspect", str(tiny.path))
    assert code == 0
    assert "layout: tp=2 pp=1 ep=1 world=2 order=pp-ep-tp" in out
    assert "quantization: none" in out
    assert "model-rank-1-part-0.safetensors" in out and "total size:" in out


def test_inspect_json(tiny: Tiny) -> None:
    code, out, _ = run("inspect", str(tiny.path), "--json")
    assert code == 0
    info = json.loads(out)
    assert info["layout"]["tp_size"] == 2 and info["format_version"] == shardspec.format_version()
    assert info["tensors"] == {"total": 8, "global": 5, "rank_local": 2, "aliases": 1,
                               "tied": 0}
    assert [r["files"] for r in info["ranks"]] == [
        ["model-rank-0-part-0.safetensors"], ["model-rank-1-part-0.safetensors"]]
    assert info["total_bytes"] == sum(f.size for r in tiny.manifest.ranks for f in r.files)


def test_inspect_tensor(tiny: Tiny) -> None:
    code, out, _ = run("inspect", str(tiny.path), "--tensor", "layers.0.col.weight")
    assert code == 0 and "BF16" in out and "global shape [8, 4]" in out and "2 pieces" in out
    code, out, _ = run("inspect", str(tiny.path), "--tensor", "lm_head.weight", "--json")
    data = json.loads(out)
    assert code == 0 and data["alias_of"] == "model.embed_tokens.weight"
    assert data["name"] == "lm_head.weight" and data["rank_local"] is True


def test_inspect_unknown_tensor(tiny: Tiny) -> None:
    code, _, err = run("inspect", str(tiny.path), "--tensor", "nope")
    assert code == 2 and "nope" in err


def test_inspect_invalid_checkpoint(tiny: Tiny) -> None:
    (tiny.path / "shardspec.json").write_text("{")
    code, _, err = run("inspect", str(tiny.path))
    assert code == 1 and "[json-syntax]" in err


def test_files_lists_the_manifest_then_the_ranks_files(tiny: Tiny) -> None:
    code, out, _ = run("files", str(tiny.path), "--rank", "1")
    assert code == 0
    assert out.splitlines() == ["shardspec.json", "model-rank-1-part-0.safetensors"]


def test_files_lists_extra_files_too(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text("{}")
    tiny = make_tiny(tmp_path / "c", extra_files=[config], max_file_size=64)
    code, out, _ = run("files", str(tiny.path), "--rank", "0")
    rank0 = [f.path for f in tiny.manifest.ranks[0].files]
    assert code == 0 and len(rank0) > 1
    assert out.splitlines() == ["shardspec.json", "config.json", *rank0]
    code, out, _ = run("files", str(tiny.path), "--rank", "0", "--json")
    data = json.loads(out)
    assert [f["path"] for f in data["files"]] == ["shardspec.json", "config.json", *rank0]


@pytest.mark.parametrize("rank", ["2", "-1", "x"])
def test_files_rank_out_of_range(tiny: Tiny, rank: str) -> None:
    assert run("files", str(tiny.path), "--rank", rank)[0] == 2


def test_schema_prints_the_schema_file_exactly() -> None:
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    assert result.stdout_bytes == SCHEMA_FILE.read_bytes()


def run_main(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "reference")}
    env.pop("SHARDSPEC_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-c", "from shardspec.cli import main; main()", *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )


def test_subprocess_exit_codes_and_no_traceback(tiny: Tiny) -> None:
    ok = run_main("validate", str(tiny.path))
    assert ok.returncode == 0, ok.stderr
    (tiny.path / "shardspec.json").write_bytes(b'{"format": "shardspec", "format_version": "1.0",'
                                               b' "layout": {"tp_size": NaN}}')
    bad = run_main("validate", str(tiny.path), "--json")
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["findings"][0]["code"] == "json-nonfinite"
    missing = run_main("inspect", str(tiny.path / "nope"))
    assert missing.returncode == 2
    for result in (ok, bad, missing):
        assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("rank", ["2", "-1", "x"])
def test_validate_rank_out_of_range_could_not_run(tiny: Tiny, rank: str) -> None:
    code, _, err = run("validate", str(tiny.path), "--rank", rank)
    assert code == 2


@pytest.mark.parametrize("value", ["inf", "nan", "1e308", "0.01"])
def test_conformance_timeout_out_of_bounds_is_a_usage_error(value: str) -> None:
    """Issue 41 item 13: an infinite timeout never killed a reader (or failed deep inside)."""
    code, _, err = run("conformance", "--reader", "true", "--timeout", value)
    assert code == 2 and "between 0.1 and 86400" in err and "Traceback" not in err
