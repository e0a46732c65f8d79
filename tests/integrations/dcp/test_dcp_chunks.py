"""shardspec's DCP Writer and Reader where a rank holds several chunks of one tensor (format 1.3,
SPEC 7.2 rules 3, 6 and 7; issue 40 item 3).

Real ``dcp.save`` / ``dcp.load`` in gloo process groups spawned by
tests/integrations/dcp/test_dcp.py's
``run_world``; two worlds run once for the module:

1. world 2: ``ShardedTensor``s with several local shards per rank (rows 0-1 and 4-5 on rank 0,
   2-3 and 6-7 on rank 1; bf16 columns in three and two chunks of uneven widths; one with an
   empty local shard), a plain tensor both ranks hold and non-tensor values: saved, then loaded
   into whole tensors, into DTensors ``Shard(0)`` / ``Shard(1)`` and into the saving sharding.
   A ``ShardedTensor`` whose two chunks on one rank differ in offset in both dimensions is
   refused before anything is written;
2. world 4: FSDP2 with tensor parallelism on a 2 x 2 mesh (``parallelize_module`` then
   ``fully_shard``: ``_StridedShard`` placements) saved and loaded back into the same sharding;
   ``ShardedTensor``s over two process groups of two ranks each (several chunks per rank, each
   held by two ranks: replicas), saved with and without ``replicas``.

The parent then validates the checkpoints, reads them per rank (each rank's value is the join
of its pieces) and loads them into a plain, non-distributed model.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from test_dcp import run_cli, run_world
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import WriteItem, WriteItemType

import shardspec
from checkpoints import assert_same_tensor
from shardspec import Layout
from shardspec.format.manifest import TensorRecord
from shardspec.integrations.dcp import Reader, Writer
from shardspec.integrations.dcp.planning import LocalChunk, LocalPlan, assign_pieces
from shardspec.write.save import plan_checkpoint

# --- the values ---------------------------------------------------------------------------------

#: each rank's chunks of "w" (8 x 3): (first row, rows)
W_ROWS = {0: [(0, 2), (4, 2)], 1: [(2, 2), (6, 2)]}
#: each rank's chunks of "c" (4 x 6, bf16): (first column, columns), uneven, three on rank 0
C_COLS = {0: [(0, 1), (2, 2), (5, 1)], 1: [(1, 1), (4, 1)]}
#: each rank's chunks of "e" (6 x 2, int64): rank 1's second chunk is empty
E_ROWS = {0: [(0, 2), (4, 2)], 1: [(2, 2), (6, 0)]}


def values() -> dict[str, torch.Tensor]:
    """The full tensors of the world-2 saves, the same in every process."""
    gen = torch.Generator().manual_seed(7)
    return {"w": torch.randn(8, 3, generator=gen),
            "c": torch.randn(4, 6, generator=gen).to(torch.bfloat16),
            "e": torch.randint(-(2**40), 2**40, (6, 2), generator=gen),
            "norm": torch.randn(5, generator=gen)}


def joined(name: str, rank: int) -> torch.Tensor:
    """What rank ``rank`` holds of ``name``: its chunks one after the other."""
    full = values()[name]
    if name == "norm":
        return full
    dim, spans = {"w": (0, W_ROWS), "c": (1, C_COLS), "e": (0, E_ROWS)}[name]
    return torch.cat([full.narrow(dim, start, size) for start, size in spans[rank]], dim)


def sharded(name: str, rank: int, *, zeros: bool = False, ranks: dict[int, int] | None = None,
            group: Any = None) -> Any:
    """``name`` as a ShardedTensor with rank ``rank``'s chunks (``ranks``: the rank of the
    chunk layout that a process plays, for process groups of their own)."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards

    full = values()[name]
    dim, spans = {"w": (0, W_ROWS), "c": (1, C_COLS), "e": (0, E_ROWS)}[name]
    shards = []
    for start, size in spans[(ranks or {}).get(rank, rank)]:
        part = full.narrow(dim, start, size).clone()
        offsets = [0] * full.dim()
        offsets[dim] = start
        shards.append(Shard(torch.zeros_like(part) if zeros else part,
                            ShardMetadata(offsets, list(part.shape), f"rank:{rank}/cpu")))
    return init_from_local_shards(shards, list(full.shape), process_group=group)


