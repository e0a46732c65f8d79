"""shardspec.distributed: save and load in real multi-process worlds (gloo on CPU).

Each world is a set of spawned processes joined through a FileStore in ``tmp_path``. Children
report through one JSON file per rank; the parent joins them with a deadline and kills any
straggler, so a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
import torch.distributed as dist
from typer.testing import CliRunner

import shardspec
from shardspec import Layout, Shard
from shardspec.cli import app
from worlds import spawn_world

if TYPE_CHECKING:
    from s3_server import S3Server

REPO = Path(__file__).resolve().parents[2]
JOIN_SECONDS = 90  # a world that takes longer than this is hung: fail, do not wait
SHORT = timedelta(seconds=4)  # the metadata timeout of the failure tests


# --- the state each rank saves ----------------------------------------------------------------


def make_state(rank: int, world: int) -> tuple[dict[str, torch.Tensor], dict[str, Shard]]:
    """Rank ``rank``'s random state for a TP=``world`` save, the same on every call.

    A colwise bf16 weight and a rowwise f32 weight (shardspec.split), a replicated norm, a
    rank-local tensor of a per-rank shape and seed, a scalar, and tied embeddings (an alias).
    """
    gen = torch.Generator().manual_seed(1234)
    col = torch.randn(4 * world, 6, generator=gen).to(torch.bfloat16)
    row = torch.randn(3, 2 * world, generator=gen)
    norm = torch.randn(6, generator=gen)
    embed = torch.randn(2 * world, 5, generator=gen).to(torch.float16)
    step = torch.tensor(7, dtype=torch.int64)
    local = torch.randn(rank + 1, 3, generator=torch.Generator().manual_seed(100 + rank))
    state: dict[str, torch.Tensor] = {}
    sharding: dict[str, Shard] = {}
    for name, tensor, dim in [("layers.0.col.weight", col, 0), ("layers.0.row.weight", row, 1),
                              ("norm.weight", norm, None), ("embed.weight", embed, 0),
                              ("step", step, None)]:
        piece, shard = shardspec.split(tensor, dim, world)[rank]
        state[name], sharding[name] = piece, shard
    state["lm_head.weight"] = state["embed.weight"]  # tied: recorded as an alias
    state["layers.0.qkv.weight"] = local  # no Shard: rank-local
    return state, sharding


def raw(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def same(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> list[str]:
    """Names whose dtype, shape or bytes differ (empty: bit-exact)."""
    if set(actual) != set(expected):
        return [f"names: {sorted(set(actual) ^ set(expected))}"]
    return [name for name, tensor in expected.items()
            if actual[name].dtype != tensor.dtype or actual[name].shape != tensor.shape
            or not torch.equal(raw(actual[name]), raw(tensor))]


# --- running a world --------------------------------------------------------------------------


def _child(rank: int, world: int, tmp: str, scenario: str, args: dict[str, Any]) -> None:
    result: dict[str, Any] = {"rank": rank, "ok": False}
    start = time.monotonic()
    try:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank,
                                world_size=world, timeout=timedelta(seconds=60))
        result.update(SCENARIOS[scenario](rank, world, **args) or {})
        result["ok"] = True
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        result.update(error_type=type(exc).__name__, error=str(exc),
                      failed_ranks=getattr(exc, "failed_ranks", None),
                      code=getattr(exc, "code", None), traceback=traceback.format_exc())
    result["seconds"] = time.monotonic() - start
    Path(tmp, f"result-{rank}.json").write_text(json.dumps(result))
    os._exit(0)  # no process-group teardown that could wait on a dead peer


def run_world(tmp: Path, world: int, scenario: str, **args: Any) -> list[dict[str, Any]]:
    """Run ``scenario`` on ``world`` spawned ranks; return each rank's result (None: died)."""
    run_dir = tmp / f"run-{scenario}-{time.monotonic_ns()}"
    run_dir.mkdir()
    return spawn_world(run_dir, world, _child, (scenario, args), JOIN_SECONDS, scenario)


def assert_all_ok(results: list[dict[str, Any] | None]) -> None:
    for result in results:
        assert result is not None and result["ok"], result and result.get("traceback")


