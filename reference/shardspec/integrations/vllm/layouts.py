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


def check_quantization(manifest: Manifest, engine_method: str | None) -> None:
    """The checkpoint's quantization (SPEC 8.1) must be the engine's. An unquantized checkpoint
    serves any method (vLLM quantizes it online); vLLM's kernel variants (``awq_marlin`` for
    ``awq``) count as their method."""
    method = manifest.quantization.method
    engine = engine_method or "none"
    if method == "none" or engine == method or engine.startswith(method + "_"):
        return
    raise QuantizationError(Finding(
        code="quantization-mismatch", file="shardspec.json", json_path="$.quantization.method",
        message=f"the checkpoint is quantized with {method!r} but the vLLM engine runs "
        f"quantization {engine!r}",
        hint=f"start the engine with quantization={method!r} (or leave it unset so vLLM reads "
        "config.json)"))


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
