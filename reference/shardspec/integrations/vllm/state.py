"""Workers write the state they loaded as one shardspec checkpoint (``save_to``).

Every worker writes its own rank's files at once; rank 0 writes the manifest last, after all
have succeeded (SPEC 10, :func:`shardspec.distributed.save` over vLLM's world group). The state
is the model's ``state_dict()`` under vLLM's names (fused ``qkv_proj``, buffers such as
``attn._k_scale``), rank-local at the engine's layout, taken *before*
``process_weights_after_loading``: vLLM runs that step again on every load, so a saved state
from after it (repacked or requantized weights, as vLLM's own ``sharded_state`` saves) would be
processed twice. The manifest's metadata records vLLM's version, the architecture and that
stage; the quantization record and the extra files (config.json, tokenizer) are the source's,
config.json with the quantized modules that vLLM would otherwise look for under the source's
names (GPTQ, AWQ).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from ... import distributed
from ...format.manifest import Layout, TensorRecord
from ...reader import Checkpoint
from .layouts import EngineRank

__all__ = ["SAVED_STAGE", "save_worker_state"]

#: The ``vllm_state`` metadata value: the weights as loaded, before vLLM post-processed them.
SAVED_STAGE = "before_process_weights_after_loading"


def save_worker_state(model: nn.Module, source: Checkpoint, rank: EngineRank,
                      path: str) -> None:
    """Write this worker's state into the checkpoint at ``path`` (collective over the
    engine's workers, which all call it at the same point of loading)."""
    import vllm
    from vllm.distributed import get_world_group

    world = get_world_group()
    layout = Layout(tp_size=rank.tp_size, pp_size=rank.pp_size)
    expected = layout.rank_of(tp_rank=rank.tp_rank, pp_rank=rank.pp_rank, ep_rank=0)
    if world.rank_in_group != expected or world.world_size != layout.size:
        raise RuntimeError(
            f"save_to needs one vLLM worker per rank of tp={rank.tp_size} pp={rank.pp_size} "
            f"numbered tp-fastest; this worker is {world.rank_in_group} of {world.world_size}, "
            f"at tp_rank {rank.tp_rank}, pp_rank {rank.pp_rank}")
    extra: dict[str, str | Path] = {}
    if isinstance(source.path, Path):
        extra = {f.path: source.path / f.path for f in source.manifest.extra_files}
    state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    with tempfile.TemporaryDirectory(prefix="shardspec-save-to-") as folder:
        if "config.json" in extra:
            extra["config.json"] = _config_for_vllm_names(Path(extra["config.json"]), source,
                                                          Path(folder))
        distributed.save(
            state, path, layout=layout, group=world.cpu_group,
            quantization=source.manifest.quantization, extra_files=extra,
            metadata={"vllm_version": vllm.__version__,
                      "vllm_model_class": type(model).__name__, "vllm_state": SAVED_STAGE})


#: The dtypes vLLM counts as not quantized when it reads a checkpoint's files.
_UNQUANTIZED = ("F16", "BF16", "F32")


def _config_for_vllm_names(config: Path, source: Checkpoint, folder: Path) -> Path:
    """config.json for the saved state. vLLM completes a GPTQ or AWQ config that does not list
    its quantized modules from the tensor names of the files it serves
    (``maybe_update_config``); under vLLM's fused names (``qkv_proj.qweight``) it would find
    no ``q_proj`` and build the fused layers unquantized. So the saved config lists them, as
    vLLM found them in the source's names; any other config.json is copied as it is."""
    data: dict[str, Any] = json.loads(config.read_text(encoding="utf-8"))
    quant = data.get("quantization_config")
    method = str(quant.get("quant_method", "")).lower() if isinstance(quant, dict) else ""
    key = {"gptq": "modules_in_block_to_quantize", "awq": "modules_to_not_convert"}.get(method)
    if key is None or not isinstance(quant, dict) or quant.get(key):
        return config
    dtypes = {name: record.dtype for name, record in source.manifest.tensors.items()
              if isinstance(record, TensorRecord)}  # what the files hold, as vLLM reads them
    modules = {name.rsplit(".", 1)[0] for name in dtypes}
    quantized = {name.rsplit(".", 1)[0] for name, dtype in dtypes.items()
                 if dtype not in _UNQUANTIZED}
    quant[key] = sorted(quantized if method == "gptq" else modules - quantized)
    out = folder / "config.json"
    out.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return out
