"""SPEC 11.3 rules 9 and 10: tied tensors follow their base when resharding, and ep_size may
change, routed experts moving whole to the expert rank that owns them.

Checkpoints are built from a small model of the layout written here (:func:`boxes_of`): every
tensor has a :class:`Kind` saying how a rank holds it, and the same model gives what a rank of
the target layout must hold, compared bit for bit with what the resharder returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import shardspec
from checkpoints import assert_same_tensor
from shardspec import Layout, RequestError, Shard, Tie
from shardspec.format.manifest import TensorRecord
from shardspec.format.stages import assign_stages
from shardspec.reshard import reshard
from shardspec.reshard.boxes import ReadStats
from shardspec.reshard.load import load_resharded
from shardspec.reshard.plan import Resharder

#: per dimension: (start, stop)
Span = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Kind:
    """How the ranks hold a tensor: split over tp ranks along ``tp_dim`` (None: replicated);
    ``expert``: one expert's tensor, on its expert rank only; ``stacked``: dim 0 counts the
    experts, cut into one run per expert rank; ``ep_dim``: a tensor of no expert split over the
    expert ranks anyway (refused); ``tie``: derived from its base (SPEC 8.4 rule 4)."""

    tp_dim: int | None = None
    expert: int | None = None
    stacked: bool = False
    ep_dim: int | None = None
    tie: Tie | None = None


Model = dict[str, tuple[torch.Tensor, Kind]]


def _part(size: int, parts: int, index: int) -> tuple[int, int]:
    """(start, stop) of part ``index`` of ``size`` split like torch.tensor_split."""
    sizes = [len(c) for c in torch.tensor_split(torch.arange(size), parts)]
    start = sum(sizes[:index])
    return start, start + sizes[index]


def _cut(span: Span, dim: int | None, parts: int, index: int) -> Span:
    if dim is None:
        return span
    lo, hi = span[dim]
    start, stop = _part(hi - lo, parts, index)
    return tuple((lo + start, lo + stop) if d == dim else s for d, s in enumerate(span))


def _tied_span(base: Span, tie: Tie, shape: tuple[int, ...]) -> Span:
    """SPEC 8.4 rule 4 for an unpacked base: block j follows grid dim axes[j]."""
    assert tie.block is not None
    axes = tie.axes or tuple(range(len(tie.block)))
    out = [(0, size) for size in shape]
    for j, (axis, block) in enumerate(zip(axes, tie.block, strict=True)):
        lo, hi = base[axis]
        assert lo % block == 0
        out[j] = (lo // block, -(-hi // block))
    return tuple(out)


def boxes_of(model: Model, layout: Layout, experts: int = 0) -> dict[int, dict[str, Span]]:
    """rank -> name -> the span it holds under ``layout`` (bases before tied tensors)."""
    stages = assign_stages(model, layout.pp_size)
    out: dict[int, dict[str, Span]] = {}
    for rank in range(layout.size):
        c = layout.coordinates(rank)
        held: dict[str, Span] = {}
        for name, (tensor, kind) in model.items():
            if kind.tie is not None or stages[name] != c["pp_rank"]:
                continue
            span: Span = tuple((0, s) for s in tensor.shape)
            if kind.expert is not None:
                if kind.expert // (experts // layout.ep_size) != c["ep_rank"]:
                    continue
            elif kind.stacked:
                span = _cut(span, 0, layout.ep_size, c["ep_rank"])
            elif kind.ep_dim is not None:
                span = _cut(span, kind.ep_dim, layout.ep_size, c["ep_rank"])
            held[name] = _cut(span, kind.tp_dim, layout.tp_size, c["tp_rank"])
        for name, (tensor, kind) in model.items():
            if kind.tie is not None and kind.tie.tensor in held:
                held[name] = _tied_span(held[kind.tie.tensor], kind.tie, tuple(tensor.shape))
        out[rank] = held
    return out


def _slice(tensor: torch.Tensor, span: Span) -> torch.Tensor:
    return tensor[tuple(slice(lo, hi) for lo, hi in span)]


def expected(model: Model, layout: Layout, rank: int, experts: int = 0
             ) -> dict[str, torch.Tensor]:
    return {name: _slice(model[name][0], span)
            for name, span in boxes_of(model, layout, experts)[rank].items()}


def save_model(path: Path, model: Model, layout: Layout, experts: int = 0,
               **kwargs: Any) -> shardspec.Manifest:
    """Write ``model`` as ``layout`` holds it; equal spans are replicas in rank order."""
    states: dict[int, dict[str, torch.Tensor]] = {}
    sharding: dict[int, dict[str, Shard]] = {}
    seen: dict[tuple[str, Span], int] = {}
    for rank, held in boxes_of(model, layout, experts).items():
        states[rank], sharding[rank] = {}, {}
        for name, span in held.items():
            tensor = model[name][0]
            replica = seen.get((name, span), 0)
            seen[name, span] = replica + 1
            states[rank][name] = _slice(tensor, span).clone()
            sharding[rank][name] = Shard(tuple(tensor.shape), tuple(lo for lo, _ in span),
                                         replica=replica)
    ties = {name: kind.tie for name, (_, kind) in model.items() if kind.tie is not None}
    return shardspec.save(states, path, layout=layout, sharding=sharding, ties=ties,
                          **kwargs)


def assert_loads(path: Path, model: Model, layout: Layout, experts: int = 0) -> None:
    """Every rank of ``layout``, resharded on load, holds exactly its slices, bit for bit."""
    checkpoint = shardspec.open(path)
    for rank in range(layout.size):
        got = checkpoint.load_rank(rank, "cpu", layout=layout)
        want = expected(model, layout, rank, experts)
        assert set(got) == set(want), rank
        for name, tensor in want.items():
            assert_same_tensor(got[name], tensor)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def fp8(*shape: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(torch.float8_e4m3fn)


# --- models ------------------------------------------------------------------------------------


def fp8_blocks() -> Model:
    """DeepSeek-V3 style 128x128 block scales beside a colwise and a rowwise fp8 weight."""
    gen = _gen(1)
    q, o = "model.layers.0.self_attn.q_proj.", "model.layers.0.self_attn.o_proj."
    block = Tie(tensor=q + "weight", block=(128, 128))
    return {
        q + "weight": (fp8(256, 512, gen=gen), Kind(tp_dim=0)),
        q + "weight_scale_inv": (torch.randn(2, 4, generator=gen), Kind(tie=block)),
        o + "weight": (fp8(256, 512, gen=gen), Kind(tp_dim=1)),
        o + "weight_scale_inv": (torch.randn(2, 4, generator=gen),
                                 Kind(tie=Tie(tensor=o + "weight", block=(128, 128)))),
    }


def moe(experts: int, layers: int = 1, seed: int = 0) -> Model:
    """A Mixtral/Qwen-MoE-shaped model, one tensor per expert, with shared tensors."""
    gen = _gen(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(torch.bfloat16)

    model: Model = {"model.embed_tokens.weight": (rand(10, 4), Kind(tp_dim=0))}
    for layer in range(layers):
        p = f"model.layers.{layer}."
        model[p + "self_attn.q_proj.weight"] = (rand(4, 4), Kind(tp_dim=0))
        model[p + "self_attn.o_proj.weight"] = (rand(4, 4), Kind(tp_dim=1))
        model[p + "mlp.gate.weight"] = (rand(experts, 4), Kind())
        model[p + "mlp.shared_expert.up_proj.weight"] = (rand(6, 4), Kind(tp_dim=0))
        for e in range(experts):
            x = f"{p}mlp.experts.{e}."
            model[x + "gate_proj.weight"] = (rand(6, 4), Kind(tp_dim=0, expert=e))
            model[x + "down_proj.weight"] = (rand(4, 6), Kind(tp_dim=1, expert=e))
    model["model.norm.weight"] = (rand(4), Kind())
    model["lm_head.weight"] = (rand(10, 4), Kind(tp_dim=0))
    return model


def stacked_fp8(experts: int = 4) -> Model:
    """Stacked fp8 experts [E, o, i] with [E, o/128, i/128] scales, block [1, 128, 128]."""
    gen = _gen(2)
    x = "model.layers.0.mlp.experts."
    up, down = x + "gate_up_proj", x + "down_proj"
    return {
        "model.layers.0.mlp.gate.weight": (torch.randn(experts, 128, generator=gen), Kind()),
        up: (fp8(experts, 256, 128, gen=gen), Kind(tp_dim=1, stacked=True)),
        up + "_scale_inv": (torch.randn(experts, 2, 1, generator=gen),
                            Kind(tie=Tie(tensor=up, block=(1, 128, 128)))),
        down: (fp8(experts, 128, 256, gen=gen), Kind(tp_dim=2, stacked=True)),
        down + "_scale_inv": (torch.randn(experts, 1, 2, generator=gen),
                              Kind(tie=Tie(tensor=down, block=(1, 128, 128)))),
    }


# --- rule 9: tied tensors ------------------------------------------------------------------------


def test_block_scales_follow_their_weight_from_tp2_to_tp1(tmp_path: Path) -> None:
    model = fp8_blocks()
    save_model(tmp_path / "c", model, Layout(tp_size=2))
    assert_loads(tmp_path / "c", model, Layout(tp_size=1))
    got = shardspec.load_rank(tmp_path / "c", 0, "cpu", layout=Layout(tp_size=1))
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(got[name].view(torch.uint8), model[name][0].view(torch.uint8))


def test_a_split_inside_a_block_is_refused_naming_the_tied_tensor(tmp_path: Path) -> None:
    save_model(tmp_path / "c", fp8_blocks(), Layout(tp_size=2))
    with pytest.raises(RequestError) as info:
        shardspec.load_rank(tmp_path / "c", 0, "cpu", layout=Layout(tp_size=4))
    assert info.value.code == "reshard-unsupported"
    # the rowwise weight splits at 128-column edges; the colwise one at 64 rows, inside blocks
    assert info.value.finding.tensor == "model.layers.0.self_attn.q_proj.weight_scale_inv"
    assert "inside a block of 128" in str(info.value)


def test_a_per_channel_scale_is_whole_on_every_rank_of_a_rowwise_split(tmp_path: Path) -> None:
    gen = _gen(3)
    # one scale per output channel, applying along every input feature (broadcast dim 1)
    per_channel = Tie(tensor="row.weight", block=(1,), axes=(0,))
    model: Model = {
        "row.weight": (fp8(8, 12, gen=gen), Kind(tp_dim=1)),
        "row.weight_scale": (torch.randn(8, 1, generator=gen), Kind(tie=per_channel)),
        "col.weight": (fp8(8, 12, gen=gen), Kind(tp_dim=0)),
        "col.weight_scale": (torch.randn(8, 1, generator=gen),
                             Kind(tie=Tie(tensor="col.weight", block=(1, 12)))),
    }
    save_model(tmp_path / "c", model, Layout(tp_size=2))
    target = Layout(tp_size=4)
    assert_loads(tmp_path / "c", model, target)
    resharder = Resharder(shardspec.open(tmp_path / "c").manifest, target)
    pieces = [resharder.plan(rank).pieces for rank in range(4)]
    assert [p["row.weight_scale"].replica for p in pieces] == [0, 1, 2, 3]
    assert {(p["row.weight_scale"].offset, p["row.weight_scale"].shape) for p in pieces} == {
        ((0, 0), (8, 1))}
    assert [p["col.weight_scale"].offset for p in pieces] == [(0, 0), (2, 0), (4, 0), (6, 0)]


# --- rule 10: another ep_size ------------------------------------------------------------------


@pytest.mark.parametrize(("source", "target", "experts"), [
    ((1, 2), (1, 1), 4),   # EP 2 -> 1
    ((1, 2), (1, 4), 8),   # EP 2 -> 4
    ((1, 2), (1, 4), 4),   # one expert per rank
    ((1, 1), (1, 2), 4),   # EP 1 -> 2
    ((2, 2), (1, 4), 8),   # TP 2 -> 1 with EP 2 -> 4
    ((1, 4), (2, 2), 4),   # TP 1 -> 2 with EP 4 -> 2 (TP inferred from no split: replicated)
    ((2, 1), (3, 2), 4),   # TP 2 -> 3 with EP 1 -> 2
])
def test_per_expert_tensors_move_to_their_new_expert_rank(
    tmp_path: Path, source: tuple[int, int], target: tuple[int, int], experts: int
) -> None:
    model = moe(experts)
    save_model(tmp_path / "c", model, Layout(tp_size=source[0], ep_size=source[1]), experts)
    if source[0] == 1:  # a TP=1 source splits nothing: every tensor is held whole
        model = {name: (tensor, Kind(expert=kind.expert)) for name, (tensor, kind)
                 in model.items()}
    assert_loads(tmp_path / "c", model, Layout(tp_size=target[0], ep_size=target[1]), experts)


@pytest.mark.parametrize(("source", "target"), [((1, 2), (1, 4)), ((2, 2), (2, 4)),
                                                ((2, 1), (2, 4)), ((2, 4), (1, 2))])
def test_stacked_experts_and_their_block_scales_are_cut_into_runs(
    tmp_path: Path, source: tuple[int, int], target: tuple[int, int]
) -> None:
    model = stacked_fp8()
    save_model(tmp_path / "c", model, Layout(tp_size=source[0], ep_size=source[1]), 4)
    if source[0] == 1:
        model = {name: (tensor, Kind(stacked=kind.stacked, tie=kind.tie))
                 for name, (tensor, kind) in model.items()}
    layout = Layout(tp_size=target[0], ep_size=target[1])
    assert_loads(tmp_path / "c", model, layout, 4)
    got = shardspec.load_rank(tmp_path / "c", layout.size - 1, "cpu", layout=layout)
    up = "model.layers.0.mlp.experts.gate_up_proj"
    run = 4 // target[1]  # the last expert rank holds the last run of experts
    assert got[up].shape[0] == run and got[up + "_scale_inv"].shape[0] == run
    want = model[up][0][4 - run:]
    want = torch.tensor_split(want, target[0], dim=1)[-1] if source[0] > 1 else want
    assert torch.equal(got[up].view(torch.uint8), want.view(torch.uint8))


def test_experts_that_do_not_divide_by_the_new_ep_size_are_refused(tmp_path: Path) -> None:
    save_model(tmp_path / "c", moe(4), Layout(tp_size=1, ep_size=2), 4)
    with pytest.raises(RequestError) as info:
        shardspec.load_rank(tmp_path / "c", 0, "cpu", layout=Layout(tp_size=1, ep_size=3))
    assert info.value.code == "reshard-unsupported" and "4 routed experts" in str(info.value)
    assert ".mlp.experts." in (info.value.finding.tensor or "")
    save_model(tmp_path / "s", stacked_fp8(), Layout(tp_size=1, ep_size=2), 4)
    with pytest.raises(RequestError) as info:
        shardspec.load_rank(tmp_path / "s", 0, "cpu", layout=Layout(tp_size=1, ep_size=8))
    assert info.value.code == "reshard-unsupported"
    assert info.value.finding.tensor in ("model.layers.0.mlp.experts.gate_up_proj",
                                         "model.layers.0.mlp.experts.down_proj")


def test_a_shared_tensor_held_differently_by_expert_ranks_is_refused(tmp_path: Path) -> None:
    model = moe(4)
    name = "model.layers.0.mlp.gate.weight"
    model[name] = (model[name][0], Kind(ep_dim=0))  # each expert rank holds its own rows
    save_model(tmp_path / "c", model, Layout(tp_size=1, ep_size=2), 4)
    with pytest.raises(RequestError) as info:
        shardspec.load_rank(tmp_path / "c", 0, "cpu", layout=Layout(tp_size=1, ep_size=4))
    assert info.value.code == "reshard-unsupported"
    assert info.value.finding.tensor == name and "different slices" in str(info.value)
    # the same ep_size still loads it as written
    assert_loads(tmp_path / "c", model, Layout(tp_size=1, ep_size=2), 4)


@pytest.mark.parametrize(("source", "target"), [((1, 2, 2), (2, 2, 1)), ((1, 2, 2), (1, 1, 4)),
                                                ((2, 1, 2), (1, 2, 4))])
def test_ep_size_changes_with_two_pipeline_stages(
    tmp_path: Path, source: tuple[int, int, int], target: tuple[int, int, int]
) -> None:
    model = moe(4, layers=2, seed=5)
    save_model(tmp_path / "c", model, Layout(tp_size=source[0], pp_size=source[1],
                                             ep_size=source[2]), 4)
    if source[0] == 1:
        model = {name: (tensor, Kind(expert=kind.expert)) for name, (tensor, kind)
                 in model.items()}
    layout = Layout(tp_size=target[0], pp_size=target[1], ep_size=target[2])
    assert_loads(tmp_path / "c", model, layout, 4)


def _files_holding(manifest: shardspec.Manifest) -> dict[tuple[int, str], set[str]]:
    """(source rank, file) -> the names of the tensors with a piece in it."""
    out: dict[tuple[int, str], set[str]] = {}
    for name, record in manifest.tensors.items():
        for piece in record.pieces if isinstance(record, TensorRecord) else ():
            out.setdefault((piece.rank, piece.file), set()).add(name)
    return out


def test_a_target_rank_reads_only_the_files_of_its_experts(tmp_path: Path) -> None:
    model = moe(8)
    # tiny files: every tensor of a source rank lies in a file of its own
    manifest = save_model(tmp_path / "c", model, Layout(tp_size=1, ep_size=2), 8,
                          max_file_size=1)
    holding = _files_holding(manifest)
    assert all(len(names) == 1 for names in holding.values())
    layout = Layout(tp_size=1, ep_size=4)
    resharder = Resharder(manifest, layout)
    for rank in range(layout.size):
        mine = set(expected(model, layout, rank, 8))
        owned = {e for e in range(8) if e // 2 == rank}
        plan = resharder.plan(rank)
        assert set(plan.pieces) == mine
        files = plan.source_files()
        # every file read holds a tensor the rank holds: none of other experts' files
        assert all(holding[f] & mine for f in files)
        assert len(files) == len(mine)
        # the expert pieces come from the one source rank that held those experts
        assert {r for r, _ in files} == {rank // 2}
        for name, piece in plan.pieces.items():
            if ".experts." in name:
                assert int(name.split(".experts.")[1].split(".")[0]) in owned
                assert all(s.rank == rank // 2 for s in piece.sources)
        stats = ReadStats()
        got = load_resharded(tmp_path / "c", manifest, rank, layout, torch.device("cpu"),
                             stats=stats, resharder=resharder)
        assert sorted(stats.files_opened) == sorted({f for _, f in files})
        for name, tensor in expected(model, layout, rank, 8).items():
            assert_same_tensor(got[name], tensor)


def test_a_written_reshard_across_ep_sizes_validates_and_keeps_the_ties(tmp_path: Path) -> None:
    model = stacked_fp8() | moe(4)
    save_model(tmp_path / "src", model, Layout(tp_size=2, ep_size=2), 4)
    layout = Layout(tp_size=1, ep_size=4)
    reshard(tmp_path / "src", tmp_path / "dst", layout)
    report = shardspec.validate(tmp_path / "dst", checksums=True)
    assert report.ok, report.findings
    checkpoint = shardspec.open(tmp_path / "dst")
    assert checkpoint.layout == layout
    for name, (_, kind) in model.items():
        record = checkpoint.manifest.tensors[name]
        assert isinstance(record, TensorRecord)
        assert record.tied_to == kind.tie
    for rank in range(layout.size):
        got = checkpoint.load_rank(rank, "cpu")
        want = expected(model, layout, rank, 4)
        assert set(got) == set(want)
        for name, tensor in want.items():
            assert_same_tensor(got[name], tensor)
