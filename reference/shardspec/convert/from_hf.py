"""From Hugging Face: :func:`convert` splits a Hugging Face checkpoint directory into a TP x PP x
EP shardspec checkpoint.

:mod:`~shardspec.convert.plan` decides every tensor's pieces (a tensor-parallel plan,
:mod:`~shardspec.convert.tp_plan`; contiguous pipeline stages, :mod:`~shardspec.format.stages`;
routed experts over expert ranks; quantized weights with their tied scales). It streams: for
each rank, for each tensor it holds, only that piece's bytes are read from the source
(:func:`~shardspec.convert.hf.iter_box`) and written into the rank's file as they come
(:func:`~shardspec.convert.hf.write_safetensors`), so peak memory is a bounded read buffer
(16 MiB, or one row of a tensor where a row is larger), not the model nor even the largest
tensor; with ``quantize="fp8"``, one piece of a quantized weight. The manifest is planned and
checked before the first byte is written (:func:`~shardspec.write.save.plan_checkpoint`) and
committed last.

With Hugging Face names (``names="hf"``) the data files are named as torch's distributed
Hugging Face writer names them, ``shard-{rank+1}-model-{part+1}-of-{parts}.safetensors``
(:func:`~shardspec.write.save.torch_file_name`), and each says in its ``__metadata__`` where its
entries lie (``DCP_SHARDING_INFO``): transformers' ``from_pretrained`` loads the directory, in
one process or tensor-parallel, and torch's ``HuggingFaceStorageReader`` reads it at any layout
(SPEC 6.2, 6.3, informative). shardspec readers still find every file through the manifest. The
files are claimed before the first is written (:mod:`~shardspec.write.directory`), so an
interrupted convert is replaced by the next, and a directory holding other safetensors files
(a distributed save of transformers, say) is refused, never emptied.

Tied embeddings: Hugging Face files drop ``lm_head.weight`` when ``tie_word_embeddings`` is
set. Convert gives it back, because serving frameworks need the LM head on the last pipeline
stage. Where the LM head and the embedding have the same pieces on the same ranks, the data is
stored once and the other name is an alias (SPEC 7.6); otherwise (different stages, or styles
that split them differently, or ``untie_embeddings``, which transformers' ``from_pretrained``
of a tied model needs: torch's reader loads every name of the state dict from the files, which
hold no aliases) ``lm_head.weight`` is written as a tensor of its own. The stored name of a
tied pair is the alphabetically smaller one (``lm_head.weight`` before
``model.embed_tokens.weight``), which is the name vLLM's sharded-state saver keeps of tensors
sharing storage, so vLLM's loader finds the keys it expects.

With ``names="vllm"`` the fused parameters of :mod:`~shardspec.convert.vllm_names` are
written in place of the Hugging Face projections, in vLLM's ``model-rank-{R}-part-{P}``
files: global tensors of which each rank holds one piece per part, each piece in a file of its
own (the planner's runs of files, :func:`~shardspec.write.shards.file_entries`), whose join is
vLLM's parameter; with ``sharded_state``, rank-local tensors of the same bytes.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..format.dtypes import DTYPES, byte_size
from ..format.limits import DEFAULT_MAX_FILE_SIZE
from ..format.manifest import FileRecord, Layout, Manifest, Piece, Quantization, TensorRecord
from ..format.safetensors_header import SHARDING_INFO_KEY
from ..format.ties import Box
from ..storage.location import Location, PathOrURL, locate
from ..storage.remote import RemoteRoot
from ..write.save import (
    RankInfo,
    Shard,
    TensorInfo,
    commit_checkpoint,
    copy_extra_files,
    finish_manifest,
    place_file,
    plan_checkpoint,
    prepare_directory,
)
from ..write.shards import Cut, file_entries
from . import fp8
from .directories import Progress, hf_extra_files, local_dir, read_json
from .hf import HFSource, OutTensor, iter_box, write_safetensors
from .plan import LM_HEAD, Split, Tied, plan_splits
from .tp_plan import PlanError, PlanWarning, TPPlan
from .vllm_names import Constant, Fused, fuse_for_vllm, vllm_name

__all__ = ["NAME_STYLES", "convert"]


#: The values of ``convert``'s ``names``: Hugging Face's parameter names, or vLLM's fused ones.
NAME_STYLES = ("hf", "vllm")

#: How a tensor of the output is made: a split of a source tensor, a tie, vLLM's fusion, a constant.
Written = Split | Tied | Fused | Constant


def _quantization(config: Mapping[str, Any] | None) -> Quantization:
    quant = (config or {}).get("quantization_config")
    if isinstance(quant, dict):
        method = str(quant.get("quant_method", "")).lower()
        if re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,63}", method):
            return Quantization(method=method, config=dict(quant))
    return Quantization()


def _rank_infos(layout: Layout, splits: Mapping[str, Written], tied: str | None
                ) -> list[RankInfo]:
    infos = []
    copies: dict[str, dict[tuple[tuple[int, ...], tuple[int, ...]], int]] = {}

    def shard_of(name: str, global_shape: tuple[int, ...], box: Box) -> Shard:
        seen = copies.setdefault(name, {})
        replica = seen[box] = seen.get(box, -1) + 1  # copies numbered in rank order
        return Shard(global_shape, box[0], replica=replica, shape=box[1])

    for rank in range(layout.size):
        coords = layout.coordinates(rank)
        tensors: dict[str, TensorInfo] = {}
        for name, split in splits.items():
            if split.stage != coords["pp_rank"]:
                continue
            shard: Shard | tuple[Shard, ...] | None
            if isinstance(split, Fused) and split.rank_local:  # SPEC 7.5
                shard, shape, dtype = None, split.shape(coords["tp_rank"]), split.dtype
            elif isinstance(split, Fused):  # one piece per part, joined (SPEC 7.2 rule 7)
                shards = tuple(shard_of(name, split.global_shape, box)
                               for box in split.parts(coords["tp_rank"]))
                shard = shards[0] if len(shards) == 1 else shards
                shape, dtype = split.shape(coords["tp_rank"]), split.dtype
            else:
                box = split.box(coords["ep_rank"], coords["tp_rank"])
                if box is None:
                    continue
                shard, shape = shard_of(name, split.shape, box), box[1]
                dtype = DTYPES[split.dtype]
            nbytes = byte_size(dtype, shape)
            if nbytes is None:
                raise PlanError(f"tensor {name!r}: a piece of shape {list(shape)} in "
                                f"{dtype.name} is not whole bytes (SPEC 6.5)")
            tensors[name] = TensorInfo(dtype.name, shape, nbytes, shard)
        aliases: dict[str, str] = {}
        if tied is not None and tied in tensors and LM_HEAD in tensors \
                and tensors[tied] == tensors[LM_HEAD]:
            target, alias = sorted((tied, LM_HEAD))
            aliases[alias] = target
        infos.append(RankInfo(rank, tensors, aliases))
    return infos


def convert(
    src: str | os.PathLike[str],
    dst: PathOrURL,
    *,
    tp_size: int,
    pp_size: int = 1,
    ep_size: int = 1,
    plan: TPPlan | Mapping[str, str] | None = None,
    stages: Mapping[str, int] | None = None,
    allow_uneven: bool = False,
    max_file_size: int = DEFAULT_MAX_FILE_SIZE,
    overwrite: bool = False,
    metadata: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    names: str = "hf",
    quantize: str | None = None,
    storage_options: dict[str, Any] | None = None,
    untie_embeddings: bool = False,
    sharded_state: bool = False,
    remove_adopted: bool = False,
) -> Manifest:
    """Convert the Hugging Face checkpoint directory ``src`` to a shardspec checkpoint ``dst``
    (a directory, or an object-storage URL with ``storage_options`` for its filesystem).

    ``plan`` maps name patterns to styles (default: the config's ``base_model_tp_plan`` with
    the common extras, else the built-in plan of Llama-, Mistral- and Qwen2-shaped models; see
    :mod:`shardspec.convert.tp_plan`). ``stages`` overrides the pipeline stage of the tensors its
    patterns match (default: :func:`shardspec.format.stages.assign_stages`: contiguous runs of
    layers, the embedding on the first stage, the final norm and LM head on the last). A split dim
    that ``tp_size`` does not divide is refused unless ``allow_uneven``.

    ``ep_size`` deals each layer's routed experts to expert ranks in contiguous blocks
    (:mod:`shardspec.format.experts`); within an expert rank they are split by tensor parallelism
    like any MLP (a plan giving them ``replicate`` keeps each expert whole). Pre-quantized weights
    (FP8 with block, channel or tensor scales, AWQ, GPTQ, MXFP4; :mod:`shardspec.convert.quantized`)
    are recorded with their logical dtype and shape, and their scales and zero points tied to them
    and split in the matching blocks (SPEC 8.4); a split through a block is refused.
    ``quantize="fp8"`` writes linear weights as FP8 with 128 x 128 block scales
    (:mod:`shardspec.convert.fp8`), and config.json with the matching ``quantization_config``.
    Raises :class:`~shardspec.convert.tp_plan.PlanError` or :class:`~shardspec.convert.hf.HFError`
    before writing anything when the source or the plan is unusable.

    ``names="vllm"`` writes vLLM's fused ``qkv_proj`` and ``gate_up_proj`` tensors in place of
    the Hugging Face projections, and the attention layers' scale buffers (see the module's
    docstring): global tensors, each rank holding one piece per part (q, k, v; gate, up) whose
    join is vLLM's parameter, so that the checkpoint reshards. It needs ``pp_size == 1`` and
    head counts in ``config.json`` that vLLM deals to the TP size (fewer key/value heads than
    ranks are replicated, as vLLM does). vLLM's own ``sharded_state`` loader reads a name once
    per rank, so it reads such a checkpoint at TP 1 only; ``sharded_state=True`` writes each
    rank's fused tensors as one rank-local tensor (SPEC 7.5) instead, which it reads at any TP
    size, and which cannot be resharded.

    ``untie_embeddings`` writes a tied LM head as a tensor of its own (the embedding's bytes
    twice), as transformers' distributed save does: transformers' ``from_pretrained`` of a
    tied model needs it (its reader loads every name of the state dict from the files, which
    hold no aliases). vLLM then serves the model untied, with an LM head of its own in memory,
    so it is off by default: the tied head is an alias of the embedding (SPEC 7.6).
    """
    for label, value in (("tp_size", tp_size), ("pp_size", pp_size), ("ep_size", ep_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive integer, got {value!r}")
    if names not in NAME_STYLES:
        raise ValueError(f"names must be one of {list(NAME_STYLES)}, got {names!r}")
    if sharded_state and names != "vllm":
        raise ValueError("sharded_state=True needs names='vllm'")
    if names == "vllm" and pp_size != 1:
        raise PlanError(f"names='vllm' needs pp_size = 1 (got pp={pp_size}): vLLM's "
                        "sharded-state loader names pipeline stages' files otherwise")
    source = HFSource(local_dir(src, "the Hugging Face checkpoint to convert"))
    root = locate(dst, storage_options)
    if isinstance(root, Path) and root.resolve() == source.root.resolve():
        raise ValueError("the destination must be another directory than the source")
    if names == "vllm" and ep_size != 1:
        raise PlanError("names='vllm' needs ep_size = 1: vLLM's sharded-state loader reads "
                        "tensor-parallel checkpoints only")
    layout = Layout(tp_size=tp_size, pp_size=pp_size, ep_size=ep_size)
    planned = plan_splits(source, layout, plan, stages, allow_uneven, quantize)
    splits: dict[str, Written] = dict(planned.splits)
    if names == "vllm":
        splits = fuse_for_vllm(planned.splits, source.config, tp_size, rank_local=sharded_state)
    extras = hf_extra_files(source.root, exclude=root if isinstance(root, Path) else None)
    quantization = _quantization(source.config)
    if quantize == "fp8":
        quantization = Quantization(method="fp8", config=dict(fp8.CONFIG))
    info = {"converted_from": "huggingface"}
    torch_names = names == "hf"  # torch's file names (see the module docstring)
    tied = None if torch_names and untie_embeddings else planned.tied_embedding
    draft = plan_checkpoint(
        layout, _rank_infos(layout, splits, tied),
        quantization=quantization, logical=planned.logical, ties=planned.ties,
        metadata={**info, **(metadata or {})}, extra_files=list(extras),
        max_file_size=max_file_size, file_names="torch" if torch_names else "shardspec",
    )
    for notice in planned.notices:  # once every check has passed: the layout is written
        if names == "vllm":  # the tensors it names as they are written
            notice = re.sub(r"'([^']+)'", lambda m: repr(vllm_name(m.group(1))), notice)
        warnings.warn(notice, PlanWarning, stacklevel=2)
    with tempfile.TemporaryDirectory(prefix="shardspec-convert-") as folder:
        if quantize == "fp8" and "config.json" in extras:
            extras["config.json"] = _with_quantization(extras["config.json"], Path(folder))
        return _write_converted(root, layout, draft, splits, extras, overwrite, progress,
                                claim=torch_names, remove_adopted=remove_adopted)


def _with_quantization(config: Path, folder: Path) -> Path:
    """A copy of config.json that records ``--quantize fp8``'s quantization_config."""
    data = read_json(config) or {}
    data["quantization_config"] = dict(fp8.CONFIG)
    out = folder / "config.json"
    out.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out


