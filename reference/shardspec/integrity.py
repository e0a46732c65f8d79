"""File digests of SPEC 9.2, computed by streaming (never the whole file in memory)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["ALGORITHMS", "Readable", "digest_stream"]


class Readable(Protocol):
    """A binary file opened for reading (what ``open(..., "rb")`` and ``os.fdopen`` give)."""

    def read(self, size: int = ..., /) -> bytes: ...
    def readinto(self, buffer: Any, /) -> int | None: ...
    def seek(self, offset: int, whence: int = ..., /) -> int: ...

#: SPEC 9.2: digest algorithms this implementation computes and verifies; sha256 is mandatory.
ALGORITHMS: dict[str, Callable[[], Any]] = {
    "sha256": hashlib.sha256,
    "blake2b": hashlib.blake2b,
}

_CHUNK = 16 * 1024 * 1024


def digest_stream(
    handle: Readable,
    algorithms: tuple[str, ...] = ("sha256",),
    progress: Callable[[int], None] | None = None,
) -> tuple[dict[str, str], int]:
    """Hex digests of everything left in ``handle`` and the number of bytes read."""
    hashers = {name: ALGORITHMS[name]() for name in algorithms}
    total = 0
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    while True:
        got = handle.readinto(view)
        if not got:
            break
        for hasher in hashers.values():
            hasher.update(view[:got])
        total += got
        if progress is not None:
            progress(got)
    return {name: hasher.hexdigest() for name, hasher in hashers.items()}, total
