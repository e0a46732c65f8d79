"""Checkpoints in memory (:class:`Ckpt`: a manifest and its files), written by the reference
writer or by hand, and vectors (:class:`Vector`) written to disk with what each rank loads."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import struct
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import shardspec
from shardspec import Layout, Shard
from shardspec.format.dtypes import spec_shape

from .raw import TensorData, manifest_text, st_assemble, st_entries, st_file, st_tensors, triple

#: Written as ``generator`` in every manifest instead of the package version, so that a
#: version bump does not change the vectors.
GENERATOR = "shardspec conformance/make_vectors.py"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_record(path: str, data: bytes) -> dict[str, Any]:
    return {"path": path, "size": len(data), "checksums": {"sha256": sha256(data)}}


@dataclass
class Ckpt:
    """A checkpoint directory in memory: the manifest (None: none) and every file's bytes."""

    manifest: dict[str, Any] | None
    files: dict[str, bytes]
    #: Manifest bytes written verbatim instead of serializing ``manifest``.
    raw: bytes | None = None

    def clone(self) -> Ckpt:
        return Ckpt(copy.deepcopy(self.manifest), dict(self.files), self.raw)

    @property
    def m(self) -> dict[str, Any]:
        assert self.manifest is not None
        return self.manifest

    def records(self) -> Iterable[dict[str, Any]]:
        for rank in self.m["ranks"]:
            yield from rank["files"]
        yield from self.m.get("extra_files", [])

    def record(self, path: str) -> dict[str, Any]:
        for record in self.records():
            if record["path"] == path:
                return record
        raise KeyError(path)

    def put(self, path: str, data: bytes, *, refresh: bool = True) -> None:
        """Replace a file's bytes; with ``refresh`` its manifest record follows (size, sha256)."""
        self.files[path] = data
        if refresh:
            record = self.record(path)
            record["size"] = len(data)
            record["checksums"] = {"sha256": sha256(data)}

    def edit_file(self, path: str, edit: Callable[[list[list[Any]]], object]) -> None:
        """Rewrite a data file from its entries ``[name, dtype, shape, bytes]`` after ``edit``."""
        entries = [list(e) for e in st_entries(self.files[path])]
        edit(entries)
        self.put(path, st_file(entries, metadata={"format": "pt"}))

    def rename_file(self, old: str, new: str) -> None:
        self.files[new] = self.files.pop(old)
        self.record(old)["path"] = new
        for record in self.m["tensors"].values():
            for piece in record.get("pieces", []):
                if piece["file"] == old:
                    piece["file"] = new

    def tensor(self, name: str) -> dict[str, Any]:
        record: dict[str, Any] = self.m["tensors"][name]
        return record

    def piece(self, name: str, rank: int) -> dict[str, Any]:
        return next(p for p in self.tensor(name)["pieces"] if p["rank"] == rank)

    def manifest_bytes(self) -> bytes | None:
        if self.raw is not None:
            return self.raw
        return None if self.manifest is None else manifest_text(self.manifest)


def rank_record(layout: Layout, rank: int, files: list[dict[str, Any]]) -> dict[str, Any]:
    c = layout.coordinates(rank)
    return {"rank": rank, "tp_rank": c["tp_rank"], "pp_rank": c["pp_rank"],
            "ep_rank": c["ep_rank"], "files": files}


def whole(state: dict[str, torch.Tensor]) -> dict[str, Shard]:
    """Shards that make each tensor of a one-rank state a global tensor held whole."""
    shards = {}
    for name, tensor in state.items():
        shape = spec_shape(tensor)[1]
        shards[name] = Shard(shape, (0,) * len(shape))
    return shards


def saved_whole(state: dict[str, torch.Tensor], **kwargs: Any) -> Ckpt:
    """A one-rank checkpoint of global tensors, each held whole by rank 0."""
    return saved({0: state}, Layout(tp_size=1), sharding={0: whole(state)}, **kwargs)