def _write_converted(root: Location, layout: Layout, draft: Manifest,
                     splits: Mapping[str, Written], extras: Mapping[str, Path],
                     overwrite: bool, progress: Progress | None, claim: bool,
                     remove_adopted: bool = False) -> Manifest:
    total = sum(byte_size(DTYPES[r.dtype], p.shape) or 0 for r in draft.tensors.values()
                if isinstance(r, TensorRecord) for p in r.pieces)
    data_files = [f.path for r in draft.ranks for f in r.files]
    prepare_directory(root, overwrite, claim=data_files if claim else (),
                      remove_adopted=remove_adopted, paths=list(extras))
    advance = None if progress is None else (lambda n: progress(n, total))
    records: dict[str, FileRecord] = {}
    for rank in range(layout.size):
        coords = layout.coordinates(rank)
        for path, entries in file_entries(draft, rank).items():
            pieces = [(name, cut, _piece_in(draft, name, rank, path)) for name, cut in entries]
            outs = [_piece_out(name, splits[name], coords, draft, piece, cut)
                    for name, cut, piece in pieces]
            records[path] = _write_part(root, path, outs, _file_metadata(pieces), advance)
    records.update({f.path: f for f in copy_extra_files(root, extras)})
    manifest = finish_manifest(draft, records)
    commit_checkpoint(root, manifest.to_json(), claimed=claim)
    return manifest


