"""Back to Hugging Face: :func:`merge` writes a shardspec checkpoint as a Hugging Face directory.

Shards of at most 5 GB (``model-00001-of-00002.safetensors`` plus ``model.safetensors.index.json``,
or one ``model.safetensors``), with the tied ``lm_head.weight`` dropped again when the config
ties it and it equals the embedding, and the extra files copied (their checksums verified). A
tensor split along dim 0 only is streamed piece by piece; any other is assembled in memory, so
peak memory is about one tensor.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..format.dtypes import DTYPES, byte_size
from ..format.errors import raise_first_error
from ..format.integrity import digest_stream
from ..format.manifest import Alias, FileRecord, Manifest, TensorRecord
from ..reader import open_checkpoint
from ..storage.commit import fsync_dir, uncommit, write_inside
from ..storage.entries import folder_inside
from ..storage.paths import resolve_inside
from ..validate import validate
from ..write.save import claim_directory
from .directories import Progress, local_dir, read_json
from .hf import (
    DEFAULT_MAX_SHARD_SIZE,
    HF_INDEX,
    HFError,
    OutTensor,
    SourceTensor,
    hf_shard_names,
    iter_slice,
    plan_hf_shards,
    scan_safetensors,
    write_hf_index,
    write_safetensors,
)
from .plan import EMBEDDING_NAMES, LM_HEAD

__all__ = ["merge"]


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
    existing = claim_directory(root, overwrite, leftovers=False)
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
    verify: bool = True,
    progress: Progress | None = None,
) -> list[str]:
    """Write the shardspec checkpoint ``src`` as a Hugging Face checkpoint directory ``dst``.

    The checkpoint is validated first, with every checksum unless ``verify=False`` (corrupt
    bytes are refused, not written again as a good Hugging Face file). Returns the weight
    files written (``model.safetensors``, or the shards and the index, last).
    """
    source_root = local_dir(src, "the checkpoint to merge")
    root = local_dir(dst, "the Hugging Face directory to write")
    if root.resolve() == source_root.resolve():
        raise ValueError("the destination must be another directory than the source")
    checkpoint = open_checkpoint(source_root)
    raise_first_error(validate(source_root, checksums=verify).findings)
    manifest = checkpoint.manifest
    config = None
    if any(f.path == "config.json" for f in manifest.extra_files):
        config = read_json(resolve_inside(source_root, "config.json"))
    reader = _PieceReader(source_root, manifest)
    names = _merge_names(manifest, reader, config)
    sizes = [(name, reader.nbytes(name)) for name in names]
    shards = plan_hf_shards(sizes, max_shard_size)
    files = hf_shard_names(len(shards))
    total = sum(size for _, size in sizes)
    advance = None if progress is None else (lambda n: progress(n, total))
    for extra in manifest.extra_files:  # a linked folder on the way: before any removal
        folder_inside(root, extra.path, create=False)
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


def _bind(function: Callable[[str], Iterator[bytes | bytearray]], name: str
          ) -> Callable[[], Iterator[bytes | bytearray]]:
    return lambda: function(name)


def _copy_verified(source_root: Path, root: Path, record: FileRecord) -> None:
    """Copy an extra file, checking its size and sha256 against the manifest."""
    source = resolve_inside(source_root, record.path)

    def copy(temp: Path) -> None:
        shutil.copyfile(source, temp)
        with temp.open("rb") as handle:
            digests, size = digest_stream(handle)
        expected = record.checksums.get("sha256")
        if size != record.size or digests["sha256"] != expected:
            raise HFError(f"extra file {record.path}: its size or sha256 differs from the "
                          "manifest (SPEC 9)")

    write_inside(root, record.path, copy)
