"""Nothing half-written: what can be checked is checked before the first byte; an interrupted
write (Ctrl-C or SIGTERM) leaves no temporary file, and a rerun replaces its leftovers: the
files it claimed, never a distributed save of transformers that no shardspec write made."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

import shardspec
import shardspec.convert.from_hf as from_hf
from hf_helpers import llama_tensors, write_hf_dir
from shardspec import Layout
from shardspec.cli import app
from shardspec.convert import convert, import_directory
from shardspec.convert.hf import HFError
from shardspec.storage.commit import CLAIM_NAME, read_claim

REFERENCE = Path(__file__).resolve().parents[2] / "reference"
HELPERS = Path(__file__).resolve().parents[1] / "helpers"


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


def _interrupted_convert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tp_size: int,
                         file: int, *, mid_tensor: bool) -> Path:
    """A Hugging Face directory (returned) converted to ``tmp_path / "ckpt"`` at ``tp_size`` with
    Ctrl-C as convert writes its ``file``-th data file: before its first byte, or half-way
    through its first tensor."""
    src = _hf(tmp_path)
    written = from_hf.write_safetensors
    calls = [0]

    def interrupted(path: Path, tensors: object, **kwargs: object) -> tuple[int, str]:
        calls[0] += 1
        if calls[0] == file:
            if not mid_tensor:
                raise KeyboardInterrupt

            def stop(count: int) -> None:
                raise KeyboardInterrupt
            kwargs["progress"] = stop
        return written(path, tensors, **kwargs)  # type: ignore[arg-type]

    with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
        patched.setattr(from_hf, "write_safetensors", interrupted)
        convert(src, tmp_path / "ckpt", tp_size=tp_size)
    return src


def test_ctrl_c_mid_convert_leaves_no_temporary_file_and_a_rerun_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _interrupted_convert(tmp_path, monkeypatch, 2, 2, mid_tensor=True)
    names = sorted(os.listdir(tmp_path / "ckpt"))
    # no temporary file, no manifest: the first file and the claim listing both files
    assert names == [CLAIM_NAME, "shard-00001-model-00001-of-00001.safetensors"]
    assert read_claim(tmp_path / "ckpt") == {"shard-00001-model-00001-of-00001.safetensors",
                                             "shard-00002-model-00001-of-00001.safetensors"}
    convert(src, tmp_path / "ckpt", tp_size=2)  # the leftover is replaced without overwrite
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok
    assert CLAIM_NAME not in os.listdir(tmp_path / "ckpt")  # gone with the commit


@pytest.mark.filterwarnings("ignore:the model has 2 key/value heads")
def test_a_rerun_at_another_layout_removes_what_the_interrupted_convert_claimed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _interrupted_convert(tmp_path, monkeypatch, 4, 3, mid_tensor=False)
    assert "shard-00002-model-00001-of-00001.safetensors" in os.listdir(tmp_path / "ckpt")
    with pytest.raises(HFError, match="interrupted shardspec write"):  # not a save to adopt
        import_directory(tmp_path / "ckpt")
    convert(src, tmp_path / "ckpt", tp_size=1)  # no overwrite needed; TP 4's files go
    assert sorted(os.listdir(tmp_path / "ckpt")) == [
        "config.json", "shard-00001-model-00001-of-00001.safetensors", "shardspec.json",
        "tokenizer.json", "tokenizer_config.json"]
    assert shardspec.validate(tmp_path / "ckpt", checksums=True).ok


def _distributed_save(root: Path) -> dict[str, bytes]:
    """What transformers' save_pretrained(..., distributed_checkpoint=True) leaves: one
    shard-* file per rank with torch's sharding info, config.json, no manifest."""
    root.mkdir()
    w = torch.randn(4, 8)
    for rank in range(2):
        save_file({"w": w[2 * rank:2 * rank + 2]},
                  str(root / f"shard-{rank + 1:05d}-model-00001-of-00001.safetensors"),
                  metadata={"DCP_SHARDING_INFO": json.dumps({"w": {"saved_offsets":
                                                                   [2 * rank, 0]}})})
    (root / "config.json").write_text("{}")
    return {f.name: f.read_bytes() for f in root.iterdir()}


def test_a_transformers_distributed_save_is_never_removed_by_overwrite(tmp_path: Path) -> None:
    src = _hf(tmp_path)
    before = _distributed_save(tmp_path / "dist")
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match=r"such as 'shard-00001-model-00001-of-00001"
                           r"\.safetensors' and 1 more .*never removes them"):
            convert(src, tmp_path / "dist", tp_size=2, overwrite=overwrite)
    result = CliRunner().invoke(app, ["convert", str(src), str(tmp_path / "dist"), "--tp", "2",
                                      "--overwrite"])
    assert result.exit_code == 2 and "never removes them" in " ".join(result.output.split())
    # Writers with shardspec's names leave the files alone too: only the manifest's go.
    states, sharding = _states()
    for _ in range(2):
        shardspec.save(states, tmp_path / "dist", layout=Layout(tp_size=2), sharding=sharding,
                       overwrite=True)
    assert {f.name: f.read_bytes() for f in (tmp_path / "dist").iterdir()
            if f.name in before} == before
    # Adopted, it is a checkpoint like any other; and a claim lists only plain safetensors
    # names, so a claim written by hand removes nothing else.
    (tmp_path / "claimed").mkdir()
    (tmp_path / "claimed" / "notes.txt").write_text("mine")
    (tmp_path / "claimed" / CLAIM_NAME).write_text(
        '{"files": ["notes.txt", "../hf/config.json", ".hidden.safetensors"]}')
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        convert(src, tmp_path / "claimed", tp_size=1)
    convert(src, tmp_path / "claimed", tp_size=1, overwrite=True)
    assert (tmp_path / "claimed" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "hf" / "config.json").exists()


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
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REFERENCE), str(HELPERS)])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert "terminated" in done.stderr and "Traceback" not in done.stderr
    assert os.listdir(dst) == [CLAIM_NAME]  # the temporary file went with the write
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