def _write_part(root: Location, path: str, outs: list[OutTensor], metadata: dict[str, str],
                advance: Callable[[int], None] | None) -> FileRecord:
    """One data file, streamed from its pieces; hashed as written when it is a local one."""
    def write(target: Path) -> tuple[int, str]:
        return write_safetensors(target, outs, metadata=metadata, progress=advance)

    if isinstance(root, RemoteRoot):
        return place_file(root, path, write)
    size, sha = write(root / path)
    return FileRecord(path=path, size=size, checksums={"sha256": sha})


def _piece_in(draft: Manifest, name: str, rank: int, path: str) -> Piece:
    """The piece of tensor ``name`` that rank ``rank`` holds in file ``path``."""
    record = draft.tensors[name]
    assert isinstance(record, TensorRecord)
    return next(p for p in record.pieces if p.rank == rank and p.file == path)


def _file_metadata(pieces: list[tuple[str, Cut, Piece]]) -> dict[str, str]:
    """A data file's ``__metadata__``: safetensors' ``format``, and where its pieces are global,
    torch's ``DCP_SHARDING_INFO`` (each entry's offset in its tensor: the offset of the piece
    this file holds, where a rank holds several), with which torch's
    ``HuggingFaceStorageReader`` reads the checkpoint at any layout (SPEC 6.3, informative)."""
    info: dict[str, dict[str, list[int]]] = {}
    for name, _, piece in pieces:
        if piece.offset is None:  # rank-local (vLLM's names): nothing to say
            return {"format": "pt"}
        info[name] = {"saved_offsets": list(piece.offset)}
    return {"format": "pt", SHARDING_INFO_KEY: json.dumps(info, separators=(",", ":"))}


