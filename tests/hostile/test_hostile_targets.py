"""Hostile input, round four (issue 49): what a writer meets in its target directory.

Each test failed before its fix: a writer wrote, changed the mode of, or removed a file
outside what it writes because a name in its target was a symlink someone planted there.
"""

from __future__ import annotations

import os
import shutil
import stat
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from typer.testing import CliRunner

import shardspec
from checkpoints import make_tiny
from hf_helpers import llama_tensors, write_hf_dir
from shardspec.cli import app
from shardspec.convert import convert, import_vllm, merge
from shardspec.format.errors import PathError
from shardspec.format.manifest import Layout
from shardspec.integrations.dcp import Writer
from shardspec.reshard.write import reshard
from shardspec.storage.commit import CLAIM_NAME, LEFTOVER, TEMP_SUFFIX, write_durably

runner = CliRunner()


@pytest.fixture
def hf(tmp_path: Path) -> Path:
    return write_hf_dir(tmp_path / "hf", llama_tensors(layers=1, hidden=32, heads=4,
                                                       kv_heads=2, dtype=torch.bfloat16))


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A user's file outside every target: private, and never to be written."""
    path = tmp_path / "victim"
    path.write_bytes(b"the user's own")
    path.chmod(0o600)
    return path


def untouched(victim: Path) -> None:
    assert victim.read_bytes() == b"the user's own"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600


def plant_temporaries(out: Path, names: Iterator[str] | list[str], victim: Path) -> None:
    """A link to ``victim`` under the temporary name a writer used for each of ``names``
    (``.NAME.shardspec-tmp``), and under the claim's: what a directory of only such names
    looks like, an interrupted write that needs no --overwrite."""
    out.mkdir(parents=True, exist_ok=True)
    for name in [*names, CLAIM_NAME]:
        (out / f".{name}{TEMP_SUFFIX}").symlink_to(victim)


def written_names(write: Callable[[Path], object], where: Path) -> list[str]:
    """The names a writer writes into a fresh directory."""
    write(where)
    return sorted(p.name for p in where.iterdir())


# --- item 1: a temporary name planted as a link ---------------------------------------------


def test_write_durably_never_writes_through_a_planted_temporary(tmp_path: Path,
                                                                victim: Path) -> None:
    final = tmp_path / "shardspec.json"
    (tmp_path / f".shardspec.json{TEMP_SUFFIX}").symlink_to(victim)
    seen: list[Path] = []

    def write(temp: Path) -> None:
        seen.append(temp)
        temp.write_bytes(b"{}")

    write_durably(final, write)
    untouched(victim)
    assert final.read_bytes() == b"{}" and not final.is_symlink()
    assert LEFTOVER.match(seen[0].name) and not seen[0].exists()


def test_a_temporary_swapped_while_written_is_not_renamed(tmp_path: Path, victim: Path) -> None:
    def write(temp: Path) -> None:
        temp.unlink()
        temp.symlink_to(victim)

    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(PathError, match="replaced while it was written"):
        write_durably(out / "a.safetensors", write)
    untouched(victim)
    assert list(out.iterdir()) == []


