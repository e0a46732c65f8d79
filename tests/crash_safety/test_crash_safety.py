"""SPEC 10: a writer killed at any moment leaves the old checkpoint intact, or no manifest.

A child process rewrites a checkpoint (overwrite=True) in many small files; the parent kills it
with SIGKILL after a growing delay, then checks what the directory says it is.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import shardspec

REPO = Path(__file__).resolve().parents[2]

WRITER = textwrap.dedent(
    """
    import sys, torch, shardspec
    path, seed = sys.argv[1], int(sys.argv[2])
    g = torch.Generator().manual_seed(seed)
    states = {r: {f"layer.{i}": torch.randn(64, 64, generator=g) for i in range(48)}
              for r in range(2)}
    print("ready", flush=True)
    shardspec.save(states, path, layout=shardspec.Layout(tp_size=2), overwrite=True,
                   max_file_size=64 * 64 * 4 * 2)
    print("done", flush=True)
    """
)


def _write(path: Path, seed: int, kill_after: float | None) -> bool:
    """Run the writer; kill it ``kill_after`` seconds after it is ready. True if it finished."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "reference")}
    with subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(seed)],
                          stdout=subprocess.PIPE, text=True, env=env) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        if kill_after is None:
            assert child.wait(timeout=120) == 0
            return True
        time.sleep(kill_after)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        return child.returncode == 0


def _fingerprint(path: Path) -> dict[int, dict[str, torch.Tensor]]:
    checkpoint = shardspec.open(path)
    return {r: checkpoint.load_rank(r, "cpu", verify=True) for r in range(checkpoint.world_size)}


def _same(a: dict[int, dict[str, torch.Tensor]], b: dict[int, dict[str, torch.Tensor]]) -> bool:
    return a.keys() == b.keys() and all(
        a[r].keys() == b[r].keys() and all(torch.equal(a[r][k], b[r][k]) for k in a[r])
        for r in a
    )


@pytest.mark.slow
def test_sigkill_during_overwrite_leaves_old_checkpoint_or_no_manifest(tmp_path: Path) -> None:
    previous, reference = tmp_path / "previous", tmp_path / "reference"
    _write(previous, seed=1, kill_after=None)
    _write(reference, seed=2, kill_after=None)
    old, new = _fingerprint(previous), _fingerprint(reference)
    outcomes = {"uncommitted": 0, "old": 0, "new": 0}
    for step in range(8):
        target = tmp_path / f"ckpt-{step}"
        shutil.copytree(previous, target)
        _write(target, seed=2, kill_after=0.08 * step)
        report = shardspec.validate(target, checksums=True)
        if not (target / "shardspec.json").exists():
            assert [f.code for f in report.findings] == ["not-committed"]
            outcomes["uncommitted"] += 1
            continue
        # A manifest exists: it must describe exactly the bytes on disk, old or new.
        assert report.ok, [str(f) for f in report.findings]
        loaded = _fingerprint(target)
        if _same(loaded, old):
            outcomes["old"] += 1
        else:
            assert _same(loaded, new)
            outcomes["new"] += 1
    # The sweep really interrupted writes, not only finished ones.
    assert outcomes["uncommitted"] + outcomes["old"] > 0, outcomes


class _Crash(BaseException):
    """The process dies here (not an Exception: nothing may catch it on the way)."""


def _counted(real: Callable[..., None], events: list[int], crash_at: int
             ) -> Callable[..., None]:
    """``real``, then a crash after the ``crash_at``-th rename or removal of the write."""
    def event(*args: object, **kwargs: object) -> None:
        real(*args, **kwargs)
        events[0] += 1
        if events[0] == crash_at:
            raise _Crash
    return event


def test_convert_stopped_at_any_step_is_replaced_by_a_rerun_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``convert`` writes torch's file names, which no leftover pattern matches (a distributed
    save of transformers has the same): it claims them first. Stopped after any rename or
    removal of an overwrite (TP 4 -> TP 2), the directory is the old checkpoint, the new one
    or no checkpoint, and a rerun at TP 1 replaces it (without overwrite where only data files
    and the claim are left) leaving exactly its own files."""
    from hf_helpers import llama_tensors, write_hf_dir
    from shardspec.convert import convert

    src = write_hf_dir(tmp_path / "hf", llama_tensors(hidden=64, heads=4, kv_heads=4),
                       kv_heads=4)
    convert(src, tmp_path / "tp1", tp_size=1)
    want = sorted(os.listdir(tmp_path / "tp1"))
    real_replace, real_unlink = os.replace, os.unlink
    step, outcomes = 0, {"old": 0, "none": 0, "new": 0}
    while True:
        step += 1
        target = tmp_path / f"ckpt-{step}"
        convert(src, target, tp_size=4)
        events = [0]
        monkeypatch.setattr(os, "replace", _counted(real_replace, events, step))
        monkeypatch.setattr(os, "unlink", _counted(real_unlink, events, step))
        try:
            convert(src, target, tp_size=2, overwrite=True)
            finished = True
        except _Crash:
            finished = False
        monkeypatch.undo()
        committed = (target / "shardspec.json").exists()
        if committed:
            assert shardspec.validate(target, checksums=True).ok
            world = shardspec.open(target).world_size
            outcomes["new" if world == 2 else "old"] += 1
        else:
            outcomes["none"] += 1
        extras = {n for n in os.listdir(target) if not n.endswith(".safetensors")
                  and n not in (".shardspec-writing", "shardspec.json")}
        try:  # without overwrite where only data files and the claim are left
            convert(src, target, tp_size=1)
            assert not committed and not extras, step
        except FileExistsError as exc:
            assert "pass overwrite=True" in str(exc), step  # never "never removes them"
            assert committed or extras, step
            convert(src, target, tp_size=1, overwrite=True)
        assert sorted(os.listdir(target)) == want, step
        assert shardspec.validate(target, checksums=True).ok
        if finished:
            break
    assert outcomes["old"] and outcomes["none"] and outcomes["new"], outcomes
