"""transformers' own tensor parallelism over checkpoints, for the native-loading tests: run
under torchrun with gloo ranks. ``python -m torch.distributed.run --nproc-per-node 2
hf_tp_logits.py OUT ORIGINAL,CKPT,... ...`` loads each directory with ``from_pretrained(DIR,
distributed_config=DistributedConfig(tp_plan="auto"))`` (each rank its share; a converted
shardspec checkpoint through its torch-named files and their ``DCP_SHARDING_INFO``), runs one
forward pass, and rank 0 saves ``{DIR: logits}`` to OUT. Each rank also checks that its
share of every parameter is, bit for bit, that of the first directory of its group."""

from __future__ import annotations

import sys

import torch
import transformers

IDS = torch.tensor([[1, 5, 9, 17, 33, 65, 127, 0]])


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def main() -> None:
    out, groups = sys.argv[1], [group.split(",") for group in sys.argv[2:]]
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    config = transformers.DistributedConfig(tp_plan="auto")
    logits = {}
    for group in groups:
        first: dict[str, torch.Tensor] = {}
        for path in group:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                path, distributed_config=config).eval()
            with torch.no_grad():
                logits[path] = model(IDS).logits
            share = {n: _local(t.detach()).clone() for n, t in model.state_dict().items()}
            first = first or share
            assert share.keys() == first.keys(), (path, sorted(share))
            for name, tensor in share.items():
                assert torch.equal(tensor, first[name]), (rank, path, name)
    if rank == 0:
        torch.save(logits, out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
