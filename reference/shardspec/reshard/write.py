"""Resharding, the writer: a whole checkpoint written again under another layout.

One target rank is in memory at a time: its pieces are read by
:func:`~shardspec.reshard.load.execute_reshard` and written by the writer's own steps, and the
manifest is committed last (SPEC 10).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..format.errors import Finding, IntegrityError, raise_first_error
from ..format.manifest import FileRecord, Layout, Manifest, TensorRecord
from ..storage.location import Location, PathOrURL, locate
from ..storage.manifest_file import read_manifest
from ..storage.paths import resolve_inside
from ..storage.remote import RemoteRoot, is_remote
from ..storage.remote_files import RemoteObject
from ..write.save import (
    RankInfo,
    Shard,
    TensorInfo,
    commit_checkpoint,
    copy_extra_files,
    finish_manifest,
    plan_checkpoint,
    prepare_directory,
    write_rank,
)
from .load import checkpoint_heads, execute_reshard
from .plan import Resharder, ReshardPlan

__all__ = ["rank_info", "reshard"]


def rank_info(plan: ReshardPlan) -> RankInfo:
    """The writer's description of a target rank, from its plan alone (no data)."""
    tensors = {
        name: TensorInfo(piece.dtype, piece.shape, piece.nbytes,
                         Shard(piece.global_shape, piece.offset, piece.replica))
        for name, piece in plan.pieces.items()
    }
    for name, held in plan.parts.items():  # the join of one piece of each part (rule 12)
        dim = plan.joined_along[name]
        shape = list(held[0].shape)
        shape[dim] = sum(p.shape[dim] for p in held)
        tensors[name] = TensorInfo(held[0].dtype, tuple(shape), sum(p.nbytes for p in held),
                                   tuple(Shard(p.global_shape, p.offset, p.replica, p.shape)
                                         for p in held))
    for alias, target in plan.aliases.items():
        tensors[alias] = tensors[target]
    return RankInfo(plan.rank, tensors, dict(plan.aliases))


def reshard(
    source: PathOrURL,
    destination: PathOrURL,
    layout: Layout,
    *,
    overwrite: bool = False,
    verify: bool = True,
    ignore_extensions: tuple[str, ...] = (),
    progress: Callable[[int, int], None] | None = None,
    storage_options: dict[str, Any] | None = None,
    destination_options: dict[str, Any] | None = None,
    gap_budget: float | None = None,
    remove_adopted: bool = False,
) -> Manifest:
    """Write the checkpoint at ``source`` again at ``destination`` with ``layout``.

    Either may be an object-storage URL: ``storage_options`` configure the source's fsspec
    filesystem, ``destination_options`` the destination's (default: the source's).
    ``gap_budget`` is :func:`execute_reshard`'s, for a source in object storage.

    One target rank is in memory at a time. Quantization, logical records, ties, metadata,
    extensions and extra files carry over; extra files are checked against their recorded
    sha256 as they are copied. ``verify`` (the default) hashes every source data file once
    (whole, when it is first read, SPEC 9.2), so corrupt bytes are refused instead of being
    written again under fresh checksums; ``verify=False`` trusts the source.
    ``progress(done, total)`` is called with the bytes of target pieces read or written so far
    and in all: before the first rank, as each source file's pieces are read, after each rank.
    """
    src = locate(source, storage_options if is_remote(source) else None)
    dst = locate(destination, (destination_options if destination_options is not None
                               else storage_options) if is_remote(destination) else None)
    parsed = read_manifest(src, ignore_extensions=ignore_extensions)
    raise_first_error(parsed.findings)
    assert parsed.manifest is not None, "no errors means the manifest was built"
    manifest = parsed.manifest
    resharder = Resharder(manifest, layout, heads=checkpoint_heads(src, manifest))
    plans = [resharder.plan(rank) for rank in range(layout.size)]
    logical = {name: r.logical for name, r in manifest.tensors.items()
               if isinstance(r, TensorRecord) and r.logical is not None}
    ties = {name: r.tied_to for name, r in manifest.tensors.items()
            if isinstance(r, TensorRecord) and r.tied_to is not None}
    draft = plan_checkpoint(
        layout, [rank_info(p) for p in plans], quantization=manifest.quantization,
        logical=logical, ties=ties, metadata=manifest.metadata, extensions=manifest.extensions,
        extra_files=[f.path for f in manifest.extra_files],
    )
    if _same_place(src, dst):
        raise ValueError("the destination is the source checkpoint's directory")
    with tempfile.TemporaryDirectory(prefix="shardspec-extras-") as folder:
        extras = _extra_sources(src, manifest, Path(folder))
        return _write_resharded(src, dst, manifest, plans, draft, extras, overwrite, verify,
                                progress, gap_budget, remove_adopted)


