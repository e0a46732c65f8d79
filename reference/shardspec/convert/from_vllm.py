"""A manifest for a vLLM ``save_sharded_state`` directory: :func:`import_vllm`.

The data files are ``model-rank-{rank}-part-{part}.safetensors``: the TP size is the number of
ranks, every tensor is rank-local (vLLM's pieces are not described as slices), every file is
checksummed and nothing is rewritten or copied (:mod:`.adopt`).
"""

from __future__ import annotations

import os
import re

from ..format.manifest import Piece
from ..format.safetensors_header import Header
from .adopt import Imported, add_data_file, adopt, adoptable, check_numbering
from .directories import WEIGHT_SUFFIXES, Progress
from .hf import HFError

__all__ = ["VLLM_FILE", "Imported", "import_vllm"]


#: Matched whole (fullmatch: ``$`` would take a trailing newline), ASCII digits only.
VLLM_FILE = re.compile(r"model-rank-(0|[1-9][0-9]*)-part-(0|[1-9][0-9]*)\.safetensors")


def import_vllm(
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Imported:
    """Commit a manifest for the vLLM ``save_sharded_state`` directory at ``path``.

    Data files are ``model-rank-{rank}-part-{part}.safetensors``; ranks must be 0..R-1 and each
    rank's parts 0..P-1, without gaps; the TP size is R. Every tensor is recorded rank-local.
    Other files become extra files, except stale indexes (``*.index.json``), ``original/``
    folders and hidden files, which are skipped (and reported); any other weight file
    (``*.safetensors``, ``*.bin``, ``*.pt``...) at the top is refused as ambiguous. Nothing is
    rewritten or copied: only ``shardspec.json`` is added. Refuses a directory that already
    holds a manifest unless ``overwrite``.
    """
    root = adoptable(path, "the vLLM directory to import", overwrite=overwrite)
    files: dict[int, dict[int, str]] = {}
    stray = []
    for entry in sorted(os.listdir(root)):
        match = VLLM_FILE.fullmatch(entry)
        if match:
            add_data_file(files, int(match[1]), int(match[2]), entry)
        elif (entry.endswith(WEIGHT_SUFFIXES) and not entry.endswith(".index.json")) \
                or entry.startswith("model-rank-"):
            stray.append(entry)
    if stray:
        raise HFError(f"{root} holds weight files that are not vLLM sharded-state files "
                      f"model-rank-{{rank}}-part-{{part}}.safetensors: {stray}")
    if not files:
        raise HFError(f"{root} holds no model-rank-{{rank}}-part-{{part}}.safetensors files")
    check_numbering(files)
    return adopt(root, files, _rank_local, shapes=lambda pieces: dict.fromkeys(pieces),
                 metadata={"imported_from": "vllm sharded_state"}, progress=progress)


def _rank_local(rank: int, name: str, header: Header) -> list[tuple[str, Piece]]:
    """Every entry of the file as a rank-local piece of rank ``rank``, in the file's order."""
    entries = sorted(header.entries.values(), key=lambda e: (e.begin, e.end, e.name))
    return [(e.name, Piece(rank=rank, file=name, shape=e.shape)) for e in entries]
