"""The loaders a user picks instead of shardspec, as benchmark contenders, each loading a rank's
own safetensors files to owned tensors (the copies a serving engine keeps):

* ``runai``    - runai-model-streamer's ``SafetensorsStreamer`` (what vLLM's ``runai_streamer``
  load format uses): its C++ reader threads fill buffers it owns, tensors yielded per file;
* ``fastsafe`` - fastsafetensors' ``fastsafe_open`` without GPUDirect (``nogds=True``): the
  files read into one buffer per file, tensors as views of it;

and, onto a GPU only (``GPU_PEERS``):

* ``instanttensor`` - InstantTensor's ``safe_open`` (a vLLM and SGLang load extension) with its
  defaults: direct I/O through io_uring or AIO, a GPU ring buffer, tensors cloned out of it.

Each is left out, with the reason, where it does not import (``make bench`` installs the first
two; InstantTensor needs CUDA or ROCm).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = ["GPU_PEERS", "PEERS", "missing_peers"]

# runai-model-streamer logs a throughput line at INFO for every load.
logging.getLogger("runai_model_streamer").setLevel(logging.WARNING)


def load_runai(files: list[Path], device: str = "cpu") -> dict[str, torch.Tensor]:
    from runai_model_streamer import SafetensorsStreamer

    out: dict[str, torch.Tensor] = {}
    with SafetensorsStreamer() as streamer:
        streamer.stream_files([str(p) for p in files], device=device)
        out.update(streamer.get_tensors())
    return out


def load_fastsafe(files: list[Path], device: str = "cpu") -> dict[str, torch.Tensor]:
    from fastsafetensors import fastsafe_open

    # The tensors it returns keep their buffer alive after the context closes (its docstring).
    with fastsafe_open([str(p) for p in files], device=device, nogds=True) as opened:
        return {name: opened.get_tensor(name) for name in opened.keys()}  # noqa: SIM118 - not iterable


def load_instanttensor(files: list[Path], device: str) -> dict[str, torch.Tensor]:
    from instanttensor import safe_open

    index = torch.device(device).index or 0
    with safe_open([str(p) for p in files], framework="pt", device=index) as opened:
        return dict(opened.tensors())  # copy=True (its default): each tensor owns its memory


Loader = Callable[..., dict[str, torch.Tensor]]
PEERS: dict[str, tuple[str, Loader]] = {
    "runai": ("runai_model_streamer", load_runai),
    "fastsafe": ("fastsafetensors", load_fastsafe),
}
GPU_PEERS: dict[str, tuple[str, Loader]] = {
    "instanttensor": ("instanttensor", load_instanttensor),
}


def missing_peers(peers: dict[str, tuple[str, Loader]] = PEERS) -> dict[str, str]:
    """Peer name -> why it cannot run here (an import error), for the peers that cannot."""
    missing = {}
    for name, (module, _) in peers.items():
        try:
            __import__(module)
        except Exception as exc:  # noqa: BLE001 - any failure to import leaves the peer out
            missing[name] = f"{module} does not import: {type(exc).__name__}: {exc}"
    return missing
