"""Format 1.3: several pieces of one tensor on one rank, joined (SPEC 7.2 rules 3, 6, 7).

Written by the reference writer from a rank's value and one Shard per piece, checked by the
validator (and its numpy fast path), read back joined, resharded from.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import shardspec
from shardspec import Layout, Manifest, Shard
from shardspec.format.checks import check_manifest
from shardspec.format.checks_fast import is_sound
from shardspec.reshard.write import reshard

GLOBAL = torch.arange(16 * 4, dtype=torch.float32).reshape(16, 4)


def per_part(tp: int, parts: int = 2) -> tuple[dict[int, Any], dict[int, Any]]:
    """A fused [16, 4] of ``parts`` equal parts, each split over ``tp`` ranks (gate_up-like)."""
    part = GLOBAL.shape[0] // parts
    states, sharding = {}, {}
    for r in range(tp):
        rows = [(p * part + r * part // tp, part // tp) for p in range(parts)]
        states[r] = {"fused": torch.cat([GLOBAL[a:a + n] for a, n in rows]),
                     "norm": torch.ones(3)}
        sharding[r] = {"fused": [Shard((16, 4), (a, 0), shape=(n, 4)) for a, n in rows],
                       "norm": Shard((3,), (0,), replica=r)}
    return states, sharding


@pytest.fixture
def fused_tp2(tmp_path: Path) -> tuple[Path, dict[int, Any]]:
    states, sharding = per_part(2)
    shardspec.save(states, tmp_path / "c", layout=Layout(tp_size=2), sharding=sharding)
    return tmp_path / "c", states


def test_a_rank_reads_the_join_of_its_pieces(fused_tp2: tuple[Path, dict[int, Any]]) -> None:
    path, states = fused_tp2
    manifest = json.loads((path / "shardspec.json").read_text())
    assert manifest["format_version"] == "1.3"
    pieces = manifest["tensors"]["fused"]["pieces"]
    assert [(p["rank"], p["offset"][0]) for p in pieces] == [(0, 0), (0, 8), (1, 4), (1, 12)]
    assert len({p["file"] for p in pieces}) == 4  # each piece in a file of its own
    for rank in range(2):
        for options in ({}, {"mmap": True}, {"verify": True}):
            got = shardspec.load_rank(path, rank, "cpu", **options)
            assert torch.equal(got["fused"], states[rank]["fused"]), (rank, options)
            assert torch.equal(got["norm"], torch.ones(3))
    assert shardspec.validate(path, checksums=True).ok


def test_joined_pieces_reshard_on_load_and_on_disk(
    fused_tp2: tuple[Path, dict[int, Any]], tmp_path: Path
) -> None:
    """Resharded part by part (SPEC 11.3 rule 12): at TP 4 each rank holds its quarter of each
    part, as a TP-4 writer cutting per part writes it; at TP 1 the parts are one piece."""
    path, _ = fused_tp2
    whole = shardspec.load_rank(path, 0, "cpu", layout=Layout(tp_size=1))
    assert torch.equal(whole["fused"], GLOBAL)
    tp4, sharding4 = per_part(4)
    for rank in range(4):
        got = shardspec.load_rank(path, rank, "cpu", layout=Layout(tp_size=4), verify=True)
        assert torch.equal(got["fused"], tp4[rank]["fused"])
    reshard(path, tmp_path / "tp4", Layout(tp_size=4))
    for rank in range(4):
        got = shardspec.load_rank(tmp_path / "tp4", rank, "cpu")
        assert torch.equal(got["fused"], tp4[rank]["fused"])
    record = shardspec.open(tmp_path / "tp4").manifest.tensors["fused"]
    assert [(p.rank, p.offset, p.shape) for p in record.pieces] == [  # type: ignore[union-attr]
        (rank, s.offset, s.shape) for rank in range(4) for s in sharding4[rank]["fused"]]
    reshard(path, tmp_path / "tp1", Layout(tp_size=1))
    record = shardspec.open(tmp_path / "tp1").manifest.tensors["fused"]
    assert [(p.offset, p.shape) for p in record.pieces] == [  # type: ignore[union-attr]
        ((0, 0), (16, 4))]


def test_columns_join_with_gaps_and_uneven_runs(tmp_path: Path) -> None:
    runs = {0: [(0, 1), (4, 3)], 1: [(1, 3), (7, 1)]}
    weight = torch.arange(16, dtype=torch.int32).reshape(2, 8)
    states = {r: {"w": torch.cat([weight[:, a:a + n] for a, n in rs], dim=1)}
              for r, rs in runs.items()}
    sharding = {r: {"w": [Shard((2, 8), (0, a), shape=(2, n)) for a, n in rs]}
                for r, rs in runs.items()}
    shardspec.save(states, tmp_path / "c", layout=Layout(tp_size=2), sharding=sharding)
    for rank in range(2):
        assert torch.equal(shardspec.load_rank(tmp_path / "c", rank, "cpu")["w"],
                           states[rank]["w"])


def manifest_of(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((path / "shardspec.json").read_text())
    return data


def findings(data: dict[str, Any]) -> list[tuple[str, str]]:
    manifest = Manifest.from_dict(data)
    found = [(f.code, f.message) for f in check_manifest(manifest)]
    assert is_sound(manifest) == (not found)  # the fast verdict agrees with the rules
    return found


def test_the_written_manifest_is_sound_on_the_fast_path(
        fused_tp2: tuple[Path, dict[int, Any]]) -> None:
    assert findings(manifest_of(fused_tp2[0])) == []


def edited(path: Path, change: Any) -> list[tuple[str, str]]:
    data = copy.deepcopy(manifest_of(path))
    change(data["tensors"]["fused"]["pieces"], data)
    return findings(data)


def test_two_pieces_of_a_rank_in_one_file_are_refused(
        fused_tp2: tuple[Path, dict[int, Any]]) -> None:
    def one_file(pieces: list[dict[str, Any]], data: dict[str, Any]) -> None:
        pieces[1]["file"] = pieces[0]["file"]
    [(code, message)] = edited(fused_tp2[0], one_file)
    assert code == "piece-duplicate"
    assert "rank 0 holds 2 pieces" in message and "one file" in message


def test_pieces_of_a_rank_that_do_not_join_are_refused(
        fused_tp2: tuple[Path, dict[int, Any]]) -> None:
    def wider(pieces: list[dict[str, Any]], data: dict[str, Any]) -> None:
        data["tensors"]["fused"]["shape"] = [16, 8]  # rank 1's pieces move to columns 4..8
        for piece in pieces[2:]:
            piece["offset"][1] = 4
        for piece in pieces:
            piece["shape"][1] = 4
    codes = edited(fused_tp2[0], wider)
    assert ("coverage-gap" in {c for c, _ in codes}) and not any(c == "piece-duplicate"
                                                                 for c, _ in codes)

    def two_dimensions(pieces: list[dict[str, Any]], data: dict[str, Any]) -> None:
        data["tensors"]["fused"]["shape"] = [16, 8]
        pieces[1]["offset"] = [8, 4]
    assert ("piece-duplicate", "rank 0 holds 2 pieces; they cannot be joined: their offsets "
            "differ in dimensions [0, 1], not in one") in edited(fused_tp2[0], two_dimensions)

    def overlapping(pieces: list[dict[str, Any]], data: dict[str, Any]) -> None:
        pieces[1]["offset"] = [2, 0]
        pieces[1]["replica"] = 1
    assert ("piece-duplicate", "rank 0 holds 2 pieces; they cannot be joined: they overlap "
            "along dimension 0") in edited(fused_tp2[0], overlapping)

    def other_sizes(pieces: list[dict[str, Any]], data: dict[str, Any]) -> None:
        data["tensors"]["fused"]["shape"] = [16, 8]
        pieces[1]["shape"] = [4, 8]
    assert ("piece-duplicate", "rank 0 holds 2 pieces; they cannot be joined: their offsets or "
            "sizes differ outside dimension 0") in edited(fused_tp2[0], other_sizes)


def test_rank_local_and_tied_tensors_keep_one_piece_per_rank(
        fused_tp2: tuple[Path, dict[int, Any]]) -> None:
    def rank_local(pieces: list[dict[str, Any]], data: dict[str, Any]) -> None:
        record = data["tensors"]["fused"]
        del record["shape"]
        record["rank_local"] = True
        for piece in pieces:
            del piece["offset"]
    assert [c for c, _ in edited(fused_tp2[0], rank_local)] == ["piece-duplicate"] * 2

    def tied(pieces: list[dict[str, Any]], data: dict[str, Any]) -> None:
        data["tensors"]["norm"]["tied_to"] = {"tensor": "fused"}
    codes = edited(fused_tp2[0], tied)
    assert ("piece-duplicate", "rank 0 holds 2 pieces; a tied tensor and its base have one "
            "piece per rank (SPEC 8.4)") in codes


def test_the_writer_refuses_shards_that_do_not_join_to_the_tensor(tmp_path: Path) -> None:
    states, sharding = per_part(2)
    bad = copy.deepcopy(sharding)
    bad[0]["fused"] = [Shard((16, 4), (0, 0)), Shard((16, 4), (8, 0))]
    with pytest.raises(ValueError, match="each of several Shards needs the shape of its piece"):
        shardspec.save(states, tmp_path / "a", layout=Layout(tp_size=2), sharding=bad)
    bad[0]["fused"] = [Shard((16, 4), (0, 0), shape=(4, 4)), Shard((16, 4), (2, 0), shape=(4, 4))]
    with pytest.raises(ValueError, match=r"cannot be joined \(SPEC 7.2 rule 7\): they overlap"):
        shardspec.save(states, tmp_path / "b", layout=Layout(tp_size=2), sharding=bad)
    bad[0]["fused"] = [Shard((16, 4), (0, 0), shape=(2, 4)), Shard((16, 4), (8, 0), shape=(4, 4))]
    with pytest.raises(ValueError, match=r"join to shape \[6, 4\], but the tensor has shape"):
        shardspec.save(states, tmp_path / "c", layout=Layout(tp_size=2), sharding=bad)
    assert not any(p.exists() for p in (tmp_path / "a", tmp_path / "b", tmp_path / "c")) or all(
        not list(p.glob("*.safetensors")) for p in (tmp_path / "a", tmp_path / "b",
                                                    tmp_path / "c") if p.exists())


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), parts=st.integers(1, 4), data=st.data())
def test_any_per_part_split_round_trips(tp: int, parts: int, data: st.DataObject,
                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each part cut over the ranks at random points: every rank joins its runs, in order."""
    sizes = [data.draw(st.integers(tp, 12)) for _ in range(parts)]
    total = sum(sizes)
    weight = torch.randn(total, 3).to(torch.bfloat16)
    runs: dict[int, list[tuple[int, int]]] = {r: [] for r in range(tp)}
    start = 0
    for size in sizes:
        cuts = sorted(data.draw(st.lists(st.integers(0, size), min_size=tp - 1,
                                         max_size=tp - 1)))
        edges = [0, *cuts, size]
        for r in range(tp):
            runs[r].append((start + edges[r], edges[r + 1] - edges[r]))
        start += size
    states, sharding = {}, {}
    for r, rs in runs.items():
        solid = [(a, n) for a, n in rs if n] or [rs[0]]  # empty runs are no piece
        states[r] = {"w": torch.cat([weight[a:a + n] for a, n in solid])}
        sharding[r] = {"w": [Shard((total, 3), (a, 0), shape=(n, 3)) for a, n in solid]}
    path = tmp_path_factory.mktemp("c")
    try:
        shardspec.save(states, path, layout=Layout(tp_size=tp), sharding=sharding,
                       overwrite=True)
    except shardspec.ShardspecError:
        # an empty piece beside others of its rank overlaps nothing but must still not share
        # an offset with them (rule 7): such draws are refused, as the rule says
        assert any(n == 0 for rs in runs.values() for _, n in rs)
        return
    for r in range(tp):
        assert torch.equal(shardspec.load_rank(path, r, "cpu")["w"], states[r]["w"])


