"""One object of a remote checkpoint: its checked size and version, its header, its bytes as a
stream (SPEC 2.4, 9.1, 9.3). Torch-free: ``validate`` uses these without importing torch."""

from __future__ import annotations

import io
import struct

from ..format.errors import Finding, IntegrityError
from ..format.limits import MAX_SAFETENSORS_HEADER_BYTES
from ..format.safetensors_header import Header, read_header
from .remote import ObjectVersion, RemoteRoot

__all__ = ["FILES_IN_FLIGHT", "HEADER_PROBE", "PARTIAL_HEADER_PROBE", "RemoteReader",
           "open_object", "read_remote_header", "remote_version"]

#: Bytes asked for first, to get a file's header in one request when the whole file is read
#: anyway (the data bytes that come with it are used).
HEADER_PROBE = 64 * 1024

#: Objects of one rank fetched (or validated with checksums) at the same time, each with its
#: own ranged requests.
FILES_IN_FLIGHT = 4

#: The same for a resharding rank, which may want none of the data bytes that come with it.
PARTIAL_HEADER_PROBE = 16 * 1024


def remote_version(root: RemoteRoot, relative: str, size: int) -> ObjectVersion:
    """The object's version, after checking its size against the manifest (SPEC 9.1)."""
    version = root.version(relative)
    if version.size != size:
        raise IntegrityError(Finding(
            code="file-size", file=relative,
            message=f"the object has {version.size} bytes, the manifest says {size}",
            hint="the object is truncated, replaced or still uploading"))
    return version


def read_remote_header(root: RemoteRoot, relative: str, size: int,
                       probe: int = HEADER_PROBE) -> tuple[Header, bytes]:
    """The checked header (SPEC 6.3) and every byte fetched for it (a prefix of the object):
    ``probe`` bytes first, the rest of a longer header with a second request."""
    return _finish_header(root, relative, size, root.read(relative, 0, min(size, probe)))


def _finish_header(root: RemoteRoot, relative: str, size: int, prefix: bytes
                   ) -> tuple[Header, bytes]:
    if len(prefix) >= 8:
        (length,) = struct.unpack("<Q", prefix[:8])
        end = 8 + length
        # Only a length that read_header would accept is worth a second request.
        if length <= MAX_SAFETENSORS_HEADER_BYTES and len(prefix) < end <= size:
            prefix += root.read(relative, len(prefix), end)
    return read_header(io.BytesIO(prefix), size, relative), prefix


def open_object(root: RemoteRoot, relative: str, size: int, probe: int = HEADER_PROBE
                ) -> tuple[ObjectVersion, Header, bytes]:
    """:func:`remote_version`, then :func:`read_remote_header`. In this order, not in flight
    together: a version taken after the header's request was answered could belong to an
    object that replaced the one the header came from, and the check of SPEC 9.3 would pass
    on torn bytes."""
    version = remote_version(root, relative, size)
    return version, *read_remote_header(root, relative, size, probe)


class RemoteReader:
    """An object as a readable stream (what :func:`~shardspec.format.integrity.digest_stream`
    reads): its bytes in order, the next ranged requests already in flight."""

    def __init__(self, root: RemoteRoot, relative: str, size: int) -> None:
        self._chunks = root.stream(relative, 0, size)
        self._pending = memoryview(b"")

    def readinto(self, buffer: memoryview) -> int:
        if not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count

    def read(self, size: int = -1) -> bytes:
        raise io.UnsupportedOperation("RemoteReader is read with readinto")

    def seek(self, offset: int, whence: int = 0) -> int:
        raise io.UnsupportedOperation("RemoteReader reads forward only")
