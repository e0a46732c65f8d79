#!/usr/bin/env python3
"""Regenerate the conformance vectors in ``conformance/vectors/``.

    python conformance/make_vectors.py           # rewrite conformance/vectors/
    python conformance/make_vectors.py --check   # regenerate into a temporary directory and
                                                 # compare every byte (exit 1 on a difference)

Each vector is ``vectors/<id>/`` holding ``vector.json`` (described by ``vector.schema.json``),
``checkpoint/`` and, for a valid vector, ``expected/rank-<r>.safetensors``: the tensors rank r
loads, aliases included as entries of their own.

Deterministic: values come from fixed seeds, nothing depends on the clock, and every file is
written from sorted data. Valid bases are written by the reference writer (``shardspec.save``);
sub-byte and odd layouts are written by hand. Each invalid vector is a field or byte edit of a
valid base that breaks one rule; where a data file changes, its manifest record (size, sha256)
is updated, so only the intended finding fires.
"""

from __future__ import annotations

import argparse
import copy
import filecmp
import hashlib
import json
import math
import random
import shutil
import struct
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VECTORS = HERE / "vectors"
#: Files in ``vectors/`` that are not generated.
HAND_WRITTEN = {"README.md"}

try:
    import shardspec
except ImportError:  # a source checkout without an installed package
    sys.path.insert(0, str(REPO / "reference"))
    import shardspec

import torch  # noqa: E402

from shardspec import Layout, Logical, Quantization, Shard, Tie  # noqa: E402
from shardspec.dtypes import spec_shape  # noqa: E402

#: Written as ``generator`` in every manifest instead of the package version, so that a
#: version bump does not change the vectors.
GENERATOR = "shardspec conformance/make_vectors.py"

TensorData = tuple[str, tuple[int, ...], bytes]  # spec dtype, spec shape (elements), raw bytes


# --- deterministic values ----------------------------------------------------------------------


