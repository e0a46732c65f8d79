"""The one contract every command keeps (cli/app.py, docs/cli.md): exit codes, --json errors,
flags named as flags, output that survives a pipe, errors that point the right way."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import shardspec
from hf_helpers import llama_tensors, write_hf_dir
from shardspec.cli import app
from shardspec.convert import convert

REFERENCE = Path(__file__).resolve().parents[2] / "reference"
cli_app = importlib.import_module("shardspec.cli.app")  # the module; the attribute is the app

runner = CliRunner()


@pytest.fixture
def hf(tmp_path: Path) -> Path:
    return write_hf_dir(tmp_path / "hf", llama_tensors(layers=2, hidden=64, heads=4,
                                                       kv_heads=2, dtype=torch.bfloat16))


@pytest.fixture
def ckpt(hf: Path, tmp_path: Path) -> Path:
    convert(hf, tmp_path / "ckpt", tp_size=2)
    return tmp_path / "ckpt"


def _json_error(result: object) -> dict[str, object]:
    data = json.loads(result.stdout)  # type: ignore[attr-defined]
    assert data["ok"] is False and data["exit_code"] == result.exit_code  # type: ignore[attr-defined]
    return data


# --- --json errors ------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["validate"], ["inspect"], ["files", "--rank", "0"],
                                     ["fetch-config", "out"]])
def test_errors_honour_json(tmp_path: Path, command: list[str]) -> None:
    result = runner.invoke(app, [command[0], str(tmp_path / "nonexistent"), *command[1:],
                                 "--json"])
    assert result.exit_code == 2
    data = _json_error(result)
    assert "does not exist" in str(data["error"]) or "no such file" in str(data["error"])
    assert result.stderr == ""


def test_a_finding_under_json_keeps_its_code(hf: Path) -> None:
    result = runner.invoke(app, ["inspect", str(hf), "--json"])
    assert result.exit_code == 1
    error = _json_error(result)["error"]
    assert isinstance(error, dict)
    assert error["code"] == "not-committed" and error["section"] == "2.3"


def test_usage_errors_honour_json_from_the_entry_point(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from shardspec.cli import main; main()", "validate",
         str(tmp_path), "--rank", "minus-one", "--json"],
        env={**os.environ, "PYTHONPATH": str(REFERENCE)}, capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 2
    data = json.loads(done.stdout)
    assert data["ok"] is False and "--rank" in data["error"]["message"]


# --- one exit-code rule -------------------------------------------------------------------------


def test_a_layout_the_checkpoint_cannot_take_exits_2_in_convert_and_reshard(
        hf: Path, ckpt: Path, tmp_path: Path) -> None:
    converted = runner.invoke(app, ["convert", str(hf), str(tmp_path / "a"), "--tp", "1",
                                    "--ep", "3"])
    assert converted.exit_code == 2, converted.output
    assert "ep_size (--ep) is 3" in " ".join(converted.output.split())
    resharded = runner.invoke(app, ["reshard", str(ckpt), str(tmp_path / "b"), "--tp", "3"])
    assert resharded.exit_code == 2, resharded.output
    assert "reshard-unsupported" in resharded.output


def test_rank_local_refusals_exit_alike_in_reshard_and_merge(tmp_path: Path) -> None:
    states = {r: {"local": torch.full((4,), float(r))} for r in range(2)}
    shardspec.save(states, tmp_path / "local", layout=shardspec.Layout(tp_size=2))
    resharded = runner.invoke(app, ["reshard", str(tmp_path / "local"), str(tmp_path / "r"),
                                    "--tp", "1"])
    merged = runner.invoke(app, ["merge", str(tmp_path / "local"), str(tmp_path / "m")])
    assert resharded.exit_code == merged.exit_code == 2, (resharded.output, merged.output)
    assert "rank-local" in resharded.output and "rank-local" in merged.output


def test_an_invalid_checkpoint_exits_1(ckpt: Path) -> None:
    (ckpt / "shard-00002-model-00001-of-00001.safetensors").unlink()
    result = runner.invoke(app, ["validate", str(ckpt)])
    assert result.exit_code == 1 and "file-missing" in result.output


# --- words a CLI user types ---------------------------------------------------------------------


def test_messages_name_flags_not_python_arguments(hf: Path, ckpt: Path, tmp_path: Path) -> None:
    for args in (["convert", str(hf), str(ckpt), "--tp", "2"],
                 ["reshard", str(ckpt), str(hf), "--tp", "1"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        text = " ".join(result.output.split())
        assert "pass --overwrite" in text and "overwrite=True" not in text


@pytest.mark.parametrize("command", ["convert", "reshard", "merge", "validate", "inspect",
                                     "fetch-config"])
def test_flags_show_as_flags_in_help(command: str) -> None:
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for line in result.output.splitlines():
        if any(f in line for f in ("--overwrite", "--json", "--checksums", "--tensors",
                                   "--allow-uneven")):
            assert "<bool>" not in line, line


def test_singular_and_plural(tmp_path: Path) -> None:
    states = {0: {"w": torch.ones(2)}}
    shardspec.save(states, tmp_path / "one", layout=shardspec.Layout(tp_size=1),
                   sharding={0: {"w": shardspec.Shard((2,), (0,))}})
    result = runner.invoke(app, ["validate", str(tmp_path / "one")])
    assert "1 file checked" in result.output and "1 files" not in result.output
    resharded = runner.invoke(app, ["reshard", str(tmp_path / "one"), str(tmp_path / "two"),
                                    "--tp", "1"])
    assert "1 rank," in resharded.output and "1 ranks" not in resharded.output


def test_one_unit_family(hf: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["convert", str(hf), str(tmp_path / "c"), "--tp", "1"])
    assert result.exit_code == 0
    assert "KiB" in result.output and " kB" not in result.output and " MB" not in result.output
    help_text = runner.invoke(app, ["convert", "--help"], env={"COLUMNS": "200"}).output
    assert "5GiB" in help_text  # --max-file-size's default, in the same family


# --- output that survives a pipe ----------------------------------------------------------------


def test_inspect_never_cuts_names_in_a_pipe(hf: Path, tmp_path: Path) -> None:
    convert(hf, tmp_path / "pp", tp_size=2, pp_size=2)
    result = runner.invoke(app, ["inspect", str(tmp_path / "pp")])
    assert result.exit_code == 0
    assert "shard-00004-model-00001-of-00001.safetensors" in result.output
    assert "…" not in result.output


def test_progress_is_plain_lines_off_a_terminal(hf: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_app, "PROGRESS_EVERY", 0.0)
    result = runner.invoke(app, ["convert", str(hf), str(tmp_path / "c"), "--tp", "2"])
    assert result.exit_code == 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("converting: ")]
    assert lines and all("%" in line and "iB" in line for line in lines)
    assert "\x1b" not in result.stderr  # no bar, no escape codes


def test_inspect_lists_tensors(ckpt: Path) -> None:
    result = runner.invoke(app, ["inspect", str(ckpt), "--tensors"])
    assert result.exit_code == 0
    row = next(line for line in result.output.splitlines()
               if "model.layers.0.self_attn.k_proj.weight" in line)
    assert "BF16" in row and "[32, 64]" in row and "dim 0" in row and "[16, 64] x2" in row
    data = json.loads(runner.invoke(app, ["inspect", str(ckpt), "--tensors", "--json"]).stdout)
    k = next(t for t in data["tensors"] if t["name"] == "model.layers.0.self_attn.k_proj.weight")
    assert k["dtype"] == "BF16" and k["shape"] == [32, 64] and k["split_dims"] == [0]
    assert [(p["rank"], p["shape"], p["offset"]) for p in k["pieces"]] == [
        (0, [16, 64], [0, 0]), (1, [16, 64], [16, 0])]


# --- errors that point the right way ------------------------------------------------------------


def test_validate_on_a_hugging_face_directory_says_so(hf: Path) -> None:
    result = runner.invoke(app, ["validate", str(hf)])
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert "a Hugging Face checkpoint" in text and "shardspec convert" in text
    assert "interrupted write" not in text


def test_python_load_of_a_missing_path_says_it_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(shardspec.NotCommittedError, match="does not exist"):
        shardspec.load_rank(tmp_path / "nonexistent", 0)


def test_convert_of_a_missing_or_shardspec_source_says_so(ckpt: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["convert", str(tmp_path / "nonexistent"), str(tmp_path / "x"),
                                 "--tp", "1"])
    assert result.exit_code == 2 and "no such directory" in result.output
    result = runner.invoke(app, ["convert", str(ckpt), str(tmp_path / "y"), "--tp", "1"])
    assert result.exit_code == 2
    assert "is a shardspec checkpoint" in " ".join(result.output.split())
