"""The vLLM plugin's placement plans without an engine: a model's ``load_weights`` recorded on
stand-ins, lowered against a checkpoint's pieces, cached and replayed, against the same
``load_weights`` run on the real tensors. (The real vLLM models:
tests/integrations/vllm/test_vllm_engine.py.)

The model here follows vLLM's weight loaders in miniature: a fused ``qkv`` whose key/value
parts are narrowed by their own rule, a row-parallel ``o`` (the worker's columns of every row),
an embedding padded past the vocabulary (its padding filled with zeros) and a replicated norm.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import shardspec
from checkpoints import evict
from shardspec import Layout, Shard
from shardspec.format.errors import SafetensorsError, ShardspecError
from shardspec.integrations.vllm import replay as replay_module
from shardspec.integrations.vllm.placements import PlacementPlan, Read, lower
from shardspec.integrations.vllm.plan_cache import load_plan, plan_key, store_plan
from shardspec.integrations.vllm.recorder import RecordingFailed, StandIn, record
from shardspec.integrations.vllm.replay import replay
from shardspec.load.reads import open_direct

HIDDEN, KV, VOCAB, PADDED = 16, 8, 30, 32
SPLIT = {"q": 0, "k": 0, "v": 0, "o": 1, "emb": 0, "norm": None}


class Toy(nn.Module):
    """One worker of a ``tp``-way engine, loading global tensors by narrowing them."""

    def __init__(self, tp: int, rank: int, *, scale: str | None = None) -> None:
        super().__init__()
        self.tp, self.rank, self.scale = tp, rank, scale
        rows = (HIDDEN + 2 * KV) // tp
        self.qkv = nn.Parameter(torch.empty(rows, HIDDEN, dtype=torch.bfloat16), False)
        self.o = nn.Parameter(torch.empty(HIDDEN, HIDDEN // tp, dtype=torch.bfloat16), False)
        self.emb = nn.Parameter(torch.empty(PADDED // tp, HIDDEN, dtype=torch.bfloat16), False)
        self.norm = nn.Parameter(torch.empty(HIDDEN, dtype=torch.bfloat16), False)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded = set()
        for name, w in weights:
            if self.scale == name:
                w = w * 2  # a loader that computes on the weights: not a placement
            if name in ("q", "k", "v"):
                size = w.shape[0] // self.tp
                part = w.narrow(0, self.rank * size, size)
                start = {"q": 0, "k": HIDDEN // self.tp, "v": (HIDDEN + KV) // self.tp}[name]
                self.qkv.data.narrow(0, start, size).copy_(part)
                loaded.add("qkv")
            elif name == "o":
                size = w.shape[1] // self.tp
                self.o.data.copy_(w.narrow(1, self.rank * size, size))
                loaded.add("o")
            elif name == "emb":
                rows = PADDED // self.tp
                first = self.rank * rows
                held = max(0, min(VOCAB, first + rows) - first)
                self.emb.data[:held].copy_(w[first : first + held])
                self.emb.data[held:].fill_(0)
                loaded.add("emb")
            else:
                self.norm.data.copy_(w)
                loaded.add("norm")
        return loaded


def _tensors() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    shapes = {"q": (HIDDEN, HIDDEN), "k": (KV, HIDDEN), "v": (KV, HIDDEN), "o": (HIDDEN, HIDDEN),
              "emb": (VOCAB, HIDDEN), "norm": (HIDDEN,)}
    return {n: torch.randn(s).to(torch.bfloat16) for n, s in shapes.items()}


def _save(path: Path, tensors: dict[str, torch.Tensor], tp: int, dims: dict[str, int | None]
          ) -> shardspec.Checkpoint:
    states: dict[int, dict[str, torch.Tensor]] = {r: {} for r in range(tp)}
    sharding: dict[int, dict[str, Shard]] = {r: {} for r in range(tp)}
    for name, tensor in tensors.items():
        for rank, (piece, shard) in enumerate(shardspec.split(tensor, dims[name], tp)):
            states[rank][name] = piece
            sharding[rank][name] = shard
    shardspec.save(states, path, layout=Layout(tp_size=tp), sharding=sharding)
    return shardspec.open(path)


def _stand_ins(tensors: dict[str, torch.Tensor]) -> list[StandIn]:
    return [StandIn(n, n, tuple(t.shape), t.dtype) for n, t in tensors.items()]


def _targets(model: nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters())


def _expected(tensors: dict[str, torch.Tensor], tp: int, rank: int) -> dict[str, torch.Tensor]:
    model = Toy(tp, rank)
    model.load_weights(tensors.items())
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@settings(max_examples=30, deadline=None)
@given(ckpt_tp=st.sampled_from([1, 2, 4]), engine_tp=st.sampled_from([1, 2, 4]),
       split_o_by_rows=st.booleans(), block_bytes=st.sampled_from([1, 40, 96, 1 << 21]),
       cold=st.booleans(), data=st.data())
def test_a_replayed_plan_places_every_byte_as_load_weights_does(
        tmp_path_factory: pytest.TempPathFactory, ckpt_tp: int, engine_tp: int,
        split_o_by_rows: bool, block_bytes: int, cold: bool, data: st.DataObject) -> None:
    """Whatever the checkpoint's layout (pieces split along either dimension), however strided
    runs are cut in blocks of the target (a row a block, blocks that end mid-row, the whole
    target), and whether the files are read through the page cache or around it (cold), a
    worker whose parameters were poisoned with NaN holds, after the replay, exactly what its
    own loader makes of the global tensors."""
    rank = data.draw(st.integers(0, engine_tp - 1))
    tensors = _tensors()
    ckpt = _save(tmp_path_factory.mktemp("ckpt"), tensors, ckpt_tp,
                 {**SPLIT, "o": 0 if split_o_by_rows else 1})
    model = Toy(engine_tp, rank)
    recording = record(model.load_weights, _stand_ins(tensors), _targets(model))
    plan = lower(recording, ckpt.manifest, _targets(model))
    assert not plan.fallback
    direct = (lambda fd, position, count: open_direct(fd)) if cold else (lambda *_: None)
    with mock.patch.object(replay_module, "BLOCK_BYTES", block_bytes), \
            mock.patch.object(replay_module, "direct_descriptor", direct):
        replay(ckpt.path, ckpt.manifest, plan, _targets(model), poison=True)  # type: ignore[arg-type]
    for name, want in _expected(tensors, engine_tp, rank).items():
        assert torch.equal(getattr(model, name), want), name


@pytest.mark.parametrize("cold", [False, True])
def test_strided_runs_from_several_files_are_read_a_block_of_the_target_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cold: bool) -> None:
    """A row-parallel weight from four files at TP 1: each block of its rows is read from every
    file in turn before the next block begins, so the block is still in the processor's cache
    when the last file's runs land (``BLOCK_BYTES``). Cold, each file's span of the block is
    read around the page cache and its runs copied out of the buffer. Bit-exact either way."""
    tensors = _tensors()
    ckpt = _save(tmp_path / "ckpt", tensors, 4, SPLIT)  # o: a quarter of every row a file
    model = Toy(1, 0)
    plan = lower(record(model.load_weights, _stand_ins(tensors), _targets(model)),
                 ckpt.manifest, _targets(model))
    calls: list[tuple[int, int]] = []  # (the target's first byte, its file) in call order
    if cold:  # taken as cold: files this small share their header's page, always cached
        monkeypatch.setattr(replay_module, "direct_descriptor",
                            lambda fd, position, count: open_direct(fd))
        monkeypatch.setattr(replay_module, "DIRECT_IN_FLIGHT", 1)  # the calls in one order
        read_from: list[int] = []
        real_read, real_strided = replay_module.pread_direct_span, replay_module._strided

        def read_spy(direct: int, fd: int, *args: Any) -> int:
            read_from[:] = [fd]
            return real_read(direct, fd, *args)

        def copy_spy(array: Any, at: int, *args: Any) -> Any:
            if array.ctypes.data == model.o.data_ptr():
                calls.append((at, read_from[0]))
            return real_strided(array, at, *args)

        monkeypatch.setattr(replay_module, "pread_direct_span", read_spy)
        monkeypatch.setattr(replay_module, "_strided", copy_spy)
    else:
        real = replay_module.pread_runs

        def spy(fd: int, target: Any, dst: int, *args: Any) -> int:
            if target.ctypes.data == model.o.data_ptr():
                calls.append((dst, fd))
            return real(fd, target, dst, *args)

        monkeypatch.setattr(replay_module, "pread_runs", spy)
        monkeypatch.setattr(replay_module, "REPLAY_THREADS", 1)  # the calls in one order
    row = 2 * HIDDEN
    monkeypatch.setattr(replay_module, "BLOCK_BYTES", 3 * row)  # blocks of 3 rows; 16 = 5*3+1
    replay(ckpt.path, ckpt.manifest, plan, _targets(model), poison=True)  # type: ignore[arg-type]
    assert torch.equal(model.o, tensors["o"])
    blocks = [dst // (3 * row) for dst, _ in calls]
    assert len(calls) == 6 * 4 and len({fd for _, fd in calls}) == 4
    assert blocks == sorted(blocks)  # block-major: four files a block
    assert all(len({fd for dst, fd in calls if dst // (3 * row) == b}) == 4 for b in range(6))


def test_recording_writes_nothing_into_the_model(tmp_path: Path) -> None:
    model = Toy(2, 1)
    for p in model.parameters():
        p.data.fill_(7)
    record(model.load_weights, _stand_ins(_tensors()), _targets(model))
    assert all(bool((p == 7).all()) for p in model.parameters())


def test_a_row_parallel_weight_is_one_strided_read_and_padding_one_fill(tmp_path: Path) -> None:
    tensors = _tensors()
    ckpt = _save(tmp_path / "ckpt", tensors, 1, SPLIT)
    model = Toy(2, 1)
    recording = record(model.load_weights, _stand_ins(tensors), _targets(model))
    plan = lower(recording, ckpt.manifest, _targets(model))
    (o,) = [r for r in plan.reads if r.target == "o"]
    assert (o.count, o.length, o.src_stride, o.dst_stride) == (HIDDEN, HIDDEN, 2 * HIDDEN,
                                                               HIDDEN)
    assert o.src == HIDDEN  # bf16: the second half of the first row
    (fill,) = plan.fills
    assert fill.target == "emb" and fill.value == 0.0
    assert fill.dst.shape == (PADDED // 2 - (VOCAB - PADDED // 2), HIDDEN)


def test_a_loader_that_computes_leaves_that_tensor_to_load_weights(tmp_path: Path) -> None:
    """``o`` multiplied before it is copied cannot be placed: it is named in the fallback with
    the reason, its reads left out; every other tensor is still placed."""
    tensors = _tensors()
    ckpt = _save(tmp_path / "ckpt", tensors, 2, SPLIT)
    model = Toy(2, 0, scale="o")
    recording = record(model.load_weights, _stand_ins(tensors), _targets(model))
    plan = lower(recording, ckpt.manifest, _targets(model))
    assert set(plan.fallback) == {"o"} and "computed" in plan.fallback["o"]
    assert {r.tensor for r in plan.reads} == {"q", "k", "v", "emb", "norm"}
    replay(ckpt.path, ckpt.manifest, plan, _targets(model))  # type: ignore[arg-type]
    model.load_weights((n, tensors[n]) for n in plan.fallback)  # what the plugin does next
    want = Toy(2, 0, scale="o")
    want.load_weights(tensors.items())
    for name, p in want.named_parameters():
        assert torch.equal(getattr(model, name), p), name


def test_a_loader_that_needs_values_fails_the_recording() -> None:
    class Peeks(Toy):
        def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
            for _, w in weights:
                float(w.flatten()[0])  # a value a stand-in does not hold
            return set()

    model = Peeks(1, 0)
    with pytest.raises(RecordingFailed, match="while loading 'q'"):
        record(model.load_weights, _stand_ins(_tensors()), _targets(model))


def test_a_plan_round_trips_through_the_cache_and_a_foreign_file_is_ignored(
        tmp_path: Path) -> None:
    tensors = _tensors()
    ckpt = _save(tmp_path / "ckpt", tensors, 2, SPLIT)
    model = Toy(2, 1)
    plan = lower(record(model.load_weights, _stand_ins(tensors), _targets(model)),
                 ckpt.manifest, _targets(model))
    key = plan_key({"manifest": ckpt.manifest_sha256, "rank": 1})
    assert key != plan_key({"manifest": ckpt.manifest_sha256, "rank": 0})
    cache = tmp_path / "cache"
    stored = store_plan(cache, key, plan)
    assert stored == cache / f"{key}.json"
    assert load_plan(cache, key) == plan
    assert load_plan(cache, "0" * 64) is None
    stored.write_text(json.dumps({"key": key, "plan": {"version": 1, "reads": [["x"]]}}))
    assert load_plan(cache, key) is None  # not a plan: recorded again
    other = cache / ("1" * 64 + ".json")
    other.write_text(stored.read_text().replace(key, "2" * 64))
    assert load_plan(cache, "1" * 64) is None  # a file under another key's name


def test_a_plan_that_reads_past_its_tensor_is_refused_before_any_read(tmp_path: Path) -> None:
    tensors = _tensors()
    ckpt = _save(tmp_path / "ckpt", tensors, 1, SPLIT)
    model = Toy(1, 0)
    for p in model.parameters():
        p.data.fill_(3)
    file = ckpt.manifest.files_of(0)[0].path
    bad = PlacementPlan([Read(file, "norm", 0, 2 * HIDDEN, "norm", 0, 2 * HIDDEN,
                              2 * HIDDEN + 2, 1)])
    with pytest.raises(SafetensorsError, match="st-offsets|past the tensor"):
        replay(ckpt.path, ckpt.manifest, bad, _targets(model))  # type: ignore[arg-type]
    assert bool((model.norm == 3).all())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_plan_replays_into_parameters_on_a_gpu(tmp_path: Path) -> None:
    """Parameters on a GPU are filled through host memory, one copy each, bit-exact."""
    tensors = _tensors()
    ckpt = _save(tmp_path / "ckpt", tensors, 2, SPLIT)
    model = Toy(2, 1).to("cuda")
    plan = lower(record(model.load_weights, _stand_ins(tensors), _targets(model)),
                 ckpt.manifest, _targets(model))
    replay(ckpt.path, ckpt.manifest, plan, _targets(model), poison=True)  # type: ignore[arg-type]
    for name, want in _expected(tensors, 2, 1).items():
        assert torch.equal(getattr(model, name).cpu(), want), name


class Wide(nn.Module):
    """A worker holding one column-parallel run of a 12 MiB weight and a whole 2 KiB one, the
    first in a parameter that does not start on a page."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        # Mid-page whatever the allocator returns (a page-aligned block happens now and then).
        block = torch.empty(1536 * 2048 + 2048, dtype=torch.bfloat16)
        start = (2048 - block.data_ptr() % 4096) % 4096 // block.element_size()
        self.w = nn.Parameter(block[start:start + 1536 * 2048].view(1536, 2048), False)
        self.b = nn.Parameter(torch.empty(1024, dtype=torch.bfloat16), False)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        for name, w in weights:
            if name == "w":
                self.w.data.copy_(w.narrow(0, self.rank * 1536, 1536))
            else:
                self.b.data.copy_(w)
        return {"w", "b"}


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="direct I/O is Linux's")
@pytest.mark.parametrize("cold", [True, False])
def test_a_cold_file_is_read_around_the_page_cache_and_a_warm_one_through_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cold: bool) -> None:
    """Runs of a file the page cache does not hold go through direct reads (the parameter
    starts mid-page, the run mid-page of the file), bit-exact; a warm file's do not."""
    torch.manual_seed(1)
    tensors = {"b": torch.randn(1024).to(torch.bfloat16),
               "w": torch.randn(3072, 2048).to(torch.bfloat16)}
    ckpt = _save(tmp_path / "ckpt", tensors, 1, {"w": 0, "b": None})
    (data,) = [ckpt.path / f.path for f in ckpt.manifest.files_of(0)]
    if cold:
        evict(data)
    else:
        data.read_bytes()
    direct_runs: list[int] = []
    real = replay_module._direct_jobs

    def spy(*args: Any) -> Any:
        direct_runs.append(args[4])
        return real(*args)

    monkeypatch.setattr(replay_module, "_direct_jobs", spy)
    model = Wide(1)
    assert model.w.data_ptr() % 4096  # not on a page
    plan = lower(record(model.load_weights, _stand_ins(tensors), _targets(model)),
                 ckpt.manifest, _targets(model))
    replay(ckpt.path, ckpt.manifest, plan, _targets(model), poison=True)  # type: ignore[arg-type]
    assert torch.equal(model.w, tensors["w"][1536:]) and torch.equal(model.b, tensors["b"])
    assert sorted(direct_runs) == ([2048, 1536 * 2048 * 2] if cold else [])


