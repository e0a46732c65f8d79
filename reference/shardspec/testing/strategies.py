"""Hypothesis strategies for valid shardspec checkpoints.

:func:`checkpoint_specs` draws a whole checkpoint: a parallel layout (TP, PP, EP, any rank
order), tensors of every dtype (F6 included), scalars, zero-size and odd shapes, unicode names,
split, replicated, single-holder and rank-local tensors, aliases, tensors of which each holder
holds several pieces that it joins (SPEC 7.2 rule 7: fused per-part tensors, GQA-like
replicas, row and column joins, sub-byte dtypes, pieces filed and listed out of offset order;
see :func:`_place_joined`), several parts per rank, files in subdirectories, extra files,
quantization records and logical dtypes, metadata, extensions a reader may ignore (and a
must-understand one its user allows ignoring), and sometimes a newer minor version with fields
today's reader must ignore. :meth:`CheckpointSpec.write` writes it with
:func:`shardspec.save` and returns what each rank must load. :func:`checkpoints` does both for a
directory factory. Broken checkpoints derived from them are in :mod:`shardspec.testing.broken`.

Example::

    @given(data=st.data())
    def test_my_reader(tmp_path_factory, data):
        root = tmp_path_factory.mktemp("ckpt")
        written = data.draw(checkpoint_specs()).write(root / "ckpt")
        for rank, expected in written.expected.items():
            assert my_load(written.path, rank) == expected
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hypothesis import strategies as st

from ..format.dtypes import DTYPES, from_torch
from ..format.limits import MANIFEST_NAME, SUPPORTED_MINOR
from ..format.manifest import (
    RANK_ORDERS,
    Alias,
    Layout,
    Logical,
    Manifest,
    Quantization,
    format_version,
)
from ..write.save import Shard, save
from .adapter import RankTensors, tensor_bytes
from .handwritten import (
    F6,
    SUB_BYTE,
    UNKNOWN_PLACES,
    move_into,
    newer_minor,
    spec_shape,
    write_f6,
)
from .values import make_tensor, tensor_split_boxes, torch_index, writer_units

__all__ = [
    "CheckpointSpec",
    "GeneratedCheckpoint",
    "TensorPlan",
    "checkpoint_specs",
    "checkpoints",
    "dtypes",
    "extension_names",
    "json_values",
    "layouts",
    "shapes",
    "tensor_names",
]


SPEC_DTYPES: tuple[str, ...] = tuple(DTYPES)


short_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)


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
               | st.floats(allow_nan=False, allow_infinity=False) | short_text)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(short_text, inner, max_size=3), max_leaves=max_leaves)


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
    min_dims = 1 if dtype in SUB_BYTE else 0
    dims = draw(st.lists(st.integers(0, 4), min_size=min_dims, max_size=max_dims))
    if dtype == "F4":
        dims[-1] = 2 * draw(st.integers(0, 3))
    elif dtype in F6:
        dims[-1] = 4 * draw(st.integers(0, 2))
    return tuple(dims)


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
    #: Pieces on each holder where they are joined (SPEC 7.2 rule 7); 0 for one a holder.
    pieces: int = 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "dtype": self.dtype,
                               "holders": list(self.holders)}
        if self.shape is not None:
            out["shape"] = list(self.shape)
        if self.split:
            out["split"] = self.split
        if self.target is not None:
            out["alias_of"] = self.target
        if self.pieces:
            out["pieces_per_rank"] = self.pieces
        return out


@dataclass
class CheckpointSpec:
    """A whole checkpoint to write: every rank's tensors and everything around them."""

    layout: Layout
    plans: list[TensorPlan]
    states: dict[int, dict[str, torch.Tensor]]
    sharding: dict[int, dict[str, Shard | list[Shard]]]
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
    #: Joined tensors whose pieces the manifest lists in the reverse of the writer's order.
    reversed_pieces: set[str] = field(default_factory=set)

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
                out[rank][name] = (dtype, spec_shape(dtype, tuple(tensor.shape)),
                                   tensor_bytes(tensor))
        return out

    def sections(self) -> tuple[str, ...]:
        """The SPEC sections a load of this checkpoint exercises, in order, but for the first:
        the section a reader that refuses the checkpoint is said to break (the judgement
        names ``sections[0]``). That is the first of :data:`_BLAMED` the checkpoint exercises
        (joins first: 7.2 rules 3, 6, 7), else 5.1. A failing example shrinks to the few
        features the reader lacks, so its refusal names the section of one of them."""
        found = {"5.1", "5.3", "6.1", "6.3", "6.4", "7.1", "7.2", "9.1", "9.2", "11.1"}
        kinds = {p.kind for p in self.plans}
        if self.world_size > 1:
            found.add("5.2")
        if any(p.dtype in SUB_BYTE for p in self.plans):
            found.add("6.5")
        if "global" in kinds:
            found.add("7.3")
        given = [s for shards in self.sharding.values() for one in shards.values()
                 for s in ([one] if isinstance(one, Shard) else one)]
        if any(s.replica for s in given):
            found.add("7.4")
        joins = any(p.pieces for p in self.plans)
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
        blamed = next((b for b in _BLAMED if b in found and (b != "7.2" or joins)), "5.1")
        return (blamed, *sorted(found - {blamed}, key=_section_key))

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
        reference writer's output, then the order of pieces in the manifest, F6 dtypes, the
        subdirectory and the newer minor version it cannot write itself."""
        manifest = self.save(path)
        aliases = frozenset(n for n, t in manifest.tensors.items() if isinstance(t, Alias))
        record = manifest.to_dict()
        for name in self.reversed_pieces:
            record["tensors"][name]["pieces"].reverse()
        if self.f6:
            write_f6(path, record, self.f6)
        if self.subdirectory:
            move_into(path, record, self.subdirectory)
        if self.f6 or self.subdirectory or self.reversed_pieces:
            (path / MANIFEST_NAME).write_bytes(Manifest.from_dict(record).to_json())
        if self.newer_minor:
            newer_minor(path, record, self.newer_minor, self.unknown_fields)
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


#: The sections of the features a refusal of a valid checkpoint is blamed on, in order (see
#: :meth:`CheckpointSpec.sections`): the tensors' layouts first, the manifest's envelope last.
_BLAMED = ("7.2", "7.5", "7.6", "6.5", "7.4", "7.7", "8.1", "4.2", "4.4", "2.2", "2.1")


def _section_key(section: str) -> tuple[int, ...]:
    return tuple(int(part) for part in section.split(".")) if section[0].isdigit() else (999,)


def _place_global(draw: st.DrawFn, spec: CheckpointSpec, name: str, seed: int) -> TensorPlan:
    """A global tensor on one pipeline stage, split along tensor- and expert-parallel ranks,
    replicated, or held whole by one rank."""
    layout = spec.layout
    dtype = draw(dtypes(), label=f"{name} dtype")
    shape = draw(shapes(dtype), label=f"{name} shape")
    base = make_tensor(dtype, shape, seed)
    tshape = tuple(base.shape)
    # F6 is held as placeholder bytes: never split it along its last dimension.
    dims = list(range(len(tshape) - 1 if dtype in F6 else len(tshape)))
    stage = draw(st.integers(0, layout.pp_size - 1))
    tp_mode = draw(st.sampled_from(["split", "replicate", "single"]))
    tp_dim = draw(st.sampled_from(dims)) if tp_mode == "split" and dims else None
    ep_dim = None
    if layout.ep_size > 1 and dims and draw(st.booleans()):
        ep_dim = draw(st.sampled_from(dims))
    splits = ([(ep_dim, layout.ep_size)] if ep_dim is not None else []) + \
        ([(tp_dim, layout.tp_size)] if tp_dim is not None else [])
    boxes = tensor_split_boxes(tshape, splits)
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
    if dtype in F6:
        spec.f6[name] = dtype
    how = ", ".join(f"{axis} dim {dim}" for axis, dim in (("ep", ep_dim), ("tp", tp_dim))
                    if dim is not None) or ("whole on one rank" if tp_mode == "single"
                                            else "replicated")
    return TensorPlan(name, "global", dtype, shape, tuple(held), f"stage {stage}, {how}")


#: A rank's pieces of a joined tensor in its data files (the writer puts a rank's k-th Shard of
#: a tensor in the rank's k-th run of files): in increasing offset, reversed or shuffled.
FILE_ORDERS = ("offset", "reversed", "shuffled")


def _place_joined(draw: st.DrawFn, spec: CheckpointSpec, name: str, seed: int) -> TensorPlan:
    """A global tensor of which every holder holds several pieces, its value being their join
    (SPEC 7.2 rules 3, 6, 7; format 1.3).

    Along the join dimension (0, rows, as vLLM's fused ``qkv_proj`` and ``gate_up_proj``; or a
    middle or the last one, columns) the tensor is 1 to 3 *parts* one after the other. Each
    part is cut into ``groups`` slices (1 to tp_size) and tensor-parallel rank t holds slice
    ``t * groups // tp_size`` of every part: ``groups = tp_size`` splits the part over the
    ranks; fewer repeat each slice on several ranks as replicas, as the K and V of grouped-query
    attention. A slice may be held as 2 adjacent chunks (a lone part always is), so each rank
    holds at least 2 pieces, not adjacent between parts. Ranks of the stage at other expert
    coordinates hold replicas too, numbered in rank order (7.4). Sub-byte dtypes are cut only
    where every run is whole bytes (6.5). The writer puts each of a rank's pieces in a file of
    its own in the order drawn (see :data:`FILE_ORDERS`), and the manifest may list them in
    reverse: a reader joins by increasing offset, whatever the order of files or records.
    """
    layout, tp = spec.layout, spec.layout.tp_size
    dtype = draw(dtypes(), label=f"{name} dtype")
    ndim = draw(st.integers(1, 3), label=f"{name} dims")
    dim = draw(st.integers(0, ndim - 1), label=f"{name} join dim")
    # elements a byte boundary falls on along the last dimension (SPEC 6.5)
    unit = 2 if dtype == "F4" else 4 if dtype in F6 else 1
    parts = draw(st.integers(1, 3), label=f"{name} parts")
    groups = [draw(st.integers(1, tp)) for _ in range(parts)]
    chunks = [draw(st.integers(2 if parts == 1 else 1, 2)) for _ in range(parts)]
    step = unit if dim == ndim - 1 else 1
    runs: list[list[list[tuple[int, int]]]] = []  # part -> slice -> (start, length) of chunks
    start = 0
    for part in range(parts):
        runs.append([])
        for _ in range(groups[part]):
            runs[-1].append([])
            for _ in range(chunks[part]):
                length = step * draw(st.integers(1, 2))
                runs[-1][-1].append((start, length))
                start += length
    shape = tuple(start if d == dim else
                  (unit if d == ndim - 1 else 1) * draw(st.integers(0, 3 if unit == 1 else 2))
                  for d in range(ndim))
    base = make_tensor(dtype, shape, seed)
    count = sum(chunks)  # pieces on each holder
    order = draw(st.sampled_from(FILE_ORDERS), label=f"{name} file order")
    arranged = (list(range(count)) if order == "offset" else list(range(count))[::-1]
                if order == "reversed" else draw(st.permutations(range(count))))
    if draw(st.booleans(), label=f"{name} manifest lists pieces reversed"):
        spec.reversed_pieces.add(name)
    stage = draw(st.integers(0, layout.pp_size - 1), label=f"{name} stage")
    held: list[int] = []
    seen: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    for rank in range(layout.size):
        c = layout.coordinates(rank)
        if c["pp_rank"] != stage:
            continue
        mine = [run for part in range(parts)
                for run in runs[part][c["tp_rank"] * groups[part] // tp]]
        boxes = [(tuple(begin if d == dim else 0 for d in range(ndim)),
                  tuple(length if d == dim else shape[d] for d in range(ndim)))
                 for begin, length in mine]  # in increasing offset
        shards = []
        for offset, size in boxes:
            replica = seen[offset, size] = seen.get((offset, size), -1) + 1
            shards.append(Shard(writer_units(dtype, shape), writer_units(dtype, offset),
                                replica, writer_units(dtype, size)))
        # the rank's value, computed apart from any reader: its pieces in increasing offset
        # (as bytes where torch cannot concatenate the dtype, F4 among them)
        as_bytes = base.dtype.itemsize == 1
        spec.states[rank][name] = torch.cat(
            [base[torch_index(dtype, offset, size)].view(torch.uint8) if as_bytes else
             base[torch_index(dtype, offset, size)] for offset, size in boxes],
            dim=dim).view(base.dtype)
        spec.sharding[rank][name] = [shards[i] for i in arranged]
        held.append(rank)
    if dtype in F6:
        spec.f6[name] = dtype
    how = (f"stage {stage}, {count} pieces a rank joined along dim {dim}: {parts} part(s) "
           f"cut in {groups} slice(s) over tp, {chunks} chunk(s) a slice; files in {order} "
           f"order" + (", manifest reversed" if name in spec.reversed_pieces else ""))
    return TensorPlan(name, "global", dtype, shape, tuple(held), how, pieces=count)


def _place_local(draw: st.DrawFn, spec: CheckpointSpec, name: str, seed: int) -> TensorPlan:
    """A rank-local tensor (SPEC 7.5): each holder's piece has a shape of its own."""
    dtype = draw(dtypes(), label=f"{name} dtype")
    holders = sorted(draw(st.sets(st.integers(0, spec.world_size - 1), min_size=1)))
    for rank in holders:
        shape = draw(shapes(dtype), label=f"{name} shape on rank {rank}")
        spec.states[rank][name] = make_tensor(dtype, shape, seed + rank)
    if dtype in F6:
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
        kind = draw(st.sampled_from(["global", "joined", "rank-local", "joined", "global",
                                     "alias"]), label=f"{name} kind")
        plan = _place_alias(draw, spec, name) if kind == "alias" else None
        if plan is None:
            place = {"rank-local": _place_local, "joined": _place_joined}.get(kind,
                                                                               _place_global)
            plan = place(draw, spec, name, seed + 1000 * i)
        spec.plans.append(plan)
    method = draw(st.sampled_from(["none", "fp8", "awq", "gptq", "compressed-tensors"])
                  | st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,15}", fullmatch=True))
    config = {} if method == "none" else draw(
        st.dictionaries(short_text, json_values(), max_size=3))
    spec.quantization = Quantization(method=method, config=config)
    for plan in spec.plans:
        if plan.kind != "alias" and plan.name not in spec.f6 and draw(st.booleans()):
            spec.logical[plan.name] = Logical(
                dtype=draw(dtypes()), shape=tuple(draw(st.lists(st.integers(0, 64),
                                                                max_size=3))))
    spec.metadata = draw(st.dictionaries(short_text, short_text, max_size=3))
    optional = draw(st.dictionaries(extension_names(), st.dictionaries(short_text, json_values(),
                                                                       max_size=2), max_size=2))
    spec.extensions = {n: {**record, "must_understand": False} for n, record in optional.items()}
    if draw(st.booleans()):
        name = draw(extension_names().filter(lambda n: n not in spec.extensions))
        spec.extensions[name] = {"must_understand": True, "note": "safe to ignore"}
        spec.ignored = (name,)
    if draw(st.integers(0, 3)) == 3:  # one in four; a shrunk failure has none
        spec.newer_minor = draw(st.integers(SUPPORTED_MINOR + 1, 999999))
        spec.unknown_fields = [
            (where, "x_" + draw(st.from_regex(r"[a-z_]{1,10}", fullmatch=True)), value)
            for where, value in draw(st.lists(st.tuples(st.sampled_from(UNKNOWN_PLACES),
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