def saved(
    states: dict[int, dict[str, torch.Tensor]],
    layout: Layout,
    *,
    sharding: dict[int, dict[str, Shard]] | None = None,
    extra: dict[str, bytes] | None = None,
    **kwargs: Any,
) -> Ckpt:
    """A checkpoint written by the reference writer, read back into memory."""
    with tempfile.TemporaryDirectory() as tmp:
        sources = {}
        for name, data in (extra or {}).items():
            source = Path(tmp) / "src" / name
            source.parent.mkdir(parents=True, exist_ok=True)
            source.write_bytes(data)
            sources[name] = source
        root = Path(tmp) / "ckpt"
        shardspec.save(states, root, layout=layout, sharding=sharding, extra_files=sources,
                       **kwargs)
        manifest = json.loads((root / "shardspec.json").read_bytes())
        files = {p.relative_to(root).as_posix(): p.read_bytes()
                 for p in sorted(root.rglob("*")) if p.is_file() and p.name != "shardspec.json"}
    manifest["generator"] = GENERATOR
    ck = Ckpt(manifest, files)
    for rank, state in states.items():  # the writer kept every tensor as given
        assert expected_of(ck)[rank] == {n: triple(t) for n, t in state.items()}, rank
    return ck


def handmade(
    layout: Layout,
    files: dict[str, tuple[int, list[tuple[str, str, tuple[int, ...], bytes]]]],
    tensors: dict[str, Any],
    *,
    pad_to: int = 8,
    empty_ranks: Iterable[int] = (),
) -> Ckpt:
    """A checkpoint whose data files are written here: ``path -> (rank, entries)``."""
    blobs = {path: st_file(entries, metadata={"format": "pt"}, pad_to=pad_to)
             for path, (_, entries) in files.items()}
    ranks = []
    for rank in range(layout.size):
        records = [file_record(p, blobs[p]) for p, (r, _) in files.items() if r == rank]
        assert records or rank in empty_ranks
        ranks.append(rank_record(layout, rank, records))
    manifest = {
        "format": "shardspec", "format_version": "1.0", "generator": GENERATOR,
        "layout": {"tp_size": layout.tp_size, "pp_size": layout.pp_size,
                   "ep_size": layout.ep_size, "world_size": layout.world_size,
                   "rank_order": layout.rank_order},
        "ranks": ranks, "quantization": {"method": "none"}, "tensors": tensors,
    }
    return Ckpt(manifest, blobs)


def expected_of(ck: Ckpt) -> dict[int, dict[str, TensorData]]:
    """What each rank must load, read from the files as the manifest places them (SPEC 7.2,
    7.6): every piece of the rank under its tensor's name, and every alias whose target it holds.
    """
    m = ck.m
    out: dict[int, dict[str, TensorData]] = {}
    for index, rank in enumerate(m["ranks"]):
        contents = {record["path"]: st_tensors(ck.files[record["path"]])
                    for record in rank["files"]}
        loaded = {}
        for name, record in m["tensors"].items():
            mine = [p for p in record.get("pieces", []) if p["rank"] == index]
            for piece in mine:
                dtype, shape, data = contents[piece["file"]][name]
                assert (dtype, shape) == (record["dtype"], tuple(piece["shape"]))
            if mine:
                loaded[name] = _joined([(p, contents[p["file"]][name]) for p in mine])
        for name, record in m["tensors"].items():
            if "alias_of" in record and record["alias_of"] in loaded:
                loaded[name] = loaded[record["alias_of"]]
        out[index] = loaded
    return out


def _joined(pieces: list[tuple[dict[str, Any], TensorData]]) -> TensorData:
    """A rank's value (SPEC 7.2 rules 6, 7): its one piece, or its pieces laid one after the
    other, in increasing offset, along the one dimension where their offsets differ."""
    if len(pieces) == 1:
        return pieces[0][1]
    offsets = [p["offset"] for p, _ in pieces]
    (dim,) = [d for d in range(len(offsets[0])) if len({o[d] for o in offsets}) > 1]
    pieces = sorted(pieces, key=lambda item: item[0]["offset"][dim])
    dtype, shape, _ = pieces[0][1]
    outer = math.prod(shape[:dim])
    rows = []  # per index of the dimensions before dim, each piece's bytes in turn
    for i in range(outer):
        for _, (_, _, data) in pieces:
            step = len(data) // outer
            rows.append(data[i * step:(i + 1) * step])
    joined = list(shape)
    joined[dim] = sum(s[dim] for _, (_, s, _) in pieces)
    return dtype, tuple(joined), b"".join(rows)


