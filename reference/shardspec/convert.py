"""Into shardspec from Hugging Face and vLLM, and back to Hugging Face.

:func:`convert` splits a Hugging Face checkpoint directory into a TP x PP x EP shardspec
checkpoint: :mod:`shardspec.convert_plan` decides every tensor's pieces (a tensor-parallel plan,
:mod:`shardspec.tp_plan`; contiguous pipeline stages, :mod:`shardspec.stages`; routed experts
over expert ranks; quantized weights with their tied scales). It streams: for each rank, for
each tensor it holds, only that piece's bytes are read from the source
(:func:`shardspec.hf.iter_box`) and written into the rank's file as they come
(:func:`shardspec.hf.write_safetensors`), so peak memory is a bounded read buffer (16 MiB, or
one row of a tensor where a row is larger), not the model nor even the largest tensor; with
``quantize="fp8"``, one piece of a quantized weight. The manifest is planned and checked
before the first byte is written (:func:`shardspec.writer.plan_checkpoint`) and committed last.

Tied embeddings: Hugging Face files drop ``lm_head.weight`` when ``tie_word_embeddings`` is
set. Convert gives it back, because serving frameworks need the LM head on the last pipeline
stage: where the LM head and the embedding have the same pieces on the same ranks, the data is
stored once and the other name is an alias (SPEC 7.6); otherwise (different stages, or styles
that split them differently) ``lm_head.weight`` is written as a tensor of its own, read from the
embedding. The stored name of a tied pair is the alphabetically smaller one (``lm_head.weight``
before ``model.embed_tokens.weight``), which is the name vLLM's sharded-state saver keeps of
tensors sharing storage, so vLLM's loader finds the keys it expects.

:func:`merge` writes a Hugging Face directory back: shards of at most 5 GB
(``model-00001-of-00002.safetensors`` plus ``model.safetensors.index.json``, or one
``model.safetensors``), with the tied ``lm_head.weight`` dropped again when the config ties it
and it equals the embedding, and the extra files copied (their checksums verified). A tensor
split along dim 0 only is streamed piece by piece; any other is assembled in memory, so peak
memory is about one tensor.

:func:`import_vllm` adds a manifest to a directory written by vLLM's ``save_sharded_state``
(``model-rank-{rank}-part-{part}.safetensors``): the TP size is the number of ranks, every
tensor is rank-local (vLLM's pieces are not described as slices), every file is checksummed and
nothing is rewritten or copied.

With ``names="vllm"``, :func:`convert` writes the fused parameters of vLLM's Llama-, Mistral-
and Qwen2-shaped model classes instead of the Hugging Face projections: each TP rank's
``...self_attn.qkv_proj.weight`` (and ``.bias``) is its q rows, then its k rows, then its v rows
(``num_attention_heads / tp`` query heads and ``num_key_value_heads / tp`` key/value heads), and
its ``...mlp.gate_up_proj.weight`` its gate rows then its up rows. Under grouped-query attention
such a piece is not a slice of one global tensor, so the fused tensors are rank-local
(SPEC 7.5); every other tensor is written as with ``names="hf"``. vLLM's sharded-state loader
reads tensor-parallel layouts only, so this needs ``tp_size > 1`` and ``pp_size == 1``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__, fp8
from .checks import check_manifest, path_problem
from .commit import commit_manifest, fsync_dir, uncommit, write_durably
from .convert_plan import EMBEDDING_NAMES, LM_HEAD, Split, Tied, plan_splits
from .dtypes import DTYPES, byte_size
from .errors import ShardspecError, raise_first_error
from .hf import (
    DEFAULT_MAX_SHARD_SIZE,
    HF_INDEX,
    HFError,
    HFSource,
    OutTensor,
    SourceTensor,
    hf_shard_names,
    iter_box,
    iter_slice,
    plan_hf_shards,
    scan_safetensors,
    write_hf_index,
    write_safetensors,
)
from .integrity import digest_stream
from .limits import DEFAULT_MAX_FILE_SIZE, MANIFEST_NAME
from .location import Location, PathOrURL, locate
from .manifest import (
    Alias,
    FileRecord,
    Layout,
    Manifest,
    Piece,
    Quantization,
    RankRecord,
    TensorRecord,
    format_version,
)
from .paths import resolve_inside
from .reader import open_checkpoint
from .remote import RemoteRoot, is_remote
from .schema import schema_findings
from .tp_plan import PlanError, TPPlan
from .validate import validate
from .writer import (
    RankInfo,
    Shard,
    TensorInfo,
    claim_directory,
    commit_checkpoint,
    copy_extra_files,
    finish_manifest,
    place_file,
    plan_checkpoint,
    prepare_directory,
)

__all__ = [
    "EMBEDDING_NAMES",
    "LM_HEAD",
    "NAME_STYLES",
    "Imported",
    "Progress",
    "convert",
    "hf_extra_files",
    "import_vllm",
    "merge",
]

#: progress(bytes just written, total bytes to write)
Progress = Callable[[int, int], None]

#: The values of ``convert``'s ``names``: Hugging Face's parameter names, or vLLM's fused ones.
NAME_STYLES = ("hf", "vllm")

#: vLLM's fusions: (module suffix of the fused parameter, the Hugging Face modules it joins).
_VLLM_FUSIONS = (
    ("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")),
)

#: Never copied from a Hugging Face directory: weights in other formats and stale indexes.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack",
                    ".gguf", ".index.json")
#: Never copied: Meta's original weights and tool caches.
_SKIPPED_DIRS = ("original",)


# --- convert ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fused:
    """A rank-local tensor written as each rank's dim-0 slices of ``members``, one after the
    other (vLLM's ``qkv_proj`` and ``gate_up_proj``); every member is split along dim 0."""

    members: tuple[Split, ...]
    stage: int

    @property
    def dtype(self) -> Any:
        return self.members[0].source.dtype

    def shape(self, tp_rank: int) -> tuple[int, ...]:
        rows = sum(m.sizes[tp_rank] for m in self.members)
        return (rows, *self.members[0].source.shape[1:])

    def chunks(self, tp_rank: int) -> Iterator[bytes | bytearray]:
        for member in self.members:
            box = member.box(0, tp_rank)  # vLLM's layouts have ep_size 1
            assert box is not None
            start = box[0][0]
            yield from iter_slice(member.source, 0, start, start + box[1][0])


def _config_int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"names='vllm' needs a positive integer {key} in config.json, got "
                        f"{value!r}")
    return value


