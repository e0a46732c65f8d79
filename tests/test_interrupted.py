"""Nothing half-written: what can be checked is checked before the first byte; an interrupted
write (Ctrl-C or SIGTERM) leaves no temporary file, and a rerun replaces its leftovers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import shardspec
import shardspec.convert.from_hf as from_hf
from hf_helpers import llama_tensors, write_hf_dir
from shardspec import Layout
from shardspec.cli import app
from shardspec.convert import convert

REFERENCE = Path(__file__).resolve().parents[1] / "reference"
TESTS = Path(__file__).resolve().parent


def _states() -> tuple[dict[int, dict[str, torch.Tensor]], dict[int, dict[str, shardspec.Shard]]]:
    weight = torch.randn(64, 16)
    states: dict[int, dict[str, torch.Tensor]] = {r: {} for r in range(2)}
    sharding: dict[int, dict[str, shardspec.Shard]] = {r: {} for r in range(2)}
    for rank, (piece, shard) in enumerate(shardspec.split(weight, 0, 2)):
        states[rank]["w"], sharding[rank]["w"] = piece, shard
    return states, sharding


def test_a_missing_extra_file_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    states, sharding = _states()
    with pytest.raises(FileNotFoundError, match=r"extra file 'config.json'.*does not exist; "
                       "nothing was written"):
        shardspec.save(states, tmp_path / "ckpt", layout=Layout(tp_size=2), sharding=sharding,
                       extra_files=[tmp_path / "config.json"])
    assert not (tmp_path / "ckpt").exists()
    (tmp_path / "config.json").write_text("{}")
    shardspec.save(states, tmp_path / "ckpt", layout=Layout(tp_size=2), sharding=sharding,
                   extra_files=[tmp_path / "config.json"])  # the rerun needs no overwrite
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok


def _hf(tmp_path: Path) -> Path:
    return write_hf_dir(tmp_path / "hf", llama_tensors(layers=2, hidden=64, heads=4,
                                                       kv_heads=2))


def test_ctrl_c_mid_convert_leaves_no_temporary_file_and_a_rerun_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _hf(tmp_path)
    written = from_hf.write_safetensors
    calls = [0]

    def interrupted(path: Path, tensors: object, **kwargs: object) -> tuple[int, str]:
        calls[0] += 1
        if calls[0] == 2:  # the second data file, half-way through its first tensor
            def stop(count: int) -> None:
                raise KeyboardInterrupt
            kwargs["progress"] = stop
        return written(path, tensors, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(from_hf, "write_safetensors", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert(src, tmp_path / "ckpt", tp_size=2)
    names = sorted(os.listdir(tmp_path / "ckpt"))
    assert names == ["model-rank-0-part-0.safetensors"]  # no temporary file, no manifest
    monkeypatch.undo()
    convert(src, tmp_path / "ckpt", tp_size=2)  # the leftover is replaced without overwrite
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok


def test_sigterm_mid_convert_cleans_up_like_ctrl_c(tmp_path: Path) -> None:
    src = _hf(tmp_path)
    dst = tmp_path / "ckpt"
    script = textwrap.dedent(f"""
        import os, signal, sys
        import shardspec.convert.from_hf as from_hf
        from shardspec.cli import main
        written = from_hf.write_safetensors
        def terminated(path, tensors, **kwargs):
            kwargs["progress"] = lambda n: os.kill(os.getpid(), signal.SIGTERM)
            return written(path, tensors, **kwargs)
        from_hf.write_safetensors = terminated
        sys.argv = ["shardspec", "convert", {str(src)!r}, {str(dst)!r}, "--tp", "2"]
        main()
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REFERENCE), str(TESTS)])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert "terminated" in done.stderr and "Traceback" not in done.stderr
    assert os.listdir(dst) == []  # the temporary file went with the write
    result = CliRunner().invoke(app, ["convert", str(src), str(dst), "--tp", "2"])
    assert result.exit_code == 0, result.output


def test_a_directory_with_other_files_still_needs_overwrite(tmp_path: Path) -> None:
    src = _hf(tmp_path)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"holds 1 entry such as 'notes.txt'.*pass "
                       "overwrite=True"):
        convert(src, tmp_path / "ckpt", tp_size=1)
    result = CliRunner().invoke(app, ["convert", str(src), str(tmp_path / "ckpt"), "--tp", "1"])
    assert result.exit_code == 2
    assert "pass --overwrite" in " ".join(result.output.split())
    assert "overwrite=True" not in result.output
    convert(src, tmp_path / "done", tp_size=1)
    with pytest.raises(FileExistsError, match="holds a checkpoint"):
        convert(src, tmp_path / "done", tp_size=1)


def test_the_readme_python_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    readme = (REFERENCE.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Python usage", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - the README's own example
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok
    assert (tmp_path / "ckpt" / "config.json").exists()