# --- scenarios (run in the children) ----------------------------------------------------------


def _save_and_load(rank: int, world: int, path: str) -> dict[str, Any]:
    from shardspec import distributed

    state, sharding = make_state(rank, world)
    manifest = distributed.save(state, path, layout=Layout(tp_size=world), sharding=sharding)
    loaded = distributed.load(path)
    result = {"mismatched": same(loaded, state),
              "alias_shared": loaded["lm_head.weight"] is loaded["embed.weight"],
              "manifest_ok": manifest == shardspec.open(path).manifest}
    if world == 4:  # and again in two subgroups of 2, {0, 1} and {2, 3}, at the same time
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        state, sharding = make_state(rank % 2, 2)
        pair_path = f"{path}-pair{rank // 2}"
        distributed.save(state, pair_path, layout=Layout(tp_size=2), sharding=sharding,
                         group=pairs[rank // 2])
        result["pair_mismatched"] = same(distributed.load(pair_path, group=pairs[rank // 2]),
                                         state)
    return result


def _load_nodes(rank: int, world: int, paths: list[str], broken: list[str]) -> dict[str, Any]:
    """Load from this rank's node directory; then from ``broken``, where one node lacks files."""
    from shardspec import distributed

    loaded = distributed.load(paths[rank], device="cpu", timeout=SHORT)
    result: dict[str, Any] = {"mismatched": same(loaded, make_state(rank, world)[0])}
    try:
        distributed.load(broken[rank], device="cpu", timeout=SHORT)
    except distributed.DistributedLoadError as exc:
        result["broken"] = {"error": str(exc), "failed_ranks": exc.failed_ranks}
    return result


def _save_failing(rank: int, world: int, path: str, how: str) -> dict[str, Any]:
    from shardspec import distributed

    real = distributed.write_rank

    def write_rank(root: Path, r: int, state: Any, draft: Any) -> Any:
        files = real(root, r, state, draft)
        if r == 1 and how == "raise":
            raise OSError("disk full (injected)")
        if r == 1 and how == "exit":
            os._exit(1)
        if r == 1 and how == "hang":
            time.sleep(2 * SHORT.total_seconds())
        return files

    distributed.write_rank = write_rank  # type: ignore[assignment]
    state, sharding = make_state(rank, world)
    distributed.save(state, path, layout=Layout(tp_size=world), sharding=sharding,
                     timeout=SHORT)
    return {}


def _load_wrong_size(rank: int, world: int, path: str) -> dict[str, Any]:
    from shardspec import distributed

    distributed.load(path, timeout=SHORT)
    return {}


def _save_wrong_size(rank: int, world: int, path: str) -> dict[str, Any]:
    from shardspec import distributed

    state, sharding = make_state(rank, world)
    distributed.save(state, path, layout=Layout(tp_size=2 * world), sharding=sharding,
                     timeout=SHORT)
    return {}


def _global_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {"col": torch.randn(8, 6, generator=g).to(torch.bfloat16),
            "row": torch.randn(6, 8, generator=g), "norm": torch.randn(6, generator=g)}


def _load_resharded(rank: int, world: int, path: str) -> dict[str, Any]:
    from shardspec import distributed

    loaded = distributed.load(path, device="cpu", timeout=SHORT)
    full = _global_tensors()
    expected = {"col": full["col"].tensor_split(world, 0)[rank],
                "row": full["row"].tensor_split(world, 1)[rank], "norm": full["norm"]}
    return {"mismatched": sorted(k for k in expected if not torch.equal(loaded[k], expected[k]))
            + sorted(set(loaded) ^ set(expected))}


def _save_and_load_url(rank: int, world: int, url: str, options: dict[str, Any]
                       ) -> dict[str, Any]:
    from shardspec import distributed

    state, sharding = make_state(rank, world)
    distributed.save(state, url, layout=Layout(tp_size=world), sharding=sharding,
                     storage_options=options)
    loaded = distributed.load(url, storage_options=options)
    return {"mismatched": same(loaded, state)}


SCENARIOS = {
    "load_resharded": _load_resharded,
    "save_and_load_url": _save_and_load_url,
    "save_and_load": _save_and_load,
    "load_nodes": _load_nodes,
    "save_failing": _save_failing,
    "load_wrong_size": _load_wrong_size,
    "save_wrong_size": _save_wrong_size,
}


def assert_matches_single_process(path: Path, world: int) -> None:
    checkpoint = shardspec.open(path)
    assert checkpoint.world_size == world
    for rank in range(world):
        expected = make_state(rank, world)[0]
        assert same(checkpoint.load_rank(rank, device="cpu"), expected) == []
    assert shardspec.validate(path, checksums=True).ok


# --- tests ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any] | None]]:
    """A world-2 distributed save and load; the checkpoint and each rank's result."""
    tmp = tmp_path_factory.mktemp("world2")
    results = run_world(tmp, 2, "save_and_load", path=str(tmp / "ckpt"))
    return tmp / "ckpt", results


@pytest.mark.parametrize("world", [2, 4])
def test_save_then_load_bit_exact(
    world: int, saved2: tuple[Path, list[dict[str, Any] | None]], tmp_path: Path
) -> None:
    if world == 2:
        path, results = saved2
    else:
        path = tmp_path / "ckpt"
        results = run_world(tmp_path, world, "save_and_load", path=str(path))
    assert_all_ok(results)
    for result in results:
        assert result is not None
        assert result["mismatched"] == []
        assert result["alias_shared"] and result["manifest_ok"]
    assert_matches_single_process(path, world)
    if world == 4:
        assert all(r is not None and r["pair_mismatched"] == [] for r in results)
        for pair in range(2):
            assert_matches_single_process(Path(f"{path}-pair{pair}"), 2)


@pytest.mark.parametrize("how", ["raise", "exit", "hang"])
def test_failing_rank_leaves_no_manifest_and_all_raise(how: str, tmp_path: Path) -> None:
    """Rank 1 raises, exits, or outlasts the timeout after writing its files."""
    path = tmp_path / "ckpt"
    results = run_world(tmp_path, 2, "save_failing", path=str(path), how=how)
    assert not (path / "shardspec.json").exists()
    assert list(path.glob("model-rank-0-*"))  # rank 0 did write: only the commit is missing
    if how == "exit":
        assert results[1] is None  # it died without reporting
        results = results[:1]
    for result in results:
        assert result is not None and not result["ok"]
        assert result["error_type"] == "DistributedSaveError", result.get("traceback")
        assert "no manifest was written" in result["error"]
        if how == "raise":
            assert result["failed_ranks"] == {"1": "OSError: disk full (injected)"}
            assert "on rank 1: OSError: disk full (injected)" in result["error"]
        else:  # a rank that went silent cannot be named, only noticed
            assert "lost contact" in result["error"] and result["failed_ranks"] == {}
    if how != "raise":  # rank 0 gave up after the timeout, not after rank 1 (or never)
        assert results[0]["seconds"] < 2 * SHORT.total_seconds() + 10


def test_wrong_world_size_fails_cleanly_on_every_rank(tmp_path: Path) -> None:
    # a TP=4 checkpoint, written in one process, loaded by a world of 2
    path = tmp_path / "ckpt4"
    states, sharding = zip(*(make_state(r, 4) for r in range(4)), strict=True)
    shardspec.save(dict(enumerate(states)), path, layout=Layout(tp_size=4),
                   sharding=dict(enumerate(sharding)))
    results = run_world(tmp_path, 2, "load_wrong_size", path=str(path))
    messages = set()
    for result in results:
        assert result is not None and not result["ok"]
        assert result["error_type"] == "RequestError", result.get("traceback")
        assert result["code"] == "world-size-mismatch"
        assert "world size 4" in result["error"] and "has 2 ranks" in result["error"]
        assert "rank-local" in result["error"]  # why it could not reshard on load
        messages.add(result["error"])
    assert len(messages) == 1  # the same error on every rank

    target = tmp_path / "out"
    results = run_world(tmp_path, 2, "save_wrong_size", path=str(target))
    for result in results:
        assert result is not None and result["error_type"] == "DistributedSaveError"
        assert set(result["failed_ranks"]) == {"0", "1"}
        assert "process group has 2 ranks" in result["error"]
    assert not target.exists()  # refused before anything was written


def test_a_group_of_another_size_reshards_on_load(tmp_path: Path) -> None:
    """A TP=4 checkpoint of global tensors, loaded by a world of 2: partial reads, exact."""
    path = tmp_path / "ckpt4"
    full = _global_tensors()
    states: dict[int, dict[str, torch.Tensor]] = {r: {} for r in range(4)}
    sharding: dict[int, dict[str, Shard]] = {r: {} for r in range(4)}
    for name, dim in (("col", 0), ("row", 1), ("norm", None)):
        for r, (piece, shard) in enumerate(shardspec.split(full[name], dim, 4)):
            states[r][name], sharding[r][name] = piece, shard
    shardspec.save(states, path, layout=Layout(tp_size=4), sharding=sharding)
    results = run_world(tmp_path, 2, "load_resharded", path=str(path))
    assert_all_ok(results)
    assert all(r is not None and r["mismatched"] == [] for r in results)


def test_save_and_load_through_object_storage(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """Every rank writes its objects to one S3 prefix, rank 0 the manifest last; every rank
    then fetches the manifest and its own objects, each once."""
    url = f"s3://{s3_bucket}/world"
    options = s3_server.storage_options()
    results = run_world(tmp_path, 2, "save_and_load_url", url=url, options=options)
    assert_all_ok(results)
    assert all(r is not None and r["mismatched"] == [] for r in results)
    manifest = shardspec.open(url, storage_options=options).manifest
    for record in (f for r in manifest.ranks for f in r.files):
        assert s3_server.bytes_requested(f"world/{record.path}") == record.size
    puts = [r.key for r in s3_server.requests("PUT")]
    assert puts[-1] == "world/shardspec.json"


def test_two_nodes_each_load_from_their_own_directory(
    saved2: tuple[Path, list[dict[str, Any] | None]], tmp_path: Path
) -> None:
    path, results = saved2
    assert_all_ok(results)
    nodes = []
    for rank in range(2):
        listed = CliRunner().invoke(app, ["files", str(path), "--rank", str(rank)])
        assert listed.exit_code == 0, listed.output
        node = tmp_path / f"node{rank}"
        node.mkdir()
        names = listed.stdout.split()
        assert "shardspec.json" in names
        for name in names:
            (node / name).write_bytes((path / name).read_bytes())
        nodes.append(node)
    other = {p.name for p in nodes[1].iterdir()} - {"shardspec.json"}
    assert other and not other & {p.name for p in nodes[0].iterdir()}  # no file on both
    broken = tmp_path / "node1-no-manifest"
    broken.mkdir()
    for name in other:
        (broken / name).write_bytes((path / name).read_bytes())
    results = run_world(tmp_path, 2, "load_nodes", paths=[str(n) for n in nodes],
                        broken=[str(nodes[0]), str(broken)])
    assert_all_ok(results)
    for result in results:
        assert result is not None and result["mismatched"] == []
        # a node that lacks the manifest fails its rank, and every rank raises naming it
        assert list(result["broken"]["failed_ranks"]) == ["1"]
        assert "NotCommittedError" in result["broken"]["failed_ranks"]["1"]
        assert "while opening the checkpoint on rank 1: NotCommittedError" in (
            result["broken"]["error"])


def test_import_shardspec_does_not_import_distributed() -> None:
    code = ("import sys, shardspec; assert 'shardspec.distributed' not in sys.modules; "
            "import shardspec.distributed")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_example_runs_under_torchrun(tmp_path: Path) -> None:
    """The command README.md gives, as written there, with a temporary --dir."""
    readme = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    command = [line for line in readme if line.startswith("python -m torch.distributed.run")]
    assert len(command) == 1
    argv = shlex.split(command[0])
    assert argv[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                        "examples/distributed_save_load.py", "--dir", argv[-1]]
    out = tmp_path / "ckpt"
    run = subprocess.run([sys.executable, *argv[1:-1], str(out)], cwd=REPO,
                         env={**os.environ, "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert shardspec.validate(out, checksums=True).ok
    # the four ranks print concurrently: two lines can share a line of the combined output
    assert run.stdout.count("bit-exact") == 4
