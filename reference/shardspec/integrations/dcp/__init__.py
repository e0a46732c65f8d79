"""torch.distributed.checkpoint (DCP) reads and writes shardspec checkpoints.

``dcp.save(state_dict, storage_writer=Writer(path))`` from any DCP job (FSDP2, tensor parallel
with DTensor, plain tensors) writes a committed shardspec checkpoint: each rank its own data
files, the coordinator the manifest last. ``dcp.load(state_dict, storage_reader=Reader(path))``
loads any shardspec checkpoint into any sharding, reading only the byte ranges each rank needs.
:mod:`.planning` maps DCP's chunks to shardspec's pieces and back.
"""

from __future__ import annotations

from .planning import OBJECTS_KEY
from .reader import Reader
from .writer import Writer

__all__ = ["OBJECTS_KEY", "Reader", "Writer"]
