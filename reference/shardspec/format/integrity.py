"""File digests of SPEC 9.2, computed by streaming (never the whole file in memory)."""

from __future__ import annotations

import contextlib
import hashlib
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from .errors import Finding, IntegrityError

__all__ = ["ALGORITHMS", "Digests", "Readable", "check_digests", "digest_stream",
           "known_algorithms"]


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

def known_algorithms(checksums: Mapping[str, str]) -> tuple[str, ...]:
    """SPEC 9.2 rule 5: what verifying a file computes: every listed algorithm known here."""
    return tuple(name for name in ALGORITHMS if name in checksums)


class Digests:
    """The digests of one file's bytes, fed in order: each algorithm its record lists that this
    implementation knows (sha256 always), so a reader checks what the validator checks."""

    def __init__(self, checksums: Mapping[str, str]) -> None:
        self.hashers = {name: ALGORITHMS[name]() for name in known_algorithms(checksums)}

    def update(self, data: Any) -> None:
        for hasher in self.hashers.values():
            hasher.update(data)

    def hexdigests(self) -> dict[str, str]:
        return {name: hasher.hexdigest() for name, hasher in self.hashers.items()}


def check_digests(path: str, checksums: Mapping[str, str], actual: Mapping[str, str],
                  what: str = "file") -> None:
    """IntegrityError ``checksum-mismatch`` unless every digest in ``actual`` is the listed one."""
    wrong = [name for name, digest in actual.items() if checksums.get(name) != digest]
    if wrong:
        verb = "differs" if len(wrong) == 1 else "differ"
        raise IntegrityError(Finding(
            code="checksum-mismatch", file=path,
            message=f"the {what}'s {' and '.join(wrong)} {verb} from the manifest's: it is "
            "corrupt or was changed"))


#: Two buffers of this size: one being read into, one being hashed (16 MiB in all).
_CHUNK = 8 * 1024 * 1024


def digest_stream(
    handle: Readable,
    algorithms: tuple[str, ...] = ("sha256",),
    progress: Callable[[int], None] | None = None,
    prefix: bytes = b"",
) -> tuple[dict[str, str], int]:
    """Hex digests of ``prefix`` (bytes already read from ``handle``) then everything left in
    ``handle``, and the number of bytes hashed.

    A reader thread fills one buffer while this thread hashes the other (both release the
    GIL), so verifying runs at the rate of the slower of reading and hashing, not their sum.
    """
    hashers = {name: ALGORITHMS[name]() for name in algorithms}
    for hasher in hashers.values():
        hasher.update(prefix)
    if prefix and progress is not None:
        progress(len(prefix))
    buffers = [memoryview(bytearray(_CHUNK)), memoryview(bytearray(_CHUNK))]
    filled: queue.Queue[tuple[int, int] | BaseException] = queue.Queue(maxsize=1)
    free: queue.Queue[int] = queue.Queue()
    free.put(0)
    free.put(1)
    stop = threading.Event()

    def read() -> None:
        try:
            while True:
                index = free.get()
                if stop.is_set():
                    return
                got = handle.readinto(buffers[index]) or 0
                filled.put((index, got))
                if not got:
                    return
        except BaseException as exc:  # handed to the hashing thread, which raises it
            filled.put(exc)

    reader = threading.Thread(target=read, name="shardspec-digest-reader", daemon=True)
    reader.start()
    total = len(prefix)
    try:
        while True:
            item = filled.get()
            if isinstance(item, BaseException):
                raise item
            index, got = item
            if not got:
                break
            for hasher in hashers.values():
                hasher.update(buffers[index][:got])
            free.put(index)
            total += got
            if progress is not None:
                progress(got)
    finally:
        stop.set()
        while reader.is_alive():  # after an error here the reader may wait on either queue
            free.put(0)
            with contextlib.suppress(queue.Empty):
                filled.get_nowait()
            reader.join(timeout=0.01)
    return {name: hasher.hexdigest() for name, hasher in hashers.items()}, total
