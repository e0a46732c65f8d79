"""One object of a remote checkpoint, read as one version: its checked size and version, its
header, its bytes in requests the store's link sizes, or as a stream (SPEC 2.4, 9.1, 9.3).
Torch-free: ``validate`` uses these without importing torch."""

from __future__ import annotations

import io
import itertools
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from functools import partial

from ..format.errors import Finding, IntegrityError
from ..format.limits import MAX_SAFETENSORS_HEADER_BYTES
from ..format.safetensors_header import Header, read_header
from .remote import Cancelled, ObjectVersion, RemoteRoot, describe_version

__all__ = ["FILES_IN_FLIGHT", "HEADER_PROBE", "PARTIAL_HEADER_PROBE", "STREAM_AHEAD",
           "RemoteObject", "RemoteReader", "header_in", "remote_version"]

#: Bytes asked for first, to get a file's header in one request when the whole file is read
#: anyway (the data bytes that come with it are used).
HEADER_PROBE = 64 * 1024

#: Objects of one rank fetched (or validated with checksums) at the same time, each with its
#: own ranged requests.
FILES_IN_FLIGHT = 4

#: The same for a resharding rank, which may want none of the data bytes that come with it.
PARTIAL_HEADER_PROBE = 16 * 1024

#: Requests kept ahead of a stream's reader (hashing a file for ``validate --checksums``).
STREAM_AHEAD = 4


def remote_version(root: RemoteRoot, relative: str, size: int) -> ObjectVersion:
    """The object's version by a metadata request, after checking its size against the
    manifest (SPEC 9.1)."""
    version = root.version(relative)
    if version.size != size:
        raise _size_error(relative, version.size, size)
    return version


def _size_error(relative: str, actual: int, size: int) -> IntegrityError:
    return IntegrityError(Finding(
        code="file-size", file=relative,
        message=f"the object has {actual} bytes, the manifest says {size}",
        hint="the object is truncated, replaced or still uploading"))