class RightHalf(nn.Module):
    """Worker 1 of 2 holding the right half of every row of a row-parallel weight (4 KiB rows
    in the file: a 2 KiB run, then a 2 KiB gap)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(48, 1024, dtype=torch.bfloat16), False)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        for _, w in weights:
            self.w.data.copy_(w.narrow(1, 1024, 1024))
        return {"w"}


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="direct I/O is Linux's")
def test_a_cold_files_strided_runs_are_read_whole_rows_at_a_time_gaps_included(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cold, strided runs less than a page apart are read around the page cache, gaps
    included, in direct reads no larger than a thread's buffer, each of whole rows and starting
    on a page though the tensor does not; then copied out, bit-exact."""
    torch.manual_seed(2)
    tensors = {"w": torch.randn(48, 2048).to(torch.bfloat16)}
    ckpt = _save(tmp_path / "ckpt", tensors, 1, {"w": None})
    monkeypatch.setattr(replay_module, "direct_descriptor",
                        lambda fd, position, count: open_direct(fd))
    monkeypatch.setattr(replay_module, "DIRECT_CHUNK_BYTES", 3 * 4096)  # two rows a read
    reads: list[tuple[int, int, int]] = []  # (position, bytes wanted, bytes asked)
    real = replay_module.pread_direct_span

    def spy(direct: int, fd: int, view: memoryview, position: int, want: int, path: str) -> int:
        reads.append((position, want, len(view)))
        return real(direct, fd, view, position, want, path)

    monkeypatch.setattr(replay_module, "pread_direct_span", spy)
    model = RightHalf()
    plan = lower(record(model.load_weights, _stand_ins(tensors), _targets(model)),
                 ckpt.manifest, _targets(model))
    (read,) = plan.reads
    assert (read.length, read.src_stride, read.count) == (2048, 4096, 48)
    replay(ckpt.path, ckpt.manifest, plan, _targets(model), poison=True)  # type: ignore[arg-type]
    assert torch.equal(model.w, tensors["w"][:, 1024:])
    assert len(reads) == 24 and all(p % 4096 == 0 and n <= 3 * 4096 for p, _, n in reads)
    assert sorted(p for p, _, _ in reads) == [p for p, _, _ in reads]