def local_shards_match(tensor: Any, name: str) -> bool:
    full = values()[name]
    return all(torch.equal(s.tensor, full[tuple(slice(o, o + n) for o, n in zip(
        s.metadata.shard_offsets, s.metadata.shard_sizes, strict=True))])
        for s in tensor.local_shards())


#: The FSDP2 + TP model: a column-parallel then a row-parallel projection.
def make_model(seed: int) -> nn.Sequential:
    model = nn.Sequential(nn.Linear(6, 8), nn.Linear(8, 4))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen))
    return model


def shard_fsdp_tp(model: nn.Sequential) -> nn.Sequential:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "1": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    return model


# --- scenarios (run in the spawned ranks) -------------------------------------------------------


def chunks_world(rank: int, world: int, out: str) -> dict[str, Any]:
    """World 2: save ShardedTensors of several chunks per rank; load them three ways; refuse."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    warnings.filterwarnings("ignore", category=FutureWarning)  # ShardedTensor is deprecated
    full = values()
    state = {name: sharded(name, rank) for name in ("w", "c", "e")}
    dcp.save({**state, "norm": full["norm"].clone(), "step": 11, "extra": {"tag": b"\x01"}},
             storage_writer=Writer(f"{out}/chunks"))
    report: dict[str, Any] = {}

    whole: dict[str, Any] = {n: torch.zeros_like(t) for n, t in full.items()}
    whole.update(step=0, extra={"tag": b""})
    dcp.load(whole, storage_reader=Reader(f"{out}/chunks", verify=True))
    report["whole"] = sorted(n for n, t in full.items() if not torch.equal(whole[n], t))
    report["objects"] = [whole["step"], whole["extra"]["tag"].hex()]

    mesh = init_device_mesh("cpu", (world,))
    dtensors = {n: distribute_tensor(torch.zeros_like(full[n]), mesh, [Shard(d)])
                for n, d in (("w", 0), ("c", 1), ("e", 0))}
    dcp.load(dtensors, storage_reader=Reader(f"{out}/chunks"))
    report["dtensor"] = sorted(n for n, t in dtensors.items()
                               if not torch.equal(t.full_tensor(), full[n]))

    same = {name: sharded(name, rank, zeros=True) for name in ("w", "c", "e")}
    reader = Reader(f"{out}/chunks")
    dcp.load(same, storage_reader=reader)
    report["same"] = sorted(n for n, t in same.items() if not local_shards_match(t, n))
    report["same_files_opened"] = reader.stats.files_opened

    # rank 0 holds blocks (0, 0) and (2, 2) of a 4 x 4 tensor, rank 1 (0, 2) and (2, 0):
    # a valid DCP save whose chunks on one rank differ in both dimensions
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard as STShard
    from torch.distributed._shard.sharded_tensor import init_from_local_shards

    blocks = {0: [(0, 0), (2, 2)], 1: [(0, 2), (2, 0)]}[rank]
    crossed = init_from_local_shards(
        [STShard(torch.ones(2, 2), ShardMetadata(list(b), [2, 2], f"rank:{rank}/cpu"))
         for b in blocks], [4, 4])
    try:
        dcp.save({"x": crossed, "w": state["w"]}, storage_writer=Writer(f"{out}/refused"))
        report["refused"] = "no error"
    except CheckpointException as exc:  # on every rank
        report["refused"] = str(exc)
    return report


def fsdp_tp_world(rank: int, world: int, out: str) -> dict[str, Any]:
    """World 4: FSDP2 + TP saved and loaded back; ShardedTensors over two groups (replicas)."""
    warnings.filterwarnings("ignore", category=FutureWarning)  # ShardedTensor is deprecated
    # full_tensor() of a _StridedShard DTensor warns that it gathers in two steps
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    model = shard_fsdp_tp(make_model(0))
    placements = {n: [type(p).__name__ for p in v.placements]
                  for n, v in model.state_dict().items()}
    dcp.save({"model": model.state_dict()}, storage_writer=Writer(f"{out}/fsdp-tp"))
    target = shard_fsdp_tp(make_model(1))
    dcp.load({"model": target.state_dict()}, storage_reader=Reader(f"{out}/fsdp-tp"))
    expected = make_model(0).state_dict()
    mismatched = sorted(n for n, v in target.state_dict().items()
                        if not torch.equal(v.full_tensor(), expected[n]))

    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes every group
    plays = {0: 0, 1: 1, 2: 0, 3: 1}  # ranks 2 and 3 hold what ranks 0 and 1 hold
    for name, replicas in (("replicas", True), ("one-copy", False)):
        w = sharded("w", rank, ranks=plays, group=groups[rank // 2])
        dcp.save({"w": w}, storage_writer=Writer(f"{out}/{name}", replicas=replicas))
    back = sharded("w", rank, zeros=True, ranks=plays, group=groups[rank // 2])
    dcp.load({"w": back}, storage_reader=Reader(f"{out}/replicas"))
    return {"placements": placements, "mismatched": mismatched,
            "replicas_back": local_shards_match(back, "w")}


# --- the worlds, run once -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("dcp-chunks")
    return {"out": out, "chunks": run_world(out, 2, chunks_world, out=str(out)),
            "fsdp_tp": run_world(out, 4, fsdp_tp_world, out=str(out))}


@pytest.fixture
def single_process() -> Iterator[None]:
    """DCP warns that it saves and loads in one process when no group is initialised."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def pieces(path: Path, name: str) -> list[tuple[Any, ...]]:
    """(rank, file, offset, shape, replica) of each of ``name``'s pieces, in manifest order."""
    record = shardspec.open(path).manifest.tensors[name]
    assert isinstance(record, TensorRecord)
    return [(p.rank, p.file, p.offset, p.shape, p.replica) for p in record.pieces]


