"""A real distributed save of transformers, for the import tests: run under torchrun with 2
gloo ranks. ``python -m torch.distributed.run --nproc-per-node 2 hf_distributed_save.py HF OUT``
loads the Hugging Face directory HF with ``tp_plan="auto"`` (each rank its tensor-parallel
share) and saves it with ``save_pretrained(OUT, distributed_checkpoint=True)``: one
``shard-SSSSS-model-CCCCC-of-NNNNN.safetensors`` per rank, with torch's ``DCP_SHARDING_INFO``."""

from __future__ import annotations

import sys

import torch
import transformers


def main() -> None:
    source, out = sys.argv[1], sys.argv[2]
    torch.distributed.init_process_group("gloo")
    model = transformers.AutoModelForCausalLM.from_pretrained(source, tp_plan="auto",
                                                              dtype=torch.bfloat16)
    model.save_pretrained(out, distributed_checkpoint=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
