"""Pieces the benchmarks share: a synthetic Llama-shaped model, page-cache eviction, and the
directory the checkpoints are written to."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from harness import OUT

VOCAB = 32000
LAYERS = 32

Spec = list[tuple[str, tuple[int, ...], int | None]]


def model_spec(size_bytes: int) -> tuple[Spec, int]:
    """Llama-shaped tensors (name, shape, TP split dim) of at least ``size_bytes`` in bf16.

    Split dims follow vLLM: column-parallel (q, k, v, gate, up, vocab-parallel embedding and
    lm_head) on dim 0, row-parallel (o, down) on dim 1, norms replicated (None). The hidden size
    grows in steps of 64 until the total reaches the target; every dim is a multiple of 8.
    """
    hidden = 64
    while True:
        inter = -(-hidden * 11 // 4 // 64) * 64  # ~2.75 x hidden, Llama's ratio, multiple of 64
        kv = hidden // 4  # grouped-query attention, 4 query heads per kv head
        spec: list[tuple[str, tuple[int, ...], int | None]] = [
            ("model.embed_tokens.weight", (VOCAB, hidden), 0)]
        for i in range(LAYERS):
            p = f"model.layers.{i}."
            spec += [
                (p + "input_layernorm.weight", (hidden,), None),
                (p + "self_attn.q_proj.weight", (hidden, hidden), 0),
                (p + "self_attn.k_proj.weight", (kv, hidden), 0),
                (p + "self_attn.v_proj.weight", (kv, hidden), 0),
                (p + "self_attn.o_proj.weight", (hidden, hidden), 1),
                (p + "post_attention_layernorm.weight", (hidden,), None),
                (p + "mlp.gate_proj.weight", (inter, hidden), 0),
                (p + "mlp.up_proj.weight", (inter, hidden), 0),
                (p + "mlp.down_proj.weight", (hidden, inter), 1),
            ]
        spec += [("model.norm.weight", (hidden,), None), ("lm_head.weight", (VOCAB, hidden), 0)]
        total = sum(2 * int(np.prod(shape)) for _, shape, _ in spec)
        if total >= size_bytes:
            return spec, hidden
        hidden += 64


def make_weights(spec: Spec, seed: int = 20240601) -> dict[str, torch.Tensor]:
    """Deterministic bf16 weights: random int16 bit patterns with the top exponent bit cleared
    (finite values in (-2, 2), no NaN or Inf), so bit-exact comparison is meaningful."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape, _ in spec:
        bits = torch.randint(-32768, 32768, shape, dtype=torch.int16, generator=gen)
        out[name] = bits.bitwise_and_(-16385).view(torch.bfloat16)  # -16385 == 0xBFFF
    return out


def evict(paths: list[Path]) -> None:
    """Drop ``paths`` from the page cache (no root needed): the next read comes from disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@contextmanager
def bench_workdir(workdir: Path | None, *, keep: bool = False, prefix: str = "bench-"
                  ) -> Iterator[Path]:
    """Where a benchmark writes its checkpoints: ``workdir``, which must be empty, or a new
    directory under ``benchmarks/out`` (``SHARDSPEC_BENCH_OUT``). Emptied, or removed if it was
    made here, afterwards, unless ``keep``. A ``workdir`` that is not empty exits with status 2.
    """
    if workdir is None:
        OUT.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=OUT))
    else:
        path = workdir
        path.mkdir(parents=True, exist_ok=True)
        if any(path.iterdir()):
            print(f"--workdir {path} is not empty", file=sys.stderr)
            raise SystemExit(2)
    try:
        yield path
    finally:
        if keep:
            print(f"kept the checkpoints in {path}")
        elif workdir is None:
            shutil.rmtree(path, ignore_errors=True)
        else:
            for child in path.iterdir():
                shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()