# --- world 2: several chunks of one tensor on a rank --------------------------------------------


def test_several_chunks_are_several_pieces_of_a_valid_1_3_checkpoint(
    worlds: dict[str, Any],
) -> None:
    path = worlds["out"] / "chunks"
    done = run_cli("validate", "--checksums", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = shardspec.open(path).manifest
    assert manifest.format_version == "1.3"
    assert manifest.layout == Layout(tp_size=2)
    part = "model-rank-{}-part-{}.safetensors".format
    assert pieces(path, "w") == [
        (0, part(0, 0), (0, 0), (2, 3), 0), (0, part(0, 1), (4, 0), (2, 3), 0),
        (1, part(1, 0), (2, 0), (2, 3), 0), (1, part(1, 1), (6, 0), (2, 3), 0)]
    assert pieces(path, "c") == [
        (0, part(0, 0), (0, 0), (4, 1), 0), (0, part(0, 1), (0, 2), (4, 2), 0),
        (0, part(0, 2), (0, 5), (4, 1), 0),
        (1, part(1, 0), (0, 1), (4, 1), 0), (1, part(1, 1), (0, 4), (4, 1), 0)]
    # rank 1's empty chunk of "e" is no piece: rank 1 holds one
    assert [(r, o) for r, _, o, _, _ in pieces(path, "e")] == [(0, (0, 0)), (0, (4, 0)),
                                                                (1, (2, 0))]
    assert [(r, replica) for r, _, _, _, replica in pieces(path, "norm")] == [(0, 0), (1, 1)]
    objects = [f.path for f in manifest.extra_files]  # one rank writes them, DCP's choice
    assert len(objects) == 1 and objects[0].startswith("dcp-objects-rank-"), objects


def test_load_rank_returns_the_join_of_the_rank_s_pieces(worlds: dict[str, Any]) -> None:
    path = worlds["out"] / "chunks"
    for rank in range(2):
        loaded = shardspec.load_rank(path, rank, "cpu")
        assert set(loaded) == {"w", "c", "e", "norm"}
        for name, tensor in loaded.items():
            assert_same_tensor(tensor, joined(name, rank))


@pytest.mark.parametrize("case", ["whole", "dtensor", "same"])
def test_loads_bit_exact_into_any_sharding(worlds: dict[str, Any], case: str) -> None:
    for report in worlds["chunks"]:
        assert report[case] == []
        assert report["objects"] == [11, "01"]


def test_loading_the_saving_sharding_reads_the_rank_s_own_files(worlds: dict[str, Any]) -> None:
    """Each target chunk is one stored piece: a rank opens its own files, each once."""
    manifest = shardspec.open(worlds["out"] / "chunks").manifest
    for rank, report in enumerate(worlds["chunks"]):
        own = [f.path for f in manifest.ranks[rank].files]
        assert len(own) == 3 - rank  # "c" has 3 pieces on rank 0, 2 on rank 1
        assert sorted(report["same_files_opened"]) == own


def test_chunks_that_do_not_join_are_refused_before_writing(worlds: dict[str, Any]) -> None:
    for report in worlds["chunks"]:
        message = report["refused"]
        assert "rank 0 holds 2 chunks of tensor 'x'" in message, message
        assert "offset [0, 0] size [2, 2], offset [2, 2] size [2, 2]" in message
        assert "SPEC 7.2 rule 7" in message
    assert not (worlds["out"] / "refused").exists()


@pytest.mark.usefixtures("single_process")
def test_a_checkpoint_of_several_chunks_loads_in_one_process(worlds: dict[str, Any]) -> None:
    full = values()
    out = {n: torch.full_like(t, 3) for n, t in full.items()}
    dcp.load(out, storage_reader=Reader(worlds["out"] / "chunks", verify=True))
    for name, tensor in full.items():
        assert_same_tensor(out[name], tensor)


VECTORS = Path(__file__).resolve().parents[3] / "conformance" / "vectors"


@pytest.mark.usefixtures("single_process")
@pytest.mark.parametrize("vector", ["valid-several-pieces-fused-gate-up",
                                    "valid-several-pieces-fused-qkv-gqa",
                                    "valid-several-pieces-joined-along-columns"])
def test_reads_the_conformance_checkpoints_of_several_pieces(vector: str) -> None:
    """Checkpoints of several pieces per rank written by shardspec.save (replicas among them)
    load through DCP as the whole tensors that resharding to one rank gives."""
    path = VECTORS / vector / "checkpoint"
    whole = shardspec.load_rank(path, 0, "cpu", layout=Layout(tp_size=1))
    out = {name: torch.zeros_like(tensor) for name, tensor in whole.items()}
    dcp.load(out, storage_reader=Reader(path, verify=True))
    for name, tensor in whole.items():
        assert_same_tensor(out[name], tensor)


# --- world 4: FSDP2 with TP; several chunks with replicas ---------------------------------------


def test_fsdp_tp_save_loads_back_bit_exact(worlds: dict[str, Any]) -> None:
    for report in worlds["fsdp_tp"]:
        assert report["mismatched"] == []
        # fully_shard after a column-parallel plan on the same dimension: strided sharding
        assert report["placements"]["0.weight"] == ["_StridedShard", "Shard"]
    path = worlds["out"] / "fsdp-tp"
    assert shardspec.validate(path, checksums=True).ok
    # torch's DCP gives each rank one chunk of a _StridedShard DTensor: the rows of its TP
    # share that its FSDP rank holds, so rank (dp 1, tp 0) = 2 holds rows 2-3
    assert [(r, o, s) for r, _, o, s, _ in pieces(path, "model.0.weight")] == [
        (0, (0, 0), (2, 6)), (1, (4, 0), (2, 6)), (2, (2, 0), (2, 6)), (3, (6, 0), (2, 6))]
    # the row-parallel bias is replicated over TP: replicas
    assert [(r, o, replica) for r, _, o, _, replica in pieces(path, "model.1.bias")] == [
        (0, (0,), 0), (1, (0,), 1), (2, (2,), 0), (3, (2,), 1)]


@pytest.mark.usefixtures("single_process")
def test_fsdp_tp_save_loads_into_a_plain_model(worlds: dict[str, Any]) -> None:
    model = make_model(1)
    state = {"model": model.state_dict()}
    dcp.load(state, storage_reader=Reader(worlds["out"] / "fsdp-tp"))
    for name, tensor in make_model(0).state_dict().items():
        assert_same_tensor(model.state_dict()[name], tensor)


def test_several_chunks_with_replicas(worlds: dict[str, Any]) -> None:
    assert all(report["replicas_back"] for report in worlds["fsdp_tp"])
    path = worlds["out"] / "replicas"
    assert shardspec.validate(path, checksums=True).ok
    assert [(r, o, replica) for r, _, o, _, replica in pieces(path, "w")] == [
        (0, (0, 0), 0), (0, (4, 0), 0), (1, (2, 0), 0), (1, (6, 0), 0),
        (2, (0, 0), 1), (2, (4, 0), 1), (3, (2, 0), 1), (3, (6, 0), 1)]
    for rank in range(4):  # every rank finds its join in its own files
        assert_same_tensor(shardspec.load_rank(path, rank, "cpu")["w"], joined("w", rank % 2))
    one_copy = worlds["out"] / "one-copy"
    assert shardspec.validate(one_copy, checksums=True).ok
    kept = pieces(one_copy, "w")
    assert sorted(o for _, _, o, _, _ in kept) == [(0, 0), (2, 0), (4, 0), (6, 0)]
    assert all(replica == 0 for *_, replica in kept)


# --- the coordinator's planning, without a process group ---------------------------------------


def chunk(name: str, offset: tuple[int, ...], shape: tuple[int, ...],
          global_shape: tuple[int, ...] = (8, 4)) -> LocalChunk:
    return LocalChunk(name, "F32", global_shape, offset, shape)


def item(name: str, offset: tuple[int, ...]) -> WriteItem:
    return WriteItem(index=MetadataIndex(name, torch.Size(offset)), type=WriteItemType.SHARD)


def test_planning_refuses_chunks_that_do_not_join() -> None:
    crossed = [LocalPlan(0, (chunk("x", (0, 0), (4, 2)), chunk("x", (4, 2), (4, 2))), ()),
               LocalPlan(1, (chunk("x", (0, 2), (4, 2)), chunk("x", (4, 0), (4, 2))), ())]
    with pytest.raises(ValueError, match=r"rank 0 holds 2 chunks of tensor 'x' .*differ in "
                       r"dimensions \[0, 1\].*SPEC 7\.2 rule 7"):
        assign_pieces(crossed, [[], []], replicas=True)
    overlapping = [LocalPlan(0, (chunk("x", (0, 0), (4, 4)), chunk("x", (2, 0), (6, 4))), ())]
    with pytest.raises(ValueError, match=r"rank 0 .*overlap along dimension 0.*SPEC 7\.2 rule 7"):
        assign_pieces(overlapping, [[]], replicas=True)


def test_planning_gives_pieces_in_join_order_and_copies_as_replicas() -> None:
    """Chunks in any order become pieces in increasing offset, the k-th in the rank's k-th
    run of files; without ``replicas`` a rank writes the chunks DCP's planner left it."""
    rows = (chunk("w", (4, 0), (2, 4)), chunk("w", (0, 0), (2, 4)))  # given out of order
    rest = (chunk("w", (6, 0), (2, 4)), chunk("w", (2, 0), (2, 4)))
    locals_ = [LocalPlan(0, rows, ()), LocalPlan(1, rest, ()), LocalPlan(2, rows, ())]
    infos, _ = assign_pieces(locals_, [[], [], []], replicas=True)
    draft = plan_checkpoint(Layout(tp_size=3), infos)
    record = draft.tensors["w"]
    assert isinstance(record, TensorRecord)
    assert [(p.rank, p.file, p.offset, p.replica) for p in record.pieces] == [
        (0, "model-rank-0-part-0.safetensors", (0, 0), 0),
        (0, "model-rank-0-part-1.safetensors", (4, 0), 0),
        (1, "model-rank-1-part-0.safetensors", (2, 0), 0),
        (1, "model-rank-1-part-1.safetensors", (6, 0), 0),
        (2, "model-rank-2-part-0.safetensors", (0, 0), 1),
        (2, "model-rank-2-part-1.safetensors", (4, 0), 1)]
    assert infos[0].tensors["w"].shape == (4, 4) and infos[0].tensors["w"].nbytes == 64
    # DCP's planner left rank 0 one of its chunks and rank 2 the other
    kept = [[item("w", (0, 0))], [item("w", (2, 0)), item("w", (6, 0))], [item("w", (4, 0))]]
    infos, _ = assign_pieces(locals_, kept, replicas=False)
    record = plan_checkpoint(Layout(tp_size=3), infos).tensors["w"]
    assert isinstance(record, TensorRecord)
    assert [(p.rank, p.offset, p.replica) for p in record.pieces] == [
        (0, (0, 0), 0), (1, (2, 0), 0), (1, (6, 0), 0), (2, (4, 0), 0)]