def _piece_out(name: str, split: Written, coords: Mapping[str, int], draft: Manifest,
               piece: Piece, cut: Cut) -> OutTensor:
    """The entry of one piece: the rank's value of ``name``, or the ``cut`` of it that the
    file holds where the value joins several pieces."""
    record = draft.tensors[name]
    assert isinstance(record, TensorRecord)
    dtype = record.dtype
    nbytes = byte_size(DTYPES[dtype], piece.shape) or 0
    if isinstance(split, Fused):
        fused, tp_rank = split, coords["tp_rank"]
        assert cut is None or cut[0] == 0, "fused parts join along dim 0"
        start, stop = (0, None) if cut is None else (cut[1], cut[1] + cut[2])
        return OutTensor(name, dtype, piece.shape, nbytes,
                         lambda: fused.chunks(tp_rank, start, stop))
    assert cut is None, "only fused tensors are joined"
    return OutTensor(name, dtype, piece.shape, nbytes, _chunks_of(split, coords))


def _chunks_of(split: Split | Tied | Constant, coords: Mapping[str, int]
               ) -> Callable[[], Iterator[bytes | bytearray]]:
    """The bytes of the rank's piece: read from the source, or quantized as they are read."""
    if isinstance(split, Constant):
        return lambda: iter([split.data()])
    ep_rank, tp_rank = coords["ep_rank"], coords["tp_rank"]
    base = split.base if isinstance(split, Tied) else split
    base_box = base.box(ep_rank, tp_rank)
    assert base_box is not None

    def quantized(part: int) -> Iterator[bytes | bytearray]:
        data = b"".join(iter_box(base.source, *base_box))
        yield fp8.quantize_block(data, base.source.dtype.name, base_box[1])[part]

    if isinstance(split, Tied) and split.source is None:
        return lambda: quantized(1)  # the scale of a weight --quantize makes FP8
    if isinstance(split, Split) and split.quantize:
        return lambda: quantized(0)
    source = split.source
    assert source is not None
    box = split.box(ep_rank, tp_rank)
    assert box is not None
    return lambda: iter_box(source, *box)
