"""The manifest as immutable typed objects, built from and serialized to SPEC JSON.

``from_dict`` expects a dict that already passed the JSON Schema (see
:mod:`shardspec.format.schema`); semantic rules the schema cannot express live in
:mod:`shardspec.format.checks`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .limits import SUPPORTED_MAJOR, SUPPORTED_MINOR
from .pieces import Piece, build_pieces

__all__ = [
    "RANK_ORDERS",
    "Alias",
    "FileRecord",
    "Layout",
    "Logical",
    "Manifest",
    "Piece",
    "Quantization",
    "RankRecord",
    "TensorRecord",
    "format_version",
    "tensor_kind",
]

#: SPEC 5.2: axes from slowest to fastest varying.
RANK_ORDERS = ("pp-ep-tp", "pp-tp-ep", "ep-pp-tp", "ep-tp-pp", "tp-pp-ep", "tp-ep-pp")


def format_version() -> str:
    """The format version this implementation writes, e.g. ``"1.0"``."""
    return f"{SUPPORTED_MAJOR}.{SUPPORTED_MINOR}"


def _flat(value: Any) -> bool:
    if isinstance(value, dict):
        return all(not isinstance(v, dict | list) or _scalar_list(v) for v in value.values())
    return _scalar_list(value)


def _scalar_list(value: Any) -> bool:
    return isinstance(value, list) and not any(isinstance(v, dict | list) for v in value)


def _dump(value: Any, depth: int) -> str:
    if not isinstance(value, dict | list) or _flat(value):
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, list):
        items = [inner + _dump(v, depth + 1) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]" if items else "[]"
    items = [inner + json.dumps(k, ensure_ascii=False) + ": " + _dump(v, depth + 1)
             for k, v in value.items()]
    return "{\n" + ",\n".join(items) + "\n" + pad + "}" if items else "{}"


@dataclass(frozen=True, kw_only=True)
class Layout:
    """The parallel layout (SPEC 5): sizes and the rule that numbers the ranks."""

    tp_size: int
    pp_size: int = 1
    ep_size: int = 1
    rank_order: str = "pp-ep-tp"
    #: As recorded; None means the product of the sizes (SPEC 5.1 requires they agree).
    world_size: int | None = None

    def __post_init__(self) -> None:
        if self.world_size is None:
            object.__setattr__(self, "world_size", self.tp_size * self.pp_size * self.ep_size)
        if self.rank_order not in RANK_ORDERS:
            raise ValueError(f"rank_order must be one of {RANK_ORDERS} (SPEC 5.2)")

    @property
    def size(self) -> int:
        """The world size the sizes imply."""
        return self.tp_size * self.pp_size * self.ep_size

    def _axes(self) -> list[tuple[str, int]]:
        sizes = {"tp": self.tp_size, "pp": self.pp_size, "ep": self.ep_size}
        return [(axis, sizes[axis]) for axis in self.rank_order.split("-")]

    def rank_of(self, *, tp_rank: int, pp_rank: int, ep_rank: int) -> int:
        """SPEC 5.2: the rank at these coordinates (default order: vLLM's pp * tp_size + tp)."""
        coords = {"tp": tp_rank, "pp": pp_rank, "ep": ep_rank}
        rank = 0
        for axis, size in self._axes():
            rank = rank * size + coords[axis]
        return rank

    def coordinates(self, rank: int) -> dict[str, int]:
        """SPEC 5.2: ``{"tp_rank", "pp_rank", "ep_rank"}`` of ``rank``."""
        coords: dict[str, int] = {}
        for axis, size in reversed(self._axes()):
            coords[f"{axis}_rank"] = rank % size
            rank //= size
        return coords

    def to_dict(self) -> dict[str, Any]:
        return {
            "tp_size": self.tp_size,
            "pp_size": self.pp_size,
            "ep_size": self.ep_size,
            "world_size": self.world_size,
            "rank_order": self.rank_order,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Layout:
        return cls(
            tp_size=data["tp_size"],
            pp_size=data["pp_size"],
            ep_size=data["ep_size"],
            rank_order=data["rank_order"],
            world_size=data["world_size"],
        )


@dataclass(frozen=True, kw_only=True)
class FileRecord:
    """A file of the checkpoint: relative path, size in bytes, digests (SPEC 9)."""

    path: str
    size: int
    checksums: Mapping[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "checksums": dict(self.checksums)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FileRecord:
        return cls(path=data["path"], size=data["size"], checksums=dict(data["checksums"]))


@dataclass(frozen=True, kw_only=True)
class RankRecord:
    """One rank: its coordinates and the data files it owns, in part order (SPEC 5.3, 6.1)."""

    rank: int
    tp_rank: int
    pp_rank: int
    ep_rank: int
    files: tuple[FileRecord, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "tp_rank": self.tp_rank,
            "pp_rank": self.pp_rank,
            "ep_rank": self.ep_rank,
            "files": [f.to_dict() for f in self.files],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankRecord:
        return cls(
            rank=data["rank"],
            tp_rank=data["tp_rank"],
            pp_rank=data["pp_rank"],
            ep_rank=data["ep_rank"],
            files=tuple(FileRecord.from_dict(f) for f in data["files"]),
        )


@dataclass(frozen=True, kw_only=True)
class Quantization:
    """How the weights were quantized (SPEC 8.1); method ``"none"`` for none."""

    method: str = "none"
    config: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method}
        if self.config:
            out["config"] = dict(self.config)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Quantization:
        return cls(method=data["method"], config=dict(data.get("config", {})))


@dataclass(frozen=True, kw_only=True)
class Logical:
    """The dtype and shape a quantized tensor stands for (SPEC 8.2)."""

    dtype: str
    shape: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Logical:
        return cls(dtype=data["dtype"], shape=tuple(data["shape"]))


@dataclass(frozen=True, kw_only=True)
class Tie:
    """What a quantizer output (a scale, a zero point, a group index) describes: blocks of the
    elements of its base tensor's grid (SPEC 8.4). Dim ``j`` of the tied tensor follows grid
    dim ``axes[j]``, one element spanning ``block[j]`` grid elements; no ``block``: one value
    for the whole base."""

    tensor: str
    block: tuple[int, ...] | None = None
    axes: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tensor": self.tensor}
        if self.axes is not None:
            out["axes"] = list(self.axes)
        if self.block is not None:
            out["block"] = list(self.block)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Tie:
        block, axes = data.get("block"), data.get("axes")
        return cls(tensor=data["tensor"], block=None if block is None else tuple(block),
                   axes=None if axes is None else tuple(axes))


def tensor_kind(record: Mapping[str, Any]) -> str:
    """SPEC 4.3 rule 2, as the schema's ``tensor`` decides it: a record with ``alias_of`` is an
    ``"alias"``, one with ``rank_local`` is ``"rank-local"``, any other is ``"global"``."""
    if "alias_of" in record:
        return "alias"
    return "rank-local" if "rank_local" in record else "global"


@dataclass(frozen=True, kw_only=True)
class TensorRecord:
    """A tensor with data: global (``shape`` set) or rank-local (``shape`` None) (SPEC 7)."""

    dtype: str
    shape: tuple[int, ...] | None
    pieces: tuple[Piece, ...]
    logical: Logical | None = None
    tied_to: Tie | None = None

    @property
    def rank_local(self) -> bool:
        return self.shape is None

    def piece_of(self, rank: int) -> Piece | None:
        """The first piece ``rank`` holds, if any (several only where they join, SPEC 7.2)."""
        for piece in self.pieces:
            if piece.rank == rank:
                return piece
        return None

    def shape_on(self, rank: int) -> tuple[int, ...] | None:
        """The shape of the tensor's value on ``rank`` (SPEC 7.2 rule 6), or None if it has no
        piece there: its piece's shape, or where it holds several, the sum of their sizes along
        the one dimension their offsets differ in (a checked manifest's pieces join)."""
        mine = [p for p in self.pieces if p.rank == rank]
        if len(mine) < 2:
            return mine[0].shape if mine else None
        offsets = [p.offset or () for p in mine]
        dim = next(d for d in range(len(mine[0].shape)) if len({o[d] for o in offsets}) > 1)
        return tuple(sum(p.shape[d] for p in mine) if d == dim else size
                     for d, size in enumerate(mine[0].shape))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dtype": self.dtype}
        if self.shape is None:
            out["rank_local"] = True
        else:
            out["shape"] = list(self.shape)
        if self.logical is not None:
            out["logical"] = self.logical.to_dict()
        if self.tied_to is not None:
            out["tied_to"] = self.tied_to.to_dict()
        out["pieces"] = [p.to_dict() for p in self.pieces]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], shared: dict[Any, Any] | None = None,
                  built: dict[tuple[int, bool], tuple[Piece, ...]] | None = None,
                  ) -> TensorRecord:
        """The record of ``data``, a global or rank-local tensor record; ``shared`` as in
        :func:`~shardspec.format.pieces.build_pieces` (for a whole manifest).

        ``built`` (for a whole manifest whose dicts stay alive meanwhile) maps a list of pieces,
        by identity, to the pieces built from it: records that share one list (the fast parser
        gives equal texts one list) share one tuple of pieces.

        The kind is :func:`tensor_kind`'s, and only the members that kind defines are read:
        others are unknown fields of a newer minor version, which the schema check reported.
        """
        local = tensor_kind(data) == "rank-local"
        logical = data.get("logical")
        tie = None if local else data.get("tied_to")
        records = data["pieces"]
        key = (id(records), local)
        pieces = None if built is None else built.get(key)
        if pieces is None:
            pieces = build_pieces(records, shared, local=local)
            if built is not None:
                built[key] = pieces
        # Filled in directly, as pieces are: a manifest may hold 100,000 tensors.
        record = object.__new__(cls)
        put = object.__setattr__
        put(record, "dtype", data["dtype"])
        put(record, "shape", None if local else tuple(data["shape"]))
        put(record, "pieces", pieces)
        put(record, "logical", None if logical is None else Logical.from_dict(logical))
        put(record, "tied_to", None if tie is None else Tie.from_dict(tie))
        return record


@dataclass(frozen=True, kw_only=True)
class Alias:
    """Another name for a tensor, sharing its storage: tied weights (SPEC 7.6)."""

    alias_of: str

    def to_dict(self) -> dict[str, Any]:
        return {"alias_of": self.alias_of}


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """The whole manifest (SPEC 3.1)."""

    format_version: str
    layout: Layout
    ranks: tuple[RankRecord, ...]
    quantization: Quantization
    tensors: Mapping[str, TensorRecord | Alias]
    extra_files: tuple[FileRecord, ...] = ()
    metadata: Mapping[str, str] = field(default_factory=dict)
    extensions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    generator: str | None = None

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def files_of(self, rank: int) -> tuple[FileRecord, ...]:
        return self.ranks[rank].files

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": "shardspec", "format_version": self.format_version}
        if self.generator is not None:
            out["generator"] = self.generator
        out["layout"] = self.layout.to_dict()
        out["ranks"] = [r.to_dict() for r in self.ranks]
        out["quantization"] = self.quantization.to_dict()
        out["tensors"] = {name: t.to_dict() for name, t in self.tensors.items()}
        if self.extra_files:
            out["extra_files"] = [f.to_dict() for f in self.extra_files]
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        if self.extensions:
            out["extensions"] = {k: dict(v) for k, v in self.extensions.items()}
        return out

    def to_json(self) -> bytes:
        """Stable serialization: same manifest, same bytes (UTF-8, no NaN, newline-terminated).

        Objects nest with indentation; a record whose values are all scalars or lists of scalars
        (a piece, a file's checksums, a shape) stays on one line, so a big manifest stays legible.
        """
        return (_dump(self.to_dict(), 0) + "\n").encode("utf-8")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, share: bool = False) -> Manifest:
        """The manifest of ``data``, a dict that passed the schema.

        With ``share``, equal shapes, offsets and file names of pieces become one object (see
        :func:`~shardspec.format.pieces.build_pieces`), and records whose pieces are one list
        in ``data`` share one tuple of pieces: much less memory for a large manifest.
        Only for data the schema checked with integer tokens (:mod:`shardspec.format.parse`
        does): ``(1, 2)`` and ``(True, 2)`` or ``(1.0, 2)`` are equal keys.
        """
        tensors: dict[str, TensorRecord | Alias] = {}
        shared: dict[Any, Any] | None = {} if share else None
        built: dict[tuple[int, bool], tuple[Piece, ...]] | None = {} if share else None
        for name, record in data["tensors"].items():
            if tensor_kind(record) == "alias":
                tensors[name] = Alias(alias_of=record["alias_of"])
            else:
                tensors[name] = TensorRecord.from_dict(record, shared, built)
        return cls(
            format_version=data["format_version"],
            layout=Layout.from_dict(data["layout"]),
            ranks=tuple(RankRecord.from_dict(r) for r in data["ranks"]),
            quantization=Quantization.from_dict(data["quantization"]),
            tensors=tensors,
            extra_files=tuple(FileRecord.from_dict(f) for f in data.get("extra_files", ())),
            metadata=dict(data.get("metadata", {})),
            extensions={k: dict(v) for k, v in data.get("extensions", {}).items()},
            generator=data.get("generator"),
        )
