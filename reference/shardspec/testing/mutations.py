"""The machinery of broken checkpoints: :class:`Mutation`, what a mutation sees of the valid
checkpoint it breaks (:class:`Context`), edits of the manifest and its text, and the registry
the builders of :mod:`~shardspec.testing.broken_manifest` and
:mod:`~shardspec.testing.broken_files` add themselves to, in order.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from ..format.limits import MANIFEST_NAME
from .handwritten import SUB_BYTE, read_st, refresh_record, st_bytes
from .strategies import GeneratedCheckpoint

__all__ = [
    "REGISTRY",
    "Context",
    "DataFile",
    "Mutation",
    "data_files",
    "edit_manifest",
    "edit_text",
    "element_count",
    "file_level",
    "growable",
    "manifest_level",
    "mutation",
    "pick_entry",
    "pick_piece",
    "placeholder",
    "replica_pieces",
    "rewrite_file",
]


@dataclass(frozen=True)
class Mutation:
    """One way to break a valid checkpoint, and the refusal a reader owes it."""

    kind: str
    #: The error code (SPEC 13) the validator reports; readers must refuse, with any error.
    code: str
    #: The SPEC section of the rule broken.
    section: str
    description: str
    #: The ranks whose load must fail (all that read the broken part, at most two shown).
    ranks: tuple[int, ...]
    edit: Callable[[Path], None] = field(repr=False, compare=False)

    def apply(self, root: Path) -> None:
        """Break the checkpoint at ``root`` in place (work on a copy)."""
        self.edit(root)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "code": self.code, "section": self.section,
                "description": self.description, "ranks": list(self.ranks)}


@dataclass(frozen=True)
class DataFile:
    path: str
    owner: int
    header: dict[str, Any]
    data_size: int


@dataclass(frozen=True)
class Context:
    m: dict[str, Any]
    written: GeneratedCheckpoint
    files: tuple[DataFile, ...]

    @property
    def world(self) -> int:
        return int(self.m["layout"]["world_size"])

    @property
    def all_ranks(self) -> tuple[int, ...]:
        return tuple(sorted({0, self.world - 1}))

    def tensors(self, kind: str | None = None) -> list[str]:
        out = []
        for name, record in self.m["tensors"].items():
            this = "alias" if "alias_of" in record else (
                "rank-local" if "rank_local" in record else "global")
            if kind is None and this != "alias" or kind == this:
                out.append(name)
        return sorted(out)


def edit_manifest(edit: Callable[[dict[str, Any]], object]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        data = json.loads((root / MANIFEST_NAME).read_bytes())
        edit(data)
        (root / MANIFEST_NAME).write_bytes(json.dumps(data, indent=1, ensure_ascii=False)
                                           .encode())
    return apply


def edit_text(edit: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        (root / MANIFEST_NAME).write_bytes(edit((root / MANIFEST_NAME).read_bytes()))
    return apply


def _then(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        for step in steps:
            step(root)
    return apply


def placeholder(where: Callable[[dict[str, Any]], None], token: str) -> Callable[[Path], None]:
    """Put the marker string somewhere, then replace it in the text by a raw JSON token."""
    return _then(edit_manifest(where),
                 edit_text(lambda text: text.replace(b'"@@TOKEN@@"', token.encode())))


_Builder = Callable[[st.DrawFn, Context], Mutation]


#: Module name -> its builders, in the order they are defined (kind, applies-to, builder).
REGISTRY: dict[str, list[tuple[str, Callable[[Context], bool], _Builder]]] = {}


def mutation(kind: str, when: Callable[[Context], bool] = lambda ctx: True
              ) -> Callable[[_Builder], _Builder]:
    """Register a builder of the kind ``kind``, drawn only for checkpoints ``when`` accepts."""
    def register(builder: _Builder) -> _Builder:
        REGISTRY.setdefault(builder.__module__, []).append((kind, when, builder))
        return builder
    return register


def manifest_level(kind: str, code: str, section: str, description: str, ctx: Context,
                    edit: Callable[[Path], None]) -> Mutation:
    return Mutation(kind, code, section, description, ctx.all_ranks, edit)


def pick_piece(draw: st.DrawFn, ctx: Context, names: list[str]) -> tuple[str, int]:
    name = draw(st.sampled_from(names))
    return name, draw(st.integers(0, len(ctx.m["tensors"][name]["pieces"]) - 1))


def element_count(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def growable(ctx: Context) -> list[tuple[str, int]]:
    """(tensor, dim) where growing the dimension by one leaves elements nobody holds."""
    out = []
    for name in ctx.tensors("global"):
        shape = ctx.m["tensors"][name]["shape"]
        for d in range(len(shape)):
            if all(n > 0 for i, n in enumerate(shape) if i != d):
                out.append((name, d))
    return out


def replica_pieces(ctx: Context, dims: int = 0) -> list[tuple[str, int]]:
    """Replica pieces (k > 0) with elements (and a dimension of at least 2 when ``dims``)."""
    out = []
    for name in ctx.tensors("global"):
        record = ctx.m["tensors"][name]
        for index, piece in enumerate(record["pieces"]):
            if piece.get("replica", 0) and element_count(piece["shape"]) and (
                    not dims or record["dtype"] not in SUB_BYTE
                    and any(n >= 2 for n in piece["shape"])):
                out.append((name, index))
    return out


def data_files(ctx: Context, entries: bool = False) -> list[DataFile]:
    return [f for f in ctx.files if not entries or any(
        name != "__metadata__" for name in f.header)]


def file_level(kind: str, code: str, section: str, description: str, file: DataFile,
                edit: Callable[[Path], None], refresh: bool = True) -> Mutation:
    def apply(root: Path) -> None:
        edit(root / file.path)
        if refresh:
            edit_manifest(lambda m: refresh_record(root, m, file.path))(root)

    return Mutation(kind, code, section, f"{file.path!r} (rank {file.owner}): {description}",
                    (file.owner,), apply)


def rewrite_file(header_edit: Callable[[dict[str, Any]], object] | None = None, *,
             pad: bytes = b" ") -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        header, data = read_st(path)
        if header_edit is not None:
            header_edit(header)
        path.write_bytes(st_bytes(header, data, pad))
    return edit


def pick_entry(draw: st.DrawFn, file: DataFile) -> str:
    return draw(st.sampled_from(sorted(n for n in file.header if n != "__metadata__")))