def values(shape: Iterable[int], dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` with small values from ``random.Random(seed)``."""
    shape = tuple(shape)
    rng = random.Random(seed)
    n = math.prod(shape)
    if dtype == torch.bool:
        return torch.tensor([rng.random() < 0.5 for _ in range(n)], dtype=torch.bool).reshape(shape)
    if dtype == torch.float8_e8m0fnu:
        powers = [2.0 ** rng.randint(-4, 4) for _ in range(n)]
        return torch.tensor(powers, dtype=torch.float32).to(dtype).reshape(shape)
    if dtype.is_complex:
        re = torch.tensor([rng.randint(-16, 16) / 4 for _ in range(n)], dtype=torch.float32)
        im = torch.tensor([rng.randint(-16, 16) / 4 for _ in range(n)], dtype=torch.float32)
        return torch.complex(re, im).to(dtype).reshape(shape)
    if dtype.is_floating_point:
        floats = [rng.randint(-32, 32) / 8 for _ in range(n)]
        return torch.tensor(floats, dtype=torch.float32).to(dtype).reshape(shape)
    low = 0 if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64) else -100
    ints = [rng.randint(low, 100) for _ in range(n)]
    return torch.tensor(ints, dtype=torch.int64).to(dtype).reshape(shape)


def random_bytes(count: int, seed: int) -> bytes:
    rng = random.Random(seed)
    return bytes(rng.randrange(256) for _ in range(count))


def f4(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """An F4 tensor of ``shape`` elements (torch float4_e2m1fn_x2 packs two per byte)."""
    packed = (*shape[:-1], shape[-1] // 2)
    raw = torch.tensor(list(random_bytes(math.prod(packed), seed)), dtype=torch.uint8)
    return raw.reshape(packed).view(torch.float4_e2m1fn_x2)


def raw(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def triple(tensor: torch.Tensor) -> TensorData:
    dtype, shape = spec_shape(tensor)
    return dtype.name, tuple(shape), raw(tensor)


# --- safetensors bytes by hand -----------------------------------------------------------------


def st_header_text(header: dict[str, Any]) -> bytes:
    return json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def st_assemble(header: bytes, data: bytes, *, pad_to: int = 8, length: int | None = None) -> bytes:
    """8-byte little-endian length, the header (space-padded to ``pad_to``), the data region."""
    header += b" " * ((-(8 + len(header))) % pad_to)
    return struct.pack("<Q", len(header) if length is None else length) + header + data


def st_file(
    entries: Iterable[tuple[str, str, Iterable[int], bytes]],
    *,
    metadata: dict[str, str] | None = None,
    pad_to: int = 8,
) -> bytes:
    """A safetensors file of ``(name, dtype, shape, bytes)``, data laid out in the given order."""
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for name, dtype, shape, payload in entries:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    return st_assemble(st_header_text(header), data, pad_to=pad_to)


def st_split(blob: bytes) -> tuple[dict[str, Any], bytes]:
    """A well-formed safetensors file's header (parsed, in file order) and data region."""
    (length,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + length]), blob[8 + length :]


def st_tensors(blob: bytes) -> dict[str, TensorData]:
    """Every tensor of a well-formed safetensors file: name -> (dtype, shape, bytes)."""
    header, data = st_split(blob)
    header.pop("__metadata__", None)
    return {name: (e["dtype"], tuple(e["shape"]), data[e["data_offsets"][0] : e["data_offsets"][1]])
            for name, e in header.items()}


def st_entries(blob: bytes) -> list[tuple[str, str, tuple[int, ...], bytes]]:
    """The tensors of a file as ``st_file`` entries, in data order."""
    header, data = st_split(blob)
    header.pop("__metadata__", None)
    ordered = sorted(header.items(), key=lambda item: item[1]["data_offsets"])
    return [(name, e["dtype"], tuple(e["shape"]),
             data[e["data_offsets"][0] : e["data_offsets"][1]]) for name, e in ordered]


# --- manifests as text -------------------------------------------------------------------------


class Pairs(list):  # type: ignore[type-arg]
    """A JSON object given as ``(name, value)`` pairs, so a name can appear twice."""


class Raw(str):
    """Text written into the JSON verbatim (``NaN``, ``4.0``, ``1e400``)."""

    __slots__ = ()


def _flat(value: Any) -> bool:
    if isinstance(value, dict | Pairs):
        items = value.items() if isinstance(value, dict) else value
        return all(not isinstance(v, dict | list) or _scalars(v) for _, v in items)
    return _scalars(value)


def _scalars(value: Any) -> bool:
    return isinstance(value, list) and not isinstance(value, Pairs) and not any(
        isinstance(v, dict | list) for v in value)


def dump(value: Any, *, ascii_only: bool = False, depth: int = 0) -> str:
    """JSON like ``Manifest.to_json``: nested records indented, flat records on one line."""
    def scalar(v: Any) -> str:
        return str(v) if isinstance(v, Raw) else json.dumps(v, ensure_ascii=ascii_only)

    def one_line(v: Any) -> str:
        if isinstance(v, dict | Pairs):
            items = v.items() if isinstance(v, dict) else v
            return "{" + ", ".join(f"{scalar(k)}: {one_line(x)}" for k, x in items) + "}"
        if isinstance(v, list):
            return "[" + ", ".join(one_line(x) for x in v) + "]"
        return scalar(v)

    if not isinstance(value, dict | list) or _flat(value):
        return one_line(value)
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, dict | Pairs):
        items = list(value.items() if isinstance(value, dict) else value)
        body = [f"{inner}{scalar(k)}: {dump(v, ascii_only=ascii_only, depth=depth + 1)}"
                for k, v in items]
        return "{\n" + ",\n".join(body) + "\n" + pad + "}"
    body = [inner + dump(v, ascii_only=ascii_only, depth=depth + 1) for v in value]
    return "[\n" + ",\n".join(body) + "\n" + pad + "]"


def manifest_text(data: Any, *, ascii_only: bool = False) -> bytes:
    return (dump(data, ascii_only=ascii_only) + "\n").encode("utf-8", "surrogatepass")


# --- checkpoints in memory ---------------------------------------------------------------------


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
        contents = {}
        for record in rank["files"]:
            for name, tensor in st_tensors(ck.files[record["path"]]).items():
                contents[name] = tensor
        loaded = {}
        for name, record in m["tensors"].items():
            for piece in record.get("pieces", []):
                if piece["rank"] == index:
                    dtype, shape, data = contents[name]
                    assert (dtype, shape) == (record["dtype"], tuple(piece["shape"]))
                    loaded[name] = contents[name]
        for name, record in m["tensors"].items():
            if "alias_of" in record and record["alias_of"] in loaded:
                loaded[name] = loaded[record["alias_of"]]
        out[index] = loaded
    return out


# --- vectors -----------------------------------------------------------------------------------


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
    ignore_extensions: list[str] = field(default_factory=list)

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
        if self.ignore_extensions:
            out["ignore_extensions"] = self.ignore_extensions
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


# --- valid bases -------------------------------------------------------------------------------

W = "model-rank-{}-part-0.safetensors"
F0, F1 = W.format(0), W.format(1)
CONFIG = b'{"model_type": "llama", "hidden_size": 4, "vocab_size": 8}\n'


def base_tp1() -> Ckpt:
    """One rank, two tensors (BF16 [4, 8] and F32 [4])."""
    state = {"model.layers.0.mlp.down_proj.weight": values((4, 8), torch.bfloat16, 1),
             "model.norm.weight": values((4,), torch.float32, 2)}
    return saved_whole(state)


def base_tp2() -> Ckpt:
    """The tiny TP=2 model of SPEC Appendix A: colwise, rowwise, replicated, rank-local, tied,
    scalar and zero-size tensors, and config.json as an extra file."""
    embed = values((8, 4), torch.bfloat16, 10)
    o_proj = values((4, 8), torch.bfloat16, 11)
    norm = values((4,), torch.float32, 12)
    scale = values((), torch.float32, 13)
    sinks = torch.zeros(0, dtype=torch.float32)
    states, sharding = {}, {}
    for r in range(2):
        e, es = shardspec.split(embed, 0, 2)[r]
        o, os_ = shardspec.split(o_proj, 1, 2)[r]
        n, ns = shardspec.split(norm, None, 2)[r]
        s, ss = shardspec.split(scale, None, 2)[r]
        z, zs = shardspec.split(sinks, None, 2)[r]
        states[r] = {
            "model.embed_tokens.weight": e,
            "lm_head.weight": e,
            "model.layers.0.self_attn.qkv_proj.weight": values((6, 4), torch.bfloat16, 20 + r),
            "model.layers.0.self_attn.o_proj.weight": o,
            "model.norm.weight": n,
            "model.logit_scale": s,
            "model.layers.0.self_attn.sinks": z,
        }
        sharding[r] = {"model.embed_tokens.weight": es,
                       "model.layers.0.self_attn.o_proj.weight": os_,
                       "model.norm.weight": ns, "model.logit_scale": ss,
                       "model.layers.0.self_attn.sinks": zs}
    return saved(states, Layout(tp_size=2), sharding=sharding, extra={"config.json": CONFIG},
                 metadata={"model": "tiny-llama"})


def pp_tp_states(layout: Layout) -> tuple[dict[int, Any], dict[int, Any]]:
    """A two-stage, TP=2 model: stage 0 holds the embedding and layer 0, stage 1 the rest."""
    stage0 = {"model.embed_tokens.weight": (values((8, 4), torch.bfloat16, 30), 0),
              "model.layers.0.self_attn.o_proj.weight": (values((4, 4), torch.float32, 31), 1),
              "model.layers.0.input_layernorm.weight": (values((4,), torch.float32, 32), None)}
    stage1 = {"model.layers.1.mlp.down_proj.weight": (values((4, 8), torch.float32, 33), 1),
              "model.norm.weight": (values((4,), torch.float32, 34), None),
              "lm_head.weight": (values((8, 4), torch.bfloat16, 35), 0)}
    states: dict[int, Any] = {}
    sharding: dict[int, Any] = {}
    for rank in range(layout.size):
        c = layout.coordinates(rank)
        stage = stage0 if c["pp_rank"] == 0 else stage1
        states[rank], sharding[rank] = {}, {}
        for name, (tensor, dim) in stage.items():
            piece, shard = shardspec.split(tensor, dim, 2)[c["tp_rank"]]
            states[rank][name] = piece
            sharding[rank][name] = shard
    return states, sharding


def base_pp2_tp2(rank_order: str = "pp-ep-tp") -> Ckpt:
    layout = Layout(tp_size=2, pp_size=2, rank_order=rank_order)
    states, sharding = pp_tp_states(layout)
    return saved(states, layout, sharding=sharding)


def base_fp8() -> Ckpt:
    """TP=2 FP8: E4M3 weights with their logical BF16 dtype, per-channel and per-tensor scales."""
    q = values((8, 4), torch.float8_e4m3fn, 40)
    q_scale = values((8,), torch.float32, 41).abs()
    o = values((4, 8), torch.float8_e4m3fn, 42)
    o_scale = torch.tensor(0.125)
    i_scale = torch.tensor(0.5)
    states, sharding = {}, {}
    for r in range(2):
        parts = {"model.layers.0.self_attn.q_proj.weight": shardspec.split(q, 0, 2)[r],
                 "model.layers.0.self_attn.q_proj.weight_scale": shardspec.split(q_scale, 0, 2)[r],
                 "model.layers.0.self_attn.o_proj.weight": shardspec.split(o, 1, 2)[r],
                 "model.layers.0.self_attn.o_proj.weight_scale":
                     shardspec.split(o_scale, None, 2)[r],
                 "model.layers.0.self_attn.o_proj.input_scale":
                     shardspec.split(i_scale, None, 2)[r]}
        states[r] = {n: t for n, (t, _) in parts.items()}
        sharding[r] = {n: s for n, (_, s) in parts.items()}
    logical = {"model.layers.0.self_attn.q_proj.weight": Logical(dtype="BF16", shape=(8, 4)),
               "model.layers.0.self_attn.o_proj.weight": Logical(dtype="BF16", shape=(4, 8))}
    quant = Quantization(method="fp8", config={"activation_scheme": "static"})
    return saved(states, Layout(tp_size=2), sharding=sharding, quantization=quant,
                 logical=logical)


# --- quantized bases with tied tensors (SPEC 8.4) ----------------------------------------------

Cut = list[tuple[torch.Tensor, Shard]]  # (piece, Shard) per rank, in rank order


def cut(tensor: torch.Tensor, dim: int | None, sizes: Iterable[int] = (), ranks: int = 2) -> Cut:
    """``tensor`` split along ``dim`` into pieces of ``sizes`` (rank r gets the r-th), or with
    ``dim`` None held whole by ``ranks`` ranks as replicas 0, 1, ..."""
    shape = tuple(tensor.shape)
    if dim is None:
        return [(tensor, Shard(shape, (0,) * len(shape), replica=r)) for r in range(ranks)]
    out, start = [], 0
    for size in sizes:
        offset = tuple(start if d == dim else 0 for d in range(len(shape)))
        out.append((tensor.narrow(dim, start, size), Shard(shape, offset)))
        start += size
    assert start == shape[dim], (start, shape)
    return out


def saved_cuts(cuts: dict[str, Cut], layout: Layout, **kwargs: Any) -> Ckpt:
    """A checkpoint where rank r holds piece r of every cut."""
    states: dict[int, dict[str, torch.Tensor]] = {r: {} for r in range(layout.size)}
    sharding: dict[int, dict[str, Shard]] = {r: {} for r in range(layout.size)}
    for name, pieces in cuts.items():
        assert len(pieces) == layout.size, name
        for r, (piece, shard) in enumerate(pieces):
            states[r][name], sharding[r][name] = piece, shard
    return saved(states, layout, sharding=sharding, **kwargs)


def tie_after(ck: Ckpt, ties: dict[str, Tie]) -> Ckpt:
    """Record ``ties`` in a written manifest: how the broken vectors get ties the writer
    refuses (SPEC 8.4 rule 5)."""
    for name, tie in ties.items():
        ck.tensor(name)["tied_to"] = tie.to_dict()
    return ck


FP8_GATE = "model.layers.0.mlp.gate_proj.weight"
FP8_DOWN = "model.layers.0.mlp.down_proj.weight"


def base_fp8_blocks(gate_rows: tuple[int, int] = (128, 128), *, tied: bool = True) -> Ckpt:
    """TP=2 FP8 with DeepSeek-V3's 128 x 128 block scales: a colwise gate_proj [256, 256] and a
    rowwise down_proj [256, 320] split 128 + 192 columns, whose weight_scale_inv are F32 [2, 2]
    and [2, 3] (320 = 2 blocks and a partial one). ``gate_rows``: where gate_proj is split, its
    scale staying at rows 1 + 1; ``tied``: ties written by the writer, else none."""
    gate = values((256, 256), torch.float8_e4m3fn, 300)
    down = values((256, 320), torch.float8_e4m3fn, 301)
    gate_scale = values((2, 2), torch.float32, 302).abs() + 0.5
    down_scale = values((2, 3), torch.float32, 303).abs() + 0.5
    cuts = {FP8_GATE: cut(gate, 0, gate_rows), FP8_GATE + "_scale_inv": cut(gate_scale, 0, (1, 1)),
            FP8_DOWN: cut(down, 1, (128, 192)), FP8_DOWN + "_scale_inv": cut(down_scale, 1, (1, 2))}
    ties = {FP8_GATE + "_scale_inv": Tie(tensor=FP8_GATE, block=(128, 128)),
            FP8_DOWN + "_scale_inv": Tie(tensor=FP8_DOWN, block=(128, 128))}
    logical = {FP8_GATE: Logical(dtype="BF16", shape=(256, 256)),
               FP8_DOWN: Logical(dtype="BF16", shape=(256, 320))}
    quant = Quantization(method="fp8", config={"activation_scheme": "dynamic",
                                               "weight_block_size": [128, 128]})
    return saved_cuts(cuts, Layout(tp_size=2), quantization=quant, logical=logical,
                      ties=ties if tied else None)


FP8_Q = "model.layers.0.self_attn.q_proj"
FP8_K = "model.layers.0.self_attn.k_proj"
FP8_O = "model.layers.0.self_attn.o_proj"


def base_fp8_channel() -> Ckpt:
    """TP=2 FP8 with per-channel and per-tensor scales: colwise q_proj [16, 8] with weight_scale
    F32 [16, 1] (block [1, 8]: one value a row, split like its rows); rowwise o_proj [8, 16] with
    weight_scale [8, 1] (block [1] on axes [0]: grid dim 1 is broadcast, so both ranks hold the
    whole scale, as replicas); colwise k_proj [8, 8] with per-tensor weight_scale and
    input_scale F32 [] (no block: replicated)."""
    q = values((16, 8), torch.float8_e4m3fn, 310)
    k = values((8, 8), torch.float8_e4m3fn, 311)
    o = values((8, 16), torch.float8_e4m3fn, 312)
    q_scale = values((16, 1), torch.float32, 313).abs() + 0.5
    o_scale = values((8, 1), torch.float32, 314).abs() + 0.5
    cuts = {f"{FP8_Q}.weight": cut(q, 0, (8, 8)),
            f"{FP8_Q}.weight_scale": cut(q_scale, 0, (8, 8)),
            f"{FP8_K}.weight": cut(k, 0, (4, 4)),
            f"{FP8_K}.weight_scale": cut(torch.tensor(0.125), None),
            f"{FP8_K}.input_scale": cut(torch.tensor(0.5), None),
            f"{FP8_O}.weight": cut(o, 1, (8, 8)),
            f"{FP8_O}.weight_scale": cut(o_scale, None)}
    ties = {f"{FP8_Q}.weight_scale": Tie(tensor=f"{FP8_Q}.weight", block=(1, 8)),
            f"{FP8_K}.weight_scale": Tie(tensor=f"{FP8_K}.weight"),
            f"{FP8_K}.input_scale": Tie(tensor=f"{FP8_K}.weight"),
            f"{FP8_O}.weight_scale": Tie(tensor=f"{FP8_O}.weight", block=(1,), axes=(0,))}
    logical = {f"{p}.weight": Logical(dtype="BF16", shape=s)
               for p, s in ((FP8_Q, (16, 8)), (FP8_K, (8, 8)), (FP8_O, (8, 16)))}
    quant = Quantization(method="fp8", config={"activation_scheme": "static"})
    return saved_cuts(cuts, Layout(tp_size=2), quantization=quant, logical=logical, ties=ties)


AWQ_Q = "model.layers.0.self_attn.q_proj"
AWQ_O = "model.layers.0.self_attn.o_proj"


def awq_layer(prefix: str, i: int, o: int, g: int, dim: int, seed: int
              ) -> tuple[dict[str, Cut], dict[str, Tie], dict[str, Logical]]:
    """An AWQ int4 layer split in halves along ``dim`` of the grid [i, o] (0: rowwise, the
    input features; 1: colwise, the output features): qweight I32 [i, o/8] (8 int4 a word along
    the output features), scales F16 [i/g, o], qzeros I32 [i/g, o/8]."""
    qweight = values((i, o // 8), torch.int32, seed)
    scales = values((i // g, o), torch.float16, seed + 1)
    qzeros = values((i // g, o // 8), torch.int32, seed + 2)
    def halves(t: torch.Tensor) -> Cut:
        return cut(t, dim, (t.shape[dim] // 2,) * 2)
    cuts = {f"{prefix}.qweight": halves(qweight), f"{prefix}.scales": halves(scales),
            f"{prefix}.qzeros": halves(qzeros)}
    ties = {f"{prefix}.scales": Tie(tensor=f"{prefix}.qweight", block=(g, 1)),
            f"{prefix}.qzeros": Tie(tensor=f"{prefix}.qweight", block=(g, 8))}
    return cuts, ties, {f"{prefix}.qweight": Logical(dtype="F16", shape=(i, o))}


def base_awq() -> Ckpt:
    """TP=2 AWQ int4: a colwise q_proj (i 32, o 64, g 8) and a rowwise o_proj (i 64, o 32,
    g 16), each qweight with its logical F16 [i, o] and its scales and qzeros tied to it."""
    cuts, ties, logical = {}, {}, {}
    for layer in (awq_layer(AWQ_Q, 32, 64, 8, 1, 320), awq_layer(AWQ_O, 64, 32, 16, 0, 330)):
        cuts.update(layer[0])
        ties.update(layer[1])
        logical.update(layer[2])
    quant = Quantization(method="awq", config={"bits": 4, "group_size": 8, "zero_point": True})
    return saved_cuts(cuts, Layout(tp_size=2), quantization=quant, logical=logical, ties=ties)


GPTQ_UP = "model.layers.0.mlp.up_proj"
GPTQ_DOWN = "model.layers.0.mlp.down_proj"


def gptq_layer(prefix: str, dim: int, sizes: tuple[int, int], seed: int, i: int = 32,
               o: int = 16, g: int = 8, qzero_sizes: tuple[int, int] | None = None
               ) -> tuple[dict[str, Cut], dict[str, Tie], dict[str, Logical]]:
    """A GPTQ int4 layer split along ``dim`` of qweight I32 [i/8, o] (8 int4 a word along the
    input features) into ``sizes``: scales F16 [i/g, o] and qzeros I32 [i/g, o/8] follow it
    through their ties (colwise qzeros in ``qzero_sizes`` words where given), and g_idx I32
    [i] (i div g) ties to grid dim 0 alone."""
    qweight = values((i // 8, o), torch.int32, seed)
    scales = values((i // g, o), torch.float16, seed + 1)
    qzeros = values((i // g, o // 8), torch.int32, seed + 2)
    g_idx = torch.arange(i, dtype=torch.int32) // g
    if dim == 0:  # rowwise: blocks of 8 input features a word, g a group
        rows = [s * 8 // g for s in sizes]
        cuts = {f"{prefix}.qweight": cut(qweight, 0, sizes),
                f"{prefix}.scales": cut(scales, 0, rows), f"{prefix}.qzeros": cut(qzeros, 0, rows),
                f"{prefix}.g_idx": cut(g_idx, 0, [s * 8 for s in sizes])}
    else:  # colwise: qzeros packs 8 output features a word
        cuts = {f"{prefix}.qweight": cut(qweight, 1, sizes),
                f"{prefix}.scales": cut(scales, 1, sizes),
                f"{prefix}.qzeros": cut(qzeros, 1, qzero_sizes or [s // 8 for s in sizes]),
                f"{prefix}.g_idx": cut(g_idx, None)}
    ties = {f"{prefix}.scales": Tie(tensor=f"{prefix}.qweight", block=(g, 1)),
            f"{prefix}.qzeros": Tie(tensor=f"{prefix}.qweight", block=(g, 8)),
            f"{prefix}.g_idx": Tie(tensor=f"{prefix}.qweight", block=(1,), axes=(0,))}
    return cuts, ties, {f"{prefix}.qweight": Logical(dtype="F16", shape=(i, o))}


GPTQ_CONFIG = {"bits": 4, "group_size": 8, "desc_act": False}


def base_gptq() -> Ckpt:
    """TP=2 GPTQ int4 (i 32, o 16, g 8): a colwise up_proj (split along the output features,
    g_idx replicated) and a rowwise down_proj (split along the packed input features, g_idx
    split with them)."""
    cuts, ties, logical = {}, {}, {}
    for layer in (gptq_layer(GPTQ_UP, 1, (8, 8), 340), gptq_layer(GPTQ_DOWN, 0, (2, 2), 350)):
        cuts.update(layer[0])
        ties.update(layer[1])
        logical.update(layer[2])
    quant = Quantization(method="gptq", config=GPTQ_CONFIG)
    return saved_cuts(cuts, Layout(tp_size=2), quantization=quant, logical=logical, ties=ties)


MX = "model.layers.0.mlp.experts"


def base_mxfp4() -> Ckpt:
    """EP=2 (tp_size 1) MXFP4 experts as gpt-oss stores them: 4 stacked experts whose
    gate_up_proj_blocks U8 [4, 16, 2, 16] stand for BF16 [4, 16, 64] (32 FP4 values in 16
    bytes a block) and down_proj_blocks U8 [4, 8, 1, 16] for [4, 8, 32], with E8M0 scales U8
    [4, 16, 2] and [4, 8, 1] tied with block [1, 1, 32]; the router is replicated."""
    def u8(shape: tuple[int, ...], seed: int) -> torch.Tensor:
        return torch.tensor(list(random_bytes(math.prod(shape), seed)),
                            dtype=torch.uint8).reshape(shape)
    gate_up, down = u8((4, 16, 2, 16), 360), u8((4, 8, 1, 16), 361)
    gate_up_scales = u8((4, 16, 2), 362)
    down_scales = u8((4, 8, 1), 363)
    router = values((4, 8), torch.bfloat16, 364)
    cuts = {f"{MX}.gate_up_proj_blocks": cut(gate_up, 0, (2, 2)),
            f"{MX}.gate_up_proj_scales": cut(gate_up_scales, 0, (2, 2)),
            f"{MX}.down_proj_blocks": cut(down, 0, (2, 2)),
            f"{MX}.down_proj_scales": cut(down_scales, 0, (2, 2)),
            "model.layers.0.mlp.router.weight": cut(router, None)}
    ties = {f"{MX}.{p}_scales": Tie(tensor=f"{MX}.{p}_blocks", block=(1, 1, 32))
            for p in ("gate_up_proj", "down_proj")}
    logical = {f"{MX}.gate_up_proj_blocks": Logical(dtype="BF16", shape=(4, 16, 64)),
               f"{MX}.down_proj_blocks": Logical(dtype="BF16", shape=(4, 8, 32))}
    quant = Quantization(method="mxfp4")
    return saved_cuts(cuts, Layout(tp_size=1, ep_size=2), quantization=quant, logical=logical,
                      ties=ties)


def nested(depth: int) -> dict[str, Any]:
    """An object nesting ``depth`` objects (itself included). As quantization.config, whose
    depth is 3 (SPEC 3.4), its innermost object is at depth ``depth + 2``."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"k": value}
    return value


# --- valid vectors -----------------------------------------------------------------------------


def valid_vectors() -> list[Vector]:
    out: list[Vector] = []

    def add(id: str, section: str, description: str, ck: Ckpt, **kw: Any) -> None:
        ranks = list(range(len(ck.m["ranks"])))
        out.append(Vector(f"valid-{id}", description, section, ck, ranks, **kw))

    state = {"model.norm.weight": values((4,), torch.float32, 0)}
    add("tp1-minimal", "3.1", "The smallest useful checkpoint (SPEC 3.1): one rank holding one "
        "F32 tensor of shape [4].", saved_whole(state))

    add("tp2-appendix-a", "7.2", "The TP=2 model of SPEC Appendix A: a vocabulary-parallel "
        "embedding (colwise, dim 0), a rowwise o_proj (dim 1), a replicated norm (replicas 0 "
        "and 1), a rank-local fused QKV, a replicated scalar, a zero-size tensor, tied lm_head "
        "(an alias) and config.json as an extra file.", base_tp2())

    w = values((8, 4), torch.bfloat16, 50)
    o = values((4, 8), torch.bfloat16, 51)
    bias = values((4,), torch.float32, 52)
    states, sharding = {}, {}
    for r in range(2):
        parts = {"model.layers.0.mlp.up_proj.weight": shardspec.split(w, 0, 2)[r],
                 "model.layers.0.mlp.down_proj.weight": shardspec.split(o, 1, 2)[r],
                 "model.layers.0.mlp.down_proj.bias": shardspec.split(bias, None, 2)[r]}
        states[r] = {n: t for n, (t, _) in parts.items()}
        sharding[r] = {n: s for n, (_, s) in parts.items()}
    add("tp2-colwise-rowwise-replicated", "7.4", "TP=2 in Transformers' plan styles: up_proj "
        "colwise (split on dim 0), down_proj rowwise (split on dim 1, a non-contiguous slice the "
        "writer must store contiguously) and the row-parallel bias replicated (replicas 0, 1).",
        saved(states, Layout(tp_size=2), sharding=sharding))

    add("pp2-tp2-coordinate-names", "6.2", "PP=2 x TP=2 (pp-ep-tp): data files carry their "
        "coordinates (model-rank-{r}-pp-{p}-ep-{e}-tp-{t}-part-0), so vLLM's TP-only glob cannot "
        "load stage 1's weights into stage 0. Each stage holds different tensors.",
        base_pp2_tp2())

    add("pp2-tp2-rank-order-tp-pp-ep", "5.2", "PP=2 x TP=2 numbered tp-pp-ep (pp fastest): rank "
        "1 is pp_rank 1, tp_rank 0. Readers must take each rank's files from its record, never "
        "from a rank formula of their own.", base_pp2_tp2("tp-pp-ep"))

    layout = Layout(tp_size=2, ep_size=2)
    experts = values((4, 8, 4), torch.float32, 60)
    down = values((4, 4, 8), torch.bfloat16, 61)
    router = values((4, 4), torch.float32, 62)
    states, sharding = {}, {}
    for r in range(4):
        e, t = layout.coordinates(r)["ep_rank"], layout.coordinates(r)["tp_rank"]
        gate = experts[2 * e : 2 * e + 2, 4 * t : 4 * t + 4]
        dn = down[2 * e : 2 * e + 2, :, 4 * t : 4 * t + 4]
        states[r] = {"model.layers.0.mlp.experts.gate_up_proj": gate,
                     "model.layers.0.mlp.experts.down_proj": dn,
                     "model.layers.0.mlp.router.weight": router}
        sharding[r] = {
            "model.layers.0.mlp.experts.gate_up_proj": Shard((4, 8, 4), (2 * e, 4 * t, 0)),
            "model.layers.0.mlp.experts.down_proj": Shard((4, 4, 8), (2 * e, 0, 4 * t)),
            "model.layers.0.mlp.router.weight": Shard((4, 4), (0, 0), replica=r)}
    add("ep2-tp2-experts", "5.1", "EP=2 x TP=2: 4 experts split 2 per expert-parallel rank "
        "(dim 0) and each expert split by tensor-parallel rank (dim 1 or 2): pieces are 2-D "
        "blocks of 3-D tensors. The router is replicated on all four ranks.",
        saved(states, layout, sharding=sharding))

    names = ["BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64", "F16", "BF16", "F32",
             "F64", "C64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"]
    state = {}
    for i, name in enumerate(names):
        torch_dtype = shardspec.dtypes.DTYPES[name].torch_dtype
        assert torch_dtype is not None
        state[f"t.{name}"] = values((2, 3), torch_dtype, 70 + i)
    state["t.F4"] = f4((2, 4), 90)
    add("all-torch-dtypes", "6.4", "One [2, 3] tensor of every dtype of SPEC 6.4 that torch "
        "has (F4 as [2, 4], two elements a byte, low nibble first), written by the reference "
        "writer. F6 dtypes are in valid-sub-byte-dtypes.", saved_whole(state))

    e2m3 = [random_bytes(12, 91), random_bytes(12, 92)]
    e3m2 = random_bytes(3, 93)
    fp4 = [random_bytes(4, 94), random_bytes(4, 95)]
    files = {W.format(r): (r, [("w.f6_e2m3", "F6_E2M3", (4, 4), e2m3[r]),
                               ("w.f6_e3m2", "F6_E3M2", (4,), e3m2),
                               ("w.f4", "F4", (2, 4), fp4[r])]) for r in range(2)}
    tensors = {
        "w.f6_e2m3": {"dtype": "F6_E2M3", "shape": [8, 4], "pieces": [
            {"rank": r, "file": W.format(r), "offset": [4 * r, 0], "shape": [4, 4]}
            for r in range(2)]},
        "w.f6_e3m2": {"dtype": "F6_E3M2", "shape": [4], "pieces": [
            {"rank": 0, "file": F0, "offset": [0], "shape": [4]},
            {"rank": 1, "file": F1, "offset": [0], "shape": [4], "replica": 1}]},
        "w.f4": {"dtype": "F4", "shape": [2, 8], "pieces": [
            {"rank": r, "file": W.format(r), "offset": [0, 4 * r], "shape": [2, 4]}
            for r in range(2)]},
    }
    add("sub-byte-dtypes", "6.5", "Sub-byte dtypes, written by hand (torch has no F6): F6_E2M3 "
        "[8, 4] split on dim 0 (16 elements = 12 bytes a piece), F6_E3M2 [4] replicated (3 "
        "bytes), F4 [2, 8] split on dim 1 (each piece its own packed array). Shapes count "
        "elements; the reference reader returns F6 as packed uint8 bytes.",
        handmade(Layout(tp_size=2), files, tensors))

    states, sharding = {}, {}
    scalar = torch.tensor(2.5, dtype=torch.float64)
    step = torch.tensor(1234, dtype=torch.int64)
    bias = values((2,), torch.float32, 100)
    rows = torch.zeros(0, 4, dtype=torch.float16)
    cols = torch.zeros(4, 0, dtype=torch.bfloat16)
    sinks = torch.zeros(0, dtype=torch.float32)
    for r in range(2):
        parts = {"model.logit_scale": shardspec.split(scalar, None, 2)[r],
                 "model.layers.0.self_attn.sinks": shardspec.split(sinks, None, 2)[r],
                 "model.empty_rows": shardspec.split(rows, 0, 2)[r],
                 "model.empty_cols": shardspec.split(cols, 1, 2)[r],
                 "model.bias": shardspec.split(bias, 0, 2)[r]}
        states[r] = {n: t for n, (t, _) in parts.items()}
        sharding[r] = {n: s for n, (_, s) in parts.items()}
        states[r]["model.lora_a"] = torch.zeros(0, 4, dtype=torch.float32)  # rank-local
    states[0]["model.step"] = step
    sharding[0]["model.step"] = Shard((), ())
    add("scalars-and-zero-size", "7.7", "Scalars (a replicated F64 scalar, an I64 scalar held "
        "by rank 0 only) and zero-size tensors ([0], [0, 4] and [4, 0] split across ranks, and a "
        "rank-local [0, 4]). Readers MUST return zero-size tensors with their dtype and shape; "
        "vLLM's sharded_state loader drops them.", saved(states, Layout(tp_size=2),
                                                          sharding=sharding))

    names = ["模型.层.0.权重", "naïve.weight", "e\u0301.weight", "\u00e9.weight", "emoji.😀",
             "with space", 'quote".name', "back\\slash", "a/b/c", "tab\tname", "ключ"]
    state = {n: values((2,), torch.float32, 110 + i) for i, n in enumerate(names)}
    add("unicode-names", "7.1", "Tensor names in several scripts, an emoji (outside the BMP), a "
        "quote, a backslash, a slash, a tab, and two names that differ only in Unicode "
        "normalization ('e' + U+0301 vs U+00E9): names are compared as code points, never "
        "normalized.", saved_whole(state))

    states, sharding = {}, {}
    for r in range(2):
        states[r], sharding[r] = {}, {}
        for i in range(5):
            piece, shard = shardspec.split(values((2, 4), torch.float32, 120 + i), 0, 2)[r]
            states[r][f"model.layers.{i}.weight"] = piece
            sharding[r][f"model.layers.{i}.weight"] = shard
    add("several-parts", "6.1", "TP=2 with a 40-byte file size cap: each rank's five 16-byte "
        "pieces go into three parts (part-0, part-1, part-2), read in part order.",
        saved(states, Layout(tp_size=2), sharding=sharding, max_file_size=40))

    embed = values((8, 4), torch.bfloat16, 130)
    pos = values((4, 4), torch.float32, 131)
    states, sharding = {}, {}
    for r in range(2):
        e, es = shardspec.split(embed, 0, 2)[r]
        p, ps = shardspec.split(pos, None, 2)[r]
        states[r] = {"model.embed_tokens.weight": e, "lm_head.weight": e,
                     "model.decoder.embed_positions.weight": p,
                     "model.encoder.embed_positions.weight": p}
        sharding[r] = {"model.embed_tokens.weight": es, "lm_head.weight": es,
                       "model.decoder.embed_positions.weight": ps,
                       "model.encoder.embed_positions.weight": ps}
    add("tied-weights", "7.6", "Tied weights recorded as aliases: lm_head.weight is the "
        "vocabulary-parallel embedding's slice on each rank, encoder positions share the "
        "replicated decoder positions. Readers return each alias as its own name with the "
        "target's data; Hugging Face deduplicates tied weights without recording the alias.",
        saved(states, Layout(tp_size=2), sharding=sharding))

    states = {r: {"model.layers.0.self_attn.qkv_proj.weight": values((8, 4), torch.bfloat16,
                                                                     140 + r),
                  "model.layers.0.mlp.packed_weight": values((3 + 2 * r, 2), torch.int32,
                                                            150 + r)}
              for r in range(2)}
    add("rank-local-fused-qkv", "7.5", "Rank-local tensors: under grouped-query attention each "
        "rank's fused QKV ([q 4 rows | k 2 | v 2], 4 columns) is not a slice of one global "
        "tensor; a quantizer's packed weight even has a different shape per rank ([3, 2] and "
        "[5, 2]).", saved(states, Layout(tp_size=2)))

    add("fp8-quantized", "8.2", "FP8 (method 'fp8'): F8_E4M3 weights carrying their logical "
        "BF16 dtype and shape, a per-channel F32 weight_scale split like its weight, per-tensor "
        "scalar weight_scale and input_scale replicated. Scale tensors are ordinary tensors; "
        "vLLM's sharded_state saver has lost them.", base_fp8())

    add("fp8-block-scales", "8.4", "FP8 with DeepSeek-V3's 128 x 128 block scales, TP=2: a "
        "colwise gate_proj F8_E4M3 [256, 256] split at row 128 and a rowwise down_proj [256, "
        "320] split 128 + 192 columns, each with its F32 weight_scale_inv tied with block "
        "[128, 128] ([2, 2]; [2, 3], the last block 64 columns wide). Each rank holds the scale "
        "blocks of its weight piece: [1, 2] at row 0 or 1; [2, 1] at column 0 and [2, 2] at "
        "column 1, since rank 1's 192 columns end at the grid's end.", base_fp8_blocks())

    add("fp8-channel-and-tensor-scales", "8.4", "FP8 per-channel and per-tensor scales, TP=2: "
        "colwise q_proj's weight_scale F32 [16, 1] (block [1, 8], one value a row) split like "
        "its rows; rowwise o_proj's weight_scale [8, 1] tied with block [1] on axes [0] (its dim "
        "1 an inner dimension, grid dim 1 broadcast), so the split of o_proj's columns leaves "
        "the whole scale on both ranks as replicas; k_proj's per-tensor weight_scale and "
        "input_scale F32 [] tied without block, replicated.", base_fp8_channel())

    add("awq-int4-packed", "8.4", "AWQ int4, TP=2: qweight I32 [i, o/8] with logical F16 "
        "[i, o] packs 8 output features a word (the base packs 8 grid elements along dim 1); "
        "scales F16 [i/g, o] tie with block [g, 1], qzeros I32 [i/g, o/8] with [g, 8]. The "
        "colwise q_proj (i 32, o 64, g 8) splits qweight at word 4 = feature 32, its scales at "
        "column 32 and its qzeros at word 4; the rowwise o_proj (i 64, o 32, g 16) splits all "
        "three at input feature 32 (group 2).", base_awq())

    add("gptq-g-idx", "8.4", "GPTQ int4, TP=2 (i 32, o 16, g 8): qweight I32 [i/8, o] with "
        "logical F16 [i, o] packs 8 input features a word; scales [g, 1], qzeros [g, 8], and "
        "g_idx I32 [i] tied with block [1] on axes [0] (grid dim 1 broadcast). The colwise "
        "up_proj leaves g_idx whole on both ranks (replicas); the rowwise down_proj splits "
        "qweight at word 2 (input feature 16) and g_idx at element 16 with it.", base_gptq())

    add("mxfp4-experts-ep2", "8.4", "MXFP4 stacked experts (gpt-oss), tp_size 1 x ep_size 2: "
        "gate_up_proj_blocks U8 [4, 16, 2, 16] stand for BF16 [4, 16, 64] (the base packs 32 "
        "grid elements along dim 2; dim 3, the 16 bytes of a block, is an inner dimension), "
        "their E8M0 scales U8 [4, 16, 2] tie with block [1, 1, 32]; down_proj likewise with "
        "[4, 8, 1, 16] and [4, 8, 1]. Each expert-parallel rank holds 2 experts of each and "
        "their scales; the router is replicated.", base_mxfp4())

    ck = base_tp1()
    ck.m["format_version"] = "1.7"
    ck.m["load_hints"] = {"prefetch": True}
    ck.m["layout"]["numa_policy"] = "interleave"
    ck.piece("model.norm.weight", 0)["crc32c"] = "1a2b3c4d"
    add("newer-minor-version", "4.3", "A manifest from format 1.7 with fields a 1.2 reader does "
        "not know (top level, layout, piece): the reader warns version-newer-minor and "
        "unknown-field, ignores them and loads correct tensors.", ck,
        warnings=["unknown-field", "version-newer-minor"])

    ck = base_tp1()
    ck.m["extensions"] = {"org.example.load_hints": {"must_understand": False,
                                                     "order": ["model.norm.weight"]}}
    add("extension-optional", "4.4", "An extension with must_understand false: a reader that "
        "does not know it ignores it with warning extension-ignored.", ck,
        warnings=["extension-ignored"])

    ck = base_tp1()
    ck.m["extensions"] = {"org.example.provenance": {"must_understand": True,
                                                     "signed_by": "example"}}
    add("extension-ignored-by-user", "4.4", "A must-understand extension the user explicitly "
        "allows ignoring by name (ignore_extensions): warning extension-ignored instead of "
        "error extension-unsupported (compare extension-unsupported-must-understand).", ck,
        warnings=["extension-ignored"], ignore_extensions=["org.example.provenance"])

    entries = [("a.u8", "U8", (3,), bytes([1, 2, 3])),
               ("b.f32", "F32", (2,), struct.pack("<2f", 1.5, -2.25)),
               ("c.f64", "F64", (1,), struct.pack("<d", 3.0)),
               ("d.bf16", "BF16", (3,), bytes.fromhex("803f0040c0bf")),
               ("e.i64", "I64", (1,), struct.pack("<q", -7))]
    tensors = {n: {"dtype": d, "shape": list(s), "pieces": [
        {"rank": 0, "file": F0, "offset": [0] * len(s), "shape": list(s)}]}
        for n, d, s, _ in entries}
    add("unaligned-offsets", "6.3", "A hand-made data file with no alignment at all: the header "
        "is not padded and tensors start at data offsets 3, 11 and 19 (SPEC 6.3 rule 8: no "
        "alignment is required). Readers that map tensors in place must copy unaligned ones.",
        handmade(Layout(tp_size=1), {F0: (0, entries)}, tensors, pad_to=1))

    entries = [("w", "F32", (2, 2), struct.pack("<4f", 1, 2, 3, 4))]
    body = st_header_text({"__metadata__": {"format": "pt"}, "w": {
        "dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})
    ck = handmade(Layout(tp_size=1), {F0: (0, entries)}, {"w": {
        "dtype": "F32", "shape": [2, 2],
        "pieces": [{"rank": 0, "file": F0, "offset": [0, 0], "shape": [2, 2]}]}})
    ck.put(F0, st_assemble(body + b" " * 300, entries[0][3], pad_to=64))
    add("header-space-padding", "6.3", "A header followed by 300+ spaces of padding (the data "
        "region starts at a multiple of 64): trailing spaces are the only padding allowed.", ck)

    state = {"model.norm.weight": values((4,), torch.float32, 160)}
    ck = saved_whole(state,
               extra={"config.json": CONFIG, "tokenizer/tokenizer.json": b'{"version": "1.0"}\n'})
    ck.files["model.safetensors.index.json"] = b'{"metadata": {"total_size": 16}, "weight_map": ' \
        b'{"model.norm.weight": "model-00001-of-00001.safetensors"}}\n'
    ck.files["model-00001-of-00001.safetensors"] = b"not a safetensors file"
    ck.files["original/consolidated.00.pth"] = b"PK\x03\x04 stale"
    add("extra-and-unlisted-files", "2.1", "Extra files (config.json, tokenizer/tokenizer.json "
        "in a subdirectory) listed with size and sha256, and stale unlisted files that vLLM's "
        "example script copies next to the shards (model.safetensors.index.json, a broken "
        "model-00001-of-00001.safetensors, original/): readers MUST NOT read or reject unlisted "
        "files.", ck)

    ck = handmade(Layout(tp_size=2), {F0: (0, [("w", "F32", (4,), raw(values((4,), seed=170)))])},
                  {"w": {"dtype": "F32", "shape": [4], "pieces": [
                      {"rank": 0, "file": F0, "offset": [0], "shape": [4]}]}}, empty_ranks=[1])
    add("empty-rank", "5.3", "TP=2 where rank 1 owns no file and holds no tensor (files MAY be "
        "empty): loading rank 1 returns nothing.", ck)

    ck = handmade(Layout(tp_size=1), {}, {}, empty_ranks=[0])
    add("no-tensors", "7.1", "A checkpoint with no tensors and no files: tensors MAY be empty.",
        ck)

    ck = base_tp1()
    for record in ck.records():
        data = ck.files[record["path"]]
        record["checksums"] = {"sha256": sha256(data),
                               "blake2b": hashlib.blake2b(data).hexdigest(),
                               "xxh64": "0123456789abcdef"}
    add("checksums-blake2b-and-unknown", "9.2", "File records with sha256, blake2b and an "
        "algorithm no implementation knows ('xxh64', a wrong value): unknown algorithms MUST "
        "be ignored; blake2b, if implemented, must match.", ck, verify=True)

    w9 = values((9, 4), torch.float32, 180)
    b1 = values((1, 4), torch.float32, 181)
    states, sharding = {}, {}
    for r in range(2):
        parts = {"model.embed_tokens.weight": shardspec.split(w9, 0, 2)[r],
                 "model.bias": shardspec.split(b1, 0, 2)[r]}
        states[r] = {n: t for n, (t, _) in parts.items()}
        sharding[r] = {n: s for n, (_, s) in parts.items()}
    add("uneven-split", "7.3", "Splits that do not divide evenly: a [9, 4] tensor as [5, 4] + "
        "[4, 4], and a [1, 4] tensor as [1, 4] + an empty [0, 4] piece at offset [1, 0].",
        saved(states, Layout(tp_size=2), sharding=sharding))

    grid = values((4, 4), torch.float32, 190)
    states, sharding = {}, {}
    for r in range(4):
        i, j = divmod(r, 2)
        states[r] = {"w": grid[2 * i : 2 * i + 2, 2 * j : 2 * j + 2]}
        sharding[r] = {"w": Shard((4, 4), (2 * i, 2 * j))}
    add("2d-blocks", "7.3", "TP=4 where each rank holds one 2 x 2 quadrant of a [4, 4] tensor: "
        "coverage is checked in two dimensions.", saved(states, Layout(tp_size=4),
                                                        sharding=sharding))

    ck = base_tp1()
    ck.m["quantization"] = {"method": "none", "config": nested(62)}
    add("json-depth-64", "3.4", "quantization.config nested so that the deepest object is at "
        "depth exactly 64 (MAX_JSON_DEPTH): accepted. One more level is json-too-deep.", ck)

    ck = base_tp1()
    text = manifest_text(ck.m).decode()
    text = text.replace('"model-rank-0-part-0', '"model\\u002drank-0-part-0')
    text = text.replace('"format": "shardspec"', '"format": "sh\\u0061rdspec"')
    ck.raw = b"\r\n\t " + text.replace("\n", "\r\n").encode() + b" \t\r\n"
    add("manifest-json-variants", "3.2", "RFC 8259 details a reader must accept: CRLF line "
        "ends, whitespace before and after the value, and escapes (\\u002d in paths, \\u0061 in "
        "the magic) that must be unescaped before paths and names are compared.", ck)

    return out


# --- invalid vectors ---------------------------------------------------------------------------


def header_bytes(blob: bytes) -> tuple[bytes, bytes]:
    """A file's header text (padding stripped) and its data region."""
    (length,) = struct.unpack("<Q", blob[:8])
    return blob[8 : 8 + length].rstrip(b" "), blob[8 + length :]


def invalid_vectors() -> list[Vector]:
    out: list[Vector] = []
    tp1, tp2, pp, fp8 = base_tp1(), base_tp2(), base_pp2_tp2(), base_fp8()
    NORM, DOWN = "model.norm.weight", "model.layers.0.mlp.down_proj.weight"
    EMBED, O_PROJ = "model.embed_tokens.weight", "model.layers.0.self_attn.o_proj.weight"
    SCALAR, SINKS = "model.logit_scale", "model.layers.0.self_attn.sinks"

    def add(code: str, variant: str, description: str, ck: Ckpt, ranks: list[int] | None = None,
            *, section: str | None = None, **kw: Any) -> None:
        if ranks is None:  # a manifest-level defect: every rank's load fails
            ranks = list(range(len(ck.m["ranks"]))) if ck.manifest else [0]
        section = section or shardspec.errors.CODES[code].section
        out.append(Vector(f"{code}-{variant}", description, section, ck, ranks, code, **kw))

    def edit(base: Ckpt, change: Callable[[Ckpt], object]) -> Ckpt:
        ck = base.clone()
        change(ck)
        return ck

    def with_raw(base: Ckpt, text: Callable[[bytes], bytes]) -> Ckpt:
        ck = base.clone()
        ck.raw = text(manifest_text(ck.m))
        return ck

    def with_header(base: Ckpt, path: str, change: Callable[[bytes], bytes]) -> Ckpt:
        """Rewrite a data file's header text; the data region stays as it is."""
        ck = base.clone()
        header, data = header_bytes(ck.files[path])
        ck.put(path, st_assemble(change(header), data, pad_to=1))
        return ck

    # 2.3 commit marker
    ck = tp1.clone()
    ck.manifest = None
    add("not-committed", "no-manifest", "A crash before the commit: the data files are complete "
        "but shardspec.json was never written. Readers MUST NOT look at the data files.", ck,
        [0])
    ck = tp1.clone()
    ck.files[".shardspec.json.shardspec-tmp"] = manifest_text(ck.m)
    ck.manifest = None
    add("not-committed", "temp-manifest", "A crash between writing the manifest under its "
        "temporary name and renaming it: only .shardspec.json.shardspec-tmp exists. Readers "
        "MUST NOT read the temporary file.", ck, [0])
    add("file-not-regular", "manifest-directory", "shardspec.json is a directory (SPEC 2.3 rule "
        "3: the error of 2.2 rule 7), as left by a tool that extracted an archive wrongly.",
        edit(tp1, lambda c: (c.files.update({"shardspec.json/.keep": b""}),
                             setattr(c, "manifest", None))), [0], section="2.3")
    add("file-not-regular", "manifest-fifo", "shardspec.json is a FIFO (created at run time): a "
        "reader that opens it without O_NONBLOCK after checking hangs.", tp1.clone(), [0],
        section="2.3", materialize="fifo", materialize_path="shardspec.json")
    add("path-escapes", "manifest-symlink", "shardspec.json is a symbolic link to a manifest "
        "outside the checkpoint directory (created at run time).", tp1.clone(), [0],
        section="2.3", materialize="symlink-outside", materialize_path="shardspec.json")

    # 3.2 encoding and syntax
    add("json-encoding", "bom", "The manifest starts with a UTF-8 byte order mark, as written "
        "by Windows editors and PowerShell's Out-File.", with_raw(tp1, lambda t: b"\xef\xbb\xbf"
                                                                    + t))
    ck = tp1.clone()
    ck.m["metadata"] = {"note": "caf\u00e9"}
    ck.raw = manifest_text(ck.m).replace("é".encode(), b"\xe9")
    add("json-encoding", "latin1-byte", "A metadata value written by a Latin-1 encoder: the "
        "byte 0xE9 is not valid UTF-8.", ck)
    ck = tp1.clone()
    ck.m["metadata"] = {"note": Raw('"truncated \\ud83d"')}
    ck.raw = manifest_text(ck.m)
    add("json-encoding", "lone-surrogate", "A string holding an escaped lone surrogate "
        "(\\ud83d, half of an emoji cut by a UTF-16 truncation): not a Unicode string.", ck)
    add("json-syntax", "trailing-comma", "A trailing comma after the last member, accepted by "
        "JSON5 and JavaScript but not by RFC 8259.",
        with_raw(tp1, lambda t: t.rstrip()[:-1].rstrip() + b",\n}\n"))
    add("json-syntax", "comment", "A /* comment */ after the opening brace (JSONC).",
        with_raw(tp1, lambda t: b"{ /* written by hand */" + t[1:]))
    add("json-syntax", "two-values", "The manifest written twice into one file (appended "
        "instead of replaced): a second JSON value follows the first.",
        with_raw(tp1, lambda t: t + t))
    add("json-syntax", "python-repr", "The manifest written with Python's str(dict) instead of "
        "json.dumps: single quotes.", with_raw(tp1, lambda t: repr(json.loads(t)).encode()))

    # 3.3 I-JSON
    ck = tp2.clone()
    tensors = Pairs(list(ck.m["tensors"].items()))
    tensors.append((NORM, {"alias_of": EMBED}))
    ck.m["tensors"] = tensors
    add("json-duplicate-name", "tensor", "The tensor model.norm.weight recorded twice, the "
        "second time as an alias: last-wins and first-wins parsers would load different data.",
        ck)
    ck = tp1.clone()
    ck.m["metadata"] = Pairs([("source", "run-1"), ("source", "run-2")])
    add("json-duplicate-name", "metadata", "A duplicate name inside metadata: the rule holds at "
        "every depth, even in informative members.", ck)
    ck = tp2.clone()
    piece = ck.piece(NORM, 0)
    ck.tensor(NORM)["pieces"][0] = Pairs([("rank", 0), *piece.items()])
    add("json-duplicate-name", "piece-rank", "A piece that names its rank twice.", ck)
    for variant, token in (("nan", "NaN"), ("infinity", "-Infinity"), ("1e400", "1e400")):
        ck = tp1.clone()
        ck.m["extensions"] = {"org.example.stats": {"must_understand": False, "loss": Raw(token)}}
        add("json-nonfinite", variant, f"An optional extension records a training loss as "
            f"{token}, as Python's json.dumps writes by default (allow_nan=True)"
            + (": 1e400 overflows binary64." if token == "1e400" else "."), ck)
    ck = tp1.clone()
    ck.m["extensions"] = {"org.example.stats": {"must_understand": False,
                                                "tokens": Raw("1" + "0" * 400)}}
    add("json-nonfinite", "huge-integer", "An optional extension records a count as an "
        "integer token of 401 digits: a number too large for an IEEE 754 binary64 (SPEC 3.3 "
        "rule 2), like 1e400, though it has no fraction or exponent.", ck)
    ck = tp1.clone()
    ck.m["quantization"] = {"method": "none", "config": nested(63)}
    add("json-too-deep", "depth-65", "quantization.config nested one level past the limit: the "
        "deepest object is at depth 65 (compare valid-json-depth-64).", ck)
    ck = tp1.clone()
    ck.m["extensions"] = {"org.example.deep": {"must_understand": False,
                                               "x": Raw("[" * 5000 + "]" * 5000)}}
    add("json-too-deep", "arrays-5000", "5000 nested arrays in an extension record: a parser "
        "that recurses without a bound can overflow its stack.", ck)
    add("json-too-large", "space-padded", "A valid manifest padded with spaces to "
        "MAX_MANIFEST_BYTES + 1 (268435457) bytes at run time; readers compare the size before "
        "parsing.", tp1.clone(), materialize="huge-manifest", materialize_path="shardspec.json")

    # 3.5 schema
    add("schema", "wrong-magic", "format is 'safetensors' instead of the magic 'shardspec'.",
        edit(tp1, lambda c: c.m.update(format="safetensors")), section="3.1")
    add("schema", "missing-quantization", "No quantization record, as in vLLM's sharded_state "
        "format, which records no quantization at all.",
        edit(tp1, lambda c: c.m.pop("quantization")), section="3.1")
    ck = tp1.clone()
    ck.raw = manifest_text([ck.m])
    add("schema", "not-an-object", "The manifest is a JSON array holding the manifest object.",
        ck, section="3.2")
    ck = tp1.clone()
    ck.m["layout"]["tp_size"] = Raw("1.0")
    add("schema", "integer-as-float", "layout.tp_size written as 1.0, as a JavaScript or YAML "
        "round trip may write it: integers must be integer tokens.", ck, section="3.3")
    ck = tp1.clone()
    ck.piece(NORM, 0)["shape"] = [Raw("4e0")]
    add("schema", "integer-exponent", "A piece shape written as [4e0].", ck, section="3.3")
    add("schema", "format-version-malformed", "format_version '1.0.0' does not match "
        "MAJOR.MINOR.", edit(tp1, lambda c: c.m.update(format_version="1.0.0")), section="4.1")
    add("schema", "format-version-trailing-newline", "format_version '1.0\\n': the schema's "
        "patterns are ECMA-262 regular expressions, whose $ matches only at the end of the "
        "string, not before a final newline as in Python's re (SPEC 3.5).",
        edit(tp1, lambda c: c.m.update(format_version="1.0\n")), section="4.1")
    ck = tp1.clone()
    ck.piece(NORM, 0)["dtype"] = "F32"
    add("schema", "unknown-field-same-version", "A piece with a member 1.2 does not define "
        "('dtype') in a 1.2 manifest: unknown fields are errors in the reader's own version "
        "(compare valid-newer-minor-version).", ck, section="4.3")
    ck = tp1.clone()
    ck.rename_file(F0, "../" + F0)
    ck.files[F0] = ck.files.pop("../" + F0)
    add("schema", "path-dotdot", "A data file path starting with '../' (a path-traversal "
        "attempt; the file sits inside the checkpoint).", ck, section="2.2")
    ck = tp1.clone()
    ck.rename_file(F0, "/tmp/" + F0)
    ck.files[F0] = ck.files.pop("/tmp/" + F0)
    add("schema", "path-absolute", "An absolute data file path.", ck, section="2.2")
    ck = tp1.clone()
    ck.tensor(NORM)["dtype"] = "FP32"
    add("schema", "unknown-dtype", "A manifest dtype 'FP32' that SPEC 6.4 does not define.", ck,
        section="6.4")
    ck = tp1.clone()
    ck.m["tensors"] = {"__metadata__": ck.tensor(NORM), DOWN: ck.tensor(DOWN)}
    add("schema", "tensor-named-metadata", "A tensor named __metadata__, the name safetensors "
        "reserves for its metadata.", ck, section="7.1")
    long_name = "é" * 600
    ck = tp1.clone()
    ck.m["tensors"] = {long_name: ck.tensor(NORM), DOWN: ck.tensor(DOWN)}
    ck.edit_file(F0, lambda es: [e.__setitem__(0, long_name) for e in es if e[0] == NORM])
    add("schema", "name-over-1024-bytes", "A tensor name of 600 characters (within the "
        "schema's 1024) but 1200 UTF-8 bytes, over MAX_NAME_BYTES; the data file holds it under "
        "the same name.", ck, section="7.1")

    # 4.2 version, 4.4 extensions
    ck = tp1.clone()
    ck.m["format_version"] = "2.0"
    ck.m["tensor_groups"] = [{"name": "all"}]
    add("version-major", "2.0", "A checkpoint 'from the future' (format 2.0, with a member 1.2 "
        "does not know): a 1.x reader must refuse it with version-major, not load it.", ck)
    add("version-major", "0.9", "A pre-release format 0.9 manifest.",
        edit(tp1, lambda c: c.m.update(format_version="0.9")))
    ck = tp1.clone()
    ck.raw = manifest_text({"format": "shardspec", "format_version": "2.0",
                            "shards": [{"file": F0}]})
    add("version-major", "2.0-restructured", "A 2.0 manifest with a different structure (no "
        "layout, ranks or tensors): version-major is decided before the schema check, so it is "
        "not error schema.", ck)
    ck = tp1.clone()
    ck.m["extensions"] = {"org.example.encryption": {"must_understand": True,
                                                     "cipher": "aes-256-gcm"}}
    add("extension-unsupported", "must-understand", "The data files are encrypted by an "
        "extension with must_understand true that the reader does not know.", ck)
    ck = tp1.clone()
    ck.m["extensions"] = {"org.example.hints": {"must_understand": False},
                          "org.example.int4-packing": {"must_understand": True}}
    add("extension-unsupported", "with-optional", "An optional and a must-understand "
        "extension: the first only warns (extension-ignored), the second is an error.", ck)

    # 5 layout
    ck = tp2.clone()
    ck.m["layout"]["world_size"] = 4
    add("layout-world-size", "product", "world_size 4 with tp_size 2, pp_size 1, ep_size 1 "
        "(and two rank records).", ck)
    ck = tp1.clone()
    ck.m["layout"].update(tp_size=2, world_size=2)
    add("layout-world-size", "rank-count", "tp_size 2 and world_size 2 but one rank record: "
        "rank 1's record was lost when the workers' records were gathered.", ck)
    ck = pp.clone()
    ck.m["layout"]["world_size"] = 2
    add("layout-world-size", "tp-only", "A PP=2 x TP=2 checkpoint whose world_size was "
        "recorded as the TP size (vLLM's rank is the TP rank only).", ck)
    add("layout-rank-order", "wrong-order", "PP=2 x TP=2 with coordinates numbered pp-ep-tp but "
        "rank_order recorded as tp-ep-pp (Megatron and vLLM number ranks differently): ranks 1 "
        "and 2 contradict it.", edit(pp, lambda c: c.m["layout"].update(rank_order="tp-ep-pp")))
    add("layout-rank-order", "duplicate-coordinates", "Both TP ranks claim tp_rank 0 (a "
        "copy-paste of rank 0's record).", edit(tp2, lambda c: c.m["ranks"][1].update(tp_rank=0)))
    add("layout-rank-order", "coordinate-out-of-range", "Rank 1 claims tp_rank 2 with tp_size "
        "2.", edit(tp2, lambda c: c.m["ranks"][1].update(tp_rank=2)))
    add("layout-ranks", "reversed", "The rank records listed in reverse order (rank 1 first).",
        edit(tp2, lambda c: c.m["ranks"].reverse()))
    ck = pp.clone()
    ck.m["ranks"][2], ck.m["ranks"][3] = ck.m["ranks"][3], ck.m["ranks"][2]
    add("layout-ranks", "swapped", "PP=2 x TP=2 with the records of ranks 2 and 3 swapped, as "
        "gathered in arrival order instead of rank order.", ck)

    # 2.1, 2.2 paths and files
    ck = tp1.clone()
    ck.m["ranks"][0]["files"].append(copy.deepcopy(ck.record(F0)))
    add("file-duplicate", "same-rank", "Rank 0 lists its only data file twice, as part 0 and "
        "part 1.", ck)
    ck = tp1.clone()
    ck.m["extra_files"] = [copy.deepcopy(ck.record(F0))]
    add("file-duplicate", "extra-file", "A data file listed again in extra_files, as when a "
        "script globs every file of the directory into the extra files.", ck)
    path = "/".join(["é" * 120] * 5) + "/" + F0
    ck = tp1.clone()
    ck.rename_file(F0, path)
    add("path-unsafe", "utf8-bytes-2", f"A data file path of {len(path)} characters (within the "
        f"schema's 1024) but {len(path.encode())} UTF-8 bytes, over MAX_PATH_BYTES. The file "
        "exists there.", ck, section="2.2")
    path = "/".join(["😀" * 60] * 5) + "/config.json"
    ck = tp2.clone()
    ck.rename_file("config.json", path)
    ck.raw = manifest_text(ck.m, ascii_only=True)
    units = sum(1 + (ord(c) > 0xFFFF) for c in path)
    add("path-unsafe", "utf8-bytes-4", f"An extra file path of {len(path)} code points, written "
        f"as escaped surrogate pairs ({units} UTF-16 units), but {len(path.encode())} UTF-8 "
        "bytes, over MAX_PATH_BYTES.", ck, section="2.2")
    add("path-escapes", "symlink-file", "Rank 0's data file is a symbolic link to a file "
        "outside the checkpoint (created at run time), as when shards are linked from a shared "
        "cache.", tp1.clone(), [0], materialize="symlink-outside", materialize_path=F0)
    add("path-escapes", "dangling-symlink-outside", "Rank 0's data file is a symbolic link to "
        "a path outside the checkpoint where nothing exists (created at run time): the "
        "resolved location is outside, so path-escapes (SPEC 2.2 rule 5) comes before "
        "file-missing (rule 6).", tp1.clone(), [0], materialize="symlink-dangling-outside",
        materialize_path=F0)
    ck = tp1.clone()
    ck.rename_file(F0, "weights/" + F0)
    add("path-escapes", "symlink-dir", "The directory 'weights' holding the data file is a "
        "symbolic link to a directory outside the checkpoint (created at run time).", ck, [0],
        materialize="symlink-dir-escape", materialize_path="weights")
    add("file-missing", "rank-1", "Rank 1's data file is missing (an interrupted copy); rank "
        "0 can still load.", edit(tp2, lambda c: c.files.pop(F1)), [1])
    ck = saved({r: {f"w.{i}": values((4,), seed=200 + 10 * r + i) for i in range(3)}
                for r in range(2)}, Layout(tp_size=2), max_file_size=16)
    ck.files.pop("model-rank-1-part-1.safetensors")
    add("file-missing", "second-part", "Rank 1's part 1 of 3 is missing.", ck, [1])
    add("file-missing", "extra-file", "config.json, listed in extra_files, is missing. Only a "
        "validator reports it: readers do not open extra files (ranks is empty).",
        edit(tp2, lambda c: c.files.pop("config.json")), [])
    add("file-missing", "dangling-symlink", "Rank 0's data file is a dangling symbolic link "
        "(created at run time).", tp1.clone(), [0], materialize="symlink-dangling",
        materialize_path=F0)
    add("file-missing", "symlink-loop", "Rank 0's data file is a symbolic link to a link that "
        "points back to it (created at run time): nothing can be reached there, so "
        "file-missing (SPEC 2.2 rule 6), and a reader must not fail otherwise.", tp1.clone(),
        [0], materialize="symlink-loop", materialize_path=F0)
    add("file-missing", "manifest-dangling-symlink", "shardspec.json is a dangling symbolic "
        "link (created at run time): the name is there, so this is no uncommitted directory "
        "(not-committed) but a manifest that reaches nothing (SPEC 2.3 rule 3, 2.2 rule 6).",
        tp1.clone(), materialize="symlink-dangling", materialize_path="shardspec.json")
    add("file-not-regular", "fifo", "Rank 0's data file is a FIFO (created at run time): a "
        "reader that opens it blocking hangs forever.", tp1.clone(), [0], materialize="fifo",
        materialize_path=F0)
    ck = tp1.clone()
    ck.files[F0 + "/.keep"] = ck.files.pop(F0)
    add("file-not-regular", "directory", "Rank 0's data file is a directory.", ck, [0])

    # 6.1, 7.2 pieces
    ck = tp2.clone()
    ck.piece(NORM, 1)["file"] = F0
    ck.edit_file(F1, lambda es: es.remove(next(e for e in es if e[0] == NORM)))
    add("file-rank", "other-ranks-file", "Rank 1's replica of the norm weight names rank 0's "
        "file (as if ranks shared a file); rank 1's own file does not hold it.", ck)
    ck = tp1.clone()
    ck.piece(NORM, 0)["file"] = "model-rank-0-part-1.safetensors"
    norm_entry = next(e for e in st_entries(ck.files[F0]) if e[0] == NORM)
    ck.edit_file(F0, lambda es: es.remove(next(e for e in es if e[0] == NORM)))
    ck.files["model-rank-0-part-1.safetensors"] = st_file([norm_entry])
    add("file-rank", "unlisted-file", "A piece names model-rank-0-part-1.safetensors, which "
        "exists in the directory (vLLM's glob would find it) but no rank record lists.", ck)
    ck = tp2.clone()
    ck.tensor(NORM)["pieces"].append({"rank": 2, "file": F1, "offset": [0], "shape": [4],
                                      "replica": 2})
    add("piece-rank", "beyond-world-size", "A replica on rank 2 in a world of 2 ranks, left by "
        "a writer that was configured for TP=4.", ck)
    ck = tp1.clone()
    ck.tensor(NORM)["pieces"].append({"rank": 65535, "file": F0, "offset": [0], "shape": [4],
                                      "replica": 1})
    add("piece-rank", "max-rank", "A replica on rank 65535 (the schema's maximum) in a world of "
        "1.", ck)
    add("piece-bounds", "replica-offset", "Rank 1's replica of the [4] norm weight has offset "
        "[1] with shape [4]: it runs one element past the end.",
        edit(tp2, lambda c: c.piece(NORM, 1).update(offset=[1])))
    ck = tp2.clone()
    ck.piece(NORM, 1).update(offset=[0, 0], shape=[1, 4])
    ck.edit_file(F1, lambda es: [e.__setitem__(2, (1, 4)) for e in es if e[0] == NORM])
    add("piece-bounds", "extra-dimension", "Rank 1's replica of the [4] norm weight is stored "
        "unsqueezed as [1, 4]: a piece has as many dimensions as its tensor.", ck)
    add("piece-bounds", "zero-size", "The zero-size sinks tensor has global shape [0, 4] while "
        "its pieces are [0]: bounds hold for zero-size tensors too.",
        edit(tp2, lambda c: c.tensor(SINKS).update(shape=[0, 4])))
    ck = tp2.clone()
    ck.tensor(NORM)["pieces"].append({"rank": 0, "file": F0, "offset": [0], "shape": [4],
                                      "replica": 2})
    add("piece-duplicate", "replica-same-rank", "Rank 0 holds the norm weight as replica 0 and "
        "again as replica 2.", ck)
    ck = tp2.clone()
    ck.tensor(EMBED)["pieces"].append({"rank": 1, "file": F1, "offset": [0, 0], "shape": [4, 4],
                                       "replica": 1})
    add("piece-duplicate", "two-slices", "Rank 1 holds its half of the embedding and also a "
        "replica of rank 0's half: a reader would have to return two tensors under one name.",
        ck)

    # 7.1 sizes
    big = 2**32
    ck = tp1.clone()
    ck.m["tensors"]["huge"] = {"dtype": "F32", "shape": [big, big], "pieces": [
        {"rank": 0, "file": F0, "offset": [0, 0], "shape": [0, big]}]}
    ck.edit_file(F0, lambda es: es.append(["huge", "F32", (0, big), b""]))
    add("shape-overflow", "global-2-pow-64", "A global tensor of shape [2^32, 2^32] (2^64 "
        "elements) whose only piece is empty: the element count wraps to 0 in 64-bit "
        "arithmetic.", ck)
    ck = tp1.clone()
    ck.m["tensors"]["huge"] = {"dtype": "I8", "shape": [2**62, 2], "pieces": [
        {"rank": 0, "file": F0, "offset": [0, 0], "shape": [0, 2]}]}
    ck.edit_file(F0, lambda es: es.append(["huge", "I8", (0, 2), b""]))
    add("shape-overflow", "exactly-2-pow-63", "A global shape [2^62, 2]: 2^63 elements, one past "
        "MAX_SIZE.", ck)
    ck = tp1.clone()
    ck.tensor(NORM)["logical"] = {"dtype": "BF16", "shape": [2**62, 4]}
    add("shape-overflow", "logical", "A logical shape of 2^64 elements.", ck, section="7.1")

    # 7.3 coverage, 7.4 replicas, 7.6 aliases
    ck = tp2.clone()
    ck.tensor(EMBED)["pieces"].pop(1)
    ck.edit_file(F1, lambda es: es.remove(next(e for e in es if e[0] == EMBED)))
    add("coverage-gap", "missing-shard", "The embedding's rank-1 half is neither recorded nor "
        "stored (lost in the gather): rows 4..8 are never written.", ck)
    add("coverage-gap", "short-split", "The embedding's global shape is [9, 4] but its pieces "
        "cover 8 rows (the vocabulary padding was recorded, not written).",
        edit(tp2, lambda c: c.tensor(EMBED).update(shape=[9, 4])))
    add("coverage-overlap", "replicas-unnumbered", "Both ranks' copies of the replicated norm "
        "are replica 0: Megatron-style replica ids were not recorded.",
        edit(tp2, lambda c: c.piece(NORM, 1).pop("replica")))
    add("coverage-overlap", "partial", "Rank 1's rowwise o_proj piece starts at column 3 "
        "instead of 4: column 3 is covered twice and column 7 not at all.",
        edit(tp2, lambda c: c.piece(O_PROJ, 1).update(offset=[0, 3])))
    add("coverage-overlap", "scalar", "A replicated scalar whose two copies are both replica 0: "
        "any two pieces of a scalar overlap.",
        edit(tp2, lambda c: c.piece(SCALAR, 1).pop("replica")))
    ck = tp2.clone()
    ck.piece(NORM, 1)["shape"] = [2]
    ck.edit_file(F1, lambda es: [e.__setitem__(slice(2, 4), [(2,), e[3][:8]])
                                 for e in es if e[0] == NORM])
    add("replica-mismatch", "shape", "Rank 1's replica of the [4] norm weight holds only its "
        "first two elements.", ck)
    ck = tp2.clone()
    ck.piece(NORM, 1).update(offset=[2], shape=[2])
    ck.edit_file(F1, lambda es: [e.__setitem__(slice(2, 4), [(2,), e[3][8:]])
                                 for e in es if e[0] == NORM])
    add("replica-mismatch", "offset", "Rank 1's replica of the [4] norm weight is its second "
        "half (offset [2], shape [2]), which no replica-0 piece is.", ck)
    add("alias-target", "missing", "lm_head.weight is an alias of 'model.embed.weight', which "
        "does not exist (a typo for model.embed_tokens.weight).",
        edit(tp2, lambda c: c.tensor("lm_head.weight").update(alias_of="model.embed.weight")))
    add("alias-target", "chain", "output.weight is an alias of lm_head.weight, itself an alias: "
        "aliases do not chain.",
        edit(tp2, lambda c: c.m["tensors"].update({"output.weight": {
            "alias_of": "lm_head.weight"}})))
    add("alias-target", "self", "lm_head.weight is an alias of itself.",
        edit(tp2, lambda c: c.tensor("lm_head.weight").update(alias_of="lm_head.weight")))

    # 8.4 tied tensors
    fp8b, fp8c, awq, gptq = base_fp8_blocks(), base_fp8_channel(), base_awq(), base_gptq()
    GATE_S, Q_W, Q_S = FP8_GATE + "_scale_inv", f"{FP8_Q}.weight", f"{FP8_Q}.weight_scale"
    ck = tie_after(base_fp8_blocks((64, 192), tied=False), {
        GATE_S: Tie(tensor=FP8_GATE, block=(128, 128)),
        FP8_DOWN + "_scale_inv": Tie(tensor=FP8_DOWN, block=(128, 128))})
    add("tie-split", "scale-off-block", "The colwise FP8 gate_proj [256, 256] is split at row "
        "64, inside its first 128-row scale block, while its weight_scale_inv [2, 2] pieces sit "
        "at the rounded place (row 0 on rank 0, row 1 on rank 1): both ranks hold part of block "
        "0 and neither can dequantize it (vLLM refuses block-quantized layers whose per-rank "
        "size is not a multiple of the block).", ck)
    cuts, ties, logical = gptq_layer(GPTQ_UP, 1, (4, 12), 340, qzero_sizes=(1, 1))
    ck = tie_after(saved_cuts(cuts, Layout(tp_size=2), logical=logical,
                              quantization=Quantization(method="gptq", config=GPTQ_CONFIG)),
                   ties)
    add("tie-split", "mid-pack", "A GPTQ qweight I32 [4, 16] (logical [32, 16]) split along dim "
        "1 after 4 output features: its qzeros I32 [4, 2] (block [8, 8], 8 output features a "
        "word) would have to be split inside a word; its pieces are a word each.", ck)
    ck = fp8b.clone()
    ck.piece(GATE_S, 0)["offset"], ck.piece(GATE_S, 1)["offset"] = [1, 0], [0, 0]
    add("tie-split", "swapped-offsets", "The gate_proj weight_scale_inv pieces swapped between "
        "the ranks (rank 0 holds scale row 1, rank 1 row 0), as a gather in arrival order "
        "would record them: coverage holds, but each rank's scales belong to the other's "
        "rows.", ck)
    layout = Layout(tp_size=1, pp_size=2)
    weight = values((8, 4), torch.float8_e4m3fn, 370)
    scale = torch.tensor(0.25)
    name = "model.layers.0.mlp.down_proj"
    states = {0: {f"{name}.weight": weight, f"{name}.weight_scale": scale},
              1: {f"{name}.weight_scale": scale, "lm_head.weight": values((8, 4), seed=371)}}
    sharding = {0: {f"{name}.weight": Shard((8, 4), (0, 0)),
                    f"{name}.weight_scale": Shard((), ())},
                1: {f"{name}.weight_scale": Shard((), (), replica=1),
                    "lm_head.weight": Shard((8, 4), (0, 0))}}
    ck = tie_after(saved(states, layout, sharding=sharding,
                         quantization=Quantization(method="fp8")),
                   {f"{name}.weight_scale": Tie(tensor=f"{name}.weight")})
    add("tie-split", "rank-without-base", "PP=2: stage 0 holds layer 0's FP8 down_proj weight, "
        "but its per-tensor weight_scale (tied without block) is also held by stage 1, which "
        "has no piece of the weight (a writer that replicated every scalar on every rank).", ck)
    blocks = torch.tensor(list(random_bytes(4 * 16 * 2 * 16, 372)),
                          dtype=torch.uint8).reshape(4, 16, 2, 16)
    scales = torch.tensor(list(random_bytes(4 * 16 * 2, 373)), dtype=torch.uint8).reshape(4, 16, 2)
    ck = tie_after(saved_cuts({f"{MX}.gate_up_proj_blocks": cut(blocks, 3, (8, 8)),
                               f"{MX}.gate_up_proj_scales": cut(scales, None)},
                              Layout(tp_size=2), quantization=Quantization(method="mxfp4"),
                              logical={f"{MX}.gate_up_proj_blocks": Logical(
                                  dtype="BF16", shape=(4, 16, 64))}),
                   {f"{MX}.gate_up_proj_scales": Tie(tensor=f"{MX}.gate_up_proj_blocks",
                                                     block=(1, 1, 32))})
    add("tie-split", "inner-dimension", "MXFP4 gate_up_proj_blocks U8 [4, 16, 2, 16] (logical "
        "[4, 16, 64]) split across TP=2 along dim 3, the 16 bytes of one 32-value block: a "
        "base's inner dimensions are never split.", ck)
    add("tie-target", "missing", "q_proj.scales is tied to 'model.layers.0.self_attn.q_proj."
        "weight', the unquantized model's name, which this AWQ checkpoint does not have (its "
        "weight is q_proj.qweight).",
        edit(awq, lambda c: c.tensor(f"{AWQ_Q}.scales")["tied_to"].update(tensor=Q_W)))
    ck = fp8c.clone()
    ck.m["tensors"][f"{FP8_Q}.base_layer.weight"] = {"alias_of": Q_W}
    ck.tensor(Q_S)["tied_to"]["tensor"] = f"{FP8_Q}.base_layer.weight"
    add("tie-target", "alias", "q_proj.weight_scale is tied to q_proj.base_layer.weight (a "
        "PEFT-style name), an alias of q_proj.weight: a tie names the tensor with the data.", ck)
    add("tie-target", "tied", "q_proj.qzeros is tied to q_proj.scales, itself tied to "
        "q_proj.qweight: ties do not chain.",
        edit(awq, lambda c: c.tensor(f"{AWQ_Q}.qzeros")["tied_to"].update(
            tensor=f"{AWQ_Q}.scales")))
    add("tie-target", "self", "q_proj.scales is tied to itself.",
        edit(awq, lambda c: c.tensor(f"{AWQ_Q}.scales")["tied_to"].update(
            tensor=f"{AWQ_Q}.scales")))
    ck = fp8c.clone()
    record = ck.tensor(Q_W)
    record.update(rank_local=True, logical={"dtype": "BF16", "shape": [8, 8]})
    record.pop("shape")
    for piece in record["pieces"]:
        piece.pop("offset")
        piece.pop("replica", None)
    ck.m["tensors"][Q_W] = {k: record[k] for k in ("dtype", "rank_local", "pieces", "logical")}
    add("tie-target", "rank-local", "q_proj.weight is recorded rank-local, so its pieces are "
        "not slices of one grid, yet q_proj.weight_scale is tied to it: a base is a global "
        "tensor.", ck)
    weight = values((128, 192), torch.float8_e4m3fn, 380)
    ck = tie_after(saved_whole({"w.weight": weight, "w.weight_scale_inv": torch.ones(1, 1)},
                               quantization=Quantization(method="fp8"),
                               logical={"w.weight": Logical(dtype="BF16", shape=(128, 192))}),
                   {"w.weight_scale_inv": Tie(tensor="w.weight", block=(128, 128))})
    add("tie-shape", "floor-blocks", "An FP8 weight [128, 192] with 128 x 128 block scales "
        "F32 [1, 1]: the scale grid was computed with floor division, but the last 64 columns "
        "are a block of their own: ceil(192 / 128) = 2.", ck)
    name = "model.layers.0.mlp.gate_up_proj"
    ck = tie_after(saved_whole({f"{name}.weight": values((8, 4), torch.float8_e4m3fn, 381),
                                f"{name}.weight_scale": torch.tensor([0.25, 0.5])},
                               quantization=Quantization(method="fp8")),
                   {f"{name}.weight_scale": Tie(tensor=f"{name}.weight")})
    add("tie-shape", "per-tensor-two-values", "A merged gate_up_proj whose per-tensor "
        "weight_scale F32 [2] holds one value per merged projection, as vLLM keeps it, tied "
        "without block: without block a tie is one value for the whole base (this one is "
        "block [4] on axes [0]).", ck)
    add("tie-shape", "axes-out-of-range", "up_proj.g_idx is tied with block [1] on axes [2]: "
        "its base's grid [32, 16] has no dimension 2.",
        edit(gptq, lambda c: c.tensor(f"{GPTQ_UP}.g_idx")["tied_to"].update(axes=[2])))
    add("tie-shape", "axes-duplicated", "gate_proj's weight_scale_inv is tied with block "
        "[128, 128] on axes [0, 0]: the shape [2, 2] agrees, but an axis is named twice.",
        edit(fp8b, lambda c: c.tensor(GATE_S)["tied_to"].update(axes=[0, 0])))
    add("tie-shape", "pack-not-dividing", "o_proj's qweight I32 [64, 4] records the logical "
        "shape [64, 30]: 4 words do not divide 30 output features (a quantizer that padded the "
        "features to 32 recorded the unpadded count), so scales and qzeros have no grid.",
        edit(awq, lambda c: c.tensor(f"{AWQ_O}.qweight")["logical"].update(shape=[64, 30])))

    # 6.3 safetensors container (rank 0's file of tp1 unless said otherwise)
    def length_prefix(value: bytes) -> Callable[[Ckpt], object]:
        return lambda c: c.put(F0, value + c.files[F0][8:])

    n = len(tp1.files[F0])
    (hlen,) = struct.unpack("<Q", tp1.files[F0][:8])
    add("st-header-length", "over-limit", "The header length is 100000001, one past "
        "MAX_SAFETENSORS_HEADER_BYTES.",
        edit(tp1, length_prefix(struct.pack("<Q", 100_000_001))), [0])
    add("st-header-length", "big-endian", "The header length written big-endian: a reader that "
        "trusts it allocates petabytes.",
        edit(tp1, length_prefix(struct.pack(">Q", hlen))), [0])
    add("st-header-length", "past-eof", f"The header length is {n - 7}: one byte past the end of "
        f"the {n}-byte file.", edit(tp1, length_prefix(struct.pack("<Q", n - 7))), [0])
    add("st-header-length", "five-bytes", "A data file of 5 bytes, shorter than the 8-byte "
        "header length.", edit(tp1, lambda c: c.put(F0, c.files[F0][:5])), [0])
    add("st-header-length", "empty-file", "A zero-byte data file, as left by a failed download.",
        edit(tp1, lambda c: c.put(F0, b"")), [0])
    add("st-header-json", "leading-space", "The header starts with a space before '{' (the "
        "safetensors README, schema and code disagree on leading whitespace; SPEC 6.3 forbids "
        "it).", with_header(tp1, F0, lambda h: b" " + h), [0])
    add("st-header-json", "array", "The header is a JSON array of the entries.",
        with_header(tp1, F0, lambda h: b"[" + h + b"]"), [0])
    add("st-header-json", "trailing-garbage", "Bytes other than spaces after the header object.",
        with_header(tp1, F0, lambda h: h + b"\x00\x00garbage"), [0])
    add("st-header-json", "tab-padding", "The header padded with tabs instead of spaces.",
        with_header(tp1, F0, lambda h: h + b"\t\t\t\t"), [0])
    add("st-header-json", "invalid-utf8", "A __metadata__ value in Latin-1 ('caf\\xe9'): the "
        "header is not valid UTF-8.",
        with_header(tp1, F0, lambda h: h.replace(b'"pt"', b'"caf\xe9"')), [0])
    add("st-header-json", "nan", "A data offset written as NaN.",
        with_header(tp1, F0, lambda h: h.replace(b'"data_offsets":[0,', b'"data_offsets":[NaN,',
                                                 1)), [0])
    first = st_entries(tp1.files[F0])[0][0]
    def dup_tensor(h: bytes) -> bytes:
        entry = json.dumps({first: json.loads(h)[first]}, separators=(",", ":"))[1:-1]
        return h[:-1] + b"," + entry.encode() + b"}"
    add("st-duplicate-key", "tensor", "The header names the same tensor twice with the same "
        "entry: which one a reader uses depends on its JSON parser (a parser differential "
        "found in a safetensors security review).", with_header(tp1, F0, dup_tensor), [0])
    add("st-duplicate-key", "entry-member", "An entry with two 'dtype' members (F32 and F16).",
        with_header(tp1, F0, lambda h: h.replace(b'{"dtype":"F32",',
                                                 b'{"dtype":"F32","dtype":"F16",')), [0])
    add("st-duplicate-key", "metadata", "__metadata__ with 'format' twice.",
        with_header(tp1, F0, lambda h: h.replace(b'{"format":"pt"}',
                                                 b'{"format":"pt","format":"np"}')), [0])
    add("st-entry", "extra-member", "An entry with a member other than dtype, shape and "
        "data_offsets ('checksum').",
        with_header(tp1, F0, lambda h: h.replace(b'{"dtype":"F32",',
                                                 b'{"checksum":"00","dtype":"F32",')), [0])
    add("st-entry", "negative-dim", "An entry of shape [-4].",
        with_header(tp1, F0, lambda h: h.replace(b'"shape":[4]', b'"shape":[-4]')), [0])
    add("st-entry", "float-dim", "An entry of shape [4.0].",
        with_header(tp1, F0, lambda h: h.replace(b'"shape":[4]', b'"shape":[4.0]')), [0])
    def swap_offsets(h: bytes) -> bytes:
        header = json.loads(h)
        header[NORM]["data_offsets"].reverse()
        return st_header_text(header)
    add("st-entry", "begin-after-end", "An entry whose data_offsets are [end, begin].",
        with_header(tp1, F0, swap_offsets), [0])
    def drop_offsets(h: bytes) -> bytes:
        header = json.loads(h)
        del header[NORM]["data_offsets"]
        return st_header_text(header)
    add("st-entry", "missing-offsets", "An entry without data_offsets.",
        with_header(tp1, F0, drop_offsets), [0])
    for variant, metadata, what in (
            ("integer-value", b'{"format":"pt","total_size":80}', "an integer value "
             "(total_size copied from a Hugging Face index)"),
            ("string", b'"pt"', "a string instead of an object"),
            ("nested", b'{"format":"pt","config":{"dim":"4"}}', "a nested object")):
        add("st-metadata", variant, f"__metadata__ is {what}.",
            with_header(tp1, F0, lambda h, m=metadata: h.replace(b'{"format":"pt"}', m)), [0])

    def rebuild(entries: list[tuple[str, str, tuple[int, ...], bytes]],
                spans: list[tuple[int, int]], data: bytes) -> bytes:
        header = {"__metadata__": {"format": "pt"}}
        for (name, dtype, shape, _), span in zip(entries, spans, strict=True):
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": list(span)}
        return st_assemble(st_header_text(header), data)

    # the BF16 [4, 8] weight (64 bytes), then the F32 norm (16 bytes)
    entries = sorted(st_entries(tp1.files[F0]), key=lambda e: e[0] != DOWN)
    assert [(e[0], len(e[3])) for e in entries] == [(DOWN, 64), (NORM, 16)]
    data = entries[0][3] + entries[1][3]
    ck = tp1.clone()
    ck.put(F0, rebuild(entries, [(0, 64), (64, 76)], data[:76]))
    add("st-size", "span-mismatch", "The F32 [4] norm spans 12 bytes instead of 16 (the data "
        "region was shortened to match, so offsets still tile it).", ck, [0])
    ck = tp1.clone()
    ck.put(F0, rebuild([entries[0], (NORM, "F32", (2**62, 4), b"")], [(0, 64), (64, 64)],
                       data[:64]))
    add("st-size", "overflow", "A header entry of shape [2^62, 4] in F32 spanning 0 bytes: the "
        "byte count overflows 64 bits (wrapping to 0 in unchecked arithmetic).", ck, [0])
    for dtype, count, bits in (("F4", 3, 4), ("F6_E2M3", 2, 6)):
        nbytes = (count * bits + 7) // 8
        ck = handmade(Layout(tp_size=1), {F0: (0, [("w", dtype, (count,), bytes(nbytes))])},
                      {"w": {"dtype": dtype, "shape": [count], "pieces": [
                          {"rank": 0, "file": F0, "offset": [0], "shape": [count]}]}})
        add("st-size", f"{dtype.lower()}-partial-byte", f"A {dtype} tensor of {count} elements: "
            f"{count * bits} bits are not whole bytes (in the manifest and in the file).", ck,
            section="6.5")
    ck = tp1.clone()
    ck.put(F0, rebuild(entries, [(0, 64), (60, 76)], data[:76]))
    add("st-offsets", "overlap", "The norm's data starts 4 bytes inside the weight's.", ck, [0])
    ck = tp1.clone()
    ck.put(F0, rebuild(entries, [(0, 64), (68, 84)], data[:64] + bytes(4) + data[64:]))
    add("st-offsets", "hole", "4 unused bytes between the two tensors.", ck, [0])
    ck = tp1.clone()
    ck.put(F0, rebuild(entries, [(0, 64), (64, 80)], data + b"PK\x05\x06" + bytes(18)))
    add("st-offsets", "trailing-bytes", "An empty zip archive appended after the last tensor (a "
        "polyglot file).", ck, [0])
    ck = tp1.clone()
    ck.put(F0, rebuild(entries, [(0, 64), (64, 80)], data[:72]))
    add("st-offsets", "past-end", "The data region is 8 bytes shorter than the offsets say "
        "(the manifest's size was updated to the short file).", ck, [0])
    ck = tp1.clone()
    ck.m["tensors"]["model.norm.bias"] = copy.deepcopy(ck.tensor(NORM))
    ck.put(F0, rebuild([*entries, ("model.norm.bias", "F32", (4,), b"")],
                       [(0, 64), (64, 80), (64, 80)], data))
    add("st-offsets", "shared-storage", "Two tensors with the same data_offsets, as a writer "
        "that deduplicates tied weights inside the file would store them.", ck, [0])
    huge = 2**62
    files = {F0: (0, [("w.empty", "F32", (1, 4, 0), b""), ("w.one", "U8", (1,), b"\x07")])}
    tensors = {"w.empty": {"dtype": "F32", "shape": [huge, 4, 0], "pieces": [
                   {"rank": 0, "file": F0, "offset": [0, 0, 0], "shape": [1, 4, 0]}]},
               "w.one": {"dtype": "U8", "shape": [1], "pieces": [
                   {"rank": 0, "file": F0, "offset": [0], "shape": [1]}]}}
    add("shape-overflow", "partial-product", "A global tensor of shape [2^62, 4, 0] (its one "
        "piece [1, 4, 0]): no element, but "
        "the product taken in order passes MAX_SIZE at 2^62 x 4 (SPEC 7.1 rule 4): torch, "
        "sizing tensors in int64, cannot even hold it.",
        handmade(Layout(tp_size=1), files, tensors), [0], section="7.1")
    add("st-entry", "dtype-not-a-string", "An entry whose dtype is the number 32: not a string, "
        "so the entry is malformed (st-entry); only a string that names no dtype is st-dtype "
        "(SPEC 6.3 rule 5).",
        with_header(tp1, F0, lambda h: h.replace(b'"dtype":"F32"', b'"dtype":32   ')), [0])
    add("st-dtype", "lowercase", "The norm's dtype written 'f32'.",
        with_header(tp1, F0, lambda h: h.replace(b'"dtype":"F32"', b'"dtype":"f32"')), [0])
    add("st-dtype", "torch-name", "An FP8 weight's dtype written 'F8_E4M3FN' (torch's name) "
        "instead of F8_E4M3.", with_header(fp8, F0, lambda h: h.replace(
            b'"dtype":"F8_E4M3"', b'"dtype":"F8_E4M3FN"')), [0])

    # 7.2 agreement between files and manifest
    add("st-mismatch", "dtype", "The BF16 weight is stored as F16 (same size, other meaning).",
        with_header(tp1, F0, lambda h: h.replace(b'"dtype":"BF16"', b'"dtype":"F16"')), [0])
    add("st-mismatch", "shape-transposed", "The [4, 8] weight is stored as [8, 4] (a "
        "transposed rowwise/colwise mix-up).",
        with_header(tp1, F0, lambda h: h.replace(b'"shape":[4,8]', b'"shape":[8,4]')), [0])
    ck = tp2.clone()
    ck.edit_file(F0, lambda es: [e.__setitem__(2, (1,)) for e in es if e[0] == SCALAR])
    add("st-mismatch", "scalar-as-1d", "The scalar logit_scale is stored with shape [1] on rank "
        "0, as exporters that promote 0-d tensors write it.", ck, [0])
    ck = fp8.clone()
    scale = "model.layers.0.self_attn.q_proj.weight_scale"
    ck.edit_file(F0, lambda es: es.remove(next(e for e in es if e[0] == scale)))
    add("st-missing-tensor", "fp8-scale", "Rank 0's file lacks the FP8 weight_scale the manifest "
        "records (vLLM's sharded_state saver has lost scale tensors).", ck, [0])
    ck = tp2.clone()
    ck.edit_file(F0, lambda es: es.remove(next(e for e in es if e[0] == SINKS)))
    add("st-missing-tensor", "zero-size", "Rank 0's file lacks the zero-size sinks tensor the "
        "manifest records (vLLM drops zero-size tensors).", ck, [0])
    ck = tp1.clone()
    ck.edit_file(F0, lambda es: es.append(["model.rotary_emb.inv_freq", "F32", (2,),
                                           struct.pack("<2f", 1.0, 0.01)]))
    add("st-extra-tensor", "unrecorded-buffer", "The file holds a rotary inv_freq buffer the "
        "manifest does not record (an unexpected key is a bare KeyError in vLLM).", ck, [0])
    ck = tp2.clone()
    embed = next(e for e in st_entries(ck.files[F0]) if e[0] == EMBED)
    ck.edit_file(F0, lambda es: es.append(["lm_head.weight", *embed[1:]]))
    add("st-extra-tensor", "alias-entry", "Rank 0's file also stores the tied lm_head.weight, "
        "which the manifest records as an alias: an alias has no data of its own.", ck, [0])

    # 9 integrity
    add("file-size", "truncated", "Rank 0's data file lost its last 4 bytes (an interrupted "
        "download); the manifest's size is unchanged.",
        edit(tp1, lambda c: c.put(F0, c.files[F0][:-4], refresh=False)), [0])
    add("file-size", "appended", "16 bytes appended to rank 0's data file.",
        edit(tp1, lambda c: c.put(F0, c.files[F0] + bytes(16), refresh=False)), [0])
    add("file-size", "extra-file", "config.json has another size than its record. Only a "
        "validator reports it: readers do not open extra files (ranks is empty).",
        edit(tp2, lambda c: c.put("config.json", CONFIG + b"\n", refresh=False)), [])
    def flip(path: str, index: int) -> Callable[[Ckpt], object]:
        def change(c: Ckpt) -> None:
            data = bytearray(c.files[path])
            data[index] ^= 0x01
            c.put(path, bytes(data), refresh=False)
        return change
    add("checksum-mismatch", "bit-flip", "One bit flipped in the last byte of rank 0's data "
        "(silent corruption, same size): only checksum verification finds it.",
        edit(tp1, flip(F0, n - 1)), [0], verify=True)
    index = tp1.files[F0].index(b'"pt"') + 2
    add("checksum-mismatch", "metadata-edit", "The __metadata__ value 'pt' changed to 'pu' "
        "after the manifest was written: the header is still valid.",
        edit(tp1, flip(F0, index)), [0], verify=True)
    add("checksum-mismatch", "extra-file", "config.json changed in place (same size). Only a "
        "validator reports it: readers do not open extra files (ranks is empty).",
        edit(tp2, flip("config.json", 2)), [], verify=True)
    return out


# --- writing and checking ----------------------------------------------------------------------


def all_vectors() -> list[Vector]:
    vectors = valid_vectors() + invalid_vectors()
    ids = [v.id for v in vectors]
    assert len(ids) == len(set(ids)), "vector ids are unique"
    return vectors


def generate(root: Path) -> None:
    """Write every vector under ``root`` (which must hold no vector yet)."""
    for vector in all_vectors():
        write_vector(vector, root)


def tree(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*"))
            if (p.is_file() or p.is_symlink()) and p.relative_to(root).parts[0] not in HAND_WRITTEN}


def differences(expected: Path, actual: Path) -> list[str]:
    """Paths that differ between two vector trees (missing, extra or other bytes)."""
    a, b = tree(expected), tree(actual)
    out = [f"missing: {p}" for p in sorted(set(a) - set(b))]
    out += [f"not generated: {p}" for p in sorted(set(b) - set(a))]
    out += [f"differs: {p}" for p in sorted(set(a) & set(b))
            if not filecmp.cmp(a[p], b[p], shallow=False)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="regenerate into a temporary directory and compare with "
                        f"{VECTORS.relative_to(REPO)}; exit 1 on any difference")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "vectors"
        generate(fresh)
        if args.check:
            problems = differences(fresh, VECTORS)
            for line in problems:
                print(line)
            if problems:
                print(f"{len(problems)} difference(s): run python conformance/make_vectors.py")
                return 1
            print(f"{len(list(fresh.iterdir()))} vectors: regenerated bytes are identical")
            return 0
        VECTORS.mkdir(exist_ok=True)
        for old in sorted(VECTORS.iterdir()):
            if old.name not in HAND_WRITTEN:
                shutil.rmtree(old) if old.is_dir() else old.unlink()
        for new in sorted(fresh.iterdir()):
            shutil.move(str(new), VECTORS / new.name)
    print(f"wrote {len(list(VECTORS.glob('*/vector.json')))} vectors to {VECTORS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