def test_save_into_planted_temporaries(tmp_path: Path, victim: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text("{}")

    def save(out: Path) -> object:
        return make_tiny(out, extra_files=[config])

    names = written_names(save, tmp_path / "fresh")
    plant_temporaries(tmp_path / "out", names, victim)
    save(tmp_path / "out")
    untouched(victim)
    assert shardspec.validate(tmp_path / "out", checksums=True).ok
    modes = {stat.S_IMODE((tmp_path / "out" / n).stat().st_mode) for n in names}
    assert modes == {stat.S_IMODE((tmp_path / "fresh" / names[0]).stat().st_mode)}


def test_convert_and_reshard_into_planted_temporaries(hf: Path, tmp_path: Path,
                                                      victim: Path) -> None:
    """``ln -s ~/victim out/.shardspec.json.shardspec-tmp; shardspec convert HF out`` exited
    0 and wrote the manifest into the victim (and chmod'ed it 0644)."""
    for names in ("hf", "shardspec"):
        fresh, out = tmp_path / f"fresh-{names}", tmp_path / f"out-{names}"
        naming = ["--names", names] if names == "hf" else []  # torch's file names, claimed
        result = runner.invoke(app, ["convert", str(hf), str(fresh), "--tp", "2", *naming])
        assert result.exit_code == 0, result.output
        plant_temporaries(out, sorted(p.name for p in fresh.iterdir()), victim)
        result = runner.invoke(app, ["convert", str(hf), str(out), "--tp", "2", *naming])
        assert result.exit_code == 0, result.output
        untouched(victim)
        assert shardspec.validate(out, checksums=True).ok
    fresh, out = tmp_path / "fresh-reshard", tmp_path / "out-reshard"
    reshard(tmp_path / "out-hf", fresh, Layout(tp_size=1))
    plant_temporaries(out, sorted(p.name for p in fresh.iterdir()), victim)
    result = runner.invoke(app, ["reshard", str(tmp_path / "out-hf"), str(out),
                                 "--tp", "1"])
    assert result.exit_code == 0, result.output
    untouched(victim)


def test_merge_into_planted_temporaries(hf: Path, tmp_path: Path, victim: Path) -> None:
    ckpt = tmp_path / "ckpt"
    convert(hf, ckpt, tp_size=2)
    names = [*merge(ckpt, tmp_path / "fresh", max_shard_size=4096), "config.json",
             "tokenizer.json", "tokenizer_config.json"]
    plant_temporaries(tmp_path / "out", names, victim)
    merge(ckpt, tmp_path / "out", max_shard_size=4096, overwrite=True)
    untouched(victim)


def test_import_into_planted_temporaries(tmp_path: Path, victim: Path) -> None:
    """``shardspec import`` of a save received from someone: the sender planted the link."""
    tiny = make_tiny(tmp_path / "tiny")
    save = tmp_path / "received"
    save.mkdir()
    for rank in (0, 1):
        shutil.copy(tiny.data_file(rank), save / f"model-rank-{rank}-part-0.safetensors")
    fresh = tmp_path / "fresh"
    shutil.copytree(save, fresh)
    import_vllm(fresh)
    plant_temporaries(save, ["shardspec.json"], victim)
    import_vllm(save)
    untouched(victim)
    assert shardspec.validate(save, checksums=True).ok


def test_dcp_writer_into_planted_temporaries(tmp_path: Path, victim: Path) -> None:
    state = {"w": torch.arange(12.0).reshape(3, 4), "step": {"n": 3}}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, storage_writer=Writer(tmp_path / "fresh"))
        names = sorted(p.name for p in (tmp_path / "fresh").iterdir())
        assert any(n.startswith("dcp-objects") for n in names)
        plant_temporaries(tmp_path / "out", names, victim)
        dcp.save(state, storage_writer=Writer(tmp_path / "out"))
    untouched(victim)
    assert shardspec.validate(tmp_path / "out", checksums=True).ok


# --- item 2: an old file that links to a user's file ----------------------------------------


def test_overwrite_removes_the_link_not_the_users_file(tmp_path: Path) -> None:
    """An old data file (a name the writer may remove) that links to a user's file inside the
    target: the writer deleted the user's file (``resolve_inside(root, name).unlink()``)."""
    out = tmp_path / "out"
    make_tiny(out)
    mine = out / "notes.txt"
    mine.write_text("mine")
    stale = out / "model-rank-7-part-0.safetensors"
    stale.symlink_to("notes.txt")
    make_tiny(out, overwrite=True)
    assert mine.read_text() == "mine"
    assert not os.path.lexists(stale)


def test_a_link_listed_by_the_old_manifest_is_removed_itself(tmp_path: Path) -> None:
    out = tmp_path / "out"
    source = tmp_path / "tokenizer.json"
    source.write_text("{}")
    make_tiny(out, extra_files=[source])
    mine = out / "mine.json"
    mine.write_text("mine")
    (out / "tokenizer.json").unlink()
    (out / "tokenizer.json").symlink_to("mine.json")
    make_tiny(out, overwrite=True)
    assert mine.read_text() == "mine" and not os.path.lexists(out / "tokenizer.json")


# --- item 3: a folder of the target that links outside it ------------------------------------


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere"
    path.mkdir()
    return path


def linked_sub(out: Path, elsewhere: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "sub").symlink_to(elsewhere, target_is_directory=True)


