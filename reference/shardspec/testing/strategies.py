"""Hypothesis strategies for shardspec checkpoints, valid and broken.

- :func:`checkpoint_specs` draws a whole checkpoint: a parallel layout (TP, PP, EP, any rank
  order), tensors of every dtype (F6 included), scalars, zero-size and odd shapes, unicode
  names, split, replicated, single-holder and rank-local tensors, aliases, several parts per
  rank, files in subdirectories, extra files, quantization records and logical dtypes,
  metadata, extensions a reader may ignore (and a must-understand one its user allows
  ignoring), and sometimes a newer minor version with fields today's reader must ignore.
  :meth:`CheckpointSpec.write` writes it with :func:`shardspec.save` and returns what each rank
  must load. :func:`checkpoints` does both for a directory factory.
- :func:`broken_checkpoints` derives from a written checkpoint one broken in one way, with the
  error code (SPEC 13) and section a reader must refuse it under and the ranks that must fail:
  an unknown major version, a must-understand extension, JSON dialect, schema, layout, piece,
  coverage, replica and alias errors, and data files that are missing, truncated, corrupted or
  disagree with the manifest.

Example::

    @given(data=st.data())
    def test_my_reader(tmp_path_factory, data):
        root = tmp_path_factory.mktemp("ckpt")
        written = data.draw(checkpoint_specs()).write(root / "ckpt")
        for rank, expected in written.expected.items():
            assert my_load(written.path, rank) == expected
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hypothesis import strategies as st

from ..dtypes import DTYPES, from_torch
from ..limits import MANIFEST_NAME, SUPPORTED_MINOR
from ..manifest import (
    RANK_ORDERS,
    Alias,
    Layout,
    Logical,
    Manifest,
    Quantization,
    format_version,
)
from ..writer import Shard, save
from .adapter import RankTensors, tensor_bytes

__all__ = [
    "CheckpointSpec",
    "GeneratedCheckpoint",
    "Mutation",
    "TensorPlan",
    "broken_checkpoints",
    "checkpoint_specs",
    "checkpoints",
    "dtypes",
    "extension_names",
    "json_values",
    "layouts",
    "mutation_kinds",
    "shapes",
    "tensor_names",
]

SPEC_DTYPES: tuple[str, ...] = tuple(DTYPES)
_F6 = ("F6_E2M3", "F6_E3M2")
_SUB_BYTE = ("F4", *_F6)

_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)


# --- small strategies ------------------------------------------------------------------------


def dtypes() -> st.SearchStrategy[str]:
    """Every dtype of SPEC 6.4."""
    return st.sampled_from(SPEC_DTYPES)


def tensor_names() -> st.SearchStrategy[str]:
    """Realistic names and arbitrary unicode ones (any code point but surrogates), never
    ``__metadata__`` (SPEC 7.1)."""
    realistic = st.builds(
        lambda layer, part: f"model.layers.{layer}.{part}.weight", st.integers(0, 3),
        st.sampled_from(["self_attn.q_proj", "mlp.up_proj", "mlp.experts.down_proj",
                         "input_layernorm"]))
    unicode = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=10)
    return st.one_of(realistic, unicode).filter(lambda name: name != "__metadata__")


def extension_names() -> st.SearchStrategy[str]:
    """Names matching SPEC 4.4 rule 1."""
    return st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,20}", fullmatch=True)


def json_values(max_leaves: int = 6) -> st.SearchStrategy[Any]:
    """Free-form JSON that any reader must parse: I-JSON numbers, unicode strings, nesting."""
    scalars = (st.none() | st.booleans() | st.integers(-(2**53), 2**53)
               | st.floats(allow_nan=False, allow_infinity=False) | _text)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(_text, inner, max_size=3), max_leaves=max_leaves)


@st.composite
def layouts(draw: st.DrawFn, max_world: int = 4) -> Layout:
    """TP x PP x EP layouts of at most ``max_world`` ranks, in any rank order (SPEC 5)."""
    tp = draw(st.integers(1, max_world))
    pp = draw(st.integers(1, max_world // tp))
    ep = draw(st.integers(1, max_world // (tp * pp)))
    return Layout(tp_size=tp, pp_size=pp, ep_size=ep, rank_order=draw(st.sampled_from(RANK_ORDERS)))


@st.composite
def shapes(draw: st.DrawFn, dtype: str = "F32", max_dims: int = 3) -> tuple[int, ...]:
    """Shapes in elements: scalars, zero-size and odd sizes. Sub-byte dtypes get a last
    dimension that fills whole bytes (F4 even, F6 a multiple of 4; SPEC 6.5)."""
    min_dims = 1 if dtype in _SUB_BYTE else 0
    dims = draw(st.lists(st.integers(0, 4), min_size=min_dims, max_size=max_dims))
    if dtype == "F4":
        dims[-1] = 2 * draw(st.integers(0, 3))
    elif dtype in _F6:
        dims[-1] = 4 * draw(st.integers(0, 2))
    return tuple(dims)


# --- tensors ---------------------------------------------------------------------------------


def _torch_shape(dtype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The torch shape holding a spec shape: F4 packs two elements a byte, F6 (which torch
    lacks) is held as its packed bytes, 4 elements in 3 bytes, until written."""
    if dtype == "F4":
        return (*shape[:-1], shape[-1] // 2)
    if dtype in _F6:
        return (*shape[:-1], shape[-1] * 3 // 4)
    return shape


def _spec_shape(dtype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    if dtype == "F4":
        return (*shape[:-1], shape[-1] * 2)
    if dtype in _F6:
        return (*shape[:-1], shape[-1] * 4 // 3)
    return shape


def _make_tensor(dtype: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """A tensor of random bytes (NaN payloads and all); BOOL holds only 0 and 1."""
    torch_dtype = torch.uint8 if dtype in _F6 else DTYPES[dtype].torch_dtype
    assert torch_dtype is not None
    tshape = _torch_shape(dtype, shape)
    count = 1
    for dim in tshape:
        count *= dim
    if count == 0:
        return torch.empty(tshape, dtype=torch_dtype)
    raw = random.Random(seed).randbytes(count * torch_dtype.itemsize)
    if dtype == "BOOL":
        raw = bytes(b & 1 for b in raw)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(torch_dtype).reshape(tshape)


def _blocks(shape: tuple[int, ...], splits: list[tuple[int, int]]
            ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(offset, size) boxes from splitting ``shape`` by each (dim, parts) in turn, as
    ``torch.tensor_split`` divides (SPEC 11.3 rule 4), in row-major order of the splits."""
    boxes = [((0,) * len(shape), shape)]
    for dim, parts in splits:
        out = []
        for offset, size in boxes:
            quotient, remainder = divmod(size[dim], parts)
            start = offset[dim]
            for i in range(parts):
                length = quotient + (i < remainder)
                out.append((offset[:dim] + (start,) + offset[dim + 1:],
                            size[:dim] + (length,) + size[dim + 1:]))
                start += length
        boxes = out
    return boxes


@dataclass(frozen=True)
class TensorPlan:
    """How one tensor of a generated checkpoint is laid out (for reports)."""

    name: str
    kind: str  # "global", "rank-local" or "alias"
    dtype: str
    shape: tuple[int, ...] | None
    holders: tuple[int, ...]
    split: str = ""
    target: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "dtype": self.dtype,
                               "holders": list(self.holders)}
        if self.shape is not None:
            out["shape"] = list(self.shape)
        if self.split:
            out["split"] = self.split
        if self.target is not None:
            out["alias_of"] = self.target
        return out


@dataclass
class CheckpointSpec:
    """A whole checkpoint to write: every rank's tensors and everything around them."""

    layout: Layout
    plans: list[TensorPlan]
    states: dict[int, dict[str, torch.Tensor]]
    sharding: dict[int, dict[str, Shard]]
    #: Tensors of an F6 dtype, held as uint8 placeholders until written.
    f6: dict[str, str] = field(default_factory=dict)
    quantization: Quantization = field(default_factory=Quantization)
    logical: dict[str, Logical] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    #: Extensions with must_understand false, and must-understand ones in ``ignored``.
    extensions: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Must-understand extensions the user allows ignoring (SPEC 4.4 rule 3).
    ignored: tuple[str, ...] = ()
    #: A minor version newer than the writer's (0: the writer's own, ``format_version()``) and
    #: the unknown fields it adds: (where, name, value).
    newer_minor: int = 0
    unknown_fields: list[tuple[str, str, Any]] = field(default_factory=list)
    max_file_size: int = 1 << 30
    #: A directory the data files move into ("" for none).
    subdirectory: str = ""
    extra_files: dict[str, bytes] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.layout.size

    def expected(self) -> dict[int, RankTensors]:
        """What each rank must load: every name it holds (aliases too), as spec dtype, shape
        in elements and bytes."""
        out: dict[int, RankTensors] = {}
        for rank, state in self.states.items():
            out[rank] = {}
            for name, tensor in state.items():
                dtype = self.f6.get(name) or from_torch(tensor.dtype).name
                out[rank][name] = (dtype, _spec_shape(dtype, tuple(tensor.shape)),
                                   tensor_bytes(tensor))
        return out

    def sections(self) -> tuple[str, ...]:
        """The SPEC sections a load of this checkpoint exercises."""
        found = {"5.1", "5.3", "6.1", "6.3", "6.4", "7.1", "7.2", "9.1", "9.2", "11.1"}
        kinds = {p.kind for p in self.plans}
        if self.world_size > 1:
            found.add("5.2")
        if any(p.dtype in _SUB_BYTE for p in self.plans):
            found.add("6.5")
        if "global" in kinds:
            found.add("7.3")
        if any(s.replica for shards in self.sharding.values() for s in shards.values()):
            found.add("7.4")
        if "rank-local" in kinds:
            found.add("7.5")
        if "alias" in kinds:
            found.add("7.6")
        if any(t.dim() == 0 or t.numel() == 0 for s in self.states.values() for t in s.values()):
            found.add("7.7")
        if self.quantization.method != "none" or self.logical:
            found.update({"8.1", "8.2"})
        if self.extensions:
            found.add("4.4")
        if self.newer_minor:
            found.update({"4.2", "4.3"})
        if self.extra_files:
            found.add("2.1")
        if self.subdirectory:
            found.add("2.2")
        return tuple(sorted(found, key=_section_key))

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary of the checkpoint, for reports and kept failures."""
        layout = self.layout
        return {
            "layout": {"tp_size": layout.tp_size, "pp_size": layout.pp_size,
                       "ep_size": layout.ep_size, "rank_order": layout.rank_order},
            "tensors": [p.to_dict() for p in self.plans],
            "quantization": self.quantization.to_dict(),
            "logical": sorted(self.logical),
            "extensions": {k: bool(v.get("must_understand")) for k, v in self.extensions.items()},
            "ignored_by_user": list(self.ignored),
            "format_version": f"1.{self.newer_minor}" if self.newer_minor
            else format_version(),
            "unknown_fields": [f"{where}.{name}" for where, name, _ in self.unknown_fields],
            "max_file_size": self.max_file_size,
            "subdirectory": self.subdirectory,
            "extra_files": sorted(self.extra_files),
        }

    def save(self, path: Path) -> Manifest:
        """Write the checkpoint with the reference writer alone (:func:`shardspec.save`): F6
        tensors stay uint8 placeholders, no subdirectory, the writer's format version. Returns
        its manifest."""
        with tempfile.TemporaryDirectory() as sources:
            extra = {}
            for name, data in self.extra_files.items():
                source = Path(sources) / name.replace("/", "_")
                source.write_bytes(data)
                extra[name] = source
            return save(self.states, path, layout=self.layout, sharding=self.sharding,
                        quantization=self.quantization, logical=self.logical,
                        extra_files=extra, max_file_size=self.max_file_size,
                        metadata=self.metadata, extensions=self.extensions)

    def write(self, path: Path) -> GeneratedCheckpoint:
        """Write the whole checkpoint at ``path`` (which must not exist or be empty): the
        reference writer's output, then F6 dtypes, the subdirectory and the newer minor
        version it cannot write itself."""
        manifest = self.save(path)
        aliases = frozenset(n for n, t in manifest.tensors.items() if isinstance(t, Alias))
        record = manifest.to_dict()
        if self.f6:
            _write_f6(path, record, self.f6)
        if self.subdirectory:
            _move_into(path, record, self.subdirectory)
        if self.f6 or self.subdirectory:
            (path / MANIFEST_NAME).write_bytes(Manifest.from_dict(record).to_json())
        if self.newer_minor:
            _newer_minor(path, record, self.newer_minor, self.unknown_fields)
        return GeneratedCheckpoint(path=path, spec=self, expected=self.expected(),
                                   aliases=aliases)


@dataclass
class GeneratedCheckpoint:
    """A checkpoint on disk and what each rank must load from it."""

    path: Path
    spec: CheckpointSpec
    expected: dict[int, RankTensors]
    #: Names the manifest records as aliases (SPEC 7.6).
    aliases: frozenset[str]

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    @property
    def ignore_extensions(self) -> tuple[str, ...]:
        return self.spec.ignored


def _section_key(section: str) -> tuple[int, ...]:
    return tuple(int(part) for part in section.split(".")) if section[0].isdigit() else (999,)


# --- writing what the reference writer cannot ------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _file_records(data: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for rank in data["ranks"]:
        yield from rank["files"]
    yield from data.get("extra_files", [])


def _refresh_record(root: Path, data: dict[str, Any], path: str) -> None:
    for record in _file_records(data):
        if record["path"] == path:
            record["size"] = (root / path).stat().st_size
            record["checksums"] = {"sha256": _sha256(root / path)}


def _read_st(path: Path) -> tuple[dict[str, Any], bytes]:
    blob = path.read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + length]), blob[8 + length :]


def _st_bytes(header: dict[str, Any] | bytes, data: bytes, pad: bytes = b" ") -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(
        header, separators=(",", ":"), ensure_ascii=False).encode()
    text += pad * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + data


def _write_f6(root: Path, data: dict[str, Any], f6: dict[str, str]) -> None:
    """Relabel the uint8 placeholders of F6 tensors with their dtype and element shapes
    (they are never split along their last dimension, so offsets keep a last coordinate 0)."""
    files: set[str] = set()
    for name, record in data["tensors"].items():
        if name not in f6 or "alias_of" in record:
            continue
        record["dtype"] = f6[name]
        if "shape" in record:
            record["shape"] = list(_spec_shape(f6[name], tuple(record["shape"])))
        for piece in record["pieces"]:
            piece["shape"] = list(_spec_shape(f6[name], tuple(piece["shape"])))
            files.add(piece["file"])
    for path in sorted(files):
        header, blob = _read_st(root / path)
        for name, entry in header.items():
            if name in f6:
                entry["dtype"] = f6[name]
                entry["shape"] = list(_spec_shape(f6[name], tuple(entry["shape"])))
        (root / path).write_bytes(_st_bytes(header, blob))
        _refresh_record(root, data, path)


def _move_into(root: Path, data: dict[str, Any], directory: str) -> None:
    """Move every data file into ``directory`` (SPEC 2.2 allows any relative path)."""
    (root / directory).mkdir(parents=True, exist_ok=True)
    moved = {}
    for rank in data["ranks"]:
        for record in rank["files"]:
            new = f"{directory}/{record['path']}"
            os.replace(root / record["path"], root / new)
            moved[record["path"]] = new
            record["path"] = new
    for record in data["tensors"].values():
        for piece in record.get("pieces", []):
            piece["file"] = moved[piece["file"]]


def _newer_minor(root: Path, data: dict[str, Any], minor: int,
                 fields: list[tuple[str, str, Any]]) -> None:
    """Rewrite the manifest as format 1.<minor> with fields the writer's version does not know,
    which a reader of that version must ignore (4.3)."""
    data = copy.deepcopy(data)
    data["format_version"] = f"1.{minor}"
    for where, name, value in fields:
        for target in _places(data, where):
            target[name] = value
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    (root / MANIFEST_NAME).write_bytes(text.encode())


def _places(data: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The objects of a kind (SPEC 4.3 rule 1) that can hold unknown fields."""
    records = [r for r in data["tensors"].values()]
    if where == "manifest":
        return [data]
    if where == "layout":
        return [data["layout"]]
    if where == "quantization":
        return [data["quantization"]]
    if where == "rank":
        return list(data["ranks"])
    if where == "file":
        return list(_file_records(data))
    if where == "tensor":
        return records
    if where == "piece":
        return [p for r in records for p in r.get("pieces", [])]
    if where == "logical":
        return [r["logical"] for r in records if "logical" in r]
    raise ValueError(where)


_UNKNOWN_PLACES = ("manifest", "layout", "quantization", "rank", "file", "tensor", "piece",
                   "logical")


# --- whole checkpoints -----------------------------------------------------------------------


def _place_global(draw: st.DrawFn, spec: CheckpointSpec, name: str, seed: int) -> TensorPlan:
    """A global tensor on one pipeline stage, split along tensor- and expert-parallel ranks,
    replicated, or held whole by one rank."""
    layout = spec.layout
    dtype = draw(dtypes(), label=f"{name} dtype")
    shape = draw(shapes(dtype), label=f"{name} shape")
    base = _make_tensor(dtype, shape, seed)
    tshape = tuple(base.shape)
    # F6 is held as placeholder bytes: never split it along its last dimension.
    dims = list(range(len(tshape) - 1 if dtype in _F6 else len(tshape)))
    stage = draw(st.integers(0, layout.pp_size - 1))
    tp_mode = draw(st.sampled_from(["split", "replicate", "single"]))
    tp_dim = draw(st.sampled_from(dims)) if tp_mode == "split" and dims else None
    ep_dim = None
    if layout.ep_size > 1 and dims and draw(st.booleans()):
        ep_dim = draw(st.sampled_from(dims))
    splits = ([(ep_dim, layout.ep_size)] if ep_dim is not None else []) + \
        ([(tp_dim, layout.tp_size)] if tp_dim is not None else [])
    boxes = _blocks(tshape, splits)
    scale = 2 if dtype == "F4" else 1  # Shard offsets count elements; F4 packs two a byte
    global_shape = (*tshape[:-1], tshape[-1] * scale) if tshape else ()
    held: list[int] = []
    seen: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    for rank in range(layout.size):
        c = layout.coordinates(rank)
        if c["pp_rank"] != stage or (tp_mode == "single" and c["tp_rank"] != 0):
            continue
        index = (c["ep_rank"] if ep_dim is not None else 0) * \
            (layout.tp_size if tp_dim is not None else 1) + \
            (c["tp_rank"] if tp_dim is not None else 0)
        offset, size = boxes[index]
        piece = base[tuple(slice(o, o + s) for o, s in zip(offset, size, strict=True))]
        offset = (*offset[:-1], offset[-1] * scale) if offset else ()
        key = (offset, size)
        replica = seen[key] = seen.get(key, -1) + 1
        spec.states[rank][name] = piece
        spec.sharding[rank][name] = Shard(global_shape, offset, replica)
        held.append(rank)
    if dtype in _F6:
        spec.f6[name] = dtype
    how = ", ".join(f"{axis} dim {dim}" for axis, dim in (("ep", ep_dim), ("tp", tp_dim))
                    if dim is not None) or ("whole on one rank" if tp_mode == "single"
                                            else "replicated")
    return TensorPlan(name, "global", dtype, shape, tuple(held), f"stage {stage}, {how}")


def _place_local(draw: st.DrawFn, spec: CheckpointSpec, name: str, seed: int) -> TensorPlan:
    """A rank-local tensor (SPEC 7.5): each holder's piece has a shape of its own."""
    dtype = draw(dtypes(), label=f"{name} dtype")
    holders = sorted(draw(st.sets(st.integers(0, spec.world_size - 1), min_size=1)))
    for rank in holders:
        shape = draw(shapes(dtype), label=f"{name} shape on rank {rank}")
        spec.states[rank][name] = _make_tensor(dtype, shape, seed + rank)
    if dtype in _F6:
        spec.f6[name] = dtype
    return TensorPlan(name, "rank-local", dtype, None, tuple(holders))


def _place_alias(draw: st.DrawFn, spec: CheckpointSpec, name: str) -> TensorPlan | None:
    """Another name for an earlier tensor, the same object on every rank holding it (7.6)."""
    targets = [p for p in spec.plans if p.kind != "alias" and p.holders]
    if not targets:
        return None
    target = draw(st.sampled_from(targets))
    for rank in target.holders:
        spec.states[rank][name] = spec.states[rank][target.name]
        if target.name in spec.sharding[rank]:
            spec.sharding[rank][name] = spec.sharding[rank][target.name]
    if target.name in spec.f6:
        spec.f6[name] = spec.f6[target.name]
    return TensorPlan(name, "alias", target.dtype, target.shape, target.holders,
                      target=target.name)


@st.composite
def checkpoint_specs(draw: st.DrawFn, max_world: int = 4, max_tensors: int = 6
                     ) -> CheckpointSpec:
    """A whole checkpoint, not yet written (see :meth:`CheckpointSpec.write`)."""
    layout = draw(layouts(max_world), label="layout")
    spec = CheckpointSpec(layout=layout, plans=[], states={r: {} for r in range(layout.size)},
                          sharding={r: {} for r in range(layout.size)})
    count = draw(st.integers(0, max_tensors), label="tensors")
    names = draw(st.lists(tensor_names(), min_size=count, max_size=count, unique=True),
                 label="names")
    seed = draw(st.integers(0, 2**32 - 1), label="data seed")
    for i, name in enumerate(names):
        kind = draw(st.sampled_from(["global", "global", "rank-local", "alias"]),
                    label=f"{name} kind")
        plan = _place_alias(draw, spec, name) if kind == "alias" else None
        if plan is None:
            place = _place_local if kind == "rank-local" else _place_global
            plan = place(draw, spec, name, seed + 1000 * i)
        spec.plans.append(plan)
    method = draw(st.sampled_from(["none", "fp8", "awq", "gptq", "compressed-tensors"])
                  | st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,15}", fullmatch=True))
    config = {} if method == "none" else draw(st.dictionaries(_text, json_values(), max_size=3))
    spec.quantization = Quantization(method=method, config=config)
    for plan in spec.plans:
        if plan.kind != "alias" and plan.name not in spec.f6 and draw(st.booleans()):
            spec.logical[plan.name] = Logical(
                dtype=draw(dtypes()), shape=tuple(draw(st.lists(st.integers(0, 64),
                                                                max_size=3))))
    spec.metadata = draw(st.dictionaries(_text, _text, max_size=3))
    optional = draw(st.dictionaries(extension_names(), st.dictionaries(_text, json_values(),
                                                                       max_size=2), max_size=2))
    spec.extensions = {n: {**record, "must_understand": False} for n, record in optional.items()}
    if draw(st.booleans()):
        name = draw(extension_names().filter(lambda n: n not in spec.extensions))
        spec.extensions[name] = {"must_understand": True, "note": "safe to ignore"}
        spec.ignored = (name,)
    if draw(st.integers(0, 3)) == 0:
        spec.newer_minor = draw(st.integers(SUPPORTED_MINOR + 1, 999999))
        spec.unknown_fields = [
            (where, "x_" + draw(st.from_regex(r"[a-z_]{1,10}", fullmatch=True)), value)
            for where, value in draw(st.lists(st.tuples(st.sampled_from(_UNKNOWN_PLACES),
                                                        json_values(3)), min_size=1,
                                              max_size=3))]
    spec.max_file_size = draw(st.sampled_from([1 << 30, 1, 64]))
    spec.subdirectory = draw(st.sampled_from(["", "weights", "données/шарды"]))
    spec.extra_files = draw(st.dictionaries(
        st.sampled_from(["config.json", "tokenizer/tokenizer.json", "generation_config.json"]),
        st.binary(max_size=32), max_size=2))
    return spec


def checkpoints(directory: Callable[[], Path], **kwargs: Any
                ) -> st.SearchStrategy[GeneratedCheckpoint]:
    """Written checkpoints: each drawn spec is written to ``directory() / "ckpt"``, where
    ``directory`` returns a fresh, empty directory each call (for example a ``mkdtemp``)."""
    return checkpoint_specs(**kwargs).map(lambda spec: spec.write(directory() / "ckpt"))


# --- broken checkpoints ----------------------------------------------------------------------


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
class _File:
    path: str
    owner: int
    header: dict[str, Any]
    data_size: int


@dataclass(frozen=True)
class _Context:
    m: dict[str, Any]
    written: GeneratedCheckpoint
    files: tuple[_File, ...]

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


def _edit_manifest(edit: Callable[[dict[str, Any]], object]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        data = json.loads((root / MANIFEST_NAME).read_bytes())
        edit(data)
        (root / MANIFEST_NAME).write_bytes(json.dumps(data, indent=1, ensure_ascii=False)
                                           .encode())
    return apply


def _edit_text(edit: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        (root / MANIFEST_NAME).write_bytes(edit((root / MANIFEST_NAME).read_bytes()))
    return apply


def _then(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        for step in steps:
            step(root)
    return apply


def _placeholder(where: Callable[[dict[str, Any]], None], token: str) -> Callable[[Path], None]:
    """Put the marker string somewhere, then replace it in the text by a raw JSON token."""
    return _then(_edit_manifest(where),
                 _edit_text(lambda text: text.replace(b'"@@TOKEN@@"', token.encode())))


_Builder = Callable[[st.DrawFn, _Context], Mutation]
_MUTATIONS: list[tuple[str, Callable[[_Context], bool], _Builder]] = []


def _mutation(kind: str, when: Callable[[_Context], bool] = lambda ctx: True
              ) -> Callable[[_Builder], _Builder]:
    def register(builder: _Builder) -> _Builder:
        _MUTATIONS.append((kind, when, builder))
        return builder
    return register


def _manifest_level(kind: str, code: str, section: str, description: str, ctx: _Context,
                    edit: Callable[[Path], None]) -> Mutation:
    return Mutation(kind, code, section, description, ctx.all_ranks, edit)


@_mutation("version-major")
def _version_major(draw: st.DrawFn, ctx: _Context) -> Mutation:
    version = draw(st.sampled_from(["2.0", "0.9", "3.1", "10.0", "999999.999999"]))
    restructured = draw(st.booleans())

    def edit(m: dict[str, Any]) -> None:
        m["format_version"] = version
        if restructured:
            m["shards"] = [{"tensors": sorted(m.pop("tensors"))}]

    what = " with a restructured manifest" if restructured else ""
    return _manifest_level("version-major", "version-major", "4.2",
                           f"format_version {version}{what}: an unknown major version",
                           ctx, _edit_manifest(edit))


@_mutation("extension-unsupported")
def _extension(draw: st.DrawFn, ctx: _Context) -> Mutation:
    name = draw(extension_names().filter(lambda n: n not in ctx.written.ignore_extensions))
    extra = draw(st.dictionaries(_text, json_values(3), max_size=2))
    return _manifest_level(
        "extension-unsupported", "extension-unsupported", "4.4",
        f"a must-understand extension {name!r} no reader knows", ctx,
        _edit_manifest(lambda m: m.setdefault("extensions", {}).__setitem__(
            name, {**extra, "must_understand": True})))


@_mutation("json-syntax")
def _json_syntax(draw: st.DrawFn, ctx: _Context) -> Mutation:
    variants: dict[str, Callable[[bytes], bytes]] = {
        "a trailing comma": lambda t: t.rstrip()[:-1].rstrip() + b",\n}\n",
        "a comment": lambda t: b"/* written by hand */ " + t,
        "two JSON values": lambda t: t + t,
        "single quotes": lambda t: t.replace(b'"format"', b"'format'", 1),
    }
    what = draw(st.sampled_from(sorted(variants)))
    return _manifest_level("json-syntax", "json-syntax", "3.2", f"the manifest has {what}",
                           ctx, _edit_text(variants[what]))


@_mutation("json-encoding")
def _json_encoding(draw: st.DrawFn, ctx: _Context) -> Mutation:
    variants: dict[str, Callable[[bytes], bytes]] = {
        "starts with a byte order mark": lambda t: b"\xef\xbb\xbf" + t,
        "holds a byte that is not UTF-8": lambda t: t.replace(b'"shardspec"', b'"shard\xe9spec"',
                                                              1),
    }
    what = draw(st.sampled_from(sorted(variants)))
    return _manifest_level("json-encoding", "json-encoding", "3.2", f"the manifest {what}",
                           ctx, _edit_text(variants[what]))


@_mutation("json-duplicate-name")
def _json_duplicate(draw: st.DrawFn, ctx: _Context) -> Mutation:
    return _manifest_level(
        "json-duplicate-name", "json-duplicate-name", "3.3",
        "the manifest names 'format' twice", ctx,
        _edit_text(lambda t: t.replace(b"{", b'{"format": "shardspec", ', 1)))


@_mutation("json-nonfinite")
def _json_nonfinite(draw: st.DrawFn, ctx: _Context) -> Mutation:
    token = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e999"]))
    return _manifest_level(
        "json-nonfinite", "json-nonfinite", "3.3", f"quantization.config holds {token}", ctx,
        _placeholder(lambda m: m["quantization"].__setitem__("config", {"loss": "@@TOKEN@@"}),
                     token))


@_mutation("json-too-deep")
def _json_too_deep(draw: st.DrawFn, ctx: _Context) -> Mutation:
    depth = draw(st.sampled_from([62, 100, 5000]))
    return _manifest_level(
        "json-too-deep", "json-too-deep", "3.4",
        f"{depth} nested arrays in quantization.config (depth {depth + 3})", ctx,
        _placeholder(lambda m: m["quantization"].__setitem__("config", {"x": "@@TOKEN@@"}),
                     "[" * depth + "]" * depth))


def _schema_variants(ctx: _Context) -> dict[str, Callable[[Path], None]]:
    def setter(*path: Any, value: Any) -> Callable[[Path], None]:
        def edit(m: dict[str, Any]) -> None:
            target = m
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
        return _edit_manifest(edit)

    tp = ctx.m["layout"]["tp_size"]
    variants = {
        "the magic is 'safetensors'": setter("format", value="safetensors"),
        "quantization is missing": _edit_manifest(lambda m: m.pop("quantization")),
        "layout is missing": _edit_manifest(lambda m: m.pop("layout")),
        f"layout.tp_size is written {tp}.0": _placeholder(
            lambda m: m["layout"].__setitem__("tp_size", "@@TOKEN@@"), f"{tp}.0"),
        "rank_order is 'pp-tp'": setter("layout", "rank_order", value="pp-tp"),
        "an extra file's path is '../config.json'": _edit_manifest(
            lambda m: m.setdefault("extra_files", []).append(
                {"path": "../config.json", "size": 0, "checksums": {"sha256": "0" * 64}})),
        "generator has 257 characters": setter("generator", value="g" * 257),
        "a checksum is upper-case hex": _edit_manifest(
            lambda m: next(_file_records(m))["checksums"].update(sha256="A" * 64)),
    }
    if not any(True for _ in _file_records(ctx.m)):
        del variants["a checksum is upper-case hex"]
    if ctx.m["format_version"] == format_version():  # not a newer minor: unknown is an error
        variants[f"an unknown top-level member in a {format_version()} manifest"] = setter(
            "load_hints", value={"prefetch": True})
    if ctx.tensors():
        name = ctx.tensors()[0]
        variants[f"tensor {name!r} has dtype 'FP32'"] = setter("tensors", name, "dtype",
                                                               value="FP32")
    return variants


@_mutation("schema")
def _schema(draw: st.DrawFn, ctx: _Context) -> Mutation:
    variants = _schema_variants(ctx)
    what = draw(st.sampled_from(sorted(variants)))
    return _manifest_level("schema", "schema", "3.5", what, ctx, variants[what])


@_mutation("layout-world-size")
def _world_size(draw: st.DrawFn, ctx: _Context) -> Mutation:
    more = draw(st.integers(1, 3))
    return _manifest_level(
        "layout-world-size", "layout-world-size", "5.1",
        f"world_size is {ctx.world + more}, the sizes multiply to {ctx.world}", ctx,
        _edit_manifest(lambda m: m["layout"].__setitem__("world_size", ctx.world + more)))


@_mutation("layout-ranks", lambda ctx: ctx.world > 1)
def _swap_ranks(draw: st.DrawFn, ctx: _Context) -> Mutation:
    i = draw(st.integers(0, ctx.world - 2))
    j = draw(st.integers(i + 1, ctx.world - 1))

    def edit(m: dict[str, Any]) -> None:
        m["ranks"][i], m["ranks"][j] = m["ranks"][j], m["ranks"][i]

    return _manifest_level("layout-ranks", "layout-ranks", "5.3",
                           f"the records of ranks {i} and {j} are swapped", ctx,
                           _edit_manifest(edit))


@_mutation("layout-rank-order")
def _rank_order(draw: st.DrawFn, ctx: _Context) -> Mutation:
    rank = draw(st.integers(0, ctx.world - 1))
    axis = draw(st.sampled_from(["tp_rank", "pp_rank", "ep_rank"]))
    value = ctx.m["ranks"][rank][axis] + 1
    return _manifest_level(
        "layout-rank-order", "layout-rank-order", "5.2",
        f"rank {rank} claims {axis} {value}", ctx,
        _edit_manifest(lambda m: m["ranks"][rank].__setitem__(axis, value)))


def _pick_piece(draw: st.DrawFn, ctx: _Context, names: list[str]) -> tuple[str, int]:
    name = draw(st.sampled_from(names))
    return name, draw(st.integers(0, len(ctx.m["tensors"][name]["pieces"]) - 1))


@_mutation("piece-rank", lambda ctx: bool(ctx.tensors()))
def _piece_rank(draw: st.DrawFn, ctx: _Context) -> Mutation:
    name, index = _pick_piece(draw, ctx, ctx.tensors())
    rank = ctx.world + draw(st.integers(0, 100))
    return _manifest_level(
        "piece-rank", "piece-rank", "7.2", f"a piece of {name!r} is on rank {rank} of "
        f"{ctx.world}", ctx,
        _edit_manifest(lambda m: m["tensors"][name]["pieces"][index].__setitem__("rank", rank)))


@_mutation("piece-duplicate", lambda ctx: bool(ctx.tensors()))
def _piece_duplicate(draw: st.DrawFn, ctx: _Context) -> Mutation:
    name, index = _pick_piece(draw, ctx, ctx.tensors())

    def edit(m: dict[str, Any]) -> None:
        pieces = m["tensors"][name]["pieces"]
        twin = copy.deepcopy(pieces[index])
        if "offset" in twin:
            twin["replica"] = 65535
        pieces.append(twin)

    return _manifest_level("piece-duplicate", "piece-duplicate", "7.2",
                           f"a rank holds two pieces of {name!r}", ctx, _edit_manifest(edit))


@_mutation("piece-bounds", lambda ctx: bool(ctx.tensors("global")))
def _piece_bounds(draw: st.DrawFn, ctx: _Context) -> Mutation:
    name, index = _pick_piece(draw, ctx, ctx.tensors("global"))
    shape = ctx.m["tensors"][name]["shape"]
    piece = ctx.m["tensors"][name]["pieces"][index]
    if shape:
        d = draw(st.integers(0, len(shape) - 1))
        offset = list(piece["offset"])
        offset[d] = shape[d] - piece["shape"][d] + 1
    else:
        offset = [0]

    return _manifest_level(
        "piece-bounds", "piece-bounds", "7.2",
        f"a piece of {name!r} {shape} at offset {offset} runs outside it", ctx,
        _edit_manifest(lambda m: m["tensors"][name]["pieces"][index].__setitem__("offset",
                                                                                  offset)))


def _count(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _growable(ctx: _Context) -> list[tuple[str, int]]:
    """(tensor, dim) where growing the dimension by one leaves elements nobody holds."""
    out = []
    for name in ctx.tensors("global"):
        shape = ctx.m["tensors"][name]["shape"]
        for d in range(len(shape)):
            if all(n > 0 for i, n in enumerate(shape) if i != d):
                out.append((name, d))
    return out


@_mutation("coverage-gap", lambda ctx: bool(_growable(ctx)))
def _coverage_gap(draw: st.DrawFn, ctx: _Context) -> Mutation:
    name, d = draw(st.sampled_from(_growable(ctx)))
    shape = list(ctx.m["tensors"][name]["shape"])
    shape[d] += 1
    return _manifest_level(
        "coverage-gap", "coverage-gap", "7.3",
        f"{name!r} is recorded as {shape}, one more than its pieces cover along dim {d}",
        ctx, _edit_manifest(lambda m: m["tensors"][name].__setitem__("shape", shape)))


def _replicas(ctx: _Context, dims: int = 0) -> list[tuple[str, int]]:
    """Replica pieces (k > 0) with elements (and a dimension of at least 2 when ``dims``)."""
    out = []
    for name in ctx.tensors("global"):
        record = ctx.m["tensors"][name]
        for index, piece in enumerate(record["pieces"]):
            if piece.get("replica", 0) and _count(piece["shape"]) and (
                    not dims or record["dtype"] not in _SUB_BYTE
                    and any(n >= 2 for n in piece["shape"])):
                out.append((name, index))
    return out


@_mutation("coverage-overlap", lambda ctx: bool(_replicas(ctx)))
def _coverage_overlap(draw: st.DrawFn, ctx: _Context) -> Mutation:
    name, index = draw(st.sampled_from(_replicas(ctx)))
    return _manifest_level(
        "coverage-overlap", "coverage-overlap", "7.3",
        f"a replica of {name!r} is numbered 0: two primary pieces overlap", ctx,
        _edit_manifest(lambda m: m["tensors"][name]["pieces"][index].pop("replica")))


@_mutation("replica-mismatch", lambda ctx: bool(_replicas(ctx, dims=1)))
def _replica_mismatch(draw: st.DrawFn, ctx: _Context) -> Mutation:
    name, index = draw(st.sampled_from(_replicas(ctx, dims=1)))
    shape = list(ctx.m["tensors"][name]["pieces"][index]["shape"])
    d = next(i for i, n in enumerate(shape) if n >= 2)
    shape[d] -= 1
    return _manifest_level(
        "replica-mismatch", "replica-mismatch", "7.4",
        f"a replica of {name!r} has shape {shape}, which no primary piece has", ctx,
        _edit_manifest(lambda m: m["tensors"][name]["pieces"][index].__setitem__("shape",
                                                                                 shape)))


@_mutation("alias-target")
def _alias_target(draw: st.DrawFn, ctx: _Context) -> Mutation:
    names = set(ctx.m["tensors"])
    alias = next(f"alias.{i}" for i in range(len(names) + 1) if f"alias.{i}" not in names)
    choices = {"a missing tensor": next(f"missing.{i}" for i in range(len(names) + 1)
                                        if f"missing.{i}" not in names),
               "itself": alias}
    if ctx.tensors("alias"):
        choices["another alias"] = ctx.tensors("alias")[0]
    what = draw(st.sampled_from(sorted(choices)))
    target = choices[what]
    return _manifest_level(
        "alias-target", "alias-target", "7.6", f"{alias!r} is an alias of {what}", ctx,
        _edit_manifest(lambda m: m["tensors"].__setitem__(alias, {"alias_of": target})))


@_mutation("file-rank", lambda ctx: bool(ctx.tensors()))
def _file_rank(draw: st.DrawFn, ctx: _Context) -> Mutation:
    name, index = _pick_piece(draw, ctx, ctx.tensors())
    listed = {r["path"] for r in _file_records(ctx.m)}
    path = next(f"unlisted-{i}.safetensors" for i in range(len(listed) + 1)
                if f"unlisted-{i}.safetensors" not in listed)
    return _manifest_level(
        "file-rank", "file-rank", "6.1", f"a piece of {name!r} names {path!r}, which no rank "
        "lists", ctx,
        _edit_manifest(lambda m: m["tensors"][name]["pieces"][index].__setitem__("file", path)))


@_mutation("file-duplicate", lambda ctx: bool(ctx.files))
def _file_duplicate(draw: st.DrawFn, ctx: _Context) -> Mutation:
    file = draw(st.sampled_from(ctx.files))
    return _manifest_level(
        "file-duplicate", "file-duplicate", "2.1",
        f"{file.path!r} is listed again as an extra file", ctx,
        _edit_manifest(lambda m: m.setdefault("extra_files", []).append(copy.deepcopy(
            next(r for r in _file_records(m) if r["path"] == file.path)))))


@_mutation("path-unsafe")
def _path_unsafe(draw: st.DrawFn, ctx: _Context) -> Mutation:
    path = draw(st.sampled_from([MANIFEST_NAME, "/".join(["é" * 100] * 6)]))
    record = {"path": path, "size": 0, "checksums": {"sha256": "0" * 64}}
    what = "the manifest itself" if path == MANIFEST_NAME else "a path of 1205 UTF-8 bytes"
    return _manifest_level(
        "path-unsafe", "path-unsafe", "2.2" if path != MANIFEST_NAME else "2.1",
        f"an extra file is {what}", ctx,
        _edit_manifest(lambda m: m.setdefault("extra_files", []).append(record)))


@_mutation("not-committed")
def _not_committed(draw: st.DrawFn, ctx: _Context) -> Mutation:
    return _manifest_level("not-committed", "not-committed", "2.3",
                           "shardspec.json was never written", ctx,
                           lambda root: (root / MANIFEST_NAME).unlink())


@_mutation("shape-overflow", lambda ctx: bool(ctx.tensors()))
def _shape_overflow(draw: st.DrawFn, ctx: _Context) -> Mutation:
    name = draw(st.sampled_from(ctx.tensors()))
    shape = draw(st.sampled_from([[2**62, 4], [2**32, 2**32], [2**63 - 1, 2]]))
    return _manifest_level(
        "shape-overflow", "shape-overflow", "7.1",
        f"{name!r} has the logical shape {shape}, over 2^63 - 1 elements", ctx,
        _edit_manifest(lambda m: m["tensors"][name].__setitem__(
            "logical", {"dtype": "BF16", "shape": shape})))


# data files: only the owner's load must fail


def _data_files(ctx: _Context, entries: bool = False) -> list[_File]:
    return [f for f in ctx.files if not entries or any(
        name != "__metadata__" for name in f.header)]


def _file_level(kind: str, code: str, section: str, description: str, file: _File,
                edit: Callable[[Path], None], refresh: bool = True) -> Mutation:
    def apply(root: Path) -> None:
        edit(root / file.path)
        if refresh:
            _edit_manifest(lambda m: _refresh_record(root, m, file.path))(root)

    return Mutation(kind, code, section, f"{file.path!r} (rank {file.owner}): {description}",
                    (file.owner,), apply)


def _rewrite(header_edit: Callable[[dict[str, Any]], object] | None = None, *,
             pad: bytes = b" ") -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        header, data = _read_st(path)
        if header_edit is not None:
            header_edit(header)
        path.write_bytes(_st_bytes(header, data, pad))
    return edit


def _entry(draw: st.DrawFn, file: _File) -> str:
    return draw(st.sampled_from(sorted(n for n in file.header if n != "__metadata__")))


@_mutation("file-size", lambda ctx: bool(ctx.files))
def _file_size(draw: st.DrawFn, ctx: _Context) -> Mutation:
    file, extra = draw(st.sampled_from(ctx.files)), draw(st.integers(1, 16))

    def append(path: Path) -> None:
        with path.open("ab") as handle:
            handle.write(bytes(extra))

    return _file_level("file-size", "file-size", "9.1",
                       f"{extra} bytes appended; the manifest keeps the old size", file, append,
                       refresh=False)


@_mutation("checksum-mismatch", lambda ctx: any(f.data_size for f in ctx.files))
def _checksum(draw: st.DrawFn, ctx: _Context) -> Mutation:
    file = draw(st.sampled_from([f for f in ctx.files if f.data_size]))
    back, bit = draw(st.integers(1, file.data_size)), draw(st.integers(0, 7))

    def flip(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[-back] ^= 1 << bit
        path.write_bytes(bytes(data))

    return _file_level("checksum-mismatch", "checksum-mismatch", "9.2",
                       f"bit {bit} of data byte -{back} flipped (same size)", file, flip,
                       refresh=False)


@_mutation("file-missing", lambda ctx: bool(ctx.files))
def _file_missing(draw: st.DrawFn, ctx: _Context) -> Mutation:
    file = draw(st.sampled_from(ctx.files))
    return _file_level("file-missing", "file-missing", "2.1", "the file is missing", file,
                       lambda path: path.unlink(), refresh=False)


@_mutation("file-not-regular", lambda ctx: bool(ctx.files))
def _not_regular(draw: st.DrawFn, ctx: _Context) -> Mutation:
    file = draw(st.sampled_from(ctx.files))

    def directory(path: Path) -> None:
        path.unlink()
        path.mkdir()

    return _file_level("file-not-regular", "file-not-regular", "2.2", "the file is a directory",
                       file, directory, refresh=False)


@_mutation("path-escapes", lambda ctx: bool(ctx.files))
def _path_escapes(draw: st.DrawFn, ctx: _Context) -> Mutation:
    file = draw(st.sampled_from(ctx.files))
    depth = file.path.count("/")

    def link_outside(path: Path) -> None:
        outside = path.parents[depth].parent / "outside" / path.name
        outside.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), outside)
        os.symlink(os.path.relpath(outside, path.parent), path)

    return _file_level("path-escapes", "path-escapes", "2.2",
                       "a symbolic link to a file outside the checkpoint", file, link_outside,
                       refresh=False)


@_mutation("st-header-length", lambda ctx: bool(ctx.files))
def _header_length(draw: st.DrawFn, ctx: _Context) -> Mutation:
    file = draw(st.sampled_from(ctx.files))
    how = draw(st.sampled_from(["past the end", "over the limit", "truncated file"]))

    def edit(path: Path) -> None:
        blob = path.read_bytes()
        if how == "past the end":
            blob = struct.pack("<Q", len(blob)) + blob[8:]
        elif how == "over the limit":
            blob = struct.pack("<Q", 100_000_001) + blob[8:]
        else:
            blob = blob[:5]
        path.write_bytes(blob)

    return _file_level("st-header-length", "st-header-length", "6.3",
                       f"the header length is {how}", file, edit)


@_mutation("st-header-json", lambda ctx: bool(ctx.files))
def _header_json(draw: st.DrawFn, ctx: _Context) -> Mutation:
    file = draw(st.sampled_from(ctx.files))
    how = draw(st.sampled_from(["tab padding", "a leading space", "trailing garbage"]))

    def edit(path: Path) -> None:
        header, data = _read_st(path)
        text = json.dumps(header, separators=(",", ":")).encode()
        if how == "a leading space":
            text = b" " + text
        elif how == "trailing garbage":
            text += b"\x00garbage"
        else:  # at least one tab, whatever the alignment
            text += b"\t"
        path.write_bytes(_st_bytes(text, data, b"\t" if how == "tab padding" else b" "))

    return _file_level("st-header-json", "st-header-json", "6.3", f"the header has {how}",
                       file, edit)


@_mutation("st-duplicate-key", lambda ctx: bool(ctx.files))
def _duplicate_key(draw: st.DrawFn, ctx: _Context) -> Mutation:
    file = draw(st.sampled_from(ctx.files))

    def edit(path: Path) -> None:
        header, data = _read_st(path)
        key = "__metadata__" if "__metadata__" in header else next(iter(header), None)
        if key is None:
            text = b'{"__metadata__":{},"__metadata__":{}}'
        else:
            text = json.dumps(header, separators=(",", ":")).encode()[:-1] + b"," + \
                json.dumps({key: header[key]}, separators=(",", ":")).encode()[1:]
        path.write_bytes(_st_bytes(text, data))

    return _file_level("st-duplicate-key", "st-duplicate-key", "6.3",
                       "the header names a member twice", file, edit)


@_mutation("st-dtype", lambda ctx: bool(_data_files(ctx, entries=True)))
def _st_dtype(draw: st.DrawFn, ctx: _Context) -> Mutation:
    file = draw(st.sampled_from(_data_files(ctx, entries=True)))
    name = _entry(draw, file)
    dtype = file.header[name]["dtype"]
    wrong = draw(st.sampled_from([dtype.lower(), {"F8_E4M3": "F8_E4M3FN"}.get(dtype, "FP32")]))
    return _file_level("st-dtype", "st-dtype", "6.4", f"{name!r} has the dtype {wrong!r}", file,
                       _rewrite(lambda h: h[name].__setitem__("dtype", wrong)))


@_mutation("st-size", lambda ctx: bool(_data_files(ctx, entries=True)))
def _st_size(draw: st.DrawFn, ctx: _Context) -> Mutation:
    file = draw(st.sampled_from(_data_files(ctx, entries=True)))
    name = _entry(draw, file)
    old = list(file.header[name]["shape"])
    if old and _count(old):
        shape = [old[0] + 1, *old[1:]]  # more elements in the same bytes
    else:  # a scalar gets two elements; an empty tensor some
        shape = [max(d, 1) for d in old] if old else [2]
    return _file_level("st-size", "st-size", "6.3",
                       f"{name!r} claims shape {shape} but keeps its byte span", file,
                       _rewrite(lambda h: h[name].__setitem__("shape", shape)))


@_mutation("st-offsets", lambda ctx: bool(ctx.files))
def _st_offsets(draw: st.DrawFn, ctx: _Context) -> Mutation:
    file, extra = draw(st.sampled_from(ctx.files)), draw(st.integers(1, 16))

    def append(path: Path) -> None:
        with path.open("ab") as handle:
            handle.write(b"PK" + bytes(extra))

    return _file_level("st-offsets", "st-offsets", "6.3",
                       f"{extra + 2} bytes follow the last tensor", file, append)


@_mutation("st-extra-tensor", lambda ctx: bool(ctx.files))
def _extra_tensor(draw: st.DrawFn, ctx: _Context) -> Mutation:
    file = draw(st.sampled_from(ctx.files))
    name = draw(tensor_names().filter(lambda n: n not in file.header))

    def edit(path: Path) -> None:
        header, data = _read_st(path)
        header[name] = {"dtype": "U8", "shape": [3], "data_offsets": [len(data), len(data) + 3]}
        path.write_bytes(_st_bytes(header, data + b"\x01\x02\x03"))

    return _file_level("st-extra-tensor", "st-extra-tensor", "7.2",
                       f"the file also holds {name!r}, which the manifest does not place there",
                       file, edit)


@_mutation("st-missing-tensor", lambda ctx: bool(_data_files(ctx, entries=True)))
def _missing_tensor(draw: st.DrawFn, ctx: _Context) -> Mutation:
    file = draw(st.sampled_from(_data_files(ctx, entries=True)))
    name = _entry(draw, file)

    def edit(path: Path) -> None:
        header, data = _read_st(path)
        entries = sorted(((n, e) for n, e in header.items() if n not in ("__metadata__", name)),
                         key=lambda item: item[1]["data_offsets"])
        rebuilt: dict[str, Any] = {"__metadata__": header.get("__metadata__", {})}
        blob = b""
        for n, e in entries:
            begin, end = e["data_offsets"]
            rebuilt[n] = {**e, "data_offsets": [len(blob), len(blob) + end - begin]}
            blob += data[begin:end]
        path.write_bytes(_st_bytes(rebuilt, blob))

    return _file_level("st-missing-tensor", "st-missing-tensor", "7.2",
                       f"{name!r} is missing from the file", file, edit)


@_mutation("st-mismatch", lambda ctx: bool(_data_files(ctx, entries=True)))
def _mismatch(draw: st.DrawFn, ctx: _Context) -> Mutation:
    file = draw(st.sampled_from(_data_files(ctx, entries=True)))
    name = _entry(draw, file)
    shape = [*file.header[name]["shape"], 1]
    return _file_level("st-mismatch", "st-mismatch", "7.2",
                       f"{name!r} is stored with shape {shape}", file,
                       _rewrite(lambda h: h[name].__setitem__("shape", shape)))


@st.composite
def broken_checkpoints(draw: st.DrawFn, written: GeneratedCheckpoint,
                       prefer: str | None = None) -> Mutation:
    """A way to break ``written`` (a valid checkpoint on disk), with the error code, SPEC
    section and ranks that must fail. Apply it to a copy: ``mutation.apply(copy_dir)``.

    ``prefer`` names a kind (:func:`mutation_kinds`) to use when it applies to ``written``;
    drawing it before the checkpoint spreads the kinds evenly over a run."""
    m = json.loads((written.path / MANIFEST_NAME).read_bytes())
    files = []
    for rank in m["ranks"]:
        for record in rank["files"]:
            header, data = _read_st(written.path / record["path"])
            files.append(_File(record["path"], rank["rank"], header, len(data)))
    ctx = _Context(m, written, tuple(files))
    applicable = [(kind, builder) for kind, when, builder in _MUTATIONS if when(ctx)]
    preferred = [(kind, builder) for kind, builder in applicable if kind == prefer]
    kind, builder = preferred[0] if preferred else draw(st.sampled_from(applicable),
                                                        label="mutation")
    return builder(draw, ctx)


def mutation_kinds() -> list[str]:
    """Every kind of broken checkpoint :func:`broken_checkpoints` can draw."""
    return [kind for kind, _, _ in _MUTATIONS]
