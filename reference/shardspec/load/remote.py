"""A plan of reads -> tensors, for a checkpoint in object storage (SPEC 2.4, 9.3, 11.1).

Per data file: the whole object is fetched at once, in as many GETs as the store's measured
link asks for (one GET without a range when the object is smaller than one request), straight
into the file's host buffer. On S3 each answer's size and version are checked before its body
is read (no HEAD); elsewhere a metadata request before and after does it. Then the header is
checked against the plan, before any tensor is made from the bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import torch

from ..format.integrity import Digests, check_digests
from ..format.safetensors_header import Header
from ..storage.remote import RemoteRoot
from ..storage.remote_files import FILES_IN_FLIGHT, RemoteObject, header_in
from .host_memory import fresh_buffer
from .plan import FilePlan

__all__ = ["read_remote_file", "read_remote_files"]

#: Tensors are viewed in place where the data region starts at a multiple of this.
_ALIGN = 8


def read_remote_file(
    root: RemoteRoot, plan: FilePlan, verify: bool, stop: threading.Event | None = None
) -> tuple[Header, torch.Tensor]:
    """The header and the data region (a host uint8 tensor) of one planned data file.

    Verified whenever the store reports no version to compare (SPEC 9.3). ``stop`` set: the
    load failed elsewhere, send no more requests."""
    record = plan.record
    source = RemoteObject(root, record.path, record.size)
    buffer = fresh_buffer(record.size)
    view = memoryview(buffer.numpy())  # type: ignore[arg-type]
    # The header's bytes come with the data's, not in a request of their own first: the bytes
    # are used only once the header is checked.
    source.read_into(0, [view], stop)
    header = header_in(view, record.size, record.path)
    plan.check_header(header)
    assert source.version is not None
    if verify or not source.version.tag:
        digest = Digests(record.checksums)
        digest.update(view)
        check_digests(record.path, record.checksums, digest.hexdigests(), "object")
    source.finish()
    data = buffer[header.data_start:]
    # No alignment is required of the data region (SPEC 6.3): one that is unaligned is copied.
    return header, data if header.data_start % _ALIGN == 0 else data.clone()


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
