"""The engine's layout against the checkpoint's: which way a worker loads, or a refusal
before any weight is read. Pure Python (no vLLM import)."""

from __future__ import annotations

from dataclasses import dataclass

from ...format.errors import Finding, QuantizationError, error_for
from ...format.manifest import Manifest, TensorRecord

__all__ = ["EngineRank", "check_quantization", "own_rank", "refuse_rank_local"]


@dataclass(frozen=True)
class EngineRank:
    """Where a vLLM worker sits in the engine's parallel layout."""

    tp_size: int
    tp_rank: int
    pp_size: int = 1
    pp_rank: int = 0
    expert_parallel: bool = False


def check_quantization(manifest: Manifest, engine_method: str | None,
                       declared_method: str | None = None) -> None:
    """The checkpoint's quantization (SPEC 8.1) must be what the engine runs.

    ``engine_method`` is vLLM's ``model_config.quantization``: the kernel family it chose, not
    the checkpoint's method (a GPTQ checkpoint runs as ``auto_gptq``, ``gptq_marlin`` or
    ``moe_wna16``). ``declared_method`` is the ``quant_method`` of the config.json vLLM read.
    The engine serves the checkpoint's method where its kernel is a variant of it (the method
    is one of its ``_``-separated words) or where it chose that kernel for a config.json that
    declares the checkpoint's method. An unquantized checkpoint serves any method (vLLM
    quantizes it online)."""
    method = manifest.quantization.method
    engine = (engine_method or "none").lower()
    declared = (declared_method or "none").lower()
    if method == "none" or engine == method or method in engine.split("_"):
        return
    if engine != "none" and declared == method:
        return
    # vLLM itself refuses a quantization argument that is not the declared method's kernel,
    # so what is left is a config.json that is not the checkpoint's
    if declared != "none":
        hint = (f"config.json declares quantization {declared!r}: serve the checkpoint with "
                "the config.json it was converted with (among its extra files)")
    else:
        hint = ("config.json lacks the checkpoint's quantization_config: serve the checkpoint "
                "with the config.json it was converted with (among its extra files) and "
                "leave quantization unset, so that vLLM picks the method's kernel")
    raise QuantizationError(Finding(
        code="quantization-mismatch", file="shardspec.json", json_path="$.quantization.method",
        message=f"the checkpoint is quantized with {method!r} but the vLLM engine runs "
        f"quantization {engine!r}", hint=hint))


def own_rank(manifest: Manifest, rank: EngineRank) -> int | None:
    """The checkpoint rank that is exactly the engine worker's, when the layouts agree."""
    layout = manifest.layout
    if (layout.tp_size, layout.pp_size, layout.ep_size) != (rank.tp_size, rank.pp_size, 1):
        return None
    return layout.rank_of(tp_rank=rank.tp_rank, pp_rank=rank.pp_rank, ep_rank=0)


def refuse_rank_local(manifest: Manifest, rank: EngineRank) -> None:
    """Rank-local tensors load only at their own layout (SPEC 7.5): refuse any other."""
    local = next((name for name, record in manifest.tensors.items()
                  if isinstance(record, TensorRecord) and record.rank_local), None)
    if local is None:
        return
    layout = manifest.layout
    raise error_for(Finding(
        code="reshard-rank-local", tensor=local, file="shardspec.json",
        message=f"the checkpoint's layout is tp_size={layout.tp_size} pp_size={layout.pp_size} "
        f"ep_size={layout.ep_size} and it holds rank-local tensors (SPEC 7.5), which load only "
        f"at that layout; the vLLM engine runs tensor_parallel_size={rank.tp_size} "
        f"pipeline_parallel_size={rank.pp_size}",
        hint=f"serve it with tensor_parallel_size={layout.tp_size} "
        f"pipeline_parallel_size={layout.pp_size}, or convert the Hugging Face model without "
        "--names vllm: its global tensors load at any layout"))
