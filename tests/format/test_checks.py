"""SPEC 2.1-2.2, 5, 6.1 and 7: the semantic rules the JSON Schema cannot express."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checkpoints import manifest_bytes
from shardspec import Manifest
from shardspec.format.checks import check_manifest, path_problem
from shardspec.format.parse import parse_manifest

SHA = "0" * 64


def check(data: dict[str, Any]) -> list[str]:
    """Codes from the semantic layer alone, on a manifest built with from_dict."""
    return [f.code for f in check_manifest(Manifest.from_dict(data))]


def parsed(data: dict[str, Any]) -> list[str]:
    """Codes from the whole chain, as a reader sees them."""
    return [f.code for f in parse_manifest(manifest_bytes(data)).findings]


def synthetic(
    shape: list[int],
    pieces: list[tuple[int, list[int], list[int], int]],
    *,
    world: int | None = None,
    dtype: str = "F32",
) -> dict[str, Any]:
    """A TP manifest with one file per rank and one global tensor ``w`` made of
    ``(rank, offset, shape, replica)`` pieces."""
    world = world if world is not None else max([p[0] for p in pieces] + [0]) + 1
    return {
        "format": "shardspec",
        "format_version": "1.0",
        "layout": {"tp_size": world, "pp_size": 1, "ep_size": 1, "world_size": world,
                   "rank_order": "pp-ep-tp"},
        "ranks": [
            {"rank": r, "tp_rank": r, "pp_rank": 0, "ep_rank": 0,
             "files": [{"path": f"r{r}.safetensors", "size": 8, "checksums": {"sha256": SHA}}]}
            for r in range(world)
        ],
        "quantization": {"method": "none"},
        "tensors": {
            "w": {"dtype": dtype, "shape": shape, "pieces": [
                {"rank": r, "file": f"r{r}.safetensors", "offset": off, "shape": shp,
                 **({"replica": rep} if rep else {})}
                for r, off, shp, rep in pieces
            ]},
        },
    }


def test_tiny_manifest_is_clean(manifest_dict: dict[str, Any]) -> None:
    assert check(manifest_dict) == []


# --- layout (SPEC 5) -------------------------------------------------------------------------


def test_world_size_not_the_product(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["layout"]["world_size"] = 3
    assert check(manifest_dict) == ["layout-world-size", "layout-world-size"]
    assert "layout-world-size" in parsed(manifest_dict)


def test_rank_count_differs_from_world_size(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["layout"].update(tp_size=4, world_size=4)
    codes = parsed(manifest_dict)
    assert codes[0] == "layout-world-size"


def test_coordinates_must_follow_rank_order(manifest_dict: dict[str, Any]) -> None:
    ranks = manifest_dict["ranks"]
    ranks[0]["tp_rank"], ranks[1]["tp_rank"] = 1, 0
    assert parsed(manifest_dict) == ["layout-rank-order", "layout-rank-order"]


def test_coordinates_follow_a_non_default_rank_order() -> None:
    data = synthetic([4], [(r, [0], [4], r) for r in range(4)])
    data["layout"].update(tp_size=2, pp_size=2, rank_order="tp-pp-ep")
    # tp-pp-ep: rank = tp_rank * 2 + pp_rank
    for record in data["ranks"]:
        record.update(tp_rank=record["rank"] // 2, pp_rank=record["rank"] % 2)
    assert parsed(data) == []
    data["layout"]["rank_order"] = "pp-ep-tp"
    assert set(parsed(data)) == {"layout-rank-order"}


def test_ranks_out_of_order(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["ranks"][1]["rank"] = 0
    codes = parsed(manifest_dict)
    assert codes[0] == "layout-ranks" and codes.count("layout-ranks") == 1
    assert parse_manifest(manifest_bytes(manifest_dict)).findings[0].section == "5.3"


# --- files and paths (SPEC 2.1, 2.2, 6.1) ----------------------------------------------------


def test_file_listed_twice(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["extra_files"] = [copy.deepcopy(manifest_dict["ranks"][0]["files"][0])]
    assert parsed(manifest_dict) == ["file-duplicate"]


def test_file_owned_by_two_ranks(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["ranks"][1]["files"].append(copy.deepcopy(manifest_dict["ranks"][0]["files"][0]))
    assert "file-duplicate" in parsed(manifest_dict)


@pytest.mark.parametrize("path", ["/etc/passwd", "../outside.safetensors", "a/../../b",
                                  "dir\\file.safetensors", "a//b", "./a", "a/", "a\x00b"])
def test_unsafe_paths_are_caught_by_the_schema_first(
    manifest_dict: dict[str, Any], path: str
) -> None:
    manifest_dict["extra_files"] = [{"path": path, "size": 1, "checksums": {"sha256": SHA}}]
    assert parsed(manifest_dict) == ["schema"]
    assert check(manifest_dict) == ["path-unsafe"]


def test_unsafe_data_file_path_in_the_semantic_layer(manifest_dict: dict[str, Any]) -> None:
    old = manifest_dict["ranks"][0]["files"][0]["path"]
    manifest_dict["ranks"][0]["files"][0]["path"] = "../" + old
    for record in manifest_dict["tensors"].values():
        for piece in record.get("pieces", []):
            if piece["file"] == old:
                piece["file"] = "../" + old
    assert check(manifest_dict) == ["path-unsafe"]


def test_manifest_cannot_list_itself(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["extra_files"] = [{"path": "shardspec.json", "size": 1,
                                     "checksums": {"sha256": SHA}}]
    assert parsed(manifest_dict) == ["path-unsafe"]


@pytest.mark.parametrize(
    ("path", "problem"),
    [("", "empty"), ("/a", "absolute"), ("a\\b", "backslash"), ("a/../b", "'..'"),
     ("a/./b", "'.'"), ("a//b", "'empty'"), ("é" * 600, "longer than")],
)
def test_path_problem_explains(path: str, problem: str) -> None:
    found = path_problem(path)
    assert found is not None and problem in found


@pytest.mark.parametrize("path", ["model-rank-0-part-0.safetensors", "tokenizer/vocab.json",
                                  "a..b", ".hidden", "名前.json"])
def test_path_problem_accepts_ordinary_paths(path: str) -> None:
    assert path_problem(path) is None


def test_piece_in_a_file_its_rank_does_not_own(manifest_dict: dict[str, Any]) -> None:
    pieces = manifest_dict["tensors"]["layers.0.col.weight"]["pieces"]
    pieces[1]["file"] = pieces[0]["file"]
    findings = parse_manifest(manifest_bytes(manifest_dict)).findings
    assert [f.code for f in findings] == ["file-rank"]
    assert findings[0].tensor == "layers.0.col.weight" and findings[0].section == "6.1"


# --- pieces (SPEC 7.2) -----------------------------------------------------------------------


def test_piece_rank_outside_the_layout() -> None:
    data = synthetic([4], [(0, [0], [2], 0), (1, [2], [2], 0)])
    data["tensors"]["w"]["pieces"][1]["rank"] = 7
    assert parsed(data) == ["piece-rank", "coverage-gap"]  # the stray piece covers nothing


@pytest.mark.parametrize(
    ("offset", "shape"),
    [([3], [2]), ([0], [5]), ([0, 0], [2, 1]), ([], [])],
    ids=["past-end", "too-long", "extra-dim", "missing-dims"],
)
def test_piece_outside_its_tensor(offset: list[int], shape: list[int]) -> None:
    data = synthetic([4], [(0, [0], [2], 0), (1, offset, shape, 0)])
    assert parsed(data)[0] == "piece-bounds"


def test_rank_holds_two_pieces_of_one_tensor() -> None:
    data = synthetic([4], [(0, [0], [2], 0), (1, [2], [2], 0)])
    data["tensors"]["w"]["pieces"].append({"rank": 1, "file": "r1.safetensors",
                                           "offset": [0], "shape": [2], "replica": 1})
    assert parsed(data) == ["piece-duplicate"]


def test_sub_byte_piece_must_fill_whole_bytes() -> None:
    data = synthetic([2, 3], [(0, [0, 0], [1, 3], 0), (1, [1, 0], [1, 3], 0)], dtype="F4")
    assert "st-size" in parsed(data)
    data = synthetic([2, 4], [(0, [0, 0], [1, 4], 0), (1, [1, 0], [1, 4], 0)], dtype="F4")
    assert parsed(data) == []


def test_element_count_of_2_to_63_is_an_overflow() -> None:
    data = synthetic([2**62, 4], [(0, [0, 0], [1, 4], 0)])
    assert "shape-overflow" in parsed(data)
    finding = next(f for f in parse_manifest(manifest_bytes(data)).findings
                   if f.code == "shape-overflow")
    assert finding.section == "7.1"


def test_logical_shape_overflow(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["tensors"]["layers.0.qkv.weight"]["logical"] = {
        "dtype": "BF16", "shape": [2**32, 2**32]}
    assert parsed(manifest_dict) == ["shape-overflow"]


def test_name_over_1024_bytes_is_refused(manifest_dict: dict[str, Any]) -> None:
    long_name = "é" * 600  # 600 characters pass the schema's maxLength; 1200 bytes do not
    manifest_dict["tensors"][long_name] = manifest_dict["tensors"].pop("step")
    assert parsed(manifest_dict) == ["schema"]


# --- coverage and replicas (SPEC 7.3, 7.4) ---------------------------------------------------


def test_coverage_gap() -> None:
    data = synthetic([4, 4], [(0, [0, 0], [2, 4], 0), (1, [2, 0], [2, 3], 0)])
    findings = parse_manifest(manifest_bytes(data)).findings
    assert [f.code for f in findings] == ["coverage-gap"]
    assert findings[0].tensor == "w" and findings[0].section == "7.3"


def test_coverage_overlap() -> None:
    data = synthetic([4, 4], [(0, [0, 0], [3, 4], 0), (1, [2, 0], [2, 4], 0)])
    assert parsed(data) == ["coverage-overlap"]


def test_overlap_hidden_by_a_matching_total_is_still_found() -> None:
    # volumes add up to 16 but two pieces overlap and one cell is missing
    data = synthetic([4, 4], [(0, [0, 0], [2, 2], 0), (1, [0, 1], [2, 2], 0),
                              (2, [0, 3], [2, 1], 0), (3, [2, 0], [2, 4], 0),
                              (4, [0, 0], [0, 4], 0)])
    assert parsed(data) == ["coverage-overlap"]


def test_full_copies_with_distinct_replicas_are_fine() -> None:
    data = synthetic([3, 2], [(r, [0, 0], [3, 2], r) for r in range(3)])
    assert parsed(data) == []


def test_two_primary_full_copies_overlap() -> None:
    data = synthetic([3, 2], [(0, [0, 0], [3, 2], 0), (1, [0, 0], [3, 2], 0)])
    assert parsed(data) == ["coverage-overlap"]


def test_replica_must_copy_a_primary_piece() -> None:
    data = synthetic([4], [(0, [0], [2], 0), (1, [2], [2], 0), (2, [1], [2], 1)])
    assert parsed(data) == ["replica-mismatch"]
    data = synthetic([4], [(0, [0], [2], 0), (1, [2], [2], 0), (2, [2], [2], 1)])
    assert parsed(data) == []


def test_replica_only_tensor_has_a_gap() -> None:
    data = synthetic([4], [(0, [0], [4], 1)])
    assert set(parsed(data)) == {"replica-mismatch", "coverage-gap"}


def test_zero_size_global_tensor_with_in_bounds_pieces_is_valid() -> None:
    data = synthetic([0, 4], [(0, [0, 0], [0, 4], 0), (1, [0, 0], [0, 4], 0)])
    assert parsed(data) == []
    data = synthetic([0, 4], [(0, [0, 0], [0, 4], 0), (1, [0, 2], [0, 3], 0)])
    assert parsed(data) == ["piece-bounds"]


def test_replicated_scalar_is_valid() -> None:
    data = synthetic([], [(r, [], [], r) for r in range(3)])
    assert parsed(data) == []


def test_two_primary_scalars_overlap() -> None:
    data = synthetic([], [(0, [], [], 0), (1, [], [], 0)])
    assert parsed(data) == ["coverage-overlap"]


# --- aliases (SPEC 7.6) ----------------------------------------------------------------------


def test_alias_of_a_missing_tensor(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["tensors"]["lm_head.weight"]["alias_of"] = "nope"
    findings = parse_manifest(manifest_bytes(manifest_dict)).findings
    assert [f.code for f in findings] == ["alias-target"]
    assert findings[0].tensor == "lm_head.weight" and "not a tensor" in findings[0].message


def test_alias_of_an_alias(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["tensors"]["output.weight"] = {"alias_of": "lm_head.weight"}
    findings = parse_manifest(manifest_bytes(manifest_dict)).findings
    assert [f.code for f in findings] == ["alias-target"]
    assert "an alias" in findings[0].message


def test_alias_of_itself(manifest_dict: dict[str, Any]) -> None:
    manifest_dict["tensors"]["lm_head.weight"]["alias_of"] = "lm_head.weight"
    assert parsed(manifest_dict) == ["alias-target"]


# --- a property: grid partitions -------------------------------------------------------------


@st.composite
def grid_partitions(draw: st.DrawFn) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
    """A random shape cut along every dimension at random points: the grid's cells."""
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    bounds = []
    for size in shape:
        cuts = draw(st.sets(st.integers(1, size - 1), max_size=size - 1)) if size > 1 else set()
        edges = [0, *sorted(cuts), size]
        bounds.append(list(zip(edges, edges[1:], strict=False)))
    cells = [([a for a, _ in cell], [b - a for a, b in cell])
             for cell in itertools.product(*bounds)]
    return shape, cells


@given(grid=grid_partitions(), data=st.data())
def test_grid_partitions_cover_exactly(
    grid: tuple[list[int], list[tuple[list[int], list[int]]]], data: st.DataObject
) -> None:
    shape, cells = grid
    ranks = data.draw(st.permutations(range(len(cells))))
    pieces = [(rank, off, shp, 0) for rank, (off, shp) in zip(ranks, cells, strict=True)]
    assert check(synthetic(shape, pieces)) == []

    drop = data.draw(st.integers(0, len(pieces) - 1))
    assert check(synthetic(shape, pieces[:drop] + pieces[drop + 1:], world=len(pieces))) == [
        "coverage-gap"]

    rank, off, shp, _ = pieces[data.draw(st.integers(0, len(pieces) - 1))]
    copy_rank = len(pieces)
    assert check(synthetic(shape, [*pieces, (copy_rank, off, shp, 0)])) == ["coverage-overlap"]
    assert check(synthetic(shape, [*pieces, (copy_rank, off, shp, 1)])) == []
