"""Distributed save and load over ``torch.distributed``: every rank writes or reads its own files.

``import shardspec.distributed`` (``import shardspec`` alone does not load this module).
Works with any backend of the caller's process group (gloo, nccl, ...) and any launcher
(torchrun, ``torch.multiprocessing``): the ranks exchange only metadata (tensor names, shapes,
file records, statuses), never tensor data, over a gloo side group created from the caller's
group with a bounded ``timeout``, so no rank waits forever for one that failed or died.

Rank ``r`` of ``group`` is rank ``r`` of the checkpoint's layout (SPEC 5.2): the group's size
must equal the layout's world size.

Save protocol (SPEC 10.1): every rank describes its tensors; the descriptions are gathered and
every rank computes the same manifest draft; rank 0 prepares the directory (removing an old
manifest first, SPEC 10.2); every rank writes its data files; the file records are gathered;
only when every rank succeeded does rank 0 copy the extra files and commit the manifest. If any
rank fails, no manifest is written and every rank raises :class:`DistributedSaveError` naming the
failing ranks and their errors.
"""

from __future__ import annotations

import atexit
import hashlib
import os
from collections.abc import Collection, Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .format.errors import Finding, QuantizationError, RequestError, ShardspecError
from .format.limits import DEFAULT_MAX_FILE_SIZE
from .format.manifest import FileRecord, Layout, Logical, Manifest, Quantization, Tie
from .load.devices import DeviceLike, resolve_device
from .reader import Checkpoint, open_checkpoint
from .reshard.load import checkpoint_heads
from .reshard.plan import Resharder
from .storage.location import PathOrURL, locate
from .write.save import (
    RankInfo,
    Shard,
    commit_checkpoint,
    copy_extra_files,
    describe_rank,
    extra_sources,
    finish_manifest,
    plan_checkpoint,
    prepare_directory,
    write_rank,
)

__all__ = ["DEFAULT_TIMEOUT", "DistributedError", "DistributedLoadError",
           "DistributedSaveError", "load", "save"]

#: How long a rank waits for the others at each step of a save or load.
DEFAULT_TIMEOUT = timedelta(minutes=10)

StateDict = Mapping[str, torch.Tensor]


class DistributedError(RuntimeError):
    """A distributed save or load failed; raised on every rank of the group.

    ``failed_ranks`` maps each rank that reported a failure to ``"ExceptionType: message"``.
    It is empty when the ranks lost contact (a rank exited, or did not answer in time), since
    the survivors cannot tell which rank that was.
    """

    def __init__(self, message: str, failed_ranks: Mapping[int, str]) -> None:
        super().__init__(message)
        self.failed_ranks: dict[int, str] = dict(failed_ranks)


class DistributedSaveError(DistributedError):
    """A distributed save failed: no manifest was written (SPEC 10.1)."""


class DistributedLoadError(DistributedError):
    """A distributed load failed on at least one rank."""


# --- the metadata channel --------------------------------------------------------------------

#: gloo side groups by the caller's group's global ranks: (group, its timeout, the default
#: group it was made in: a new init_process_group invalidates it).
_META_GROUPS: dict[tuple[int, ...], tuple[dist.ProcessGroup, timedelta, object]] = {}
# Let the side groups go while the interpreter is whole: a gloo group destroyed during
# interpreter teardown can abort the process ("terminate called without an active exception").
atexit.register(_META_GROUPS.clear)


def _group_position(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(rank, size) of this process in ``group``; refuses when there is no usable group."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "shardspec.distributed needs an initialized process group: call "
            "torch.distributed.init_process_group() first (launch with torchrun or "
            "torch.multiprocessing)")
    rank = dist.get_rank(group)
    if rank < 0:
        raise RuntimeError("this process is not a member of the given process group")
    return rank, dist.get_world_size(group)