@dataclass
class Vector:
    id: str
    description: str
    section: str
    ck: Ckpt
    ranks: list[int]
    expected_code: str | None = None  # None: a valid vector
    warnings: list[str] = field(default_factory=list)
    verify: bool = False
    materialize: str | None = None
    materialize_path: str | None = None
    materialize_target: str | None = None
    ignore_extensions: list[str] = field(default_factory=list)
    ignore_extensions_text: str | None = None
    validator_also: list[str] = field(default_factory=list)
    requires: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return self.expected_code is None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "description": self.description,
                               "section": self.section, "valid": self.valid, "ranks": self.ranks}
        if self.expected_code is not None:
            out["expected_code"] = self.expected_code
        if self.warnings:
            out["warnings"] = self.warnings
        if self.verify:
            out["verify"] = True
        if self.materialize is not None:
            out["materialize"] = self.materialize
            out["materialize_path"] = self.materialize_path
        if self.materialize_target is not None:
            out["materialize_target"] = self.materialize_target
        if self.ignore_extensions:
            out["ignore_extensions"] = self.ignore_extensions
        if self.ignore_extensions_text is not None:
            out["ignore_extensions_text"] = self.ignore_extensions_text
        if self.validator_also:
            out["validator_also"] = self.validator_also
        if self.requires:
            out["requires"] = self.requires
        return out


def write_expected_file(tensors: dict[str, TensorData]) -> bytes:
    """An expected-output file: a plain safetensors file, entries sorted by name."""
    return st_file([(n, *tensors[n]) for n in sorted(tensors)])


def write_vector(vector: Vector, root: Path) -> None:
    base = root / vector.id
    base.mkdir(parents=True)
    text = json.dumps(vector.to_json(), indent=2, ensure_ascii=False) + "\n"
    (base / "vector.json").write_text(text, encoding="utf-8")
    ckpt = base / "checkpoint"
    ckpt.mkdir()
    for path in sorted(vector.ck.files):
        target = ckpt / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(vector.ck.files[path])
    manifest = vector.ck.manifest_bytes()
    if manifest is not None:
        (ckpt / "shardspec.json").write_bytes(manifest)
    if vector.valid:
        (base / "expected").mkdir()
        expected = expected_of(vector.ck)
        for rank in vector.ranks:
            data = write_expected_file(expected[rank])
            (base / "expected" / f"rank-{rank}.safetensors").write_bytes(data)


def header_bytes(blob: bytes) -> tuple[bytes, bytes]:
    """A file's header text (padding stripped) and its data region."""
    (length,) = struct.unpack("<Q", blob[:8])
    return blob[8 : 8 + length].rstrip(b" "), blob[8 + length :]


class Vectors(list[Vector]):
    """Invalid vectors as they are added, each named ``<code>-<variant>``."""

    def add(self, code: str, variant: str, description: str, ck: Ckpt,
            ranks: list[int] | None = None, *, section: str | None = None, **kw: Any) -> None:
        if ranks is None:  # a manifest-level defect: every rank's load fails
            ranks = list(range(len(ck.m["ranks"]))) if ck.manifest else [0]
        section = section or shardspec.format.errors.CODES[code].section
        self.append(Vector(f"{code}-{variant}", description, section, ck, ranks, code, **kw))


def edit(base: Ckpt, change: Callable[[Ckpt], object]) -> Ckpt:
    """A copy of ``base`` changed by ``change``."""
    ck = base.clone()
    change(ck)
    return ck


def with_raw(base: Ckpt, text: Callable[[bytes], bytes]) -> Ckpt:
    """A copy of ``base`` whose manifest is ``text`` of its usual text."""
    ck = base.clone()
    ck.raw = text(manifest_text(ck.m))
    return ck


def with_header(base: Ckpt, path: str, change: Callable[[bytes], bytes]) -> Ckpt:
    """Rewrite a data file's header text; the data region stays as it is."""
    ck = base.clone()
    header, data = header_bytes(ck.files[path])
    ck.put(path, st_assemble(change(header), data, pad_to=1))
    return ck
