#!/usr/bin/env python3
"""Create at run time the special files a vector cannot keep in git (SPEC 2.2, 2.3, 3.4).

Git cannot store a FIFO, and a symbolic link that points outside the repository (or a 256 MiB
manifest) does not belong in it. A vector that needs one says so in ``vector.json``::

    "materialize": "<kind>", "materialize_path": "<path inside the checkpoint>"

and a runner calls :func:`materialize`, which copies the checkpoint and creates the special
file inside the copy, never in the committed tree. Standard library only, so that runners for
other implementations can use it too::

    python conformance/materialize.py VECTOR_DIR DEST   # prints the checkpoint directory to test

Kinds:

- ``fifo``: ``materialize_path`` becomes a FIFO (named pipe).
- ``symlink-outside``: the file at ``materialize_path`` moves to ``DEST/outside/`` and a
  relative symbolic link to it takes its place.
- ``symlink-dir-escape``: the same for a directory: ``materialize_path`` names a directory of
  the checkpoint, which moves outside and is replaced by a link.
- ``symlink-dangling``: ``materialize_path`` becomes a symbolic link to a name that does not
  exist (inside the checkpoint).
- ``symlink-inside``: the file at ``materialize_path`` moves to ``objects/<name>`` inside the
  checkpoint and a relative link to it takes its place (as in a download cache).
- ``symlink-dotdot``: the file at ``materialize_path`` (at the top of the checkpoint) moves to
  ``sub/<name>``, a link ``via`` points to the directory ``sub/inner``, and the file's place
  becomes a link to ``via/../<name>``: followed as the system follows links, ``via/..`` is
  ``sub`` (SPEC 2.2 rule 5); taken lexically it is the link itself.
- ``symlink-to-listed``: the file at ``materialize_path`` becomes a relative link to
  ``materialize_target``, another listed file of the checkpoint (with the same bytes).
- ``huge-manifest``: spaces are appended to ``materialize_path`` (the manifest) until it has
  ``MAX_MANIFEST_BYTES + 1`` bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

__all__ = ["KINDS", "MAX_MANIFEST_BYTES", "materialize"]

KINDS = ("fifo", "symlink-outside", "symlink-dir-escape", "symlink-dangling",
         "symlink-dangling-outside", "symlink-loop", "symlink-inside", "symlink-dotdot",
         "symlink-to-listed", "huge-manifest")

#: SPEC 3.4 / 12 (format 1.1; 67108864 in 1.0).
MAX_MANIFEST_BYTES = 268435456

_CHUNK = 1 << 20


def materialize(vector_dir: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """The checkpoint directory to test for the vector at ``vector_dir``.

    A vector without ``materialize`` is tested in place: its committed ``checkpoint/`` is
    returned (treat it as read-only). Otherwise the checkpoint is copied to
    ``dest/checkpoint``, the special file is created in the copy (``dest/outside`` receives
    what a link points to), and the copy is returned. ``dest`` must be empty or absent.
    """
    vector_dir = Path(vector_dir)
    vector = json.loads((vector_dir / "vector.json").read_text(encoding="utf-8"))
    source = vector_dir / "checkpoint"
    kind = vector.get("materialize")
    if kind is None:
        return source
    if kind not in KINDS:
        raise ValueError(f"{vector_dir.name}: unknown materialize kind {kind!r}")
    dest = Path(dest)
    root = dest / "checkpoint"
    shutil.copytree(source, root, symlinks=True)
    target = root / vector["materialize_path"]
    if kind == "fifo":
        if target.exists():
            target.unlink()
        target.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(target)
    elif kind in ("symlink-outside", "symlink-dir-escape"):
        if not (target.is_dir() if kind == "symlink-dir-escape" else target.is_file()):
            raise ValueError(f"{vector_dir.name}: nothing to move outside at {target}")
        outside = dest / "outside" / target.name
        outside.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(target), outside)
        os.symlink(os.path.relpath(outside, target.parent), target)
    elif kind == "symlink-dangling":
        if target.exists() or target.is_symlink():
            target.unlink()
        target.parent.mkdir(parents=True, exist_ok=True)
        os.symlink("does-not-exist.safetensors", target)
    elif kind == "symlink-loop":  # two links pointing at each other
        if target.exists() or target.is_symlink():
            target.unlink()
        target.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target.name + ".loop", target)
        os.symlink(target.name, target.with_name(target.name + ".loop"))
    elif kind == "symlink-dangling-outside":  # to nothing, outside the checkpoint
        if target.exists() or target.is_symlink():
            target.unlink()
        target.parent.mkdir(parents=True, exist_ok=True)
        outside = dest / "outside" / "does-not-exist.safetensors"
        os.symlink(os.path.relpath(outside, target.parent), target)
    elif kind == "symlink-inside":
        moved = root / "objects" / target.name
        moved.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(target), moved)
        os.symlink(os.path.relpath(moved, target.parent), target)
    elif kind == "symlink-dotdot":
        if target.parent != root:
            raise ValueError(f"{vector_dir.name}: symlink-dotdot needs a top-level file")
        (root / "sub" / "inner").mkdir(parents=True)
        shutil.move(str(target), root / "sub" / target.name)
        os.symlink("sub/inner", root / "via")
        os.symlink(f"via/../{target.name}", target)
    elif kind == "symlink-to-listed":
        linked = root / vector["materialize_target"]
        if not linked.is_file():
            raise ValueError(f"{vector_dir.name}: no file to link to at {linked}")
        target.unlink()
        os.symlink(os.path.relpath(linked, target.parent), target)
    else:  # huge-manifest
        with target.open("ab") as handle:
            missing = MAX_MANIFEST_BYTES + 1 - handle.tell()
            while missing > 0:
                step = min(missing, _CHUNK)
                handle.write(b" " * step)
                missing -= step
    return root


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: materialize.py VECTOR_DIR DEST", file=sys.stderr)
        return 2
    print(materialize(argv[0], argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