class RemoteObject:
    """An object read as one version (SPEC 9.3). Where the store reports the size and version
    with every answer (S3), the first answer's are the object's, checked against the record,
    and every later answer is compared with them before its body is read: no metadata request
    at all. Elsewhere both are taken by a metadata request before the first read and again
    by :meth:`finish`."""

    def __init__(self, root: RemoteRoot, relative: str, size: int) -> None:
        self.root, self.relative, self.size = root, relative, size
        self.version: ObjectVersion | None = None
        self._lock = threading.Lock()
        if not root.answers_carry_versions:
            self.version = remote_version(root, relative, size)

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``start..end``; the whole object is one GET without a range."""
        if start == 0 and end == self.size and self.root.answers_carry_versions:
            data = self.root.read_whole(self.relative, self.size, self._agree)
            if len(data) != self.size:  # the answer's length was checked: a broken body
                raise _size_error(self.relative, len(data), self.size)
            return data
        return self.root.read(self.relative, start, end, self._agree)

    def _agree(self, reported: ObjectVersion) -> None:
        if reported.size != self.size:
            raise _size_error(self.relative, reported.size, self.size)
        with self._lock:
            if self.version is None:
                self.version = reported
                return
        if reported != self.version:
            raise IntegrityError(Finding(
                code="object-changed", file=self.relative,
                message=f"{self.root.url_of(self.relative)} changed while it was read "
                f"({describe_version(self.version)} before, {describe_version(reported)} "
                "after)",
                hint="nobody may replace an object a manifest lists (SPEC 10.2); load again "
                "once the writer has committed"))

    def finish(self) -> None:
        """After the last read: IntegrityError ``object-changed`` if the object is not the one
        read (stores whose answers carry no version: a metadata request)."""
        if not self.root.answers_carry_versions:
            assert self.version is not None
            self.root.check_unchanged(self.relative, self.version)

    def read_into(self, start: int, views: Sequence[memoryview],
                  stop: threading.Event | None = None) -> None:
        """Fill ``views``, which follow each other in the object from ``start``, in requests
        the link sizes, all at once (the shared pool bounds those in flight). Once ``stop`` is
        set (another file of the load failed), requests not yet sent are not sent.

        Before the link has measured a data request, an object of several requests is first
        measured by its own first request (``remote_link``'s docstring): on S3 a GET of all of
        the first view, whose first bytes size the requests for the rest, sent while it goes
        on with the first of them (:meth:`_stream_first`); elsewhere a first request alone."""
        link = self.root.link
        parts: list[tuple[int, memoryview]] = []
        position = start
        for view in views:
            parts.append((position, view))
            position += len(view)
        planned = [link.ranges(0, len(view)) for _, view in parts]
        if not link.data_measured and sum(map(len, planned)) > 1:
            first = next(i for i, ranges in enumerate(planned) if ranges)
            if self.root.answers_carry_versions:
                self._stream_first(parts, first, stop)
                return
            at, view = parts[first]
            head = planned[first][0][1]
            started = time.perf_counter()
            self._fill((at, view[:head]), stop)
            latency = link.latency_of(time.perf_counter() - started, head)
            parts[first] = (at + head, view[head:])
            self._fill_all(parts, stop, latency)
            return
        self._fill_all(parts, stop)

    def _stream_first(self, parts: list[tuple[int, memoryview]], first: int,
                      stop: threading.Event | None) -> None:
        """One GET for all of ``parts[first]``; once its first bytes have measured the link,
        the rest of it is cut into requests the measurement sizes with this object's own
        latency, the stream keeping the first of them, and the other parts follow. A store
        whose requests cost in proportion to the object (one that copies it per GET) keeps
        one stream; S3 gets its 8-16 MB ranges a latency after the first byte."""
        if stop is not None and stop.is_set():
            raise Cancelled(self.relative)
        at, view = parts[first]
        others = parts[:first] + parts[first + 1:]
        pending: list[Future[None]] = []

        def cut(got: int, first_byte_s: float, seconds: float) -> int:
            rate = got / max(seconds - first_byte_s, 1e-4)
            rest = self.root.link.ranges(got, len(view), first_byte_s, rate)
            if len(rest) <= 1:
                return len(view)
            jobs = [(at + low, view[low:high]) for low, high in rest[1:]]
            pool = self.root.pool()
            pending.extend(pool.submit(self._fill, job, stop) for job in jobs)
            return rest[0][1]

        try:
            self.root.read_into(self.relative, at, view, self._whole(at, view), self._agree,
                                cut)
            for future in pending:
                future.result()
        finally:
            for future in pending:
                future.cancel()
        self._fill_all(others, stop)

    def _fill_all(self, parts: Sequence[tuple[int, memoryview]], stop: threading.Event | None,
                  latency_s: float | None = None) -> None:
        link = self.root.link
        jobs = [(at + low, view[low:high]) for at, view in parts
                for low, high in link.ranges(0, len(view), latency_s)]
        self.root.map(partial(self._fill, stop=stop), jobs)

    def _fill(self, job: tuple[int, memoryview], stop: threading.Event | None) -> None:
        if stop is not None and stop.is_set():
            raise Cancelled(self.relative)
        at, view = job
        self.root.read_into(self.relative, at, view, self._whole(at, view), self._agree)

    def _whole(self, at: int, view: memoryview) -> bool:
        """Whether a request is for the whole object: asked without a range, one version."""
        return at == 0 and len(view) == self.size

    def stream(self, start: int, end: int) -> Iterator[bytes]:
        """Bytes ``start..end`` in order, request by request, the next ones already asked."""
        pool = self.root.pool()
        # an empty object is still asked for once: its answer reports its size
        ranges = iter(self.root.link.ranges(start, end) or [(start, end)])
        ahead: list[Future[bytes]] = []
        try:
            for low, high in ranges:
                ahead.append(pool.submit(self.read, low, high))
                if len(ahead) >= STREAM_AHEAD:
                    break
            while ahead:
                data = ahead.pop(0).result()
                following = next(ranges, None)
                if following is not None:
                    ahead.append(pool.submit(self.read, *following))
                yield data
        finally:
            for future in ahead:
                future.cancel()

    def header(self, probe: int = HEADER_PROBE) -> tuple[Header, bytes]:
        """The checked header (SPEC 6.3) and every byte fetched for it (a prefix of the
        object): ``probe`` bytes first (the whole object when that is all of it), the rest of
        a longer header with a second request."""
        prefix = self.read(0, min(self.size, probe))
        if len(prefix) >= 8:
            (length,) = struct.unpack("<Q", prefix[:8])
            end = 8 + length
            # Only a length that read_header would accept is worth a second request.
            if length <= MAX_SAFETENSORS_HEADER_BYTES and len(prefix) < end <= self.size:
                prefix += self.read(len(prefix), end)
        return header_in(prefix, self.size, self.relative), prefix


def header_in(prefix: bytes | memoryview, size: int, relative: str) -> Header:
    """The checked header at the start of ``prefix`` (the first bytes of a ``size``-byte file)."""
    end = len(prefix)
    if end >= 8:
        (length,) = struct.unpack_from("<Q", prefix)
        end = min(end, 8 + min(length, MAX_SAFETENSORS_HEADER_BYTES + 1))
    return read_header(io.BytesIO(prefix[:end]), size, relative)


class RemoteReader:
    """An object as a readable stream (what :func:`~shardspec.format.integrity.digest_stream`
    reads): its bytes in order, the next ranged requests already in flight. ``prefix``: its
    first bytes, already fetched (a header's request), which are not asked again."""

    def __init__(self, source: RemoteObject, prefix: bytes = b"") -> None:
        rest = source.stream(len(prefix), source.size) if len(prefix) < source.size else iter(())
        self._chunks = itertools.chain([prefix] if prefix else [], rest)
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
