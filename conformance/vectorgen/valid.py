"""Valid vectors: checkpoints a reader must load, with the tensors each rank gets."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import torch

import shardspec
from shardspec import Layout, Shard

from .bases import (
    CONFIG,
    F0,
    F1,
    W,
    base_awq,
    base_fp8,
    base_fp8_blocks,
    base_fp8_channel,
    base_gptq,
    base_mxfp4,
    base_pp2_tp2,
    base_tp1,
    base_tp2,
    nested,
    several_columns,
    several_f4_columns,
    several_gate_up,
    several_qkv,
)
from .checkpoints import Ckpt, Vector, handmade, saved, saved_whole, sha256
from .raw import f4, manifest_text, random_bytes, raw, st_assemble, st_header_text, values


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
        torch_dtype = shardspec.format.dtypes.DTYPES[name].torch_dtype
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

    add("several-pieces-fused-gate-up", "7.2", "Format 1.3: a fused gate_up_proj BF16 [8, 4] "
        "(the gate's 4 rows, then the up projection's) shared part by part at TP=2. Rank r "
        "holds rows 2r..2r+2 and 4+2r..4+2r+2 as two pieces in two files; its value is their "
        "join along dimension 0, [4, 4], the gate rows first.", several_gate_up())

    add("several-pieces-fused-qkv-gqa", "7.2", "Format 1.3: a fused QKV BF16 [16, 4] of 4 "
        "query heads and 2 KV heads of 2 rows each at TP=4. Each rank joins three pieces: "
        "its query head and the KV head it shares with one other rank, recorded as replicas "
        "(7.4). Rank r's value is [6, 4]: q, then k, then v.", several_qkv())

    add("several-pieces-joined-along-columns", "7.2", "Format 1.3: an F32 [2, 8] split into "
        "column runs of different widths: rank 0 holds columns 0..1 and 4..7, rank 1 "
        "columns 1..4 and 7..8. A join along dimension 1 interleaves the pieces' rows: rank 0 "
        "gets [2, 4], rank 1 [2, 4].", several_columns())

    add("several-pieces-f4-whole-byte-runs", "7.2", "Format 1.3: F4 [2, 8] joined along its "
        "last dimension: rank 0 holds columns 0..2 and 4..6, rank 1 columns 2..4 and 6..8. "
        "Each piece's run of a row is 2 elements, one whole byte, so the join lays bytes one "
        "after the other: rank 0 gets [2, 4], its row bytes alternating between its pieces.",
        several_f4_columns())

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
    add("newer-minor-version", "4.3", "A manifest from format 1.7 with fields a 1.3 reader does "
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
    add("extension-ignored-by-user-spaced", "4.4", "As extension-ignored-by-user, with "
        "SHARDSPEC_IGNORE_EXTENSIONS written by hand: ' org.example.provenance , ,' "
        "(ignore_extensions_text). The adapter protocol cuts it at each comma, removes spaces "
        "and tabs around each item and skips empty items, so it names the one extension: a "
        "reader that keeps the spaces refuses the checkpoint with extension-unsupported.", ck,
        warnings=["extension-ignored"], ignore_extensions=["org.example.provenance"],
        ignore_extensions_text=" org.example.provenance , ,")

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