def _fuse_for_vllm(splits: dict[str, Split | Tied], config: Mapping[str, Any] | None,
                   tp_size: int) -> dict[str, Split | Tied | _Fused]:
    """``splits`` with vLLM's fused tensors in place of the projections they join (each at
    the position of its first member); PlanError where vLLM's layout cannot be written."""
    config = config or {}
    heads = _config_int(config, "num_attention_heads")
    kv_heads = _config_int(config, "num_key_value_heads") \
        if config.get("num_key_value_heads") is not None else heads
    if config.get("head_dim") is not None:
        head_dim = _config_int(config, "head_dim")
    else:
        head_dim = _config_int(config, "hidden_size") // heads
    if kv_heads < tp_size:
        raise PlanError(f"names='vllm': num_key_value_heads ({kv_heads}) is smaller than the TP "
                        f"size ({tp_size}); vLLM then replicates key/value heads across ranks, "
                        "which convert does not write")
    for label, count in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads)):
        if count % tp_size:
            raise PlanError(f"names='vllm': {label} ({count}) is not a multiple of the TP size "
                            f"({tp_size})")
    rows_of = {"self_attn.q_proj": heads * head_dim, "self_attn.k_proj": kv_heads * head_dim,
               "self_attn.v_proj": kv_heads * head_dim}
    fused_at: dict[str, str] = {}       # member name -> fused name
    groups: dict[str, list[str]] = {}   # fused name -> member names
    for name in splits:
        module, _, leaf = name.rpartition(".")
        for fused, joined in _VLLM_FUSIONS:
            for part in joined:
                if module == part or module.endswith("." + part):
                    prefix = module[:len(module) - len(part)]
                    fused_name = f"{prefix}{fused}.{leaf}"
                    wanted = [f"{prefix}{m}.{leaf}" for m in joined]
                    missing = [w for w in wanted if w not in splits]
                    if missing:
                        raise PlanError(f"names='vllm': {name!r} is fused with {missing} into "
                                        f"{fused_name!r}, but the checkpoint lacks them")
                    if fused_name in splits:
                        raise PlanError(f"names='vllm': the checkpoint already holds "
                                        f"{fused_name!r}")
                    fused_at[name] = fused_name
                    groups[fused_name] = wanted
    if not groups:
        raise PlanError("names='vllm' found no q/k/v or gate/up projections to fuse; use "
                        "names='hf'")
    tied = [n for n, s in splits.items() if not isinstance(s, Split)]
    if tied:
        raise PlanError(f"names='vllm' cannot fuse quantized projections: {tied[0]!r} is tied "
                        "to a weight (SPEC 8.4); use names='hf'")
    plain = {n: s for n, s in splits.items() if isinstance(s, Split)}
    out: dict[str, Split | Tied | _Fused] = {}
    for name, split in plain.items():
        target = fused_at.get(name)
        if target is None:
            out[name] = split
            continue
        if target in out:
            continue
        members = tuple(plain[m] for m in groups[target])
        for member_name, member in zip(groups[target], members, strict=True):
            module = member_name.rpartition(".")[0]
            if member.dim != 0:
                raise PlanError(f"names='vllm': {member_name!r} must be split along dim 0 "
                                f"(colwise) to be fused into {target!r}; the plan gives style "
                                f"{member.style!r}")
            kind = next((k for k in rows_of if module == k or module.endswith("." + k)), None)
            if kind is not None and member.source.shape[0] != rows_of[kind]:
                raise PlanError(f"names='vllm': {member_name!r} has {member.source.shape[0]} "
                                f"rows, but config.json gives {rows_of[kind]} (heads x "
                                f"head_dim {head_dim})")
            if len(set(member.sizes)) != 1:
                raise PlanError(f"names='vllm': {member_name!r} (dim 0 of size "
                                f"{member.source.shape[0]}) does not split evenly over "
                                f"{tp_size} ranks")
        if len({m.source.dtype.name for m in members}) != 1 or \
                len({m.source.shape[1:] for m in members}) != 1:
            raise PlanError(f"names='vllm': the tensors fused into {target!r} ({groups[target]}) "
                            "differ in dtype or in their dims after the first")
        if len({m.stage for m in members}) != 1:
            raise PlanError(f"names='vllm': the tensors fused into {target!r} are on different "
                            "pipeline stages")
        out[target] = _Fused(members, members[0].stage)
    return out