def _meta_group(group: dist.ProcessGroup | None, timeout: timedelta) -> dist.ProcessGroup:
    """A gloo group over the same processes as ``group`` whose collectives time out.

    Created once per set of ranks and reused (creating it is itself a collective of those ranks).
    """
    if not isinstance(timeout, timedelta) or timeout <= timedelta(0):
        raise ValueError(f"timeout must be a positive datetime.timedelta, got {timeout!r}")
    whole = dist.group.WORLD if group is None else group
    assert whole is not None
    ranks = tuple(dist.get_process_group_ranks(whole))
    whole_world = len(ranks) == dist.get_world_size()
    cached = _META_GROUPS.get(ranks)
    if cached is not None and cached[2] is not dist.group.WORLD:
        cached = None  # the process group was destroyed and initialized again since
    if cached is not None:
        if cached[1] == timeout:
            return cached[0]
        if not whole_world:
            # A subgroup's side group has a name derived from its ranks: it can exist once.
            raise ValueError(
                f"shardspec.distributed already uses timeout={cached[1]} for this subgroup; "
                "pass the same timeout on every call for one group")
    # Whole world: every process calls this in the same order (a collective), as torch needs.
    # Subgroup: only its members call, so synchronize locally.
    meta: dist.ProcessGroup | None = dist.new_group(
        ranks=list(ranks), timeout=timeout, backend="gloo",
        use_local_synchronization=not whole_world)
    assert isinstance(meta, dist.ProcessGroup), "this process is in the group"
    _META_GROUPS[ranks] = (meta, timeout, dist.group.WORLD)
    return meta