class _ConvertedScale(nn.Module):
    """Worker ``rank`` of 2 that converts its half of a bf16 scale to float32: a copy the
    placement cannot read straight in, so the tensor goes through ``load_weights`` for real."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self.s = nn.Parameter(torch.empty(4, dtype=torch.float32), False)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        for _, w in weights:
            self.s.data.copy_(w.narrow(0, self.rank * 4, 4).float())
        return {"s"}


def test_a_byte_the_loader_computes_on_outside_the_workers_box_refuses_the_load() -> None:
    """What the loader converts rather than copies is held to the worker's box as copies are:
    a box that leaves out a byte vLLM uses refuses the load, naming the tensor."""
    from shardspec.integrations.vllm.agreement import check_agreement

    model = _ConvertedScale(rank=1)
    targets = _targets(model)
    recording = record(model.load_weights, [StandIn("s", "s", (8,), torch.bfloat16)], targets)
    assert "s" in recording.unplaceable and recording.taken["s"]
    check_agreement(recording, {"s": (8,)}, {"s": ((4,), (4,))}, {"s"}, targets)  # its share
    for box in (((0,), (4,)), ((4,), (3,))):  # another share; one byte short
        with pytest.raises(ShardspecError) as refused:
            check_agreement(recording, {"s": (8,)}, {"s": box}, {"s"}, targets)
        assert refused.value.code == "reshard-unsupported" and "'s'" in str(refused.value)
