"""Where a checkpoint is written: claiming the directory (or storage prefix), removing what a
previous write left there, and committing the manifest last (SPEC 10).

A write removes only what a shardspec writer provably wrote: the files of the manifest it
replaces, its temporary files, data files under the default names
(:data:`~shardspec.storage.commit.LEFTOVER`), and the files a claim lists
(:data:`~shardspec.storage.commit.CLAIM_NAME`). A writer naming its files as torch's
distributed Hugging Face writer does (``convert``) claims them before writing the first, so its
interrupted write is replaced like any other; a directory holding such files that no manifest
and no claim lists (a distributed save of transformers or torch) is never emptied.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from ..format.limits import MANIFEST_NAME
from ..format.manifest import Manifest
from ..storage.commit import (
    CLAIM_NAME,
    LEFTOVER,
    adopted_files,
    commit_manifest,
    drop_claim,
    foreign_weights,
    fsync_dir,
    interrupted_write,
    read_claim,
    removable,
    uncommit,
    write_claim,
)
from ..storage.entries import folder_inside, remove_entry
from ..storage.location import Location
from ..storage.manifest_file import read_manifest
from ..storage.remote import RemoteRoot
from ..storage.remote_write import commit_remote, prepare_prefix

__all__ = ["claim_directory", "commit_checkpoint", "prepare_directory"]


def commit_checkpoint(root: Location, manifest_json: bytes, *, claimed: bool = False) -> None:
    """Write the manifest, last: a directory by SPEC 10.1, a storage prefix by 10.4; then
    remove the write's claim (``claimed``: :func:`prepare_directory` was given one)."""
    if isinstance(root, RemoteRoot):
        commit_remote(root, manifest_json, claimed=claimed)
    else:
        commit_manifest(root, manifest_json)
        if claimed:
            drop_claim(root)


def claim_directory(root: Path, overwrite: bool, leftovers: bool = True) -> list[str]:
    """Create ``root``, or check that ``overwrite`` allows writing into it; its names. With
    ``leftovers``, what an interrupted checkpoint write left there (no manifest, only data and
    temporary files: :func:`~shardspec.storage.commit.interrupted_write`) may be replaced
    without ``overwrite``."""
    existing = _entries(root)
    _refuse_unless(root, existing, overwrite, leftovers)
    return existing


def _entries(root: Path) -> list[str]:
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"{root} exists and is not a directory")
    root.mkdir(parents=True, exist_ok=True)
    return [p.name for p in root.iterdir()]


def _refuse_unless(root: Path, existing: list[str], overwrite: bool, leftovers: bool) -> None:
    claimed = read_claim(root) if leftovers and CLAIM_NAME in existing else frozenset()
    if existing and not overwrite and not (leftovers and interrupted_write(existing, claimed)):
        what = "a checkpoint" if MANIFEST_NAME in existing else \
            f"{len(existing)} entr{'y' if len(existing) == 1 else 'ies'} such as " \
            f"{sorted(existing)[0]!r}"
        raise FileExistsError(f"{root} is not empty (it holds {what}); pass overwrite=True to "
                              "replace it")


def refuse_adopted(root: Location, previous: Manifest | None) -> None:
    """FileExistsError where ``previous`` lists files that an import adopted."""
    files = adopted_files(previous)
    if files:
        more = f" and {len(files) - 1} more" if len(files) > 1 else ""
        raise FileExistsError(
            f"{root} holds a checkpoint that `shardspec import` adopted in place: its files "
            f"({files[0]!r}{more}) are the save it was imported from, not files a shardspec "
            "writer wrote, and --overwrite does not delete them; pass --remove-adopted "
            "(remove_adopted=True) as well to delete them, or write the checkpoint elsewhere")


def prepare_directory(root: Location, overwrite: bool, claim: Collection[str] = (), *,
                      remove_adopted: bool = False, paths: Collection[str] = ()) -> None:
    """Create ``root``, or empty it of a previous checkpoint when ``overwrite`` (SPEC 10.2).

    The files of a checkpoint that ``shardspec import`` adopted are a user's save: they are
    removed only with ``remove_adopted`` as well (:func:`refuse_adopted`). ``paths``: the
    files the write will create in folders (extra files); a folder on their way that is a
    link or a file is refused (``path-escapes``) before anything is removed.

    ``claim``: the data files the write will create, under names that
    :data:`~shardspec.storage.commit.LEFTOVER` does not match (torch's); they are claimed
    before the first is written, and other ``*.safetensors`` files that may not be removed are
    refused (:func:`~shardspec.storage.commit.foreign_weights`)."""
    if isinstance(root, RemoteRoot):
        prepare_prefix(root, overwrite, claim)
        return
    for path in paths:
        folder_inside(root, path, create=False)
    existing = _entries(root)
    previous = read_manifest(root).manifest if MANIFEST_NAME in existing else None
    stale = removable(existing, previous, read_claim(root) if CLAIM_NAME in existing else ())
    if claim:  # before the question of overwriting: overwriting would not help
        foreign_weights(root, existing, stale)
    _refuse_unless(root, existing, overwrite, leftovers=True)
    if not remove_adopted:
        refuse_adopted(root, previous)
    # Claimed before the manifest goes: a crash from here on leaves no file under torch's
    # names that no claim lists (so none that a rerun would have to refuse).
    pending = set(claim) | {n for n in stale if n.endswith(".safetensors")
                            and not LEFTOVER.match(n)}
    if pending:
        write_claim(root, pending)
    if not existing:
        return
    uncommit(root)  # from here on a crash leaves no manifest, never a stale one
    for name in sorted(stale - {CLAIM_NAME}):
        remove_entry(root, name)  # the entry: a link's target is not the writer's to remove
    fsync_dir(root)
    if claim and pending != set(claim):
        write_claim(root, claim)  # the old files are gone: the claim lists the new ones
    elif not claim:
        drop_claim(root)
