"""``load_format="shardspec"``: a vLLM model loader that reads each worker's bytes through the
manifest, from the data files straight into the model's parameters.

Two ways in, chosen per checkpoint:

- **its own layout**: a checkpoint under vLLM's names (``convert --names vllm``, ``import-vllm``,
  or saved by this loader with ``save_to``) at the engine's tensor- and pipeline-parallel
  sizes: each tensor of the worker's checkpoint rank is read whole into the ``state_dict()``
  entry of its name, buffers included; a fused ``qkv_proj`` or ``gate_up_proj`` held in one
  piece per part has each piece read into its rows of the parameter (:mod:`.own_layout`);
- **any other layout**: a checkpoint of global tensors under Hugging Face names (``convert``):
  a placement plan says which bytes of which piece land where in which parameter. It is
  recorded once by running the model's own ``load_weights`` on stand-ins (:mod:`.recorder`;
  vLLM's loaders fuse ``qkv_proj``/``gate_up_proj``, stack experts and slice by their rules),
  lowered against the pieces (:mod:`.placements`), cached (:mod:`.plan_cache`) and replayed
  (:mod:`.replay`). Tensors the plan cannot place go through ``load_weights`` as before: the
  box of each that vLLM's rules give the worker (:mod:`.regions`) in a tensor of the global
  shape. Layers of other pipeline stages are not read.

A checkpoint in object storage (``source`` in ``model_loader_extra_config``, :mod:`.source`)
is read with ranged GETs of the worker's bytes only: at its own layout each rank's objects
whole, at any other the ``load_weights`` way for every tensor (for now).
A checkpoint whose rank-local tensors cannot serve the engine's layout is refused before any
weight is read, naming both layouts and the tensor; so is a quantization that is not the
engine's.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from vllm.config import ModelConfig
from vllm.config.load import LoadConfig
from vllm.logger import init_logger
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

from ...convert.plan import LM_HEAD
from ...format.dtypes import DTYPES, torch_layout
from ...format.errors import Finding, error_for
from ...format.experts import expert_count, find_experts
from ...format.manifest import Alias, Manifest, TensorRecord
from ...format.ties import packing, tied_box
from ...reader import Checkpoint, open_checkpoint
from ...reshard.boxes import ReadStats
from ...reshard.load import LOCAL_GAP_BUDGET, execute_reshard
from ...reshard.plan import Box
from ...reshard.regions import plan_boxes
from .agreement import bounding, check_agreement
from .layouts import EngineRank, check_quantization, own_rank, refuse_rank_local
from .options import LoaderOptions
from .own_layout import is_own_state, rank_values
from .placements import PlacementError, PlacementPlan, lower, own_layout_plan
from .plan_cache import load_plan, plan_key, store_plan
from .recorder import Recording, RecordingFailed, StandIn, record
from .regions import Heads, plan_for, quantized_of, vllm_box
from .replay import poison_, replay
from .source import open_source
from .state import save_worker_state

__all__ = ["ShardspecModelLoader"]

# Under vLLM's logger, so that its "Loading weights took" line reads like the other loaders'.
logger = init_logger("vllm.model_executor.model_loader.shardspec")

#: Set to 1 to fill what a worker does not read with NaN (integers with all bits set): a model
#: that then serves correctly proves vLLM used only the bytes read (the plugin's tests run
#: with it).
CHECK_BOXES_ENV = "SHARDSPEC_VLLM_CHECK_BOXES"
#: Why a plan hands every tensor to ``load_weights``: nothing checked where vLLM's loaders
#: take each tensor's bytes, so each is read whole.
RECORDING_FAILED = "recording failed"


class ShardspecModelLoader(BaseModelLoader):  # type: ignore[misc]  # vLLM has no stubs
    """vLLM's ``BaseModelLoader`` for shardspec checkpoints (see the module docstring)."""

    def __init__(self, load_config: LoadConfig) -> None:
        super().__init__(load_config)
        self.options = LoaderOptions.parse(load_config.model_loader_extra_config)

    def download_model(self, model_config: ModelConfig) -> None:
        self._open(model_config)  # local or object storage: nothing to fetch, only to check

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        checkpoint = self._open(model_config)
        check_quantization(checkpoint.manifest, model_config.quantization,
                           _declared_method(model_config))
        rank = _engine_rank()
        started = time.perf_counter()
        stats = ReadStats()
        config = _declared_config(model_config)
        own = own_rank(checkpoint.manifest, rank)
        whole_rank = own is not None and is_own_state(
            checkpoint.manifest, own, rank,
            {name: tuple(t.shape) for name, t in model.state_dict().items()},
            Heads.from_config(config))
        if own is not None and whole_rank:  # vLLM's names at the engine's own layout
            if checkpoint.is_remote:
                load_own_rank(checkpoint, own, model, _model_device(model), self.options.verify)
                files = checkpoint.manifest.files_of(own)
                stats.files_opened = [f.path for f in files]
                stats.data_bytes = sum(f.size for f in files)
            else:
                place_own_rank(checkpoint, own, model, verify=self.options.verify, stats=stats)
        else:
            refuse_rank_local(checkpoint.manifest, rank)
            if checkpoint.is_remote:
                checked = True
                try:  # to check the shapes only: every tensor goes through load_weights
                    _recorded(checkpoint, model, rank, config,
                              _stand_ins(checkpoint.manifest, model, config), _targets(model))
                except RecordingFailed as error:
                    checked = False
                    logger.warning("shardspec: the model's load_weights could not be recorded "
                                   "(%s); its tensors are read whole", error)
                load: Any = model.load_weights  # the vLLM model's own; nn.Module has no type
                loaded = load(global_tensors(
                    checkpoint, model, rank, config, verify=self.options.verify, stats=stats,
                    whole=not checked))
                _check_all_loaded(model, loaded, checkpoint)
            else:
                self._place(checkpoint, model, rank, config, stats)
        seconds = time.perf_counter() - started
        logger.info("Loading weights took %.2f seconds", seconds)
        logger.info("shardspec: worker tp_rank=%d pp_rank=%d read %d bytes (headers and data) "
                    "from %d files (%s)", rank.tp_rank, rank.pp_rank, stats.bytes_read,
                    len(set(stats.files_opened)),
                    f"checkpoint rank {own}, whole" if whole_rank else "resharded on load")
        if self.options.save_to is not None:
            save_worker_state(model, checkpoint, rank, self.options.save_to)

    def _place(self, checkpoint: Checkpoint, model: nn.Module, rank: EngineRank,
               config: dict[str, Any], stats: ReadStats) -> None:
        """Read the worker's bytes straight into the model's parameters by a placement plan:
        cached, or recorded now by running ``load_weights`` once on stand-ins. Tensors the
        plan cannot place go through ``load_weights`` as before, logged by name."""
        targets = _targets(model)
        key = plan_key(_key_parts(checkpoint, model, rank, config, targets))
        directory = self.options.plan_cache_dir()
        started = time.perf_counter()
        plan = None if directory is None else load_plan(directory, key)
        how = "from the cache"
        if plan is None:
            plan = _record_plan(checkpoint, model, rank, config, targets)
            how = f"recorded in {time.perf_counter() - started:.2f} s"
            stored = None if directory is None else store_plan(directory, key, plan)
            if stored is not None:
                how += f", cached at {stored}"
        logger.info("shardspec: placement plan %s: %d reads into %d parameters, %d tensors "
                    "through load_weights", how, len(plan.reads),
                    len({r.target for r in plan.reads}), len(plan.fallback))
        replay(checkpoint.path, checkpoint.manifest, plan, targets,  # type: ignore[arg-type]
               verify=self.options.verify, stats=stats,
               poison=os.environ.get(CHECK_BOXES_ENV) == "1")
        if plan.fallback:
            for name, why in sorted(plan.fallback.items()):
                logger.info("shardspec: %s goes through load_weights: %s", name, why)
            load: Any = model.load_weights
            load(global_tensors(checkpoint, model, rank, config, verify=self.options.verify,
                                stats=stats, only=set(plan.fallback),
                                whole=any(why.startswith(RECORDING_FAILED)
                                          for why in plan.fallback.values())))

    def _open(self, model_config: ModelConfig) -> Checkpoint:
        if self.options.source is not None:  # in object storage, model its local files
            return open_source(self.options.source, model_config.model,
                               storage_options=self.options.storage_options,
                               ignore_extensions=self.options.ignore_extensions)
        path = getattr(model_config, "model_weights", None) or model_config.model
        return open_checkpoint(path, ignore_extensions=self.options.ignore_extensions)


