"""The fast semantic verdict agrees with the Python rules: sound exactly when they find nothing.

Manifests are drawn here as dicts (no torch, no files), shaped to reach every rule and every
numeric corner: tensors split along one or two dimensions or laid out at random, replicas,
zero-size and scalar tensors, dimensions near 2**63, sub-byte dtypes, pieces on ranks or in
files they should not be, aliases, long names, broken layouts.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shardspec import Manifest
from shardspec.format import checks_fast as fast
from shardspec.format.checks import check_manifest
from shardspec.format.dtypes import DTYPES
from shardspec.format.manifest import RANK_ORDERS, Layout
from shardspec.format.schema import is_valid

SHA = "0" * 64
#: Small sizes mostly (so that more rules are reached), now and then one near 2**63.
DIMS = [0, 1, 2, 3, 4, 5, 8] * 5 + [2**31, 2**61, 2**62, 2**63 - 1]
#: Byte-sized dtypes mostly; the sub-byte ones (F4, F6) now and then.
DTYPE_NAMES = st.sampled_from(["F32", "BF16", "U8"] * 4 + sorted(DTYPES))
Draw = st.DrawFn


def file_of(rank: int, part: int = 0) -> str:
    return f"r{rank}-{part}.safetensors"


def _tiling(draw: Draw, shape: list[int], dims: list[int]) -> list[tuple[list[int], list[int]]]:
    """Boxes that tile ``shape``, cut along each of ``dims`` at drawn points."""
    boxes: list[tuple[list[int], list[int]]] = [([0] * len(shape), list(shape))]
    for d in dims:
        inner = st.sampled_from([1, shape[d] // 2, shape[d] - 1]) if shape[d] > 64 \
            else st.integers(0, shape[d])
        cuts = sorted({0, shape[d], *draw(st.lists(inner, min_size=1, max_size=2))})
        out = []
        for offset, size in boxes:
            for low, high in zip(cuts, cuts[1:], strict=False):
                o, s = list(offset), list(size)
                o[d], s[d] = low, high - low
                out.append((o, s))
        boxes = out
    return boxes


def _boxes(draw: Draw, shape: list[int]) -> list[tuple[list[int], list[int]]]:
    how = draw(st.sampled_from(["whole", "one dim", "one dim", "two dims", "random"]))
    ndim = len(shape)
    if how == "whole" or ndim == 0:
        return [([0] * ndim, list(shape))]
    if how == "one dim":
        return _tiling(draw, shape, [draw(st.integers(0, ndim - 1))])
    if how == "two dims" and ndim >= 2:
        return _tiling(draw, shape, draw(st.permutations(range(ndim)))[:2])
    count = draw(st.integers(1, 4))
    out = []
    for _ in range(count):
        offset = [draw(st.integers(0, max(0, n)) if n < 64 else st.sampled_from([0, 1, n // 2]))
                  for n in shape]
        size = [draw(st.integers(0, n - o) if n - o < 64 else st.sampled_from([0, 1, n - o]))
                for n, o in zip(shape, offset, strict=True)]
        out.append((offset, size))
    return out


@st.composite
def global_tensor(draw: Draw, world: int) -> dict[str, Any]:
    dtype = draw(DTYPE_NAMES)
    shape = draw(st.lists(st.sampled_from(DIMS), max_size=3))
    boxes = _boxes(draw, shape)
    ranks = draw(st.permutations(range(world)))
    pieces = []
    for (offset, size), rank in zip(boxes, ranks, strict=False):
        pieces.append({"rank": rank, "file": file_of(rank), "offset": offset, "shape": size})
    for rank in ranks[len(pieces):]:  # the other ranks: replicas of some box, or nothing
        if pieces and draw(st.booleans()):
            twin = copy.deepcopy(draw(st.sampled_from(pieces)))
            twin.update(rank=rank, file=file_of(rank), replica=draw(st.integers(1, 3)))
            pieces.append(twin)
    if not pieces:
        pieces.append({"rank": ranks[0], "file": file_of(ranks[0]), "offset": [0] * len(shape),
                       "shape": list(shape)})
    if draw(st.booleans()):
        pieces = draw(st.permutations(pieces))
    record: dict[str, Any] = {"dtype": dtype, "shape": shape, "pieces": list(pieces)}
    if draw(st.integers(0, 4)) == 0:
        record["logical"] = {"dtype": "BF16", "shape": draw(st.lists(st.sampled_from(DIMS),
                                                                     max_size=3))}
    return record


@st.composite
def local_tensor(draw: Draw, world: int) -> dict[str, Any]:
    holders = draw(st.lists(st.integers(0, world - 1), min_size=1, max_size=world, unique=True))
    return {"dtype": draw(DTYPE_NAMES), "rank_local": True, "pieces": [
        {"rank": r, "file": file_of(r), "shape": draw(st.lists(st.sampled_from(DIMS),
                                                               max_size=3))}
        for r in holders]}


def _break_piece(draw: Draw, data: dict[str, Any], world: int) -> None:
    """One small semantic fault in one piece (what a mutation or a buggy writer would do)."""
    records = [r for r in data["tensors"].values() if "pieces" in r]
    if not records:
        return
    piece = draw(st.sampled_from(draw(st.sampled_from(records))["pieces"]))
    what = draw(st.sampled_from(["rank", "file", "offset", "shape", "replica", "extra-file",
                                 "other-part"]))
    if what == "rank":
        piece["rank"] = draw(st.integers(0, world + 1))
    elif what == "file":
        piece["file"] = file_of(draw(st.integers(0, world)))
    elif what == "extra-file":
        piece["file"] = "config.json"
    elif what == "other-part":
        piece["file"] = file_of(piece["rank"], 1)
    elif what == "replica":
        piece["replica"] = draw(st.integers(0, 2))
        if "offset" not in piece:
            del piece["replica"]
    elif piece.get(what):
        values = piece[what]
        d = draw(st.integers(0, len(values) - 1))
        values[d] = max(0, values[d] + draw(st.sampled_from([-1, 1, 2**62])))
        values[d] = min(values[d], 2**63 - 1)


@st.composite
def manifests(draw: Draw) -> dict[str, Any]:
    """Schema-valid manifests, sound or with a semantic fault or two."""
    tp, pp, ep = draw(st.integers(1, 8)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    layout = Layout(tp_size=tp, pp_size=pp, ep_size=ep, rank_order=draw(
        st.sampled_from(RANK_ORDERS)))
    world = layout.size
    ranks = [{"rank": r, **layout.coordinates(r), "files": [
        {"path": file_of(r, part), "size": 8, "checksums": {"sha256": SHA}}
        for part in range(draw(st.integers(1, 2)))]} for r in range(world)]
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "d", "e", "é" * 300, "x" * 1024]),
                          max_size=6, unique=True))
    tensors: dict[str, Any] = {}
    for name in names:
        kind = draw(st.sampled_from(["global", "global", "global", "local", "alias"]))
        if kind == "alias":
            targets = [n for n, r in tensors.items() if "alias_of" not in r]
            # A tensor mostly; now and then a missing name, itself or an alias.
            tensors[name] = {"alias_of": draw(st.sampled_from(
                targets * 6 + ["missing", name, *(n for n in tensors if n not in targets)]))}
        elif kind == "local":
            tensors[name] = draw(local_tensor(world))
        else:
            tensors[name] = draw(global_tensor(world))
    data = {"format": "shardspec", "format_version": "1.0", "layout": layout.to_dict(),
            "ranks": ranks, "quantization": {"method": "none"}, "tensors": tensors,
            "extra_files": [{"path": "config.json", "size": 2, "checksums": {"sha256": SHA}}]}
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        _break_piece(draw, data, world)
    fault = draw(st.sampled_from([None] * 8 + ["world", "order", "duplicate-file"]))
    if fault == "world":
        data["layout"]["world_size"] = world + 1
    elif fault == "order" and world > 1:
        data["ranks"][0], data["ranks"][1] = data["ranks"][1], data["ranks"][0]
    elif fault == "duplicate-file":
        data["extra_files"].append(copy.deepcopy(data["extra_files"][0]))
    return data


@st.composite
def tilings(draw: Draw) -> dict[str, Any]:
    """One tensor tiled along one or two dimensions, its replicas, and maybe one box moved:
    the manifests where the overlap and coverage rules decide."""
    shape = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    dims = draw(st.permutations(range(len(shape))))[: draw(st.integers(1, min(2, len(shape))))]
    boxes = _tiling(draw, shape, dims)
    replicas = draw(st.integers(0, 3))
    pieces = [(rank, offset, size, 0) for rank, (offset, size) in enumerate(boxes)]
    for k in range(replicas):
        _, offset, size, _ = draw(st.sampled_from(pieces[: len(boxes)]))
        pieces.append((len(boxes) + k, list(offset), list(size), draw(st.integers(0, 2))))
    rank, offset, size, replica = draw(st.sampled_from(pieces))
    move = draw(st.sampled_from(["none", "none", "shift", "grow", "swap"]))
    d = draw(st.integers(0, len(shape) - 1))
    if move == "shift" and offset[d] > 0:
        offset[d] -= 1
    elif move == "shift":
        offset[d] += 1
    elif move == "grow":
        size[d] += draw(st.sampled_from([-1, 1]))
        size[d] = max(size[d], 0)
    elif move == "swap":
        other = draw(st.sampled_from(pieces))
        size[:], other[2][:] = list(other[2]), list(size)
    return one_tensor(shape, draw(st.permutations(pieces)))


def verdicts(data: dict[str, Any]) -> tuple[bool, list[str]]:
    manifest = Manifest.from_dict(data)
    return fast.is_sound(manifest), [f.code for f in check_manifest(manifest)]


def assert_sound_exactly_when_the_python_rules_find_nothing(data: dict[str, Any]) -> None:
    assume(is_valid(data))
    sound, codes = verdicts(data)
    assert sound == (not codes), codes


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests())
def test_sound_exactly_when_the_python_rules_find_nothing(data: dict[str, Any]) -> None:
    assert_sound_exactly_when_the_python_rules_find_nothing(data)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tilings())
def test_tilings_sound_exactly_when_the_python_rules_find_nothing(data: dict[str, Any]) -> None:
    assert_sound_exactly_when_the_python_rules_find_nothing(data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests() | tilings())
def test_hash_collisions_cost_time_not_correctness(data: dict[str, Any]) -> None:
    """With every box hashing alike, replicas are matched by the Python fallback."""
    assume(is_valid(data))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fast, "_row_hash", lambda rows: rows[:, 0].view("uint64") * 0)
        sound, codes = verdicts(data)
    assert sound == (not codes), codes


def one_tensor(shape: list[int], boxes: list[tuple[int, list[int], list[int], int]],
               dtype: str = "F32") -> dict[str, Any]:
    """A manifest of one global tensor made of ``(rank, offset, shape, replica)`` pieces."""
    world = max(rank for rank, *_ in boxes) + 1
    layout = Layout(tp_size=world)
    return {
        "format": "shardspec", "format_version": "1.0", "layout": layout.to_dict(),
        "ranks": [{"rank": r, **layout.coordinates(r), "files": [
            {"path": file_of(r), "size": 8, "checksums": {"sha256": SHA}}]}
            for r in range(world)],
        "quantization": {"method": "none"},
        "tensors": {"w": {"dtype": dtype, "shape": shape, "pieces": [
            {"rank": r, "file": file_of(r), "offset": o, "shape": s,
             **({"replica": k} if k else {})} for r, o, s, k in boxes]}},
    }


BIG = 2**60 - 1  # the most U8 elements a piece may hold: 8 x BIG bits < 2**63
# 8 such pieces make a tensor whose elements fit MAX_SIZE but whose bits do not: shape-overflow
# (SPEC 7.1 rule 4), while its coverage sums, past 2**62, are still taken exactly.
TILES = [(r, [r, 0], [1, BIG], 0) for r in range(8)]


@pytest.mark.parametrize(("dtype", "shape", "boxes", "codes"), [
    ("F32", [4, 4], [(0, [0, 0], [2, 2], 0), (1, [0, 2], [2, 2], 0), (2, [2, 0], [2, 2], 0),
                     (3, [2, 2], [2, 2], 0)], []),
    ("F32", [4, 4], [(0, [0, 0], [3, 3], 0), (1, [0, 2], [2, 2], 0), (2, [2, 0], [2, 2], 0),
                     (3, [3, 3], [1, 1], 0)], ["coverage-overlap"]),
    ("F32", [4, 2], [(0, [0, 0], [2, 2], 0), (1, [1, 0], [2, 2], 0)], ["coverage-overlap"]),
    ("F32", [4, 2], [(0, [2, 0], [2, 2], 0), (1, [0, 0], [2, 2], 0)], []),
    ("F32", [4, 2], [(0, [0, 0], [2, 2], 0), (1, [3, 0], [1, 2], 0)], ["coverage-gap"]),
    ("F32", [], [(0, [], [], 0), (1, [], [], 0)], ["coverage-overlap"]),
    ("F32", [], [(0, [], [], 0), (1, [], [], 1)], []),
    ("U8", [8, BIG], TILES, ["shape-overflow"]),
    ("U8", [8, BIG], [*TILES, (8, [0, 0], [1, BIG], 0)], ["shape-overflow", "coverage-overlap"]),
    ("U8", [8, BIG], TILES[:-1], ["shape-overflow", "coverage-gap"]),
    ("F32", [2**62, 4, 0], [(0, [0, 0, 0], [2**62, 4, 0], 0)], ["shape-overflow", "st-size"]),
    ("F32", [2**62, 0], [(0, [0, 0], [2**62, 0], 0), (1, [0, 0], [2**62, 0], 1)], []),
    ("U8", [2**63 - 1], [(0, [2**63 - 1], [0], 0), (1, [0], [2**63 - 1], 0)],
     ["shape-overflow", "st-size"]),
    ("F32", [8], [(0, [0], [8], 0), (1, [0], [4], 1)], ["replica-mismatch"]),
    ("F32", [8], [(0, [0], [8], 1)], ["replica-mismatch", "coverage-gap"]),
    ("F4", [6], [(0, [0], [3], 0), (1, [3], [3], 0)], ["st-size", "st-size"]),
    ("F32", [4], [(0, [0], [2], 0), (1, [2], [3], 0)], ["piece-bounds", "coverage-gap"]),
], ids=["2d-blocks", "2d-overlap", "1d-overlap", "1d-out-of-order", "1d-gap", "scalar-twice",
        "scalar-replica", "sum-past-2**62", "sum-past-2**63-overlap", "sum-past-2**62-gap",
        "running-product-overflow", "empty-huge", "huge-piece-bytes", "replica-mismatch",
        "replica-without-primary", "f4-half-bytes", "bounds"])
def test_corner_cases(dtype: str, shape: list[int],
                      boxes: list[tuple[int, list[int], list[int], int]],
                      codes: list[str]) -> None:
    sound, found = verdicts(one_tensor(shape, boxes, dtype))
    assert found == codes
    assert sound == (not codes)


def test_a_manifest_without_tensors_is_sound() -> None:
    data = one_tensor([1], [(0, [0], [1], 0)])
    data["tensors"] = {}
    assert verdicts(data) == (True, [])
