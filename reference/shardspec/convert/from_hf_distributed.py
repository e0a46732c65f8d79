"""A manifest for a distributed Hugging Face save: :func:`import_hf_distributed`.

transformers' ``save_pretrained(..., distributed_checkpoint=True)`` and torch's
``HuggingFaceStorageWriter(save_distributed=True)`` write one set of safetensors files per rank,
``shard-{S}-model-{C}-of-{N}.safetensors`` (S the rank counted from 1, C the file of that rank
counted from 1, N its files; five digits each), and record in each file's ``__metadata__`` under
``DCP_SHARDING_INFO`` (JSON) where each entry lies in its tensor: ``{name: {"saved_offsets":
[...]}}``. That is a shardspec piece: the rank, the file, the offset and the entry's shape. The
global shape is where the pieces end (as torch's reader takes it); a tensor that training
replicates is saved once, by one rank. Every file is checksummed and nothing is rewritten or
copied (:mod:`.adopt`); the manifest's checks (coverage, bounds) run before it is committed.

A rank may hold several chunks of one tensor in different files (FSDP2 with TP saves strided
shards so) where they join along one dimension (SPEC 7.2 rules 3, 7, format 1.3); chunks that do
not are refused by the manifest's checks, naming the tensor and the rank.
"""

from __future__ import annotations

import os
import re

import msgspec

from ..format.json_text import load_json
from ..format.manifest import Piece
from ..format.safetensors_header import SHARDING_INFO_KEY, Header
from .adopt import Imported, add_data_file, adopt, adoptable, check_numbering
from .directories import WEIGHT_SUFFIXES, Progress
from .hf import HFError

__all__ = ["SHARD_FILE", "import_hf_distributed"]

#: torch's name for a rank's file (``_hf_utils.SHARDED_FILE_NAME``): rank S from 1, file C of N.
#: Matched whole (fullmatch: ``$`` would take a trailing newline), ASCII digits only (``\d``
#: takes any script's, which int() reads as the same number).
SHARD_FILE = re.compile(r"shard-([0-9]{5})-model-([0-9]{5})-of-([0-9]{5})\.safetensors")


def import_hf_distributed(
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Imported:
    """Commit a manifest for the distributed Hugging Face save at ``path`` (see the module
    docstring). Ranks and files must count from 1 without gaps, each file's ``of`` its rank's
    count; other files become extra files as in :func:`~shardspec.convert.import_vllm`."""
    root = adoptable(path, "the distributed Hugging Face directory to import", overwrite=overwrite)
    files: dict[int, dict[int, str]] = {}
    counts: dict[int, set[int]] = {}
    stray = []
    for entry in sorted(os.listdir(root)):
        match = SHARD_FILE.fullmatch(entry)
        if match and int(match[1]) > 0 and int(match[2]) > 0:
            rank, part = int(match[1]) - 1, int(match[2]) - 1
            add_data_file(files, rank, part, entry)
            counts.setdefault(rank, set()).add(int(match[3]))
        elif (entry.endswith(WEIGHT_SUFFIXES) and not entry.endswith(".index.json")) \
                or (entry.startswith("shard-") and ".safetensors" in entry):
            stray.append(entry)  # a name almost torch's is no extra file either
    if stray:
        raise HFError(f"{root} holds weight files besides the per-rank files "
                      f"shard-SSSSS-model-CCCCC-of-NNNNN.safetensors: {stray}")
    if not files:
        raise HFError(f"{root} holds no shard-SSSSS-model-CCCCC-of-NNNNN.safetensors files")
    check_numbering(files)
    for rank, parts in files.items():
        if counts[rank] != {len(parts)}:
            raise HFError(f"rank {rank}'s files say they are {sorted(counts[rank])} in all, "
                          f"but it has {len(parts)}: {sorted(parts.values())}")
    return adopt(root, files, _global_pieces, shapes=_global_shapes, renumber=_replicas,
                 metadata={"imported_from": "huggingface distributed"}, progress=progress)


def _global_pieces(rank: int, name: str, header: Header) -> list[tuple[str, Piece]]:
    """Every entry of the file as the piece of rank ``rank`` its sharding info places."""
    info = _sharding_info(name, header)
    out = []
    for entry in sorted(header.entries.values(), key=lambda e: (e.begin, e.end, e.name)):
        found = info.get(entry.name)
        offsets = found.get("saved_offsets") if isinstance(found, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == len(entry.shape)
                and all(type(o) is int and 0 <= o < 2**63 for o in offsets)):
            raise HFError(f"{name}: {SHARDING_INFO_KEY} gives tensor {entry.name!r} no list of "
                          f"{len(entry.shape)} non-negative integer saved_offsets")
        out.append((entry.name, Piece(rank=rank, file=name, shape=entry.shape,
                                      offset=tuple(offsets))))
    return out


def _sharding_info(name: str, header: Header) -> dict[str, object]:
    text = header.metadata.get(SHARDING_INFO_KEY)
    if text is None:
        raise HFError(f"{name}: its __metadata__ has no {SHARDING_INFO_KEY}, which says where "
                      "each entry lies in its tensor: not a distributed save of transformers "
                      "or torch")
    try:
        info = load_json(text)
    except ValueError as exc:
        raise HFError(f"{name}: {SHARDING_INFO_KEY} is not JSON: {exc}") from None
    if not isinstance(info, dict):
        raise HFError(f"{name}: {SHARDING_INFO_KEY} is not a JSON object")
    return info


def _replicas(pieces: list[Piece]) -> list[Piece]:
    """Pieces of one tensor with the same box on several ranks (a save that did not dedup
    what training replicates) numbered as replicas in rank order (SPEC 7.4)."""
    seen: dict[tuple[object, ...], int] = {}
    out = []
    for piece in sorted(pieces, key=lambda p: p.rank):
        box = (piece.offset, piece.shape)
        out.append(msgspec.structs.replace(piece, replica=seen.get(box, 0)))
        seen[box] = seen.get(box, 0) + 1
    return out


def _global_shapes(pieces: dict[str, list[Piece]]) -> dict[str, tuple[int, ...] | None]:
    """Each tensor's shape: where its pieces end, dimension by dimension."""
    out: dict[str, tuple[int, ...] | None] = {}
    for name, held in pieces.items():
        other = next((p for p in held if len(p.shape) != len(held[0].shape)), None)
        if other is not None:
            raise HFError(f"tensor {name!r} has {len(held[0].shape)} dimensions in "
                          f"{held[0].file} and {len(other.shape)} in {other.file}: not pieces "
                          "of one tensor")
        ends = [tuple(o + s for o, s in zip(p.offset or (), p.shape, strict=True)) for p in held]
        out[name] = tuple(max(column) for column in zip(*ends, strict=True)) if ends[0] else ()
    return out
