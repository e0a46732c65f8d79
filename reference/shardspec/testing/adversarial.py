"""Large manifests built to cost a reader time or memory (issue 20), as bytes.

Each is what an attacker (or a careless writer) can put in a manifest of about 10 MB: the
tests check that they get the right answer, and ``benchmarks/hostile/bench_hostile.py`` that it
comes within the stated bounds. No data file is written: open, validate and inspect read the
manifest first, and these are about the manifest alone.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ADVERSARIAL", "floats_in_config", "joined_pieces", "many_unknown_members",
           "nested_paths", "split_ways", "staircase"]


def _manifest(world: int, tensors: dict[str, Any], *, version: str = "1.2",
              quantization: dict[str, Any] | None = None,
              files: int = 1) -> dict[str, Any]:
    """A manifest of ``world`` TP ranks, each with ``files`` data files named r{rank}-{part}."""
    zeros = "0" * 64
    return {
        "format": "shardspec",
        "format_version": version,
        "layout": {"tp_size": world, "pp_size": 1, "ep_size": 1, "world_size": world,
                   "rank_order": "pp-ep-tp"},
        "ranks": [{"rank": r, "tp_rank": r, "pp_rank": 0, "ep_rank": 0,
                   "files": [{"path": f"r{r}-{p}.safetensors", "size": 8,
                              "checksums": {"sha256": zeros}} for p in range(files)]}
                  for r in range(world)],
        "quantization": quantization or {"method": "none"},
        "tensors": tensors,
    }


def _bytes(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def staircase(n: int, *, overlap: bool = False) -> bytes:
    """An n x n tensor, column i cut at row i: 2n - 1 pieces that differ in both dimensions
    and tile it exactly (SPEC 7.3 rule 5 made a pairwise comparison of them quadratic). With
    ``overlap``, the last column's lower piece starts a row early: coverage-overlap."""
    pieces = []
    for i in range(n):
        if i:
            pieces.append(((0, i), (i, 1)))
        start = i - 1 if overlap and i == n - 1 else i
        pieces.append(((start, i), (n - start, 1)))
    tensor = {"dtype": "I8", "shape": [n, n], "pieces": [
        {"rank": r, "file": f"r{r}-0.safetensors", "offset": list(o), "shape": list(s)}
        for r, (o, s) in enumerate(pieces)]}
    return _bytes(_manifest(len(pieces), {"w": tensor}))


def many_unknown_members(pieces: int) -> bytes:
    """``pieces`` one-piece tensors, each piece with a member the schema does not define:
    ``pieces`` schema errors (they cost minutes and gigabytes to collect)."""
    tensors = {f"t{i}": {"dtype": "I8", "shape": [1], "pieces": [
        {"rank": 0, "file": "r0-0.safetensors", "offset": [0], "shape": [1], "x": 1}]}
        for i in range(pieces)}
    return _bytes(_manifest(1, tensors))


def split_ways(ways: int) -> bytes:
    """One valid tensor split ``ways`` ways, one piece a rank (inspect was ranks x pieces)."""
    tensor = {"dtype": "I8", "shape": [ways], "pieces": [
        {"rank": r, "file": f"r{r}-0.safetensors", "offset": [r], "shape": [1]}
        for r in range(ways)]}
    return _bytes(_manifest(ways, {"w": tensor}))


def floats_in_config(tensors: int) -> bytes:
    """A valid manifest of ``tensors`` tensors, quantized by GPTQ with a float in its config
    (``damp_percent``): valid, and one float sent the whole manifest to Python jsonschema."""
    records = {f"model.layers.{i // 8}.w{i % 8}.weight": {"dtype": "I8", "shape": [1],
               "pieces": [{"rank": 0, "file": "r0-0.safetensors", "offset": [0],
                           "shape": [1]}]} for i in range(tensors)}
    quantization = {"method": "gptq", "config": {"bits": 4, "group_size": 128,
                                                 "damp_percent": 0.01, "desc_act": False}}
    return _bytes(_manifest(1, records, quantization=quantization))


def joined_pieces(pieces: int, *, short_offsets: bool = False) -> bytes:
    """Format 1.3: one rank holds ``pieces`` pieces of one tensor, each in a file of its own,
    joined along dimension 0 (SPEC 7.2 rule 7). With ``short_offsets``, each offset has one
    number for the tensor's two dimensions: every piece is piece-bounds (the join check ran
    on them and raised IndexError, issue 49 item 6)."""
    tensor = {"dtype": "I8", "shape": [pieces, 1], "pieces": [
        {"rank": 0, "file": f"r0-{p}.safetensors",
         "offset": [p] if short_offsets else [p, 0], "shape": [1, 1]}
        for p in range(pieces)]}
    return _bytes(_manifest(1, {"w": tensor}, version="1.3", files=pieces))


def nested_paths(paths: int) -> bytes:
    """Extra files ``a`` and ``paths`` paths of 500 segments under it (SPEC 2.1 rule 6: each
    is path-unsafe; a check comparing every prefix of every path is quadratic in its length)."""
    manifest = _manifest(1, {})
    zeros = "0" * 64
    deep = "a/" * 500
    manifest["extra_files"] = [{"path": p, "size": 0, "checksums": {"sha256": zeros}}
                               for p in ["a", *(f"{deep}{i}" for i in range(paths))]]
    return _bytes(manifest)


#: name -> (builder, argument giving about 10 MB, what the manifest attacks)
ADVERSARIAL = {
    "staircase": (staircase, 32768, "SPEC 7.3 overlap check, pieces cut in two dimensions"),
    "unknown-members": (many_unknown_members, 85000, "one schema error per piece"),
    "split-ways": (split_ways, 32768, "one tensor split across every rank (inspect)"),
    "floats-in-config": (floats_in_config, 95000, "a float in the quantization config"),
    "joined-pieces": (joined_pieces, 48000, "one rank's pieces of a tensor, joined (1.3)"),
    "joined-short-offsets": (lambda n: joined_pieces(n, short_offsets=True), 48000,
                             "several pieces of a rank, each offset short: piece-bounds"),
    "nested-paths": (nested_paths, 8900, "extra files under a listed path (SPEC 2.1 rule 6)"),
}