def test_parts_along_columns_reshard_part_by_part(tmp_path: Path) -> None:
    """A tensor fused along its columns (a packed weight of input-major quantizers: qweight
    [K, N] of q, k and v) keeps its parts along dimension 1 (SPEC 11.3 rule 12)."""
    weight = torch.arange(4 * 24, dtype=torch.int32).reshape(4, 24)

    def per_rank(tp: int) -> tuple[dict[int, Any], dict[int, Any]]:
        states, sharding = {}, {}
        for r in range(tp):
            runs = [(p * 8 + r * 8 // tp, 8 // tp) for p in range(3)]
            states[r] = {"w": torch.cat([weight[:, a:a + n] for a, n in runs], dim=1)}
            sharding[r] = {"w": [Shard((4, 24), (0, a), shape=(4, n)) for a, n in runs]}
        return states, sharding

    states, sharding = per_rank(2)
    shardspec.save(states, tmp_path / "c", layout=Layout(tp_size=2), sharding=sharding)
    want, _ = per_rank(4)
    for rank in range(4):
        got = shardspec.load_rank(tmp_path / "c", rank, "cpu", layout=Layout(tp_size=4))
        assert torch.equal(got["w"], want[rank]["w"]), rank
    reshard(tmp_path / "c", tmp_path / "tp4", Layout(tp_size=4))
    for rank in range(4):
        assert torch.equal(shardspec.load_rank(tmp_path / "tp4", rank, "cpu")["w"],
                           want[rank]["w"])


@pytest.mark.parametrize("runs", [
    {0: [(0, 4), (4, 4)], 1: [(8, 4), (12, 4)]},  # each rank's chunks adjacent (DCP, FSDP)
    {0: [(0, 4), (4, 4)], 1: [(8, 8)]},  # ranks holding different numbers of pieces
])
def test_pieces_that_are_no_parts_reshard_as_one_region(
        tmp_path: Path, runs: dict[int, list[tuple[int, int]]]) -> None:
    """Where the j-th pieces of the ranks do not make up parts that follow one another, the
    group's pieces are one region, sliced by rule 4 (SPEC 11.3 rules 3, 4 and 12)."""
    states = {r: {"fused": torch.cat([GLOBAL[a:a + n] for a, n in rs])} for r, rs in runs.items()}
    sharding = {r: {"fused": [Shard((16, 4), (a, 0), shape=(n, 4)) for a, n in rs]}
                for r, rs in runs.items()}
    shardspec.save(states, tmp_path / "c", layout=Layout(tp_size=2), sharding=sharding)
    for rank in range(4):
        got = shardspec.load_rank(tmp_path / "c", rank, "cpu", layout=Layout(tp_size=4))
        assert torch.equal(got["fused"], torch.tensor_split(GLOBAL, 4)[rank]), rank


def test_a_join_along_the_first_dimension_is_a_view_of_the_parts(
        fused_tp2: tuple[Path, dict[int, Any]]) -> None:
    """Resharded on load, a rank's parts are read into one buffer one after the other: their
    join along dimension 0 is a view of it, not a copy."""
    path, _ = fused_tp2
    got = shardspec.load_rank(path, 1, "cpu", layout=Layout(tp_size=4))
    tp4, _ = per_part(4)
    assert torch.equal(got["fused"], tp4[1]["fused"])
    assert got["fused"]._base is not None and got["fused"].is_contiguous()