def _targets(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's parameters and buffers by name, shared ones under each name."""
    out: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    out.update(model.named_buffers(remove_duplicate=False))
    return out


def _stand_ins(manifest: Manifest, model: nn.Module, config: dict[str, Any]) -> list[StandIn]:
    """What ``load_weights`` is handed, as :func:`global_tensors` hands it: every tensor of
    the worker's pipeline stage, in the torch layout of its global shape."""
    from vllm.model_executor.models.utils import is_pp_missing_parameter

    out = []
    for name in _handed_names(manifest, model, config):
        if is_pp_missing_parameter(name, model):
            continue
        entry = manifest.tensors[name]
        data = entry.alias_of if isinstance(entry, Alias) else name
        record = manifest.tensors[data]
        assert isinstance(record, TensorRecord) and record.shape is not None
        dtype, shape = torch_layout(DTYPES[record.dtype], record.shape)
        out.append(StandIn(name, data, shape, dtype))
    return out


def _declared_config(model_config: ModelConfig) -> dict[str, Any]:
    """The model's config as vLLM holds it, with the embedding tie that config.json declares:
    vLLM unties a tied model whose checkpoint holds an LM head (``--untie-embeddings``) and
    says so in ``word_embeddings_untied_by_checkpoint``; a model with no LM head of its own
    (Gemma 2) still computes logits with the embedding, so the head is not handed to it."""
    config: dict[str, Any] = model_config.hf_config.to_dict()
    if getattr(model_config, "word_embeddings_untied_by_checkpoint", False):
        config["tie_word_embeddings"] = True
    return config


def _declared_method(model_config: ModelConfig) -> str | None:
    """The ``quant_method`` of the config.json vLLM read."""
    quant = getattr(model_config.hf_config, "quantization_config", None)
    method = quant.get("quant_method") if isinstance(quant, dict) else \
        getattr(quant, "quant_method", None)
    return None if method is None else str(method)


def _handed_names(manifest: Manifest, model: nn.Module, config: dict[str, Any]) -> list[str]:
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


def _key_parts(checkpoint: Checkpoint, model: nn.Module, rank: EngineRank,
               config: dict[str, Any], targets: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Everything a placement plan depends on (:func:`.plan_cache.plan_key`)."""
    import vllm

    from ... import __version__

    return {"vllm": vllm.__version__, "shardspec": __version__,
            "model": f"{type(model).__module__}.{type(model).__qualname__}", "config": config,
            "targets": [[n, list(t.shape), str(t.dtype), t.storage_offset()]
                        for n, t in targets.items()],
            "rank": [rank.tp_size, rank.tp_rank, rank.pp_size, rank.pp_rank,
                     rank.expert_parallel],
            "manifest": checkpoint.manifest_sha256 or checkpoint.manifest.to_dict()}


def _record_plan(checkpoint: Checkpoint, model: nn.Module, rank: EngineRank,
                 config: dict[str, Any], targets: dict[str, torch.Tensor]) -> PlacementPlan:
    """Record where ``load_weights`` puts each tensor (refused where the model disagrees with
    the checkpoint's shapes) and lower that to reads; where it cannot be recorded or replayed,
    a plan that hands every tensor to ``load_weights``."""
    stand_ins = _stand_ins(checkpoint.manifest, model, config)
    try:
        recording = _recorded(checkpoint, model, rank, config, stand_ins, targets)
        _check_all_loaded(model, recording.loaded, checkpoint)
        return lower(recording, checkpoint.manifest, targets)
    except (RecordingFailed, PlacementError) as error:
        logger.warning("shardspec: the model's load_weights could not be recorded (%s); every "
                       "tensor goes through it", error)
        return PlacementPlan(fallback={s.data: f"{RECORDING_FAILED}: {error}"
                                       for s in stand_ins})


def _recorded(checkpoint: Checkpoint, model: nn.Module, rank: EngineRank,
              config: dict[str, Any], stand_ins: list[StandIn],
              targets: dict[str, torch.Tensor]) -> Recording:
    """The recording of ``load_weights`` on ``stand_ins`` (:class:`RecordingFailed` where it
    cannot be recorded), refused where it disagrees with the checkpoint's shapes
    (:mod:`.agreement`)."""
    recording = record(model.load_weights, stand_ins, targets)  # type: ignore[arg-type]
    _, boxes, exact = worker_boxes(checkpoint.manifest, model, rank, config)
    check_agreement(recording, {s.data: s.shape for s in stand_ins}, boxes, exact, targets)
    return recording


def _engine_rank() -> EngineRank:
    from vllm.config import get_current_vllm_config
    from vllm.distributed import get_pp_group, get_tp_group

    parallel = get_current_vllm_config().parallel_config
    return EngineRank(tp_size=get_tp_group().world_size, tp_rank=get_tp_group().rank_in_group,
                      pp_size=get_pp_group().world_size, pp_rank=get_pp_group().rank_in_group,
                      expert_parallel=bool(parallel.enable_expert_parallel))


def _model_device(model: nn.Module) -> torch.device:
    for tensor in model.state_dict().values():
        device: torch.device = tensor.device
        return device
    return torch.device("cpu")


# --- its own layout -----------------------------------------------------------------------

def load_own_rank(checkpoint: Checkpoint, rank: int, model: nn.Module, device: torch.device,
                  verify: bool) -> None:
    """Copy checkpoint rank ``rank`` into the model's state dict. Every parameter must be
    there; a buffer that is not (a scale vLLM initialises itself) keeps its value."""
    # On CPU the files are mapped, so each byte is copied once, into the parameters (as vLLM's
    # own sharded_state does from safetensors' mappings); on a GPU, staged through pinned memory.
    tensors = checkpoint.load_rank(rank, device, verify=verify,
                                   mmap=device.type == "cpu" and not checkpoint.is_remote)
    state = model.state_dict()
    _check_own_rank(rank, model, state,
                    {name: (t.dtype, tuple(t.shape)) for name, t in tensors.items()},
                    exempt_parameters(model, checkpoint))
    for name, tensor in tensors.items():
        state[name].copy_(tensor)


def _check_own_rank(rank: int, model: nn.Module, state: dict[str, torch.Tensor],
                    held: dict[str, tuple[torch.dtype, tuple[int, ...]]],
                    exempt: set[str]) -> None:
    """Checkpoint rank ``rank`` (``held``: name -> dtype and shape) fits the model: every
    parameter but the ``exempt`` is there, as the model holds it; a buffer or exempt parameter
    that is not (a scale vLLM initialises itself) keeps its value (logged)."""
    params = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    missing = sorted(name for name in params if name not in held and name not in exempt)
    if missing:
        raise error_for(Finding(
            code="reshard-unsupported", tensor=missing[0], file="shardspec.json",
            message=f"checkpoint rank {rank} lacks {len(missing)} of the vLLM model's "
            f"parameters: {missing[:5]}"))
    for name, (dtype, shape) in held.items():
        target = state[name]
        if tuple(target.shape) != shape or target.dtype != dtype:
            raise error_for(Finding(
                code="reshard-unsupported", tensor=name, file="shardspec.json",
                message=f"checkpoint rank {rank} holds it as {dtype} {list(shape)}, the vLLM "
                f"model as {target.dtype} {list(target.shape)}"))
    kept = sorted(set(state) - set(held) - (params - exempt))
    if kept:
        logger.info("shardspec: %d buffers not in the checkpoint keep vLLM's values (%s...)",
                    len(kept), kept[0])


def place_own_rank(checkpoint: Checkpoint, rank: int, model: nn.Module, *, verify: bool,
                   stats: ReadStats) -> None:
    """Read checkpoint rank ``rank`` straight into the model's state dict (see
    :func:`load_own_rank` for the rules), each tensor into its parameter's own memory."""
    state = model.state_dict()
    plan = checkpoint.plan(rank)
    held = {name: torch_layout(DTYPES[dtype], shape)
            for name, (dtype, shape) in rank_values(plan).items()}
    _check_own_rank(rank, model, state, held, exempt_parameters(model, checkpoint))
    if not all(state[name].is_contiguous() for name in held):
        load_own_rank(checkpoint, rank, model, _model_device(model), verify)
        return
    replay(checkpoint.path, checkpoint.manifest,  # type: ignore[arg-type]
           own_layout_plan({f.record.path: list(f.expected) for f in plan.files}, state,
                           plan.joins),
           state, verify=verify, stats=stats, poison=os.environ.get(CHECK_BOXES_ENV) == "1")
    for alias, target in plan.aliases.items():  # a tie the model does not share
        if alias in state and state[alias].data_ptr() != state[target].data_ptr():
            state[alias].copy_(state[target])


# --- any other layout ----------------------------------------------------------------------

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
    for name in _handed_names(manifest, model, config):
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


def _check_all_loaded(model: nn.Module, loaded: set[str] | None, checkpoint: Checkpoint) -> None:
    """As vLLM's default loader: every parameter of the model was loaded (where the model
    reports what it loaded), but those vLLM's own loader lets a quantized checkpoint lack
    (:func:`exempt_parameters`)."""
    if loaded is None:
        return
    params = {name for name, _ in model.named_parameters()}
    missing = sorted(params - set(loaded) - exempt_parameters(model, checkpoint))
    if missing:
        raise error_for(Finding(
            code="reshard-unsupported", tensor=missing[0], file="shardspec.json",
            message=f"the vLLM model's parameters {missing[:5]} ({len(missing)} in all) were "
            f"not loaded from the checkpoint at {checkpoint.path}"))


def exempt_parameters(model: nn.Module, checkpoint: Checkpoint) -> set[str]:
    """The parameters of a quantized model that no checkpoint need carry, by vLLM's own rule
    (``DefaultModelLoader.track_weights_loading``, which adds them to the loaded names it is
    given): KV-cache scales, online-quantization parameters, empty placeholders, parameters
    built from the quantization config. None for an unquantized checkpoint: every parameter
    is then the checkpoint's, as every test model's is."""
    if checkpoint.manifest.quantization.method == "none":
        return set()
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    track = getattr(DefaultModelLoader, "track_weights_loading", None)
    if track is None:  # another vLLM: nothing is exempt
        return set()
    exempt: set[str] = set()
    # it then names every other parameter as not loaded: that is ours to say, or not
    with contextlib.suppress(ValueError):
        track(None, model, exempt, quantized=True)  # its self is unused
    return exempt
