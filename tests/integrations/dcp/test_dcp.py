"""shardspec.integrations.dcp: torch.distributed.checkpoint saves and loads shardspec checkpoints.

Real DCP (``dcp.save`` / ``dcp.load`` with its default planners) in real process groups (gloo on
CPU, spawned ranks joined through a FileStore), on a small transformer-like model sharded by
FSDP2 (``fully_shard``) and by a tensor-parallel plan (``parallelize_module``). Three worlds are
spawned once for the module and shared by the tests:

1. world 4, FSDP2: save; a rank failing mid-save (fresh directory and overwrite) leaves no
   manifest;
2. world 2, TP 2: save; load the FSDP 4 checkpoint under TP 2 and under FSDP 2 (world 4 -> 2);
3. world 4, FSDP2: load the TP 2 checkpoint (TP 2 -> FSDP 4).

Each rank reports through a JSON file; the tests assert on the reports and on the checkpoints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

import shardspec
from shardspec import Layout
from shardspec.integrations.dcp import OBJECTS_KEY, Reader, Writer
from worlds import spawn_world

if TYPE_CHECKING:
    from s3_server import S3Server

JOIN_SECONDS = 240  # a world slower than this on a busy machine is hung: fail, do not wait
DIM, FFN, VOCAB, LAYERS = 128, 384, 510, 2  # VOCAB: FSDP 4 shards it unevenly (128 x 3 + 126)


# --- the model ----------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(DIM)
        self.q = nn.Linear(DIM, DIM, bias=False)
        self.k = nn.Linear(DIM, DIM, bias=False)
        self.v = nn.Linear(DIM, DIM, bias=False)
        self.o = nn.Linear(DIM, DIM)  # row-parallel under TP: its bias is replicated
        self.mlp_norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, FFN, bias=False)
        self.down = nn.Linear(FFN, DIM, bias=False)
        self.gate = nn.Parameter(torch.empty(3))  # fewer rows than FSDP ranks: an empty shard


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)


def make_model(seed: int) -> Model:
    """The same values on every rank and every call with one ``seed`` (norms too)."""
    model = Model()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen))
    return model


def reference() -> dict[str, torch.Tensor]:
    """The full tensors every save writes, by DCP name."""
    return {f"model.{k}": v for k, v in make_model(0).state_dict().items()}


#: TP plan: which dimension a parameter is split on (absent: replicated, a plain tensor).
TP_DIMS = {"embed.weight": 0, "q.weight": 0, "k.weight": 0, "v.weight": 0, "o.weight": 1,
           "up.weight": 0, "down.weight": 1, "lm_head.weight": 0}


def tp_dim(name: str) -> int | None:
    for suffix, dim in TP_DIMS.items():
        if name.endswith("." + suffix):
            return dim
    return None


def shard_fsdp(model: Model, world: int) -> Model:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def shard_tp(model: Model, world: int) -> Model:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (world,))
    plan: dict[str, Any] = {"embed": RowwiseParallel(), "lm_head": ColwiseParallel()}
    for i in range(LAYERS):
        plan.update({f"layers.{i}.{n}": ColwiseParallel() for n in ("q", "k", "v", "up")})
        plan.update({f"layers.{i}.{n}": RowwiseParallel() for n in ("o", "down")})
    parallelize_module(model, mesh, plan)
    return model


def training_state(model: Model, step: int, lr: float, tag: bytes) -> dict[str, Any]:
    """What a trainer hands dcp.save: weights and non-tensor values."""
    return {"model": model.state_dict(), "step": step, "extra": {"lr": lr, "tag": tag}}


# --- running a world ----------------------------------------------------------------------------


#: A scenario: a name of :data:`SCENARIOS`, or a module-level function of another test module
#: (spawned ranks import it by name), called as ``scenario(rank, world, **args)`` -> its report.
Scenario = str | Callable[..., dict[str, Any]]


def _child(rank: int, world: int, tmp: str, scenario: Scenario, args: dict[str, Any]) -> None:
    result: dict[str, Any] = {"rank": rank, "ok": False}
    try:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank,
                                world_size=world, timeout=timedelta(seconds=120))
        torch.set_num_threads(1)
        run = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
        result.update(run(rank, world, **args))
        result["ok"] = True
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        result.update(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    Path(tmp, f"result-{rank}.json").write_text(json.dumps(result))
    os._exit(0)  # no process-group teardown that could wait on a dead peer


def run_world(tmp: Path, world: int, scenario: Scenario, **args: Any) -> list[dict[str, Any]]:
    scenario_name = scenario if isinstance(scenario, str) else scenario.__name__
    run_dir = tmp / f"run-{scenario_name}"
    run_dir.mkdir()
    results = spawn_world(run_dir, world, _child, (scenario, args), JOIN_SECONDS, scenario_name)
    for r, result in enumerate(results):
        assert result is not None, f"rank {r} of {scenario_name!r} died without a report"
        assert result["ok"], f"rank {r} of {scenario_name!r}: {result.get('traceback')}"
    return [result for result in results if result is not None]


# --- scenarios (run in the children) -----------------------------------------------------------


def _full(value: Any) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


def _local(value: Any) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return value.to_local() if isinstance(value, DTensor) else value


def _load_and_check(model: Model, path: str) -> dict[str, Any]:
    """dcp.load into ``model`` (made with other values), then compare bit for bit with the
    reference; count the bytes read against the bytes this rank holds."""
    state = training_state(model, 0, 0.0, b"")
    reader = Reader(path)
    dcp.load(state, storage_reader=reader)
    expected = reference()
    loaded = {f"model.{k}": _full(v) for k, v in model.state_dict().items()}
    mismatched = sorted(n for n, t in expected.items()
                        if loaded[n].dtype != t.dtype or not torch.equal(loaded[n], t))
    held = sum(_local(v).numel() * _local(v).element_size() for v in state["model"].values())
    return {"mismatched": mismatched, "objects": [state["step"], state["extra"]["lr"],
                                                  state["extra"]["tag"].hex()],
            "bytes_read": reader.stats.bytes_read, "target_bytes": held,
            "files_opened": reader.stats.files_opened}


class FailingWriter(Writer):
    """Rank 2 fails after writing its data files, as a full disk would."""

    def write_data(self, plan: Any, planner: Any) -> Any:
        future = super().write_data(plan, planner)
        if self.rank == 2:
            raise OSError("disk full (injected)")
        return future


def _fsdp_save(rank: int, world: int, out: str) -> dict[str, Any]:
    model = shard_fsdp(make_model(0), world)
    state = training_state(model, 5, 0.25, b"\x00\xffrng")
    writer = Writer(f"{out}/fsdp4")
    dcp.save(state, storage_writer=writer)
    result: dict[str, Any] = {"failures": {}}
    for case, overwrite in (("fresh", False), ("overwrite", True)):
        path = f"{out}/failing-{case}"
        if overwrite:
            dcp.save(state, storage_writer=Writer(path))  # a committed checkpoint first
        try:
            dcp.save(state, storage_writer=FailingWriter(path, overwrite=overwrite))
            result["failures"][case] = "no error"
        except CheckpointException as exc:  # on every rank (a BaseException, not Exception)
            result["failures"][case] = f"{type(exc).__name__}: {exc}"
    return result


def _tp_save_and_loads(rank: int, world: int, out: str) -> dict[str, Any]:
    model = shard_tp(make_model(0), world)
    dcp.save(training_state(model, 5, 0.25, b"\x00\xffrng"),
             storage_writer=Writer(f"{out}/tp2", layout=Layout(tp_size=world)))
    dcp.save(training_state(model, 5, 0.25, b""),
             storage_writer=Writer(f"{out}/tp2-one-copy", replicas=False))
    return {"fsdp4_to_tp2": _load_and_check(shard_tp(make_model(1), world), f"{out}/fsdp4"),
            "fsdp4_to_fsdp2": _load_and_check(shard_fsdp(make_model(1), world),
                                              f"{out}/fsdp4")}


def _fsdp_load_tp(rank: int, world: int, out: str) -> dict[str, Any]:
    return {"tp2_to_fsdp4": _load_and_check(shard_fsdp(make_model(1), world), f"{out}/tp2")}


SCENARIOS = {"fsdp_save": _fsdp_save, "tp_save_and_loads": _tp_save_and_loads,
             "fsdp_load_tp": _fsdp_load_tp}


# --- the worlds, run once -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    out = tmp_path_factory.mktemp("dcp")
    reports: dict[str, Any] = {"out": out}
    reports["fsdp_save"] = run_world(out, 4, "fsdp_save", out=str(out))
    reports["tp"] = run_world(out, 2, "tp_save_and_loads", out=str(out))
    reports["tp2_to_fsdp4"] = run_world(out, 4, "fsdp_load_tp", out=str(out))
    yield reports


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from shardspec.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("name", ["fsdp4", "tp2"])
def test_a_dcp_save_is_a_valid_checkpoint(worlds: dict[str, Any], name: str) -> None:
    path = worlds["out"] / name
    done = run_cli("validate", "--checksums", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "checksums" in done.stdout and "verified" in done.stdout
    manifest = shardspec.open(path).manifest
    expected = reference()
    # weights are tensors, everything else objects in one extra file of the writing rank
    assert set(manifest.tensors) == set(expected)
    objects = json.loads(manifest.metadata[OBJECTS_KEY])
    assert set(objects) == {"step", "extra.lr", "extra.tag"}
    assert {f.path for f in manifest.extra_files} == {where[0] for where in objects.values()}


def test_fsdp_save_records_uneven_and_empty_shards(worlds: dict[str, Any]) -> None:
    manifest = shardspec.open(worlds["out"] / "fsdp4").manifest
    assert manifest.layout == Layout(tp_size=4)
    embed = manifest.tensors["model.embed.weight"]
    assert [(p.rank, p.offset, p.shape) for p in embed.pieces] == [  # type: ignore[union-attr]
        (0, (0, 0), (128, DIM)), (1, (128, 0), (128, DIM)), (2, (256, 0), (128, DIM)),
        (3, (384, 0), (126, DIM))]
    gate = manifest.tensors["model.layers.0.gate"]
    assert [(p.rank, p.offset) for p in gate.pieces] == [  # type: ignore[union-attr]
        (0, (0,)), (1, (1,)), (2, (2,))]  # rank 3's chunk is empty: no piece


def test_tp_save_records_replicas(worlds: dict[str, Any]) -> None:
    manifest = shardspec.open(worlds["out"] / "tp2").manifest
    assert manifest.layout == Layout(tp_size=2)
    norm = manifest.tensors["model.norm.weight"]  # a plain tensor on both ranks
    bias = manifest.tensors["model.layers.1.o.bias"]  # a Replicate DTensor
    for record in (norm, bias):
        assert [(p.rank, p.replica, p.offset) for p in record.pieces] == [  # type: ignore[union-attr]
            (0, 0, (0,)), (1, 1, (0,))]
    down = manifest.tensors["model.layers.0.down.weight"]
    assert [(p.rank, p.offset) for p in down.pieces] == [  # type: ignore[union-attr]
        (0, (0, 0)), (1, (0, FFN // 2))]


@pytest.mark.parametrize("case", ["fsdp4_to_tp2", "fsdp4_to_fsdp2", "tp2_to_fsdp4"])
def test_loads_bit_exact_under_another_sharding(worlds: dict[str, Any], case: str) -> None:
    reports = worlds["tp"] if case != "tp2_to_fsdp4" else worlds["tp2_to_fsdp4"]
    for report in reports:
        got = report[case]
        assert got["mismatched"] == []
        assert got["objects"] == [5, 0.25, b"\x00\xffrng".hex()]


@pytest.mark.parametrize("case", ["fsdp4_to_tp2", "fsdp4_to_fsdp2", "tp2_to_fsdp4"])
def test_bytes_read_are_within_a_tenth_of_the_target(worlds: dict[str, Any], case: str) -> None:
    """The done-criterion of issue 22: a rank reads its target shards' bytes (headers and
    coalesced gaps included) within 1.1x."""
    reports = worlds["tp"] if case != "tp2_to_fsdp4" else worlds["tp2_to_fsdp4"]
    for report in reports:
        got = report[case]
        assert got["target_bytes"] <= got["bytes_read"] <= 1.1 * got["target_bytes"], got


def test_a_failing_rank_leaves_no_manifest(worlds: dict[str, Any]) -> None:
    for report in worlds["fsdp_save"]:
        for case, error in report["failures"].items():
            assert "CheckpointException" in error and "disk full (injected)" in error, case
    for case in ("fresh", "overwrite"):
        path = worlds["out"] / f"failing-{case}"
        assert path.is_dir() and not (path / "shardspec.json").exists(), case
        with pytest.raises(shardspec.NotCommittedError):
            shardspec.open(path)


def test_fsdp_checkpoint_loads_per_rank(worlds: dict[str, Any]) -> None:
    """load_rank at the saving layout returns each rank's FSDP shards, and at a serving layout
    (TP 2, resharded on load) the slices that layout holds."""
    path = worlds["out"] / "fsdp4"
    expected = reference()
    for rank in range(4):
        loaded = shardspec.load_rank(path, rank, "cpu")
        want = {n: chunks[rank] for n, t in expected.items()
                if len(chunks := torch.chunk(t, 4)) > rank and chunks[rank].numel()}
        assert set(loaded) == set(want)
        assert all(torch.equal(loaded[n], want[n]) for n in want)
    for rank in range(2):
        loaded = shardspec.load_rank(path, rank, "cpu", layout=Layout(tp_size=2))
        assert set(loaded) == set(expected)
        assert all(torch.equal(loaded[n], torch.tensor_split(t, 2)[rank])
                   for n, t in expected.items())


def test_tp_checkpoint_loads_per_rank(worlds: dict[str, Any]) -> None:
    """Every rank finds its column/row slices and the replicated tensors in its own files."""
    path = worlds["out"] / "tp2"
    for rank in range(2):
        loaded = shardspec.load_rank(path, rank, "cpu")
        for name, full in reference().items():
            dim = tp_dim(name)
            want = full if dim is None else torch.chunk(full, 2, dim)[rank]
            assert torch.equal(loaded[name], want), name
        files = shardspec.open(path).rank_files(rank)
        assert all(f"rank-{rank}-" in str(f) for f in files)


def test_without_replicas_one_rank_holds_a_replicated_tensor(worlds: dict[str, Any]) -> None:
    manifest = shardspec.open(worlds["out"] / "tp2-one-copy").manifest
    assert manifest.layout == Layout(tp_size=2)  # the flat layout of the group
    for name in ("model.norm.weight", "model.layers.1.o.bias"):
        pieces = manifest.tensors[name].pieces  # type: ignore[union-attr]
        assert len(pieces) == 1 and pieces[0].replica == 0, name
    assert len(manifest.tensors["model.layers.0.q.weight"].pieces) == 2  # type: ignore[union-attr]


# --- single process (no process group) ----------------------------------------------------------


@pytest.fixture
def single_process() -> Iterator[None]:
    """DCP warns that it saves and loads in one process when no group is initialised."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


