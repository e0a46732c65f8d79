"""Vectors that pin readings the SPEC once left open (issues 24 and 50): for each, a reader
that reads the rule the other way fails the vector. Valid and invalid ones side by side, by
section."""

from __future__ import annotations

from collections.abc import Callable

import torch

from shardspec import Layout, Logical, Quantization, Shard, Tie

from .bases import (
    F0,
    F1,
    GATE_UP,
    NORM,
    base_tp1,
    base_tp2,
    cut,
    saved_cuts,
    several_gate_up,
    several_qkv,
    tie_after,
)
from .checkpoints import Ckpt, Vector, Vectors, handmade, saved, saved_whole, with_header
from .raw import Raw, raw, values

#: The least magnitude that rounds to infinity in binary64 (round to nearest, ties to even):
#: halfway between the largest finite binary64, 2^1024 - 2^971, and 2^1024.
ROUNDS_TO_INFINITY = 2**1024 - 2**970


def reading_vectors() -> list[Vector]:
    out = Vectors()
    tp1 = base_tp1()

    def valid(id: str, section: str, description: str, ck: Ckpt, **kw: object) -> None:
        ranks = list(range(len(ck.m["ranks"])))
        out.append(Vector(f"valid-{id}", description, section, ck, ranks, **kw))  # type: ignore[arg-type]

    # 2.1 / 2.3: a manifest that is a link to a regular file inside the directory
    valid("manifest-symlink-inside", "2.3", "shardspec.json is a symbolic link to "
          "objects/shardspec.json inside the checkpoint, as in a download cache (created at "
          "run time): the manifest is found by following links (SPEC 2.3 rule 3), so a reader "
          "that opens it without following links refuses a valid checkpoint.", tp1.clone(),
          materialize="symlink-inside", materialize_path="shardspec.json")
    valid("data-symlink-inside", "2.2", "Rank 0's data file is a symbolic link to "
          "objects/<name> inside the checkpoint (created at run time): links inside the "
          "directory are followed (SPEC 2.2 rule 5).", tp1.clone(),
          materialize="symlink-inside", materialize_path=F0)
    # 2.2 rule 5: '..' after a link is physical
    valid("symlink-dotdot-after-link", "2.2", "Rank 0's data file is a link to "
          "'via/../<name>', where 'via' is a link to the directory sub/inner and the file lies "
          "in sub/ (created at run time). Links are followed as the operating system follows "
          "them (SPEC 2.2 rule 5): 'via/..' is sub/. A reader that removes 'via/..' lexically "
          "finds the link itself, a loop, and refuses a valid checkpoint.", tp1.clone(),
          materialize="symlink-dotdot", materialize_path=F0)

    # 3.3 rule 2: the binary64 boundary of integer tokens
    for value, what in ((ROUNDS_TO_INFINITY - 1, "below"), (ROUNDS_TO_INFINITY, "at")):
        ck = tp1.clone()
        ck.m["extensions"] = {"org.example.stats": {"must_understand": False,
                                                    "tokens": Raw(str(value))}}
        text = (f"An optional extension records the integer token 2^1024 - 2^970"
                f"{' - 1' if what == 'below' else ''} ({len(str(value))} digits), ")
        if what == "below":
            valid("integer-largest-finite", "3.3", text + "which rounds to the largest finite "
                  "binary64, 2^1024 - 2^971: a number (SPEC 3.3 rule 2), though above 2^63 and "
                  "in no member the schema types.", ck, warnings=["extension-ignored"])
        else:
            out.add("json-nonfinite", "integer-rounds-to-infinity", text + "halfway between "
                    "the largest finite binary64 and 2^1024: it rounds to infinity (ties to "
                    "even), so it is too large for a binary64 (SPEC 3.3 rule 2), though below "
                    "2^1024.", ck)
    # 3.3 rule 3: -0 is the integer 0
    ck = tp1.clone()
    ck.m["ranks"][0]["tp_rank"] = Raw("-0")
    ck.piece(NORM, 0)["offset"] = [Raw("-0")]
    valid("integer-negative-zero", "3.3", "rank 0's tp_rank and the norm's piece offset are "
          "written as the integer token -0: the integer 0 (SPEC 3.3 rule 3), so minimum 0 "
          "holds.", ck)
    # 3.5: maxLength counts code points
    ck = tp1.clone()
    ck.m["generator"] = "\U0001f980" * 256
    valid("generator-astral-characters", "3.5", "generator is 256 characters outside the "
          "Basic Multilingual Plane (U+1F980): exactly its maxLength of 256, which counts "
          "Unicode code points (SPEC 3.5 rule 2), not the 512 UTF-16 units nor the 1024 "
          "bytes.", ck)

    # 4.3 rule 2: the kind of a newer minor's record with alias_of and rank_local
    ck = base_tp2()
    ck.m["format_version"] = "1.4"
    ck.tensor("lm_head.weight")["rank_local"] = True
    valid("newer-minor-alias-with-rank-local", "4.3", "A 1.4 manifest whose alias "
          "lm_head.weight also has rank_local: true. alias_of decides the kind (SPEC 4.3 rule "
          "2), so it is an alias with an unknown field, ignored with a warning; read as "
          "rank-local, it would lack dtype and pieces.", ck,
          warnings=["unknown-field", "version-newer-minor"])

    # 6.3 rule 2: an escaped lone surrogate in a header
    ck = tp1.clone()
    ck.edit_file(F0, lambda entries: None)  # the header as st_file writes it
    out.add("st-header-json", "lone-surrogate", "A __metadata__ value holds the escaped lone "
            "surrogate \\ud800: a header follows SPEC 3.2 rule 1 (SPEC 6.3 rule 2).",
            with_header(ck, F0, lambda h: _replaced(h, b'"__metadata__":{',
                                                    b'"__metadata__":{"note":"\\ud800",')),
            [0])

    # 7.1 rule 4: bit counts of shapes, element counts of pieces
    count = 2**57 + 1  # I64: 2^63 + 64 bits, pieces of 2 and 2^57 - 1 elements
    ck = handmade(Layout(tp_size=2), {F0: (0, [("big", "I64", (2,), raw(values(
        (2,), torch.int64, 7)))])}, {"big": {"dtype": "I64", "shape": [count], "pieces": [
            {"rank": 0, "file": F0, "offset": [0], "shape": [2]},
            {"rank": 1, "file": F1, "offset": [2], "shape": [count - 2]}]}}, empty_ranks=[1])
    ck.m["ranks"][1]["files"] = [{"path": F1, "size": 8 * (count - 2) + 128,
                                  "checksums": {"sha256": "0" * 64}}]
    out.add("shape-overflow", "bit-count", "An I64 tensor of shape [2^57 + 1]: its element "
            "count fits MAX_SIZE, its bit count (2^63 + 64) does not (SPEC 7.1 rule 4). Each "
            "piece's bit count fits; rank 1's 1 EiB file is listed but absent, so a reader that "
            "checks element counts only loads rank 0.", ck, validator_also=["file-missing"])
    ck = tp1.clone()
    ck.tensor(NORM)["logical"] = {"dtype": "F64", "shape": [2**58]}
    out.add("shape-overflow", "logical-bit-count", "The norm's logical record is F64 of "
            "shape [2^58]: 2^58 elements fit MAX_SIZE, 2^64 bits do not (SPEC 7.1 rule 4).", ck)
    ck = tp1.clone()
    big = [2**32, 2**32]
    ck.m["tensors"]["state"] = {"dtype": "U8", "rank_local": True, "pieces": [
        {"rank": 0, "file": F0, "shape": big}]}
    ck.edit_file(F0, lambda entries: entries.append(["state", "U8", tuple(big), b""]))
    out.add("st-size", "rank-local-element-overflow", "A rank-local U8 piece, and its file "
            "entry, of shape [2^32, 2^32] spanning 0 bytes: 2^64 elements, 0 in wrapping 64-bit "
            "arithmetic. A piece's shape is not a tensor shape: st-size (SPEC 6.5 rule 2, "
            "7.1 rule 4).", ck)

    # 7.3: a replica-0 piece with a zero dimension in a tensor with elements
    norm = values((4,), torch.float32, 8)
    ck = handmade(Layout(tp_size=2), {F0: (0, [("t", "F32", (4,), raw(norm))]),
                                      F1: (1, [("t", "F32", (0,), b"")])},
                  {"t": {"dtype": "F32", "shape": [4], "pieces": [
                      {"rank": 0, "file": F0, "offset": [0], "shape": [4]},
                      {"rank": 1, "file": F1, "offset": [2], "shape": [0]}]}})
    valid("coverage-zero-size-piece", "7.3", "A tensor F32 [4] held whole by rank 0, and by "
          "rank 1 as an empty replica-0 piece at offset [2]: an empty piece covers no element "
          "and overlaps none (SPEC 7.3 rule 2), so coverage holds; rank 1 loads shape [0].", ck)

    # 8.4: ties
    fp8 = Quantization(method="fp8")
    ck = tie_after(saved_whole({"w.weight": values((4, 8), torch.float8_e4m3fn, 9),
                                "w.weight_scale_inv": torch.zeros(0, 1)}, quantization=fp8,
                               logical={"w.weight": Logical(dtype="BF16", shape=(0, 8))}),
                   {"w.weight_scale_inv": Tie(tensor="w.weight", block=(128, 128))})
    out.add("tie-shape", "base-dimension-not-zero", "A base weight F8_E4M3 [4, 8] records the "
            "logical shape [0, 8], and an empty scale [0, 1] is tied to it with block "
            "[128, 128]: 4 stored rows cannot pack 0 grid rows (SPEC 8.4 rule 2: both 0, or "
            "both positive), though 4 divides 0.", ck)
    ck = tie_after(saved_whole({"w.weight": values((4,), torch.float8_e4m3fn, 10),
                                "w.weight_scale_inv": torch.ones(1, 1)}, quantization=fp8),
                   {"w.weight_scale_inv": Tie(tensor="w.weight", block=(4, 4))})
    out.add("tie-shape", "default-axes-out-of-range", "A scale [1, 1] tied with block [4, 4] "
            "and no axes to a weight [4]: the default axes [0, 1] name grid dimension 1, which "
            "a grid of one dimension lacks (SPEC 8.4 rule 3).", ck)
    blocks = torch.tensor(list(range(16)), dtype=torch.uint8).reshape(2, 8)
    ck = tie_after(saved_cuts({"m.w_blocks": cut(blocks, 1, (4, 4)),
                               "m.w_scale": cut(torch.tensor(0.5), None)},
                              Layout(tp_size=2), quantization=Quantization(method="mxfp4"),
                              logical={"m.w_blocks": Logical(dtype="BF16", shape=(2,))}),
                   {"m.w_scale": Tie(tensor="m.w_blocks")})
    out.add("tie-split", "inner-dimension-no-block", "A base U8 [2, 8] (logical [2], so "
            "dimension 1 is inner) split across TP=2 along its inner dimension, with a "
            "per-tensor scale tied without block: a base's piece covers its inner dimensions "
            "whole with or without block (SPEC 8.4 rule 4).", ck)
    weight = values((4, 4), torch.float8_e4m3fn, 11)
    scale = torch.tensor(0.25)
    ck = saved({r: {"w.weight": weight, "w.weight_scale": scale} for r in range(2)},
               Layout(tp_size=2), quantization=fp8,
               sharding={r: {"w.weight": Shard((4, 4), (0, 0), replica=r),
                             "w.weight_scale": Shard((), (), replica=1 - r)} for r in range(2)},
               ties={"w.weight_scale": Tie(tensor="w.weight")})
    valid("tie-replicas-numbered-apart", "8.4", "A weight replicated on both ranks (replicas "
          "0, 1) with its per-tensor scale numbered the other way (replicas 1, 0): a tied "
          "tensor's replica numbers follow 7.4 on their own, not its base's (SPEC 8.4 rule 4).",
          ck)
    _join_readings(out, valid)
    return list(out)


