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
  shape (:mod:`.handed`). Layers of other pipeline stages are not read.

A checkpoint in object storage (``source`` in ``model_loader_extra_config``, :mod:`.source`)
is read the same two ways, by ranged GETs of the worker's bytes only, in parallel, each answer
copied straight into the parameters (:func:`.replay.replay`).
A checkpoint whose rank-local tensors cannot serve the engine's layout is refused before any
weight is read, naming both layouts and the tensor; so is a quantization that is not the
engine's.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import torch
from torch import nn
from vllm.config import ModelConfig
from vllm.config.load import LoadConfig
from vllm.logger import init_logger
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

from ...format.dtypes import DTYPES, torch_layout
from ...format.errors import Finding, error_for
from ...format.manifest import Alias, Manifest, TensorRecord
from ...reader import Checkpoint, open_checkpoint
from ...reshard.boxes import ReadStats
from .agreement import check_agreement
from .handed import CHECK_BOXES_ENV, global_tensors, handed_names, worker_boxes
from .layouts import EngineRank, check_quantization, own_rank, refuse_rank_local
from .options import LoaderOptions
from .own_layout import is_own_state, rank_values
from .placements import PlacementError, PlacementPlan, lower, own_layout_plan
from .plan_cache import load_plan, plan_key, store_plan
from .recorder import Recording, RecordingFailed, StandIn, record
from .regions import Heads
from .replay import replay
from .source import open_source
from .state import save_worker_state

__all__ = ["ShardspecModelLoader"]

# Under vLLM's logger, so that its "Loading weights took" line reads like the other loaders'.
logger = init_logger("vllm.model_executor.model_loader.shardspec")

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
            place_own_rank(checkpoint, own, model, verify=self.options.verify, stats=stats)
        else:  # from a directory or a bucket alike: replayed into the parameters
            refuse_rank_local(checkpoint.manifest, rank)
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
        replay(checkpoint.path, checkpoint.manifest, plan, targets, verify=self.options.verify,
               stats=stats, poison=os.environ.get(CHECK_BOXES_ENV) == "1")
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
    for name in handed_names(manifest, model, config):
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
    replay(checkpoint.path, checkpoint.manifest,
           own_layout_plan({f.record.path: list(f.expected) for f in plan.files}, state,
                           plan.joins),
           state, verify=verify, stats=stats, poison=os.environ.get(CHECK_BOXES_ENV) == "1")
    for alias, target in plan.aliases.items():  # a tie the model does not share
        if alias in state and state[alias].data_ptr() != state[target].data_ptr():
            state[alias].copy_(state[target])


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