@pytest.mark.usefixtures("single_process")
def test_a_dtype_other_than_the_checkpoint_s_is_refused_naming_the_tensor(
    worlds: dict[str, Any],
) -> None:
    state = {"model.norm.weight": torch.zeros(DIM, dtype=torch.bfloat16)}
    with pytest.raises(CheckpointException, match=r"reshard-unsupported.*model\.norm\.weight"):
        dcp.load(state, storage_reader=Reader(worlds["out"] / "fsdp4"))
    assert not state["model.norm.weight"].any()


@pytest.mark.usefixtures("single_process")
def test_loads_a_checkpoint_written_by_shardspec_save(tmp_path: Path) -> None:
    """Any shardspec checkpoint loads through DCP: here TP 2 from shardspec.save, with a
    replicated norm and a tied embedding (an alias), into whole tensors."""
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(6, 10, generator=gen).to(torch.bfloat16)
    norm = torch.randn(10, generator=gen)
    states, sharding = {}, {}
    for rank in range(2):
        (w, ws), (n, ns) = (shardspec.split(weight, 1, 2)[rank],
                            shardspec.split(norm, None, 2)[rank])
        states[rank] = {"w": w, "norm": n, "tied": w}
        sharding[rank] = {"w": ws, "norm": ns, "tied": ws}
    shardspec.save(states, tmp_path / "ckpt", layout=Layout(tp_size=2), sharding=sharding)
    assert shardspec.open(tmp_path / "ckpt").manifest.tensors["tied"].alias_of == "w"  # type: ignore[union-attr]
    out = {"w": torch.zeros(6, 10, dtype=torch.bfloat16), "norm": torch.zeros(10),
           "tied": torch.zeros(6, 10, dtype=torch.bfloat16)}
    reader = Reader(tmp_path / "ckpt", verify=True)
    dcp.load(out, storage_reader=reader)
    assert torch.equal(out["w"], weight) and torch.equal(out["tied"], weight)
    assert torch.equal(out["norm"], norm)
    assert reader.stats.verify_bytes > 0