def _join_readings(out: Vectors, valid: Callable[..., None]) -> None:
    """Format 1.3's joins (SPEC 7.2 rules 3 and 7, 4.2 rule 4): the readings issue 50 settled."""
    gate_up = several_gate_up()
    ck = gate_up.clone()
    ck.m["format_version"] = "1.2"
    out.add("piece-duplicate", "joins-in-format-1.2", "The fused gate_up_proj of "
            "valid-several-pieces-fused-gate-up (each rank two pieces, joinable) in a manifest "
            "of format_version 1.2. A manifest is read by its own version's rules, and several "
            "pieces of a tensor on one rank need 1.3 (SPEC 4.2 rule 4, 7.2 rule 3): a reader "
            "that joins them in any 1.x manifest accepts it.", ck, section="4.2")
    ck = gate_up.clone()
    ck.m["format_version"] = "1.4"
    valid("several-pieces-newer-minor", "4.2", "The same fused gate_up_proj in a manifest of "
          "format_version 1.4: a newer minor version keeps what 1.3 allows (SPEC 7.2 rule 3, "
          "'1.3 or later'), read with warning version-newer-minor.", ck,
          warnings=["version-newer-minor"])

    ck = gate_up.clone()
    first, second = (p["file"] for p in ck.m["tensors"][GATE_UP]["pieces"] if p["rank"] == 0)
    ck.put(second, ck.files[first])
    valid("several-pieces-linked-file", "7.2", "The fused gate_up_proj at TP=2, where rank 0's "
          f"second file, {second}, is a symbolic link to its first, {first} (created at run "
          "time). Files are told apart by their listed paths (SPEC 7.2 rule 3, 2.1 rule 3): "
          "the two pieces lie in two files and each is read from its own path, so rank 0's "
          "value is the first file's rows twice. A reader that takes the two paths for one "
          "file refuses a valid checkpoint.", ck, materialize="symlink-to-listed",
          materialize_path=second, materialize_target=first)

    ck = several_qkv()
    qkv = "model.layers.0.self_attn.qkv_proj.weight"
    pieces = ck.m["tensors"][qkv]["pieces"]
    by_rank = [[p for p in pieces if p["rank"] == r] for r in range(4)]
    ck.m["tensors"][qkv]["pieces"] = [p for held in by_rank for p in (held[1], held[2], held[0])]
    for rank in ck.m["ranks"]:
        files = rank["files"]
        rank["files"] = [files[2], files[0], files[1]]
    valid("several-pieces-listed-out-of-order", "7.2", "The fused QKV of "
          "valid-several-pieces-fused-qkv-gqa with each rank's pieces listed k, v, q in the "
          "manifest and its files listed v, q, k: a join lays the pieces in increasing offset "
          "(SPEC 7.2 rule 7), so each rank's value is still q, then k, then v. A reader that "
          "joins in the manifest's order or in the files' order returns other bytes.", ck)

    fused = values((4,), torch.float32, 180)
    for at, ok in ((2, False), (4, True)):
        ck = handmade(Layout(tp_size=1), {
            "a.safetensors": (0, [("t", "F32", (4,), raw(fused))]),
            "b.safetensors": (0, [("t", "F32", (0,), b"")])},
            {"t": {"dtype": "F32", "shape": [4], "pieces": [
                {"rank": 0, "file": "a.safetensors", "offset": [0], "shape": [4]},
                {"rank": 0, "file": "b.safetensors", "offset": [at], "shape": [0]}]}})
        ck.m["format_version"] = "1.3"
        text = (f"Format 1.3: rank 0 holds an F32 [4] whole in one file and an empty piece at "
                f"offset [{at}] in another. ")
        if ok:
            valid("several-pieces-empty-at-end", "7.2", text + "The empty piece begins where "
                  "the other ends: the two join (SPEC 7.2 rule 7), to the whole tensor.", ck)
        else:
            out.add("piece-duplicate", "empty-inside-run", text + "The empty piece overlaps "
                    "nothing for coverage (7.3 rule 2), but it lies inside the other's run, "
                    "so taken by offset one does not end before the next begins: they do not "
                    "join (SPEC 7.2 rule 7).", ck)
    ck = handmade(Layout(tp_size=1), {
        f"{k}.safetensors": (0, [("t", "F32", (4, 0), b"")]) for k in "ab"},
        {"t": {"dtype": "F32", "shape": [8, 0], "pieces": [
            {"rank": 0, "file": "a.safetensors", "offset": [0, 0], "shape": [4, 0]},
            {"rank": 0, "file": "b.safetensors", "offset": [2, 0], "shape": [4, 0]}]}})
    ck.m["format_version"] = "1.3"
    out.add("piece-duplicate", "empty-pieces-overlapping", "Format 1.3: an F32 [8, 0] (no "
            "element, so no coverage rule, 7.3 rule 4) whose rank 0 holds rows 0..4 and rows "
            "2..6, both empty, in two files. Their runs along dimension 0 overlap, so they do "
            "not join (SPEC 7.2 rule 7): the order of runs holds for empty pieces too.", ck)
    for width, ok in ((3, False), (4, True)):
        ck = handmade(Layout(tp_size=1), {
            f"{k}.safetensors": (0, [("w", "F4", (0, width), b"")]) for k in "ab"},
            {"w": {"dtype": "F4", "shape": [0, 2 * width], "pieces": [
                {"rank": 0, "file": f"{k}.safetensors", "offset": [0, width * i],
                 "shape": [0, width]} for i, k in enumerate("ab")]}})
        ck.m["format_version"] = "1.3"
        text = (f"Format 1.3: an F4 [0, {2 * width}] whose rank 0 holds columns 0..{width} "
                f"and {width}..{2 * width}, both empty, in two files. Each piece's run along "
                f"dimension 1 is {width} elements, {4 * width} bits")
        if ok:
            valid("several-pieces-empty-whole-byte-runs", "7.2", text + ": whole bytes, so "
                  "they join, to an empty [0, 8].", ck)
        else:
            out.add("piece-duplicate", "sub-byte-empty-half-byte-runs", text + ": not whole "
                    "bytes. The whole-byte rule of sub-byte dtypes is one of shapes and holds "
                    "for pieces with no elements too (SPEC 7.2 rule 7).", ck)


def _replaced(text: bytes, old: bytes, new: bytes) -> bytes:
    assert text.count(old) == 1, text
    return text.replace(old, new)
