"""``dcp.save`` into a shardspec checkpoint: a :class:`torch.distributed.checkpoint.StorageWriter`.

DCP drives the steps; each maps onto the reference writer's (:mod:`shardspec.write.save`):

1. every rank describes its chunks (``prepare_local_plan``);
2. the coordinator turns them into pieces and replicas, drafts and checks the manifest (nothing
   is written when it would be invalid) and prepares the directory, removing an old manifest
   first (SPEC 10.2) (``prepare_global_plan``);
3. every rank writes its own data files, durably, in parallel (``write_data``);
4. only when every rank succeeded does DCP call ``finish`` on the coordinator, which fills the
   file records in and commits ``shardspec.json`` last (SPEC 10.1, 10.4). A rank that fails
   makes DCP raise on every rank before ``finish``: no manifest is written.

Non-tensor values (a step counter, optimizer hyper-parameters, RNG state) reach a storage
writer as bytes DCP serialized with ``torch.save``. Each rank writes its share into one extra
file (SPEC 2.1, checksummed like any listed file), indexed in the manifest's ``metadata``
under :data:`~shardspec.integrations.dcp.planning.OBJECTS_KEY`. Readers of the weights ignore
both; :class:`~shardspec.integrations.dcp.reader.Reader` hands them back to DCP.
"""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from ...format.limits import DEFAULT_MAX_FILE_SIZE
from ...format.manifest import FileRecord, Layout, Manifest, TensorRecord
from ...storage.location import Location, PathOrURL, locate
from ...write.save import (
    commit_checkpoint,
    copy_extra_files,
    extra_sources,
    finish_manifest,
    place_file,
    plan_checkpoint,
    prepare_directory,
    write_data_file,
)
from .planning import (
    OBJECTS_KEY,
    Assignment,
    LocalPlan,
    assign_pieces,
    describe_plan,
    objects_file_name,
    objects_index,
)

__all__ = ["Writer"]


@dataclasses.dataclass(frozen=True)
class _Written:
    """What a rank wrote: its files' records and where each of its objects lies."""

    rank: int
    records: tuple[FileRecord, ...]
    objects: dict[str, tuple[str, int, int]]


