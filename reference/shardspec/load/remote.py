"""A plan of reads -> tensors, for a checkpoint in object storage (SPEC 2.4, 9.3, 11.1).

Per data file: the object's size and version are taken (one metadata request) and its size
checked against the manifest; the header is fetched with one ranged request (two when it is
over :data:`HEADER_PROBE` bytes) and checked against the plan; then the data region is fetched
in ranged requests, several in flight, straight into the file's host buffer. Last, the version
is taken again: an object replaced while it was read is an error, not torn tensors.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import torch

from ..format.integrity import Digests, check_digests
from ..format.safetensors_header import Header
from ..storage.remote import RemoteRoot
from ..storage.remote_files import FILES_IN_FLIGHT, open_object
from .host_memory import fresh_buffer
from .plan import FilePlan

__all__ = ["read_remote_file", "read_remote_files"]


def read_remote_file(
    root: RemoteRoot, plan: FilePlan, verify: bool, stop: threading.Event | None = None
) -> tuple[Header, torch.Tensor]:
    """The header and the data region (a host uint8 tensor) of one planned data file.

    Verified whenever the store reports no version to compare (SPEC 9.3). ``stop`` set: the
    load failed elsewhere, send no more requests."""
    record = plan.record
    before, header, prefix = open_object(root, record.path, record.size)
    verify = verify or not before.tag
    plan.check_header(header)
    buffer = fresh_buffer(record.size - header.data_start)
    view = memoryview(buffer.numpy())  # type: ignore[arg-type]
    have = len(prefix) - header.data_start  # data bytes that came with the header
    view[:have] = prefix[header.data_start:]
    root.read_into(record.path, len(prefix), [view[have:]], stop)
    if verify:
        digest = Digests(record.checksums)
        digest.update(header.header_bytes)
        digest.update(view)
        check_digests(record.path, record.checksums, digest.hexdigests(), "object")
    root.check_unchanged(record.path, before)
    return header, buffer


def read_remote_files(
    root: RemoteRoot, plans: tuple[FilePlan, ...], verify: bool
) -> Iterator[tuple[FilePlan, Header, torch.Tensor]]:
    """:func:`read_remote_file` for every plan, :data:`FILES_IN_FLIGHT` at once, in order."""
    if len(plans) <= 1:
        for plan in plans:
            yield (plan, *read_remote_file(root, plan, verify))
        return
    stop = threading.Event()
    with ThreadPoolExecutor(min(FILES_IN_FLIGHT, len(plans)),
                            thread_name_prefix="shardspec-remote-file") as pool:
        futures = [pool.submit(read_remote_file, root, plan, verify, stop) for plan in plans]
        try:
            for plan, future in zip(plans, futures, strict=True):
                yield (plan, *future.result())
        finally:
            stop.set()  # a failure (or an abandoned load): the other files stop asking
            for future in futures:
                future.cancel()