@pytest.mark.usefixtures("single_process")
def test_extra_files_and_objects_are_listed_and_checksummed(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama"}')
    state = {"w": torch.arange(12.0).reshape(3, 4), "step": 42, "rng": b"\x01\x02"}
    dcp.save(state, storage_writer=Writer(tmp_path / "c", extra_files=[config]))
    report = shardspec.validate(tmp_path / "c", checksums=True)
    # one warning: the objects are pickles (tests/integrations/dcp/test_dcp_hostile.py)
    assert report.ok
    assert [(f.code, f.json_path) for f in report.findings] == [
        ("objects-pickled", f"$.metadata[{OBJECTS_KEY!r}]")]
    manifest = shardspec.open(tmp_path / "c").manifest
    assert {f.path for f in manifest.extra_files} == {"config.json", "dcp-objects-rank-0.bin"}
    assert (tmp_path / "c" / "config.json").read_text() == config.read_text()
    out = {"w": torch.zeros(3, 4), "step": 0, "rng": b""}
    dcp.load(out, storage_reader=Reader(tmp_path / "c", verify=True))
    assert torch.equal(out["w"], state["w"]) and out["step"] == 42 and out["rng"] == b"\x01\x02"
    # a corrupted objects file is found by verify
    blob = tmp_path / "c" / "dcp-objects-rank-0.bin"
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(CheckpointException, match="checksum-mismatch"):
        dcp.load({"step": 0}, storage_reader=Reader(tmp_path / "c", verify=True))


@pytest.mark.usefixtures("single_process")
def test_a_directory_without_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointException, match="not-committed"):
        dcp.load({"w": torch.zeros(2)}, storage_reader=Reader(tmp_path))


@pytest.mark.usefixtures("single_process")
def test_a_layout_of_another_size_is_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(CheckpointException, match="layout .* has 2 ranks"):
        dcp.save({"w": torch.zeros(2)}, storage_writer=Writer(tmp_path / "c",
                                                             layout=Layout(tp_size=2)))
    assert not (tmp_path / "c").exists()


@pytest.mark.usefixtures("single_process")
def test_save_and_load_in_object_storage(s3_server: S3Server, s3_bucket: str) -> None:
    url = f"s3://{s3_bucket}/dcp"
    options = s3_server.storage_options()
    gen = torch.Generator().manual_seed(4)
    state = {"w": torch.randn(64, 32, generator=gen), "step": 9}
    dcp.save(state, storage_writer=Writer(url, storage_options=options))
    assert shardspec.validate(url, checksums=True, storage_options=options).ok
    out = {"w": torch.zeros(64, 32), "step": 0}
    reader = Reader(url, storage_options=options)
    dcp.load(out, storage_reader=reader)
    assert torch.equal(out["w"], state["w"]) and out["step"] == 9
