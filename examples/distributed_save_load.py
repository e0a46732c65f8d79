"""Save and load a small model's state across processes with ``shardspec.distributed``.

Run it with torchrun (4 processes; gloo on CPU, nccl where CUDA is available):

    python -m torch.distributed.run --standalone --nproc-per-node 4 \\
        examples/distributed_save_load.py --dir dist-checkpoint

Every rank builds the same seeded model state, keeps its tensor-parallel slice of each weight
(``shardspec.split``), and all ranks save together: each writes its own files, rank 0 writes
the manifest last. Then every rank loads its slice back onto its device and checks it bit-exact.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import shardspec
import shardspec.distributed
from shardspec import Layout

HIDDEN, INTERMEDIATE, VOCAB, LAYERS = 64, 176, 128, 2

# How each weight is split across TP ranks: 0 = colwise, 1 = rowwise, None = replicated.
SPLIT_DIM = {
    "self_attn.qkv_proj.weight": 0,
    "self_attn.o_proj.weight": 1,
    "mlp.up_proj.weight": 0,
    "mlp.down_proj.weight": 1,
    "input_layernorm.weight": None,
}


def model_state() -> dict[str, tuple[torch.Tensor, int | None]]:
    """The whole model, the same on every rank (seeded): name -> (tensor, split dim)."""
    gen = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(torch.bfloat16)

    shapes = {
        "self_attn.qkv_proj.weight": (3 * HIDDEN, HIDDEN),
        "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
        "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
        "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
        "input_layernorm.weight": (HIDDEN,),
    }
    state = {"embed_tokens.weight": (randn(VOCAB, HIDDEN), 0)}
    for layer in range(LAYERS):
        for name, shape in shapes.items():
            state[f"layers.{layer}.{name}"] = (randn(*shape), SPLIT_DIM[name])
    state["norm.weight"] = (torch.ones(HIDDEN, dtype=torch.bfloat16), None)
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="dist-checkpoint", help="checkpoint directory "
                        "(on a filesystem every rank sees); replaced if it holds one")
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")

    # This rank's slice of every weight, with the Shard saying where it sits in the whole.
    state: dict[str, torch.Tensor] = {}
    sharding: dict[str, shardspec.Shard] = {}
    for name, (tensor, dim) in model_state().items():
        piece, shard = shardspec.split(tensor, dim, world)[rank]
        state[name], sharding[name] = piece.to(device), shard
    state["lm_head.weight"] = state["embed_tokens.weight"]  # tied: saved as an alias

    shardspec.distributed.save(state, args.dir, layout=Layout(tp_size=world),
                               sharding=sharding, overwrite=True,
                               metadata={"example": "distributed_save_load"})
    loaded = shardspec.distributed.load(args.dir)  # cuda:<LOCAL_RANK> where CUDA exists

    def raw(t: torch.Tensor) -> torch.Tensor:
        return t.detach().contiguous().reshape(-1).view(torch.uint8).cpu()

    bad = sorted(name for name, t in state.items()
                 if name not in loaded or loaded[name].dtype != t.dtype
                 or loaded[name].shape != t.shape or not torch.equal(raw(loaded[name]), raw(t)))
    if set(loaded) != set(state) or loaded["lm_head.weight"] is not loaded["embed_tokens.weight"]:
        bad.append("<names or alias>")
    nbytes = sum(t.numel() * t.element_size() for n, t in loaded.items() if n != "lm_head.weight")
    dist.destroy_process_group()
    if bad:
        raise SystemExit(f"rank {rank}/{world}: MISMATCH in {bad}")
    print(f"rank {rank}/{world}: saved and loaded {len(loaded)} tensors ({nbytes} bytes) "
          f"bit-exact on {loaded['norm.weight'].device}", flush=True)


if __name__ == "__main__":
    main()