def _quantization(config: Mapping[str, Any] | None) -> Quantization:
    quant = (config or {}).get("quantization_config")
    if isinstance(quant, dict):
        method = str(quant.get("quant_method", "")).lower()
        if re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,63}", method):
            return Quantization(method=method, config=dict(quant))
    return Quantization()


def hf_extra_files(root: Path, exclude: Path | None = None) -> dict[str, Path]:
    """The files of a Hugging Face directory that belong with the weights (config, tokenizer,
    generation config, ...): every regular file except weights (``.safetensors``, ``.bin``,
    ``.pt``, ...), indexes (``*.index.json``), hidden files, ``original/`` folders, a
    ``shardspec.json`` and the folder ``exclude`` (a destination inside the source)."""
    out: dict[str, Path] = {}
    skip = None if exclude is None else exclude.resolve()
    for folder, dirs, files in os.walk(root):
        relative = Path(folder).relative_to(root)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIPPED_DIRS
                         and (Path(folder) / d).resolve() != skip)
        for name in sorted(files):
            path = Path(folder) / name
            rel = (relative / name).as_posix()
            if (name.startswith(".") or name.endswith(_WEIGHT_SUFFIXES)
                    or rel == MANIFEST_NAME or not path.is_file()):
                continue
            if path_problem(rel):
                raise HFError(f"cannot list {rel!r} as an extra file: {path_problem(rel)}")
            out[rel] = path
    return out