def _same_place(src: Location, dst: Location) -> bool:
    """Whether writing ``dst`` would overwrite ``src``: the same directory, or the same prefix
    of the same kind of store however the URL spells it (``s3://`` and ``s3a://``)."""
    if isinstance(src, RemoteRoot) and isinstance(dst, RemoteRoot):
        return type(src.fs) is type(dst.fs) and src.prefix == dst.prefix
    if isinstance(src, RemoteRoot) or isinstance(dst, RemoteRoot):
        return False
    return dst.exists() and os.path.realpath(dst) == os.path.realpath(src)


def _extra_sources(src: Location, manifest: Manifest, folder: Path) -> dict[str, Path]:
    """Local files to copy the extra files from: the source's own, or fetched copies (they are
    small: configs, tokenizers)."""
    if isinstance(src, Path):
        return {f.path: resolve_inside(src, f.path) for f in manifest.extra_files}
    extras = {}
    for index, record in enumerate(manifest.extra_files):
        local = folder / str(index)
        source = RemoteObject(src, record.path, record.size)
        with local.open("wb") as handle:
            for chunk in source.stream(0, record.size):
                handle.write(chunk)
        source.finish()
        extras[record.path] = local  # its sha256 is compared with the record when copied
    return extras


def _write_resharded(
    src: Location, dst: Location, manifest: Manifest, plans: list[ReshardPlan], draft: Manifest,
    extras: dict[str, Path], overwrite: bool, verify: bool,
    progress: Callable[[int, int], None] | None, gap_budget: float | None,
    remove_adopted: bool = False,
) -> Manifest:
    prepare_directory(dst, overwrite, remove_adopted=remove_adopted, paths=list(extras))
    records: dict[str, FileRecord] = {}
    cpu = torch.device("cpu")
    total, done = sum(p.target_bytes for p in plans), 0
    if progress is not None:
        progress(done, total)
    verified: set[str] = set()
    for plan in plans:
        read = [0]

        def on_read(count: int, start: int = done, read: list[int] = read,
                    most: int = plan.target_bytes) -> None:
            read[0] += count
            if progress is not None:  # the bar moves while a rank's pieces come in
                progress(start + min(read[0], most), total)

        state = execute_reshard(src, manifest, plan, cpu, verify=verify, separate=True,
                                gap_budget=gap_budget, verified=verified, on_read=on_read)
        records.update({f.path: f for f in write_rank(dst, plan.rank, state, draft)})
        del state
        done += plan.target_bytes
        if progress is not None:
            progress(done, total)
    copied = copy_extra_files(dst, extras)
    for old, new in zip(manifest.extra_files, copied, strict=True):
        if old.checksums.get("sha256") != new.checksums["sha256"] or old.size != new.size:
            raise IntegrityError(Finding(
                code="checksum-mismatch", file=old.path,
                message="the extra file's size or sha256 differs from the source manifest's"))
    records.update({f.path: f for f in copied})
    finished = finish_manifest(draft, records)
    commit_checkpoint(dst, finished.to_json())
    return finished