def _describe_exc(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _rank_list(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _failure_text(failed: Mapping[int, str]) -> str:
    """'rank 1: ValueError: x' or 'ranks 0, 1: ValueError: x; rank 2: ...' (same errors merged)."""
    by_message: dict[str, list[int]] = {}
    for rank in sorted(failed):
        by_message.setdefault(failed[rank], []).append(rank)
    return "; ".join(f"{_rank_list(ranks)}: {message}" for message, ranks in by_message.items())


class _Channel:
    """All-gather of small picklable statuses over the metadata group, with clear failures."""

    def __init__(self, group: dist.ProcessGroup, size: int, what: str, timeout: timedelta,
                 error: type[DistributedError], consequence: str) -> None:
        self.group, self.size, self.what, self.timeout = group, size, what, timeout
        self.error, self.consequence = error, consequence

    def gather(self, step: str, value: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        try:
            dist.all_gather_object(out, value, group=self.group)
        except Exception as exc:  # noqa: BLE001 - a timeout or a peer that exited
            raise self.error(
                f"{self.what}: lost contact with the other ranks while {step} (a rank exited "
                f"or did not answer within timeout={self.timeout}): {_describe_exc(exc)}; "
                f"{self.consequence}", {}) from exc
        return out

    def step(self, step: str, ok: bool, value: Any, local: BaseException | None) -> list[Any]:
        """Gather ``(ok, value or error text)``; raise on every rank if any rank failed."""
        statuses = self.gather(step, (ok, value))
        failed = {r: text for r, (good, text) in enumerate(statuses) if not good}
        if failed:
            raise self.error(
                f"{self.what} failed while {step} on {_failure_text(failed)}; "
                f"{self.consequence}", failed) from local
        return [value for _, value in statuses]


def _attempt(fn: Any, *args: Any, **kwargs: Any) -> tuple[bool, Any, BaseException | None]:
    """(True, result, None) or (False, "Type: message", exception): never raises Exception."""
    try:
        return True, fn(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - reported to every rank by the caller
        return False, _describe_exc(exc), exc


# --- save ------------------------------------------------------------------------------------


def save(
    state_dict: StateDict,
    path: PathOrURL,
    *,
    layout: Layout,
    sharding: Mapping[str, Shard] | None = None,
    group: dist.ProcessGroup | None = None,
    quantization: Quantization | None = None,
    logical: Mapping[str, Logical] | None = None,
    ties: Mapping[str, Tie] | None = None,
    extra_files: Mapping[str, str | os.PathLike[str]] | Iterable[str | os.PathLike[str]] = (),
    max_file_size: int = DEFAULT_MAX_FILE_SIZE,
    overwrite: bool = False,
    metadata: Mapping[str, str] | None = None,
    extensions: Mapping[str, Mapping[str, Any]] | None = None,
    timeout: timedelta = DEFAULT_TIMEOUT,
    storage_options: dict[str, Any] | None = None,
) -> Manifest:
    """Save this rank's ``state_dict`` into the checkpoint at ``path``; call on every rank.

    Every rank of ``group`` (default: the whole world) calls this at the same time with its own
    ``state_dict`` and ``sharding`` (tensor name -> :class:`shardspec.Shard`, as in
    :func:`shardspec.save`; a tensor without one is rank-local) and the *same* other arguments.
    Rank ``r`` of the group writes checkpoint rank ``r``'s files, all ranks at once; rank 0 then
    copies ``extra_files`` (read on rank 0 only; other ranks need only the same names) and
    writes the manifest last, after every rank has written its files. Returns the manifest on
    every rank.

    ``path`` must name one directory that every rank sees, on a shared filesystem, or one
    object-storage prefix (a URL; ``storage_options`` for its fsspec filesystem). (Where each
    node has its own disk, each node's files land in its own ``path``, and only rank 0's node
    gets the manifest; copying the files together yields the checkpoint.)

    If any rank fails, no manifest is written and every rank raises
    :class:`DistributedSaveError` naming the failing ranks and their errors. ``timeout`` bounds
    each wait for the other ranks, including waiting for the slowest rank to finish writing
    its files: set it above the longest write. A rank that exits or hangs makes the others raise
    after at most ``timeout``. The layout's world size must equal the group's size.
    """
    rank, size = _group_position(group)
    root = locate(path, storage_options)
    channel = _Channel(_meta_group(group, timeout), size, f"distributed save to '{root}'",
                       timeout, DistributedSaveError,
                       "no manifest was written (the checkpoint is not committed)")

    # 1. describe: metadata only, checked before any byte is written
    def describe() -> RankInfo:
        if layout.size != size:
            raise ValueError(
                f"the layout's world size is {layout.size} (tp={layout.tp_size} "
                f"pp={layout.pp_size} ep={layout.ep_size}) but the process group has {size} "
                "ranks: they must be equal")
        return describe_rank(rank, state_dict, sharding)

    infos: list[RankInfo] = channel.step("describing the tensors", *_attempt(describe))

    # 2. plan: every rank computes the same draft; a disagreement means different arguments
    extras = extra_sources(extra_files)

    def plan() -> tuple[Manifest, str]:
        draft = plan_checkpoint(
            layout, infos, quantization=quantization, logical=logical, ties=ties,
            metadata=metadata, extensions=extensions, extra_files=list(extras),
            max_file_size=max_file_size)
        return draft, hashlib.sha256(draft.to_json()).hexdigest()

    ok, planned, local = _attempt(plan)
    digests = channel.step("planning the manifest", ok, planned[1] if ok else planned, local)
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    if differ:
        raise DistributedSaveError(
            f"distributed save to '{root}': {_rank_list(differ)} called save with arguments "
            "that differ from rank 0's (layout, quantization, logical, ties, metadata, extensions, "
            "extra_files names or max_file_size): every rank must pass the same; nothing was "
            "written", {r: "arguments differ from rank 0's" for r in differ})
    draft: Manifest = planned[0]

    # 3. rank 0 prepares the directory (removes an old manifest first); the others wait for it
    channel.step("preparing the directory",
                 *(_attempt(prepare_directory, root, overwrite) if rank == 0
                   else (True, None, None)))

    # 4. every rank writes its data files
    def write() -> list[FileRecord]:
        if isinstance(root, Path):
            root.mkdir(parents=True, exist_ok=True)  # a node-local disk may not have it yet
        return write_rank(root, rank, state_dict, draft)

    written: list[list[FileRecord]] = channel.step("writing data files", *_attempt(write))

    # 5. rank 0 commits the manifest, last, only now that every rank has succeeded
    def commit() -> Manifest:
        records = {f.path: f for files in written for f in files}
        records.update({f.path: f for f in copy_extra_files(root, extras)})
        manifest = finish_manifest(draft, records)
        commit_checkpoint(root, manifest.to_json())
        return manifest

    # Rank 0's manifest travels to every rank with its status (metadata only).
    committed = channel.step("committing the manifest",
                             *(_attempt(commit) if rank == 0 else (True, None, None)))
    manifest: Manifest = committed[0]
    return manifest


# --- load ------------------------------------------------------------------------------------


def load(
    path: PathOrURL,
    *,
    device: DeviceLike = None,
    group: dist.ProcessGroup | None = None,
    verify: bool = False,
    expect_quantization: str | None = None,
    ignore_extensions: Collection[str] = (),
    timeout: timedelta = DEFAULT_TIMEOUT,
    layout: Layout | None = None,
    mmap: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, torch.Tensor]:
    """Load this rank's tensors from the checkpoint at ``path``; call on every rank.

    Rank ``r`` of ``group`` (default: the whole world) reads checkpoint rank ``r``'s files onto
    ``device`` (None: ``cuda:<LOCAL_RANK>`` where CUDA is available, else ``cpu``). ``path`` may
    differ between ranks, e.g. a node-local copy holding only the files
    ``shardspec files PATH --rank R`` lists for that node's ranks; every rank must see the same
    manifest. ``path`` may be an object-storage URL (``storage_options`` for its filesystem):
    each rank then fetches only its own objects' bytes.

    Where the group's size differs from the checkpoint's world size, each rank reshards on load
    (SPEC 11.3, partial reads): to ``layout`` when given, else to the checkpoint's layout with
    ``tp_size`` scaled to the group (same ``pp_size`` and ``ep_size``). ``layout`` can also
    reshard a checkpoint of the group's own size to another split. ``mmap`` (device ``cpu``)
    maps the files instead of copying them, as :meth:`shardspec.Checkpoint.load_rank` does.

    First, on every rank: the checkpoint opens, the target layout's world size equals the
    group's size and the checkpoint can be resharded to it (else
    :class:`shardspec.RequestError` with code ``world-size-mismatch`` on every rank), and
    ``expect_quantization`` matches (else :class:`shardspec.QuantizationError` on every rank).
    Any other failure on any rank, while opening or loading, makes every rank raise
    :class:`DistributedLoadError` naming the failing ranks. ``timeout`` bounds each wait for
    the other ranks.
    """
    rank, size = _group_position(group)
    channel = _Channel(_meta_group(group, timeout), size, f"distributed load from '{path}'",
                       timeout, DistributedLoadError, "no rank returned tensors")

    def open_() -> tuple[torch.device, Checkpoint]:
        return resolve_device(device), open_checkpoint(
            path, ignore_extensions=ignore_extensions, storage_options=storage_options)

    ok, opened, local = _attempt(open_)
    summary = None
    if ok:
        manifest = opened[1].manifest
        # the digest of the bytes read: serializing a large manifest again on every rank costs
        # seconds (to_json of 100,000 pieces is about 1 s)
        summary = (manifest.world_size, opened[1].manifest_sha256)
    summaries = channel.step("opening the checkpoint", ok, summary if ok else opened, local)
    target, checkpoint = opened
    world_sizes = sorted({s[0] for s in summaries})
    wanted, why_not = _target_layout(checkpoint, size, layout)
    if wanted is None:
        source = checkpoint.layout
        raise RequestError(Finding(
            code="world-size-mismatch", file="shardspec.json", json_path="$.layout.world_size",
            message=f"the checkpoint at '{path}' was written for world size "
            f"{', '.join(map(str, world_sizes))} (this rank's: tp={source.tp_size} "
            f"pp={source.pp_size} ep={source.ep_size}) but the process group has {size} ranks, "
            f"and it cannot be resharded on load: {why_not}",
            hint=f"launch {checkpoint.world_size} processes (e.g. torchrun --nproc-per-node "
            f"{checkpoint.world_size}), or pass layout= with a world size of {size}"))
    differ = [r for r, s in enumerate(summaries) if s[1] != summaries[0][1]]
    if differ:
        raise DistributedLoadError(
            f"distributed load from '{path}': {_rank_list(differ)} opened a manifest that "
            "differs from rank 0's: every rank must load the same checkpoint",
            {r: "manifest differs from rank 0's" for r in differ})
    method = checkpoint.manifest.quantization.method
    if expect_quantization is not None and expect_quantization != method:
        raise QuantizationError(Finding(
            code="quantization-mismatch", file="shardspec.json", json_path="$.quantization.method",
            message=f"asked to load with quantization {expect_quantization!r} but the "
            f"checkpoint is quantized with {method!r}"))
    reshard_to = None if wanted == checkpoint.layout else wanted
    ok, loaded, local = _attempt(checkpoint.load_rank, rank, target, verify=verify,
                                 layout=reshard_to, mmap=mmap)
    channel.step("loading", ok, None if ok else loaded, local)
    tensors: dict[str, torch.Tensor] = loaded
    return tensors


def _target_layout(
    checkpoint: Checkpoint, size: int, layout: Layout | None
) -> tuple[Layout | None, str]:
    """The layout a group of ``size`` ranks loads, or None and why none fits.

    Every rank computes the same answer from the same manifest.
    """
    source = checkpoint.layout
    if layout is None:
        if checkpoint.world_size == size:
            return source, ""
        stage_and_experts = source.pp_size * source.ep_size
        if size % stage_and_experts:
            return None, (f"{size} ranks is not a multiple of pp_size x ep_size = "
                          f"{stage_and_experts}")
        layout = Layout(tp_size=size // stage_and_experts, pp_size=source.pp_size,
                        ep_size=source.ep_size, rank_order=source.rank_order)
    if layout.world_size != size:
        return None, f"the requested layout has world size {layout.world_size}"
    if layout == source:
        return layout, ""
    try:
        Resharder(checkpoint.manifest, layout,
                  heads=checkpoint_heads(checkpoint.path, checkpoint.manifest))
    except ShardspecError as exc:
        return None, exc.finding.message
    return layout, ""