def _rank_infos(layout: Layout, splits: Mapping[str, Split | Tied | _Fused], tied: str | None
                ) -> list[RankInfo]:
    infos = []
    copies: dict[str, dict[tuple[tuple[int, ...], tuple[int, ...]], int]] = {}
    for rank in range(layout.size):
        coords = layout.coordinates(rank)
        tensors: dict[str, TensorInfo] = {}
        for name, split in splits.items():
            if split.stage != coords["pp_rank"]:
                continue
            shard: Shard | None
            if isinstance(split, _Fused):  # rank-local (SPEC 7.5)
                shard, shape, dtype = None, split.shape(coords["tp_rank"]), split.dtype
            else:
                box = split.box(coords["ep_rank"], coords["tp_rank"])
                if box is None:
                    continue
                seen = copies.setdefault(name, {})
                replica = seen[box] = seen.get(box, -1) + 1  # copies numbered in rank order
                shard, shape = Shard(split.shape, box[0], replica=replica), box[1]
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
) -> Manifest:
    """Convert the Hugging Face checkpoint directory ``src`` to a shardspec checkpoint ``dst``
    (a directory, or an object-storage URL with ``storage_options`` for its filesystem).

    ``plan`` maps name patterns to styles (default: the config's ``base_model_tp_plan`` with
    the common extras, else the built-in plan of Llama-, Mistral- and Qwen2-shaped models; see
    :mod:`shardspec.tp_plan`). ``stages`` overrides the pipeline stage of the tensors its
    patterns match (default: :func:`shardspec.stages.assign_stages`: contiguous runs of layers,
    the embedding on the first stage, the final norm and LM head on the last). A split dim that
    ``tp_size`` does not divide is refused unless ``allow_uneven``.

    ``ep_size`` deals each layer's routed experts to expert ranks in contiguous blocks
    (:mod:`shardspec.experts`); within an expert rank they are split by tensor parallelism like
    any MLP (a plan giving them ``replicate`` keeps each expert whole). Pre-quantized weights
    (FP8 with block, channel or tensor scales, AWQ, GPTQ, MXFP4; :mod:`shardspec.quantized`)
    are recorded with their logical dtype and shape, and their scales and zero points tied to
    them and split in the matching blocks (SPEC 8.4); a split through a block is refused.
    ``quantize="fp8"`` writes linear weights as FP8 with 128 x 128 block scales
    (:mod:`shardspec.fp8`), and config.json with the matching ``quantization_config``. Raises
    :class:`~shardspec.tp_plan.PlanError` or :class:`~shardspec.hf.HFError` before writing
    anything when the source or the plan is unusable.

    ``names="vllm"`` writes vLLM's fused ``qkv_proj`` and ``gate_up_proj`` tensors, rank-local,
    in place of the Hugging Face projections (see the module's docstring); it needs
    ``tp_size > 1`` and ``pp_size == 1``, head counts in ``config.json`` that the TP size
    divides, and at least as many key/value heads as ranks.
    """
    for label, value in (("tp_size", tp_size), ("pp_size", pp_size), ("ep_size", ep_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive integer, got {value!r}")
    if names not in NAME_STYLES:
        raise ValueError(f"names must be one of {list(NAME_STYLES)}, got {names!r}")
    if names == "vllm" and (tp_size < 2 or pp_size != 1):
        raise PlanError(f"names='vllm' needs tp_size > 1 and pp_size = 1 (got tp={tp_size}, "
                        f"pp={pp_size}): vLLM's sharded-state loader reads tensor-parallel "
                        "checkpoints only")
    source = HFSource(_local(src, "the Hugging Face checkpoint to convert"))
    root = locate(dst, storage_options)
    if isinstance(root, Path) and root.resolve() == source.root.resolve():
        raise ValueError("the destination must be another directory than the source")
    if names == "vllm" and ep_size != 1:
        raise PlanError("names='vllm' needs ep_size = 1: vLLM's sharded-state loader reads "
                        "tensor-parallel checkpoints only")
    layout = Layout(tp_size=tp_size, pp_size=pp_size, ep_size=ep_size)
    planned = plan_splits(source, layout, plan, stages, allow_uneven, quantize)
    splits: dict[str, Split | Tied | _Fused] = dict(planned.splits)
    if names == "vllm":
        splits = _fuse_for_vllm(planned.splits, source.config, tp_size)
    extras = hf_extra_files(source.root, exclude=root if isinstance(root, Path) else None)
    quantization = _quantization(source.config)
    if quantize == "fp8":
        quantization = Quantization(method="fp8", config=dict(fp8.CONFIG))
    info = {"converted_from": "huggingface"}
    draft = plan_checkpoint(
        layout, _rank_infos(layout, splits, planned.tied_embedding), quantization=quantization,
        logical=planned.logical, ties=planned.ties, metadata={**info, **(metadata or {})},
        extra_files=list(extras), max_file_size=max_file_size,
    )
    with tempfile.TemporaryDirectory(prefix="shardspec-convert-") as folder:
        if quantize == "fp8" and "config.json" in extras:
            extras["config.json"] = _with_quantization(extras["config.json"], Path(folder))
        return _write_converted(root, layout, draft, splits, extras, overwrite, progress)


def _with_quantization(config: Path, folder: Path) -> Path:
    """A copy of config.json that records ``--quantize fp8``'s quantization_config."""
    data = _read_json(config) or {}
    data["quantization_config"] = dict(fp8.CONFIG)
    out = folder / "config.json"
    out.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out


def _write_converted(root: Location, layout: Layout, draft: Manifest,
                     splits: Mapping[str, Split | Tied | _Fused], extras: Mapping[str, Path],
                     overwrite: bool, progress: Progress | None) -> Manifest:
    total = sum(byte_size(DTYPES[r.dtype], p.shape) or 0 for r in draft.tensors.values()
                if isinstance(r, TensorRecord) for p in r.pieces)
    prepare_directory(root, overwrite)
    advance = None if progress is None else (lambda n: progress(n, total))
    records: dict[str, FileRecord] = {}
    for rank in range(layout.size):
        coords = layout.coordinates(rank)
        for path, in_file in _names_by_file(draft, rank).items():
            outs = [_piece_out(name, splits[name], coords, draft) for name in in_file]
            records[path] = _write_part(root, path, outs, advance)
    records.update({f.path: f for f in copy_extra_files(root, extras)})
    manifest = finish_manifest(draft, records)
    commit_checkpoint(root, manifest.to_json())
    return manifest


def _local(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` as a local directory; ValueError for an object-storage URL."""
    if is_remote(os.fspath(path)):
        raise ValueError(f"{what} must be a local directory, not the URL {os.fspath(path)!r}: "
                         "copy it to local disk first")
    return Path(os.fspath(path))


def _write_part(root: Location, path: str, outs: list[OutTensor],
                advance: Callable[[int], None] | None) -> FileRecord:
    """One data file, streamed from its pieces; hashed as written when it is a local one."""
    def write(target: Path) -> tuple[int, str]:
        return write_safetensors(target, outs, metadata={"format": "pt"}, progress=advance)

    if isinstance(root, RemoteRoot):
        return place_file(root, path, write)
    size, sha = write(root / path)
    return FileRecord(path=path, size=size, checksums={"sha256": sha})


def _names_by_file(draft: Manifest, rank: int) -> dict[str, list[str]]:
    names: dict[str, list[str]] = {f.path: [] for f in draft.ranks[rank].files}
    for name, record in draft.tensors.items():
        if isinstance(record, TensorRecord):
            piece = record.piece_of(rank)
            if piece is not None:
                names[piece.file].append(name)
    return names


def _piece_out(name: str, split: Split | Tied | _Fused, coords: Mapping[str, int],
               draft: Manifest) -> OutTensor:
    record = draft.tensors[name]
    assert isinstance(record, TensorRecord)
    tp_rank = coords["tp_rank"]
    if isinstance(split, _Fused):
        fused = split
        shape = fused.shape(tp_rank)
        return OutTensor(name, record.dtype, shape, byte_size(DTYPES[record.dtype], shape) or 0,
                         lambda: fused.chunks(tp_rank))
    box = split.box(coords["ep_rank"], tp_rank)
    assert box is not None
    shape = box[1]
    nbytes = byte_size(DTYPES[record.dtype], shape) or 0
    return OutTensor(name, record.dtype, shape, nbytes, _chunks_of(split, coords))


def _chunks_of(split: Split | Tied, coords: Mapping[str, int]
               ) -> Callable[[], Iterator[bytes | bytearray]]:
    """The bytes of the rank's piece: read from the source, or quantized as they are read."""
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


# --- merge -----------------------------------------------------------------------------------


class _PieceReader:
    """Reads replica-0 pieces of a checkpoint's global tensors (headers parsed once a file)."""

    def __init__(self, root: Path, manifest: Manifest) -> None:
        self.root = root
        self.manifest = manifest
        self._files: dict[str, dict[str, SourceTensor]] = {}

    def _source(self, file: str, name: str) -> SourceTensor:
        if file not in self._files:
            self._files[file] = scan_safetensors(resolve_inside(self.root, file), file)
        return self._files[file][name]

    def record(self, name: str) -> TensorRecord:
        record = self.manifest.tensors[name]
        if isinstance(record, Alias):
            record = self.manifest.tensors[record.alias_of]
        assert isinstance(record, TensorRecord)
        return record

    def nbytes(self, name: str) -> int:
        record = self.record(name)
        assert record.shape is not None
        return byte_size(DTYPES[record.dtype], record.shape) or 0

    def chunks(self, name: str) -> Iterator[bytes | bytearray]:
        """The global tensor's bytes in row-major order."""
        stored = name
        if isinstance(self.manifest.tensors[name], Alias):
            alias = self.manifest.tensors[name]
            assert isinstance(alias, Alias)
            stored = alias.alias_of
        record = self.record(name)
        assert record.shape is not None
        shape = record.shape
        if not self.nbytes(name):
            return
        pieces = sorted((p for p in record.pieces if p.replica == 0),
                        key=lambda p: tuple(p.offset or ()))
        if all(p.offset is not None and all(o == 0 for o in p.offset[1:])
               and p.shape[1:] == shape[1:] for p in pieces):
            for piece in pieces:  # split along dim 0 at most: the pieces follow each other
                yield from iter_slice(self._source(piece.file, stored), None)
            return
        yield self._assemble(stored, record).tobytes()

    def _assemble(self, stored: str, record: TensorRecord) -> np.ndarray[Any, Any]:
        dtype = DTYPES[record.dtype]
        shape = record.shape
        assert shape is not None

        def byte_shape(s: tuple[int, ...]) -> tuple[int, ...]:
            if dtype.bits % 8 == 0:
                return (*s, dtype.bits // 8)
            return (*s[:-1], s[-1] * dtype.bits // 8)

        if dtype.bits % 8 and (shape[-1] * dtype.bits % 8 or any(
                (p.offset or ())[-1] != 0 or p.shape[-1] != shape[-1] for p in record.pieces)):
            raise HFError(f"tensor {stored!r}: {dtype.name} pieces split along the last "
                          "dimension cannot be reassembled byte-wise")
        whole = np.empty(byte_shape(shape), dtype=np.uint8)
        for piece in record.pieces:
            if piece.replica:
                continue
            data = b"".join(iter_slice(self._source(piece.file, stored), None))
            block = np.frombuffer(data, dtype=np.uint8).reshape(byte_shape(piece.shape))
            offset = piece.offset or ()
            if dtype.bits % 8:
                where = tuple(slice(o, o + n) for o, n in zip(offset[:-1], piece.shape[:-1],
                                                               strict=True))
            else:
                where = tuple(slice(o, o + n) for o, n in zip(offset, piece.shape, strict=True))
            whole[where] = block
        return whole

    def digest(self, name: str) -> str:
        hasher = hashlib.sha256()
        for chunk in self.chunks(name):
            hasher.update(chunk)
        return hasher.hexdigest()


def _merge_names(manifest: Manifest, reader: _PieceReader, config: Mapping[str, Any] | None
                 ) -> list[str]:
    """The tensors a merged Hugging Face checkpoint holds, in the manifest's order."""
    names = []
    for name, record in manifest.tensors.items():
        if isinstance(record, TensorRecord) and record.rank_local:
            raise HFError(f"tensor {name!r} is rank-local (SPEC 7.5): its pieces are not slices "
                          "of one tensor, so merge cannot rebuild it")
        names.append(name)
    if not (config or {}).get("tie_word_embeddings") or LM_HEAD not in manifest.tensors:
        return names
    partner = _tie_partner(manifest)
    if partner is None:
        return names
    same = _aliased(manifest, LM_HEAD, partner) or reader.digest(LM_HEAD) == reader.digest(
        partner)
    return [n for n in names if n != LM_HEAD] if same else names


def _aliased(manifest: Manifest, a: str, b: str) -> bool:
    def stored(name: str) -> str:
        record = manifest.tensors[name]
        return record.alias_of if isinstance(record, Alias) else name

    return stored(a) == stored(b)


def _tie_partner(manifest: Manifest) -> str | None:
    for name in EMBEDDING_NAMES:
        if name in manifest.tensors:
            return name
    record = manifest.tensors[LM_HEAD]
    if isinstance(record, Alias):
        return record.alias_of
    aliases = [n for n, r in manifest.tensors.items()
               if isinstance(r, Alias) and r.alias_of == LM_HEAD]
    return aliases[0] if aliases else None


def _prepare_hf_directory(root: Path, overwrite: bool) -> None:
    existing = claim_directory(root, overwrite)
    if not existing:
        return
    uncommit(root)
    weights = re.compile(r"^model(-\d{5}-of-\d{5})?\.safetensors$")
    for name in existing:
        if name == HF_INDEX or weights.match(name):
            (root / name).unlink()
    fsync_dir(root)


def merge(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
    overwrite: bool = False,
    verify: bool = False,
    progress: Progress | None = None,
) -> list[str]:
    """Write the shardspec checkpoint ``src`` as a Hugging Face checkpoint directory ``dst``.

    The checkpoint is validated first (with every checksum when ``verify``). Returns the
    weight files written (``model.safetensors``, or the shards and the index, last).
    """
    source_root = _local(src, "the checkpoint to merge")
    root = _local(dst, "the Hugging Face directory to write")
    if root.resolve() == source_root.resolve():
        raise ValueError("the destination must be another directory than the source")
    checkpoint = open_checkpoint(source_root)
    raise_first_error(validate(source_root, checksums=verify).findings)
    manifest = checkpoint.manifest
    config = None
    if any(f.path == "config.json" for f in manifest.extra_files):
        config = _read_json(resolve_inside(source_root, "config.json"))
    reader = _PieceReader(source_root, manifest)
    names = _merge_names(manifest, reader, config)
    sizes = [(name, reader.nbytes(name)) for name in names]
    shards = plan_hf_shards(sizes, max_shard_size)
    files = hf_shard_names(len(shards))
    total = sum(size for _, size in sizes)
    advance = None if progress is None else (lambda n: progress(n, total))
    _prepare_hf_directory(root, overwrite)
    for extra in manifest.extra_files:
        _copy_verified(source_root, root, extra)
    weight_map: dict[str, str] = {}
    for file, shard in zip(files, shards, strict=True):
        outs = []
        for name in shard:
            record = reader.record(name)
            assert record.shape is not None
            outs.append(OutTensor(name, record.dtype, record.shape, reader.nbytes(name),
                                  _bind(reader.chunks, name)))
            weight_map[name] = file
        write_safetensors(root / file, outs, metadata={"format": "pt"}, progress=advance)
    fsync_dir(root)
    if len(files) > 1:
        write_hf_index(root, weight_map, total)
        files.append(HF_INDEX)
    return files


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise HFError(f"{path}: not valid JSON: {exc}") from None
    return data if isinstance(data, dict) else None


def _bind(function: Callable[[str], Iterator[bytes | bytearray]], name: str
          ) -> Callable[[], Iterator[bytes | bytearray]]:
    return lambda: function(name)


def _copy_verified(source_root: Path, root: Path, record: FileRecord) -> None:
    """Copy an extra file, checking its size and sha256 against the manifest."""
    source = resolve_inside(source_root, record.path)
    target = root / record.path
    target.parent.mkdir(parents=True, exist_ok=True)

    def copy(temp: Path) -> None:
        shutil.copyfile(source, temp)
        with temp.open("rb") as handle:
            digests, size = digest_stream(handle)
        expected = record.checksums.get("sha256")
        if size != record.size or digests["sha256"] != expected:
            raise HFError(f"extra file {record.path}: its size or sha256 differs from the "
                          "manifest (SPEC 9)")

    write_durably(target, copy)
    fsync_dir(target.parent)


# --- import-vllm -----------------------------------------------------------------------------

_VLLM_FILE = re.compile(r"^model-rank-(0|[1-9][0-9]*)-part-(0|[1-9][0-9]*)\.safetensors$")


@dataclass(frozen=True)
class Imported:
    """The committed manifest and the files left out of it (with why)."""

    manifest: Manifest
    skipped: dict[str, str] = field(default_factory=dict)


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
    root = _local(path, "the vLLM directory to import")
    if not root.is_dir():
        raise HFError(f"{root}: not a directory")
    if (root / MANIFEST_NAME).exists() and not overwrite:
        raise FileExistsError(f"{root} already holds {MANIFEST_NAME}; pass overwrite=True to "
                              "replace it")
    files: dict[int, dict[int, str]] = {}
    stray = []
    for entry in sorted(os.listdir(root)):
        match = _VLLM_FILE.match(entry)
        if match:
            files.setdefault(int(match[1]), {})[int(match[2])] = entry
        elif (entry.endswith(_WEIGHT_SUFFIXES) and not entry.endswith(".index.json")) \
                or entry.startswith("model-rank-"):
            stray.append(entry)
    if stray:
        raise HFError(f"{root} holds weight files that are not vLLM sharded-state files "
                      f"model-rank-{{rank}}-part-{{part}}.safetensors: {stray}")
    if not files:
        raise HFError(f"{root} holds no model-rank-{{rank}}-part-{{part}}.safetensors files")
    world = len(files)
    if sorted(files) != list(range(world)):
        missing = sorted(set(range(max(files) + 1)) - set(files))
        raise HFError(f"ranks {missing} have no files: ranks must be 0..{max(files)} without "
                      "gaps")
    for rank, parts in files.items():
        if sorted(parts) != list(range(len(parts))):
            missing = sorted(set(range(max(parts) + 1)) - set(parts))
            raise HFError(f"rank {rank} lacks parts {missing}: parts must count from 0 without "
                          "gaps")
    layout = Layout(tp_size=world)
    total = sum((root / name).stat().st_size for parts in files.values()
                for name in parts.values())
    advance = None if progress is None else (lambda n: progress(n, total))
    ranks: list[RankRecord] = []
    pieces: dict[str, list[Piece]] = {}
    dtypes: dict[str, str] = {}
    for rank in range(world):
        records = []
        for part in range(len(files[rank])):
            name = files[rank][part]
            for tensor, src in scan_safetensors(root / name).items():
                dtype = dtypes.setdefault(tensor, src.dtype.name)
                if dtype != src.dtype.name:
                    raise HFError(f"tensor {tensor!r} is {dtype} on one rank and "
                                  f"{src.dtype.name} in {name}")
                if any(p.rank == rank for p in pieces.get(tensor, ())):
                    raise HFError(f"rank {rank} holds tensor {tensor!r} twice (in {name} too)")
                pieces.setdefault(tensor, []).append(Piece(rank=rank, file=name,
                                                           shape=src.shape))
            with (root / name).open("rb") as handle:
                digests, size = digest_stream(handle, progress=advance)
            records.append(FileRecord(path=name, size=size, checksums=digests))
        ranks.append(RankRecord(rank=rank, **layout.coordinates(rank), files=tuple(records)))
    extras, skipped = _vllm_extras(root, {n for parts in files.values() for n in parts.values()})
    manifest = Manifest(
        format_version=format_version(), layout=layout, ranks=tuple(ranks),
        quantization=Quantization(),
        tensors={name: TensorRecord(dtype=dtypes[name], shape=None, pieces=tuple(p))
                 for name, p in pieces.items()},
        extra_files=tuple(extras), metadata={"imported_from": "vllm sharded_state"},
        generator=f"shardspec {__version__}",
    )
    raise_first_error(schema_findings(manifest.to_dict()))
    raise_first_error(check_manifest(manifest))
    uncommit(root)
    commit_manifest(root, manifest.to_json())
    return Imported(manifest, skipped)


def _vllm_extras(root: Path, data_files: set[str]) -> tuple[list[FileRecord], dict[str, str]]:
    extras: list[FileRecord] = []
    skipped: dict[str, str] = {}
    for folder, dirs, names in os.walk(root):
        relative = Path(folder).relative_to(root)
        for d in sorted(dirs):
            if d.startswith(".") or d in _SKIPPED_DIRS:
                skipped[(relative / d).as_posix() + "/"] = (
                    "hidden folder" if d.startswith(".") else "original weights folder")
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIPPED_DIRS)
        for name in sorted(names):
            rel = (relative / name).as_posix()
            if rel in data_files or rel == MANIFEST_NAME:
                continue
            if name.startswith("."):
                skipped[rel] = "hidden file"
                continue
            if name.endswith(".index.json"):
                skipped[rel] = "stale index of other weight files"
                continue
            if name.endswith(_WEIGHT_SUFFIXES):
                skipped[rel] = "weight file of another format"
                continue
            problem = path_problem(rel)
            if not problem:
                try:
                    resolve_inside(root, rel)
                except ShardspecError as exc:
                    problem = exc.finding.message
            if problem or not (Path(folder) / name).is_file():
                skipped[rel] = problem or "not a regular file"
                continue
            with (Path(folder) / name).open("rb") as handle:
                digests, size = digest_stream(handle)
            extras.append(FileRecord(path=rel, size=size, checksums=digests))
    return extras, skipped
