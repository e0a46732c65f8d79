"""Round trip property: whatever is saved is loaded back exactly, rank by rank.

Random layouts (TP 1..4, PP 1..2, any rank order), every dtype torch and safetensors share
filled with random bytes (so NaN payloads and odd float8/float4 patterns are exercised),
scalars, zero-size shapes, unicode names, split/replicated/rank-local tensors, aliases,
non-contiguous inputs and tiny file caps that force several parts per rank.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hypothesis import given
from hypothesis import strategies as st

import shardspec
from checkpoints import raw_bytes
from shardspec import Layout, Shard
from shardspec.format.manifest import RANK_ORDERS, Alias

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.uint32,
    torch.int64, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu,
    torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float4_e2m1fn_x2,
]

NAMES = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12).filter(
    lambda name: name != "__metadata__")


@dataclass
class Case:
    layout: Layout
    states: dict[int, dict[str, torch.Tensor]]
    sharding: dict[int, dict[str, Shard]] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    max_file_size: int = 1 << 30


def random_tensor(
    draw: st.DrawFn, gen: torch.Generator, dtype: torch.dtype, *, scalar_ok: bool = True
) -> torch.Tensor:
    """Random bytes viewed as ``dtype``; sometimes a non-contiguous view."""
    min_dims = 1 if dtype == torch.float4_e2m1fn_x2 or not scalar_ok else 0
    shape = draw(st.lists(st.integers(0, 4), min_size=min_dims, max_size=3))
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided"]))
    if layout == "transposed" and len(shape) >= 2:
        base_shape = [*shape[:-2], shape[-1], shape[-2]]
    elif layout == "strided" and shape:
        base_shape = [shape[0] * 2, *shape[1:]]
    else:
        base_shape, layout = shape, "contiguous"
    count = 1
    for dim in base_shape:
        count *= dim
    nbytes = count * dtype.itemsize
    if dtype == torch.bool:  # only 0 and 1 are bools; other bytes are undefined behaviour
        raw = torch.randint(0, 2, (nbytes,), dtype=torch.uint8, generator=gen)
    else:
        raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
    base = raw.view(dtype).reshape(base_shape)
    if layout == "transposed":
        return base.transpose(-1, -2)
    if layout == "strided":
        return base[::2]
    return base


@st.composite
def cases(draw: st.DrawFn) -> Case:
    tp, pp = draw(st.integers(1, 4)), draw(st.integers(1, 2))
    layout = Layout(tp_size=tp, pp_size=pp, rank_order=draw(st.sampled_from(RANK_ORDERS)))
    world = layout.size
    case = Case(layout=layout, states={r: {} for r in range(world)},
                sharding={r: {} for r in range(world)},
                max_file_size=draw(st.sampled_from([1, 48, 1 << 30])))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    names = draw(st.lists(NAMES, min_size=1, max_size=6, unique=True))
    for name in names:
        kind = draw(st.sampled_from(["split", "replicated", "local", "alias"]))
        stage = draw(st.integers(0, pp - 1))
        stage_ranks = [layout.rank_of(tp_rank=t, pp_rank=stage, ep_rank=0) for t in range(tp)]
        targets = sorted({n for state in case.states.values() for n in state
                          if n not in case.aliases})
        if kind == "alias" and targets:
            target = draw(st.sampled_from(targets))
            for rank in range(world):
                if target in case.states[rank]:
                    case.states[rank][name] = case.states[rank][target]
            case.aliases[name] = target
            continue
        dtype = draw(st.sampled_from(DTYPES))
        if kind in ("local", "alias"):  # an alias with nothing to alias yet: rank-local
            ranks = draw(st.lists(st.sampled_from(range(world)), min_size=1, unique=True))
            for rank in ranks:
                case.states[rank][name] = random_tensor(draw, gen, dtype)
            continue
        tensor = random_tensor(draw, gen, dtype)
        dim = None
        if kind == "split" and tensor.dim():
            dim = draw(st.integers(-tensor.dim(), tensor.dim() - 1))
        for rank, (piece, shard) in zip(stage_ranks, shardspec.split(tensor, dim, tp),
                                        strict=True):
            case.states[rank][name] = piece
            case.sharding[rank][name] = shard
    return case


@given(case=cases())
def test_every_rank_loads_exactly_what_was_saved(case: Case) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ckpt"
        manifest = shardspec.save(case.states, root, layout=case.layout, sharding=case.sharding,
                                  max_file_size=case.max_file_size)
        checkpoint = shardspec.open(root)
        assert checkpoint.manifest == manifest
        for rank, state in case.states.items():
            loaded = checkpoint.load_rank(rank, "cpu")
            assert set(loaded) == set(state)
            for name, tensor in state.items():
                got = loaded[name]
                assert got.dtype == tensor.dtype, name
                assert tuple(got.shape) == tuple(tensor.shape), name
                assert raw_bytes(got) == raw_bytes(tensor), name
            for alias, target in case.aliases.items():
                if isinstance(manifest.tensors[alias], Alias) and alias in state:
                    assert loaded[alias].data_ptr() == loaded[target].data_ptr()
        for alias, target in case.aliases.items():
            # tied on every rank that holds it, with data: recorded as an alias (SPEC 7.6)
            holders = [s for s in case.states.values() if target in s]
            if all(s[target].numel() for s in holders):
                assert manifest.tensors[alias] == Alias(alias_of=target)
        report = shardspec.validate(root, checksums=True)
        assert report.ok, [str(f) for f in report.findings]
        files = [f for r in manifest.ranks for f in r.files]
        assert report.checksums_verified == len(files)
