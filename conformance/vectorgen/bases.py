"""The valid checkpoints vectors start from: TP, PP x TP, FP8 and the quantized layouts with
tied tensors (SPEC 8.4)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

import shardspec
from shardspec import Layout, Logical, Quantization, Shard, Tie

from .checkpoints import Ckpt, saved, saved_whole
from .raw import f4, random_bytes, values

W = "model-rank-{}-part-0.safetensors"


F0, F1 = W.format(0), W.format(1)


CONFIG = b'{"model_type": "llama", "hidden_size": 4, "vocab_size": 8}\n'

#: Tensors of the bases that vectors refer to by name.
NORM, DOWN = "model.norm.weight", "model.layers.0.mlp.down_proj.weight"
EMBED, O_PROJ = "model.embed_tokens.weight", "model.layers.0.self_attn.o_proj.weight"
SCALAR, SINKS = "model.logit_scale", "model.layers.0.self_attn.sinks"
GATE_UP = "model.layers.0.mlp.gate_up_proj.weight"


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


def several_gate_up() -> Ckpt:
    gate_up = values((8, 4), torch.bfloat16, 160)
    states, sharding = {}, {}
    for r in range(2):
        rows = [(2 * r, 2), (4 + 2 * r, 2)]
        states[r] = {GATE_UP:
                     torch.cat([gate_up[a:a + n] for a, n in rows])}
        sharding[r] = {GATE_UP:
                       [Shard((8, 4), (a, 0), shape=(n, 4)) for a, n in rows]}
    return saved(states, Layout(tp_size=2), sharding=sharding)


def several_qkv() -> Ckpt:
    qkv = values((16, 4), torch.bfloat16, 161)
    states, sharding = {}, {}
    for r in range(4):
        rows = [(2 * r, 0), (8 + 2 * (r // 2), r % 2), (12 + 2 * (r // 2), r % 2)]
        states[r] = {"model.layers.0.self_attn.qkv_proj.weight":
                     torch.cat([qkv[a:a + 2] for a, _ in rows])}
        sharding[r] = {"model.layers.0.self_attn.qkv_proj.weight":
                       [Shard((16, 4), (a, 0), replica, (2, 4)) for a, replica in rows]}
    return saved(states, Layout(tp_size=4), sharding=sharding)


def several_columns() -> Ckpt:
    weight = values((2, 8), torch.float32, 162)
    states, sharding = {}, {}
    for r, runs in enumerate([[(0, 1), (4, 3)], [(1, 3), (7, 1)]]):
        states[r] = {"model.layers.0.mlp.down_proj.weight":
                     torch.cat([weight[:, a:a + n] for a, n in runs], dim=1)}
        sharding[r] = {"model.layers.0.mlp.down_proj.weight":
                       [Shard((2, 8), (0, a), shape=(2, n)) for a, n in runs]}
    return saved(states, Layout(tp_size=2), sharding=sharding)


def several_f4_columns() -> Ckpt:
    """F4 [2, 8] in column runs of 2 elements (one byte a row): rank 0 columns 0..2 and 4..6."""
    weight = f4((2, 8), 163)  # torch's shape counts bytes: [2, 4]
    states, sharding = {}, {}
    for r, starts in enumerate([(0, 4), (2, 6)]):
        states[r] = {"model.layers.0.mlp.experts.down_proj_blocks":
                     torch.cat([weight[:, a // 2:a // 2 + 1] for a in starts], dim=1)}
        sharding[r] = {"model.layers.0.mlp.experts.down_proj_blocks":
                       [Shard((2, 8), (0, a), shape=(2, 2)) for a in starts]}
    return saved(states, Layout(tp_size=2), sharding=sharding)
