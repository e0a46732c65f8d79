"""``shardspec import DIR``: what a directory of weights is, and adopting it in place.

Two kinds of per-rank directories become shardspec checkpoints without a byte moved: vLLM's
sharded state (:func:`~shardspec.convert.import_vllm`) and transformers'/torch's distributed
Hugging Face saves (:func:`~shardspec.convert.import_hf_distributed`). Anything else is refused
with what it looks like and what to do with it.
"""

from __future__ import annotations

import os

from ..format.limits import MANIFEST_NAME
from ..storage.commit import CLAIM_NAME
from .adopt import Imported
from .directories import Progress, local_dir
from .from_hf_distributed import SHARD_FILE, import_hf_distributed
from .from_vllm import VLLM_FILE, import_vllm
from .hf import HFError

__all__ = ["import_directory", "what_it_is"]


def import_directory(path: str | os.PathLike[str], *, overwrite: bool = False,
                     progress: Progress | None = None) -> tuple[str, Imported]:
    """Adopt the directory at ``path`` in place: (what it was, the result)."""
    root = local_dir(path, "the directory to import")
    kind = what_it_is(path)
    if (root / MANIFEST_NAME).exists() and not overwrite:
        raise FileExistsError(f"{root} already holds {MANIFEST_NAME}; pass overwrite=True "
                              "(--overwrite) to write it anew")
    if kind == "vllm sharded_state":
        return kind, import_vllm(root, overwrite=overwrite, progress=progress)
    return kind, import_hf_distributed(root, overwrite=overwrite, progress=progress)


def what_it_is(path: str | os.PathLike[str]) -> str:
    """``"vllm sharded_state"`` or ``"huggingface distributed"``; HFError saying what the
    directory looks like otherwise."""
    root = local_dir(path, "the directory to import")
    if not root.is_dir():
        raise HFError(f"{root}: not a directory")
    names = set(os.listdir(root))
    if CLAIM_NAME in names and MANIFEST_NAME not in names:
        raise HFError(f"{root}: what an interrupted shardspec write left ({CLAIM_NAME} lists "
                      "the files it was writing), not a save to adopt: write it again, which "
                      "replaces them")
    vllm = any(VLLM_FILE.fullmatch(n) for n in names)
    distributed = any(SHARD_FILE.fullmatch(n) for n in names)
    if vllm and distributed:
        raise HFError(f"{root} holds both vLLM sharded-state files (model-rank-R-part-P) and "
                      "distributed Hugging Face files (shard-S-model-C-of-N): import one kind "
                      "per directory")
    if vllm:
        return "vllm sharded_state"
    if distributed:
        return "huggingface distributed"
    raise HFError(f"{root}: {_looks_like(names)}")


def _looks_like(names: set[str]) -> str:
    if any(n.endswith(".distcp") for n in names) or ".metadata" in names:
        return ("a torch.distributed.checkpoint directory (.metadata, *.distcp): its pieces "
                "are in DCP's own container, which shardspec does not adopt; save with "
                "shardspec.integrations.dcp.Writer instead, or with torch's "
                "HuggingFaceStorageWriter(save_distributed=True) and import that")
    if "model.safetensors" in names or any(n.endswith(".safetensors.index.json")
                                           for n in names):
        return ("a Hugging Face checkpoint of whole tensors: convert it with `shardspec "
                "convert DIR OUT --tp N`")
    if any(n.endswith((".bin", ".pt", ".pth")) for n in names):
        return ("pickled PyTorch weights, which shardspec does not read: save them as "
                "safetensors first")
    if MANIFEST_NAME in names:
        return "already a shardspec checkpoint (validate it with `shardspec validate`)"
    return ("no per-rank weight files: neither vLLM's model-rank-R-part-P.safetensors nor "
            "transformers' shard-SSSSS-model-CCCCC-of-NNNNN.safetensors")