def test_save_refuses_an_extra_file_through_a_linked_folder(tmp_path: Path,
                                                            elsewhere: Path) -> None:
    source = tmp_path / "x.txt"
    source.write_text("x")
    out = tmp_path / "out"
    make_tiny(out)
    linked_sub(out, elsewhere)
    with pytest.raises(PathError, match="sub") as excinfo:
        make_tiny(out, overwrite=True, extra_files={"sub/x.txt": source})
    assert excinfo.value.code == "path-escapes"
    assert list(elsewhere.iterdir()) == []
    assert shardspec.validate(out, checksums=True).ok  # refused before the old one went


def test_convert_reshard_merge_refuse_a_linked_folder(hf: Path, tmp_path: Path,
                                                      elsewhere: Path) -> None:
    (hf / "sub").mkdir()
    (hf / "sub" / "x.txt").write_text("x")
    ckpt = tmp_path / "ckpt"
    convert(hf, ckpt, tp_size=2)
    assert (ckpt / "sub" / "x.txt").is_file()
    for command in (["convert", str(hf)], ["reshard", str(ckpt)], ["merge", str(ckpt)]):
        out = tmp_path / f"out-{command[0]}"
        (out / "old").mkdir(parents=True)
        linked_sub(out, elsewhere)
        tp = ["--tp", "1"] if command[0] != "merge" else []
        result = runner.invoke(app, [*command, str(out), *tp, "--overwrite"])
        said = result.stdout + result.stderr
        assert result.exit_code == 1, said
        assert "Traceback" not in said and "internal error" not in said
        assert "path-escapes" in said and "sub" in said and "symlink" in said, said
        assert list(elsewhere.iterdir()) == []
        assert (out / "old").is_dir() and sorted(p.name for p in out.iterdir()) == \
            ["old", "sub"]  # refused before anything was removed or written


# --- item 5: --overwrite and the files an import adopted -------------------------------------


def imported_save(tmp_path: Path) -> Path:
    """A vLLM save someone trained and imported in place: its files are theirs."""
    tiny = make_tiny(tmp_path / "tiny")
    save = tmp_path / "save"
    save.mkdir()
    for rank in (0, 1):
        shutil.copy(tiny.data_file(rank), save / f"model-rank-{rank}-part-0.safetensors")
    (save / "notes.json").write_text("{}")
    import_vllm(save)
    return save


def test_overwrite_refuses_to_delete_an_adopted_save(hf: Path, tmp_path: Path) -> None:
    """convert --overwrite over an imported save deleted the user's training save."""
    save = imported_save(tmp_path)
    before = {p.name: p.read_bytes() for p in save.iterdir() if p.name != "shardspec.json"}
    result = runner.invoke(app, ["convert", str(hf), str(save), "--tp", "1", "--overwrite"])
    said = result.stdout + result.stderr
    assert result.exit_code == 2 and "--remove-adopted" in said and "import" in said, said
    assert {p.name: p.read_bytes() for p in save.iterdir() if p.name != "shardspec.json"} \
        == before
    assert shardspec.validate(save, checksums=True).ok
    with pytest.raises(FileExistsError, match="remove_adopted=True"):
        make_tiny(save, overwrite=True)
    result = runner.invoke(app, ["convert", str(hf), str(save), "--tp", "1", "--overwrite",
                                 "--remove-adopted"])
    assert result.exit_code == 0, result.stdout + result.stderr
    assert shardspec.validate(save, checksums=True).ok
    assert not (save / "notes.json").exists()


def test_the_dcp_writer_and_reshard_take_remove_adopted(hf: Path, tmp_path: Path) -> None:
    save = imported_save(tmp_path)
    state = {"w": torch.arange(12.0).reshape(3, 4)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        with pytest.raises(CheckpointException) as excinfo:
            dcp.save(state, storage_writer=Writer(save, overwrite=True))
        (error, _), = excinfo.value.failures.values()
        assert isinstance(error, FileExistsError) and "remove_adopted" in str(error)
        assert shardspec.validate(save, checksums=True).ok
        source = tmp_path / "source"
        convert(hf, source, tp_size=2)
        with pytest.raises(FileExistsError, match="remove_adopted"):
            reshard(source, save, Layout(tp_size=1), overwrite=True)
        reshard(source, save, Layout(tp_size=1), overwrite=True, remove_adopted=True)
    assert shardspec.validate(save, checksums=True).ok