class Writer(StorageWriter):
    """Write a DCP save as a committed shardspec checkpoint at ``path`` (a directory or an
    object-storage URL, ``storage_options`` for its fsspec filesystem).

    ``layout`` names the checkpoint's parallel layout (SPEC 5): rank r of the process group is
    rank r of the layout, so its size must equal the group's. None records a flat layout,
    ``Layout(tp_size=world_size)``. ``replicas`` writes every rank's copy of a replicated tensor
    (SPEC 7.4), so each rank of the layout loads from its own files alone; False writes one copy
    (DCP's choice of rank), as DCP's own writers do. A rank holding several chunks of one tensor
    (a ``ShardedTensor`` with several local shards) writes each as a piece in a file of its own
    (format 1.3, SPEC 7.2 rule 7); chunks that do not lie along one dimension are refused before
    anything is written. ``overwrite`` allows replacing the checkpoint in a non-empty
    directory (SPEC 10.2). ``metadata`` goes to the manifest.
    ``extra_files`` (a serving engine's ``config.json``, tokenizer files: names inside the
    checkpoint -> sources, or a list of sources kept by base name) are copied in by the
    coordinator before it commits, as :func:`shardspec.save` copies them.
    """

    def __init__(
        self,
        path: PathOrURL,
        *,
        layout: Layout | None = None,
        replicas: bool = True,
        max_file_size: int = DEFAULT_MAX_FILE_SIZE,
        overwrite: bool = False,
        metadata: Mapping[str, str] | None = None,
        extra_files: Mapping[str, str | os.PathLike[str]] | Iterable[str | os.PathLike[str]] = (),
        storage_options: dict[str, Any] | None = None,
        remove_adopted: bool = False,
    ) -> None:
        super().__init__()
        if metadata and OBJECTS_KEY in metadata:
            raise ValueError(f"metadata key {OBJECTS_KEY!r} is the writer's own")
        self.path: PathOrURL = path
        self.layout = layout
        self.replicas = replicas
        self.max_file_size = max_file_size
        self.overwrite = overwrite
        self.remove_adopted = remove_adopted
        self.metadata = dict(metadata or {})
        self.extra_files = extra_sources(extra_files)
        self.storage_options = storage_options
        self.rank = 0
        self.is_coordinator = False
        self._items: dict[tuple[str, tuple[int, ...]], WriteItem] = {}
        self._draft: Manifest | None = None
        #: The committed manifest, on the coordinator, once ``finish`` ran.
        self.manifest: Manifest | None = None

    @property
    def root(self) -> Location:
        return locate(self.path, self.storage_options)

    # -- DCP's protocol ------------------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """A new save: a ``checkpoint_id`` given to ``dcp.save`` replaces the path."""
        if checkpoint_id is not None:
            self.path = checkpoint_id
        self._items, self._draft, self.manifest = {}, None, None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        self.rank = int(kwargs.get("rank", 0))

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=str(self.path))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Describe this rank's chunks before DCP's planner drops the copies (see module)."""
        self._items = {_key(item): item for item in plan.items}
        return dataclasses.replace(plan, storage_data=describe_plan(self.rank, plan))

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Draft and check the manifest, prepare the directory, tell each rank what to write."""
        layout = self.layout or Layout(tp_size=len(plans))
        if layout.size != len(plans):
            raise ValueError(f"layout {layout} has {layout.size} ranks but the process group "
                             f"saving has {len(plans)} (SPEC 5.1)")
        locals_ = [plan.storage_data for plan in plans]
        if not all(isinstance(local, LocalPlan) for local in locals_):
            raise TypeError("a rank's plan lacks the description shardspec's Writer adds in "
                            "prepare_local_plan; use the Writer on every rank")
        infos, objects = assign_pieces(locals_, [p.items for p in plans], self.replicas)
        object_files = [objects_file_name(r) for r, names in enumerate(objects) if names]
        draft = plan_checkpoint(layout, infos, metadata=self.metadata,
                                extra_files=[*object_files, *self.extra_files],
                                max_file_size=self.max_file_size)
        prepare_directory(self.root, self.overwrite, remove_adopted=self.remove_adopted,
                          paths=list(self.extra_files))
        self._draft = draft
        assignments = [Assignment() for _ in plans]
        for record in draft.ranks:
            for file in record.files:
                assignments[record.rank].files[file.path] = []
        for name, tensor in draft.tensors.items():
            if isinstance(tensor, TensorRecord):
                for piece in tensor.pieces:  # a rank may hold several (SPEC 7.2 rule 7)
                    assignments[piece.rank].files[piece.file].append((name, piece.offset or ()))
        for rank, names in enumerate(objects):
            if names:
                assignments[rank].objects = names
                assignments[rank].objects_file = objects_file_name(rank)
        return [dataclasses.replace(plan, storage_data=a)
                for plan, a in zip(plans, assignments, strict=True)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Write this rank's data files (and objects file), one at a time, durably."""
        assignment = plan.storage_data
        assert isinstance(assignment, Assignment), "prepare_global_plan ran"
        root = self.root
        records: list[FileRecord] = []
        for path, chunks in assignment.files.items():
            tensors = {}
            for name, offset in chunks:  # each chunk of a tensor is a piece in a file of its own
                data = planner.resolve_data(self._items[(name, offset)])
                assert isinstance(data, torch.Tensor)
                tensors[name] = data
            records.append(write_data_file(root, path, tensors))
        placed: dict[str, tuple[str, int, int]] = {}
        if assignment.objects_file is not None:
            blob = io.BytesIO()
            for name in assignment.objects:
                data = planner.resolve_data(self._items[(name, ())])
                value = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                placed[name] = (assignment.objects_file, blob.tell(), len(value))
                blob.write(value)
            content = blob.getvalue()

            def write(temp: Path) -> None:
                temp.write_bytes(content)

            records.append(place_file(root, assignment.objects_file, write))
        written = _Written(self.rank, tuple(records), placed)
        results = [WriteResult(index=item.index, size_in_bytes=0, storage_data=None)
                   for item in plan.items]
        # One result always carries the records: a rank may write only replicas, which DCP's
        # plan (its copies removed) no longer lists.
        results.append(WriteResult(index=MetadataIndex(f"shardspec:rank-{self.rank}"),
                                   size_in_bytes=sum(r.size for r in records),
                                   storage_data=written))
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Every rank wrote its files: fill their records in and commit the manifest, last."""
        draft = self._draft
        assert draft is not None, "prepare_global_plan ran on the coordinator"
        written = [r.storage_data for rank_results in results for r in rank_results
                   if isinstance(r.storage_data, _Written)]
        records = {f.path: f for w in written for f in w.records}
        records.update({f.path: f for f in copy_extra_files(self.root, self.extra_files)})
        placed = {name: where for w in written for name, where in w.objects.items()}
        if placed:
            draft = dataclasses.replace(
                draft, metadata={**draft.metadata, OBJECTS_KEY: objects_index(placed)})
        manifest = finish_manifest(draft, records)
        commit_checkpoint(self.root, manifest.to_json())
        self.manifest = manifest


def _key(item: WriteItem) -> tuple[str, tuple[int, ...]]:
    if item.type == WriteItemType.BYTE_IO:
        return item.index.fqn, ()
    return item.index.fqn, tuple(item.index.offset or ())
