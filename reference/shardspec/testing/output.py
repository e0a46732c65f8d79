"""A reader's output file: written, and read back within bounds.

The output is written by the reader under test, so it is read as hostile input: only a regular
file is opened (a FIFO, a device or a symbolic link is refused without being opened for a
blocking read), its header is checked before any tensor byte is read, and with an expectation
(what the rank must load, and what the other ranks load) only the tensors whose name, dtype and
shape match one expected are read, each by itself: whatever the output holds, the bytes read
are bounded by the bytes expected.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..format.errors import SafetensorsError
from ..format.safetensors_header import read_header

__all__ = ["MAX_OUTPUT_BYTES", "OutputError", "RankTensors", "TensorData", "allowed_bytes",
           "read_bounded", "read_output", "write_output"]

#: One loaded tensor: spec dtype name, shape in elements, raw bytes (SPEC 6.3 rule 8, 6.5).
TensorData = tuple[str, tuple[int, ...], bytes]
#: Everything one rank loads, by name.
RankTensors = dict[str, TensorData]
#: The most tensor bytes read from an output when nothing says what it should hold.
MAX_OUTPUT_BYTES = 1 << 30
#: Header bytes allowed beyond what the expected tensors' entries need (for ``__metadata__``).
_HEADER_SLACK = 1 << 20


class OutputError(Exception):
    """The reader's output file is not a valid safetensors file (or not a file at all)."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a plain file"


def _open(path: Path) -> int:
    """A descriptor of ``path``, which must be a regular file: never follows a link, and never
    blocks (a FIFO or device is refused, by lstat and again by fstat, before any read)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise OutputError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise OutputError(f"{path.name} is {_kind(mode)}, not a regular file: not read")
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(
        os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:  # replaced since the lstat
        raise OutputError(f"{path.name} cannot be opened as a regular file: "
                          f"{exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OutputError(f"{path.name} is {_kind(mode)}, not a regular file: not read")
    return fd


def _allowed(expect: Iterable[Mapping[str, TensorData]]) -> dict[str, set[tuple[str, tuple[
        int, ...]]]]:
    allowed: dict[str, set[tuple[str, tuple[int, ...]]]] = {}
    for tensors in expect:
        for name, (dtype, shape, _) in tensors.items():
            allowed.setdefault(name, set()).add((dtype, tuple(shape)))
    return allowed


def allowed_bytes(expect: Iterable[Mapping[str, TensorData]]) -> int:
    """The most tensor bytes an output may hold that matches one of ``expect``."""
    return max((sum(len(t[2]) for t in tensors.values()) for tensors in expect), default=0)


def _pread(fd: int, count: int, offset: int, name: str) -> bytes:
    data = os.pread(fd, count, offset) if count else b""
    while len(data) < count:  # a regular file gives short reads only at its end
        more = os.pread(fd, count - len(data), offset + len(data))
        if not more:
            raise OutputError(f"{name} changed while it was read")
        data += more
    return data


def read_bounded(path: Path, expect: Iterable[Mapping[str, TensorData]] | None = None
                 ) -> tuple[RankTensors, int]:
    """(tensors, bytes of tensor data the header declares) of a reader's output, parsed
    strictly (SPEC 6.3 rules 1-7).

    Without ``expect``, every tensor is read, unless they hold more than
    :data:`MAX_OUTPUT_BYTES`. With ``expect`` (the tensors the rank must load, and those
    other ranks load), the header may be no larger than their entries need (plus 1 MiB), and
    only the tensors whose name, dtype and shape match one of them are read, one at a time;
    the others keep their name, dtype and shape with empty bytes: a comparison with the
    expected tensors needs no more.
    """
    allowed = None if expect is None else _allowed(expect)
    fd = _open(path)
    try:
        size = os.fstat(fd).st_size
        if allowed is not None and size >= 8:
            (length,) = struct.unpack("<Q", _pread(fd, 8, 0, path.name))
            limit = _HEADER_SLACK + sum(128 + 8 * len(name.encode()) + 24 * len(shape)
                                        for name, kinds in allowed.items() for _, shape in kinds)
            if length > limit:
                raise OutputError(f"its header has {length} bytes, more than the {limit} bytes "
                                  "the expected tensors need: not read")
        with open(fd, "rb", buffering=0, closefd=False) as handle:
            header = read_header(handle, size, path.name)
        data_size = size - header.data_start
        if allowed is None and data_size > MAX_OUTPUT_BYTES:
            raise OutputError(f"it holds {data_size} bytes of tensor data, more than the "
                              f"{MAX_OUTPUT_BYTES} bytes read without an expectation")
        out: RankTensors = {}
        for name, entry in header.entries.items():
            dtype = entry.dtype.name
            wanted = allowed is None or (dtype, entry.shape) in allowed.get(name, ())
            out[name] = (dtype, entry.shape, _pread(fd, entry.end - entry.begin,
                         header.data_start + entry.begin, path.name) if wanted else b"")
    except SafetensorsError as exc:
        raise OutputError(str(exc)) from None
    except OSError as exc:
        raise OutputError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return out, data_size


def read_output(path: Path, expect: Iterable[Mapping[str, TensorData]] | None = None
                ) -> RankTensors:
    """Parse a reader's output strictly (SPEC 6.3 rules 1-7): name -> (dtype, shape, bytes).
    ``expect``: see :func:`read_bounded`."""
    return read_bounded(path, expect)[0]


def write_output(path: Path | str, tensors: Mapping[str, TensorData]) -> None:
    """Write ``tensors`` as a plain safetensors file with exact spec dtype names: entries
    sorted by name, data back to back, the header padded with spaces to 8 bytes."""
    import json

    header: dict[str, object] = {}
    offset = 0
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    with partial.open("wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text)
        for name in sorted(tensors):
            handle.write(tensors[name][2])
    partial.replace(target)
