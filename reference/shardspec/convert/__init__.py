"""Into shardspec from Hugging Face and vLLM, and back to Hugging Face.

- :mod:`~shardspec.convert.from_hf`: :func:`convert`, a Hugging Face directory -> a TP x PP x EP
  checkpoint, streamed piece by piece;
- :mod:`~shardspec.convert.plan`: every tensor's pieces, decided before a byte is written, from
  the tensor-parallel plan (:mod:`~shardspec.convert.tp_plan`), the pipeline stages, the routed
  experts and the quantized weights (:mod:`~shardspec.convert.quantized`,
  :mod:`~shardspec.convert.fp8`);
- :mod:`~shardspec.convert.vllm_names`: vLLM's fused parameter names (``names="vllm"``);
- :mod:`~shardspec.convert.to_hf`: :func:`merge`, back to a Hugging Face directory;
- :mod:`~shardspec.convert.recognize`: :func:`import_directory` (``shardspec import``), a
  manifest for a directory of per-rank files, written in place (:mod:`~shardspec.convert.adopt`):
  a vLLM ``save_sharded_state`` directory (:func:`import_vllm`) or a distributed save of
  transformers or torch (:func:`import_hf_distributed`);
- :mod:`~shardspec.convert.hf`: Hugging Face's files (safetensors read by region, written by
  streaming, shards and their index, the directory's other files).

Imports every folder below it and :mod:`shardspec.reader` and :mod:`shardspec.validate`. The
entry points are loaded on first use: the command line imports this package without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .adopt import Imported
    from .directories import Progress, hf_extra_files
    from .from_hf import NAME_STYLES, convert
    from .from_hf_distributed import import_hf_distributed
    from .from_vllm import import_vllm
    from .plan import EMBEDDING_NAMES, LM_HEAD
    from .recognize import import_directory
    from .to_hf import merge

__all__ = [
    "EMBEDDING_NAMES",
    "LM_HEAD",
    "NAME_STYLES",
    "Imported",
    "Progress",
    "convert",
    "hf_extra_files",
    "import_directory",
    "import_hf_distributed",
    "import_vllm",
    "merge",
]

_LAZY = {
    "EMBEDDING_NAMES": "plan", "LM_HEAD": "plan", "NAME_STYLES": "from_hf",
    "Imported": "adopt", "Progress": "directories", "convert": "from_hf",
    "hf_extra_files": "directories", "import_directory": "recognize",
    "import_hf_distributed": "from_hf_distributed", "import_vllm": "from_vllm",
    "merge": "to_hf",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
