"""What a vLLM model's ``load_weights`` is handed when the checkpoint is not at its own layout:
every tensor of the worker's pipeline stage under its Hugging Face name, in its global shape,
with only the worker's box read (:mod:`.regions`: vLLM's rules, quantized grids and ties)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from vllm.logger import init_logger

from ...convert.plan import LM_HEAD
from ...format.experts import expert_count, find_experts
from ...format.manifest import Alias, Manifest, TensorRecord
from ...format.ties import packing, tied_box
from ...reader import Checkpoint
from ...reshard.boxes import ReadStats
from ...reshard.load import LOCAL_GAP_BUDGET, execute_reshard
from ...reshard.plan import Box
from ...reshard.regions import plan_boxes
from .agreement import bounding
from .layouts import EngineRank
from .regions import Heads, plan_for, quantized_of, vllm_box
from .replay import poison_

__all__ = ["CHECK_BOXES_ENV", "global_tensors", "handed_names", "worker_boxes"]

logger = init_logger("vllm.model_executor.model_loader.shardspec")

#: Set to 1 to fill what a worker does not read with NaN (integers with all bits set): a model
#: that then serves correctly proves vLLM used only the bytes read (the plugin's tests run
#: with it).
CHECK_BOXES_ENV = "SHARDSPEC_VLLM_CHECK_BOXES"


def handed_names(manifest: Manifest, model: nn.Module, config: dict[str, Any]) -> list[str]:
    """The names ``load_weights`` is handed: every tensor's, but the LM head's where it is
    tied to the embedding and the model has no LM head of its own (Gemma's classes compute
    logits with the embedding and refuse the name). Hugging Face files of a tied model hold
    the embedding only: ``auto`` hands exactly that."""
    names = list(manifest.tensors)
    if LM_HEAD not in manifest.tensors or _has_target(model, LM_HEAD):
        return names
    entry = manifest.tensors[LM_HEAD]
    aliased = isinstance(entry, Alias) or any(
        isinstance(e, Alias) and e.alias_of == LM_HEAD for e in manifest.tensors.values())
    own_config = getattr(model, "config", None)  # a text config, in multimodal classes
    if aliased or config.get("tie_word_embeddings", False) or \
            getattr(own_config, "tie_word_embeddings", False):
        names.remove(LM_HEAD)
    return names


def _has_target(model: nn.Module, name: str) -> bool:
    return any(n == name for n, _ in model.named_parameters(remove_duplicate=False))


def worker_boxes(manifest: Manifest, model: nn.Module, rank: EngineRank, config: dict[str, Any]
                 ) -> tuple[dict[str, tuple[str, Box]], dict[str, Box], set[str]]:
    """What the worker is handed of each tensor of its pipeline stage, by vLLM's rules
    (:func:`.regions.vllm_box`): name -> (the name holding its data, its box); data name -> the
    box read of it (the bounding box of its names'); and the data names whose box vLLM takes
    whole (:mod:`.agreement`: all but experts under expert parallelism, and at ``tp_size`` > 1
    the tensors it does not cut)."""
    from vllm.model_executor.models.utils import is_pp_missing_parameter

    plan = plan_for(config)
    heads = Heads.from_config(config)
    records = {n: r for n, r in manifest.tensors.items() if isinstance(r, TensorRecord)}
    experts = find_experts({n: r.shape for n, r in records.items()},
                           expert_count=expert_count(config))
    quantized = quantized_of(records, config)

    def box_of(name: str, data: str) -> Box:
        record = records[data]
        assert record.shape is not None
        tie = record.tied_to
        if data in quantized.replicated:
            return (0,) * len(record.shape), record.shape
        if tie is not None and tie.tensor in records:  # a scale follows its weight's blocks
            found = tied_box(records[tie.tensor], box_of(tie.tensor, tie.tensor), tie,
                             record.shape)
            return ((0,) * len(record.shape), record.shape) if isinstance(found, str) \
                else found
        base = quantized.bases.get(data)
        return vllm_box(name, record.shape, rank, plan=plan, heads=heads,
                        expert=data in experts, pack=packing(record),
                        input_major=base is not None and base.input_major)

    wanted: dict[str, tuple[str, Box]] = {}
    boxes: dict[str, Box] = {}
    for name in handed_names(manifest, model, config):
        if is_pp_missing_parameter(name, model):
            continue
        entry = manifest.tensors[name]
        data = entry.alias_of if isinstance(entry, Alias) else name
        box = box_of(name, data)
        wanted[name] = (data, box)
        boxes[data] = bounding(boxes[data], box) if data in boxes else box
    exact = {data for data, box in boxes.items()
             if not (data in experts and rank.expert_parallel)
             and (rank.tp_size == 1 or box[1] != records[data].shape)}
    return wanted, boxes, exact


def global_tensors(checkpoint: Checkpoint, model: nn.Module, rank: EngineRank,
                   config: dict[str, Any], *, verify: bool, stats: ReadStats | None = None,
                   only: set[str] | None = None, whole: bool = False
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every tensor the worker's stage holds (of those whose data is in
    ``only``, where given), in the global shape, with the worker's box read (see
    :mod:`.regions`; with ``whole``, every tensor whole: where no recording of the loader
    checked the boxes); what is outside the box is never read."""
    manifest = checkpoint.manifest
    records = {n: r for n, r in manifest.tensors.items() if isinstance(r, TensorRecord)}
    wanted, boxes, _ = worker_boxes(manifest, model, rank, config)
    if whole:
        boxes = {data: _whole(records[data]) for data in boxes}
        wanted = {name: (data, boxes[data]) for name, (data, _) in wanted.items()}
    if only is not None:
        wanted = {name: (data, box) for name, (data, box) in wanted.items() if data in only}
        boxes = {data: boxes[data] for data, _ in wanted.values()}
    hashed: set[str] = set()  # with verify, each source file is hashed once, by either path
    pieces = {} if checkpoint.is_remote else _mapped_boxes(checkpoint, records, boxes,
                                                          verify=verify, stats=stats,
                                                          hashed=hashed)
    rest = {name: box for name, box in boxes.items() if name not in pieces}
    logger.info("shardspec: %d boxes mapped from the data files, %d read", len(pieces),
                len(rest))
    if rest:
        # Gaps between a worker's runs (its columns of a row-parallel weight) are read only
        # while they stay within LOCAL_GAP_BUDGET of the bytes wanted from local files
        # (REMOTE_GAP_BUDGET from object storage).
        pieces.update(execute_reshard(checkpoint.path, manifest, plan_boxes(manifest, rest),
                                      torch.device("cpu"), verify=verify, stats=stats,
                                      verified=hashed, local_gap_budget=LOCAL_GAP_BUDGET))
    poison = os.environ.get(CHECK_BOXES_ENV) == "1"
    for name, (data, box) in wanted.items():
        record = records[data]
        assert record.shape is not None
        yield name, _in_global_shape(pieces[data], boxes[data], record.shape, box, poison)


def _whole(record: TensorRecord) -> Box:
    assert record.shape is not None
    return (0,) * len(record.shape), record.shape


def _mapped_boxes(checkpoint: Checkpoint, records: dict[str, TensorRecord],
                  boxes: dict[str, Box], *, verify: bool, stats: ReadStats | None,
                  hashed: set[str]) -> dict[str, torch.Tensor]:
    """Name -> its box as a view of the mapped data file, for each box that one piece holds
    whole (every box where the engine's layout is the checkpoint's, or a multiple of it).

    No byte is read here: vLLM's weight loaders copy each box straight out of the page cache
    into their parameters, once, as its own loaders copy out of safetensors' mappings. Reading
    into new memory first cost a second pass over fresh pages (on a 2-core VM, 0.75 s of a TP=2
    worker's 1.0 s). The checkpoint ranks whose pieces are used are opened as a load of the
    rank with ``mmap=True`` opens them: every header checked against the manifest, and with
    ``verify`` every file hashed whole (its path is added to ``hashed``).
    """
    holders: dict[str, tuple[int, tuple[int, ...]]] = {}  # name -> (rank, box start in piece)
    options = {name: _pieces_holding(records[name], box) for name, box in boxes.items()}
    ranks: set[int] = set()
    for name in sorted(options, key=lambda n: len(options[n])):  # split tensors decide first
        if options[name]:  # a replicated tensor's piece from a rank already mapped
            holders[name] = next((o for o in options[name] if o[0] in ranks), options[name][0])
            ranks.add(holders[name][0])
    mapped: dict[int, dict[str, torch.Tensor]] = {}
    views: dict[str, torch.Tensor] = {}
    for name, (rank, within) in holders.items():
        if rank not in mapped:
            mapped[rank] = checkpoint.load_rank(rank, "cpu", verify=verify, mmap=True)
            files = [f.path for f in checkpoint.manifest.files_of(rank)]
            if verify:
                hashed.update(files)
            if stats is not None:
                stats.files_opened += files
        shape = boxes[name][1]
        view = mapped[rank][name][tuple(
            slice(w, w + n) for w, n in zip(within, shape, strict=True))]
        views[name] = view
        if stats is not None:
            stats.data_bytes += view.numel() * view.element_size()
    return views


def _pieces_holding(record: TensorRecord, box: Box) -> list[tuple[int, tuple[int, ...]]]:
    """(rank, the box's start within the piece) of each piece that holds ``box`` whole."""
    start, shape = box
    return [(piece.rank, tuple(b - o for b, o in zip(start, piece.offset, strict=True)))
            for piece in record.pieces
            if piece.offset is not None and all(
                o <= b and b + n <= o + s for o, s, b, n
                in zip(piece.offset, piece.shape, start, shape, strict=True))]


def _in_global_shape(piece: torch.Tensor, read: Box, shape: tuple[int, ...], box: Box,
                     poison: bool) -> torch.Tensor:
    """``piece`` (the ``read`` box) placed in an uninitialised tensor of the global shape:
    pages that are never written are never touched, so they cost address space, not memory."""
    if read[1] == shape:
        return piece
    full = torch.empty(shape, dtype=piece.dtype)
    if poison:
        poison_(full)
    region = tuple(slice(o, o + s) for o, s in zip(read[0], read[1], strict=True))
    full[region] = piece
    return full
