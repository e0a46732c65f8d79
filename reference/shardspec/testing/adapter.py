"""The adapter protocol: run a reader under test on one rank and read back what it loaded.

A reader under test is a command, called as ``CMD CHECKPOINT_DIR RANK OUTPUT_FILE``. For a valid
checkpoint it writes to OUTPUT_FILE a plain safetensors file holding exactly the tensors that
rank loads (every name, aliases included, with the spec dtype, the shape in elements and the
bytes) and exits 0. For an invalid checkpoint it exits non-zero, writes no output and should say
why on stderr. It MUST verify checksums (SPEC 9.2) on every call, and MUST treat the
comma-separated names in the environment variable ``SHARDSPEC_IGNORE_EXTENSIONS`` as the
must-understand extensions its user allows ignoring (SPEC 4.4 rule 3).

:class:`CommandReader` runs such a command with a per-call time limit; :class:`BatchReader`
starts it once and sends it one request a line (the batch form, for readers whose start-up is
slow, such as anything importing torch); :class:`PythonReader` calls a Python function
in-process (fast, but without a time limit: for Python implementations and tests).
:func:`read_output` parses an output file strictly.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import select
import shlex
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

import torch

from ..format.errors import SafetensorsError
from ..format.safetensors_header import read_header

__all__ = [
    "BatchReader",
    "DEFAULT_TIMEOUT",
    "IGNORE_EXTENSIONS_ENV",
    "CommandReader",
    "Outcome",
    "OutputError",
    "PythonReader",
    "Reader",
    "RankTensors",
    "TensorData",
    "read_output",
    "reference_load",
    "reference_read",
    "tensor_bytes",
    "write_output",
]

#: Names of must-understand extensions the user allows ignoring, comma-separated (SPEC 4.4).
IGNORE_EXTENSIONS_ENV = "SHARDSPEC_IGNORE_EXTENSIONS"
#: Seconds one reader call may take before it is killed.
DEFAULT_TIMEOUT = 60.0

#: One loaded tensor: spec dtype name, shape in elements, raw bytes (SPEC 6.3 rule 8, 6.5).
TensorData = tuple[str, tuple[int, ...], bytes]
#: Everything one rank loads, by name.
RankTensors = dict[str, TensorData]

_TAIL = 4000


class OutputError(Exception):
    """The reader's output file is not a valid safetensors file."""


@dataclass(frozen=True)
class Outcome:
    """What one reader call did."""

    #: The exit status; None when the call was killed at the time limit.
    exit_code: int | None
    stderr: str
    seconds: float
    #: Whether OUTPUT_FILE exists after the call.
    wrote_output: bool
    #: The parsed output, when it exists and is a valid safetensors file.
    output: RankTensors | None = None
    #: Why the output could not be parsed, when it exists but is not valid.
    output_error: str | None = None

    @property
    def timed_out(self) -> bool:
        return self.exit_code is None

    @property
    def accepted(self) -> bool:
        return self.exit_code == 0


class Reader(Protocol):
    """Something that loads one rank of a checkpoint by the adapter protocol."""

    @property
    def name(self) -> str: ...

    def run(self, checkpoint: Path, rank: int, output: Path,
            ignore_extensions: Sequence[str] = ()) -> Outcome: ...


def _finish(exit_code: int | None, stderr: str, started: float, output: Path) -> Outcome:
    seconds = time.monotonic() - started
    stderr = stderr[-_TAIL:]
    if not output.exists():
        return Outcome(exit_code, stderr, seconds, wrote_output=False)
    try:
        tensors = read_output(output)
    except OutputError as exc:
        return Outcome(exit_code, stderr, seconds, wrote_output=True, output_error=str(exc))
    return Outcome(exit_code, stderr, seconds, wrote_output=True, output=tensors)


_SHELL = re.compile(r"[|&;<>()$`\n]")


class CommandReader:
    """A reader command, run as a subprocess with a per-call time limit.

    The command string is split like a shell would (:func:`shlex.split`) and run without a
    shell, unless it uses shell syntax (pipes, redirections, ``$``, ``;``...): then it runs
    under ``/bin/sh -c`` with the three arguments appended as ``"$@"``.
    """

    def __init__(self, command: str, *, timeout: float = DEFAULT_TIMEOUT,
                 cwd: Path | None = None) -> None:
        self.command = command
        self.timeout = timeout
        self.cwd = cwd
        if _SHELL.search(command):
            self._argv = ["/bin/sh", "-c", command + ' "$@"', "shardspec-reader"]
            return
        self._argv = shlex.split(command)
        if not self._argv:
            raise ValueError("the reader command is empty")
        program = self._argv[0]
        if shutil.which(program) is None and not (cwd or Path.cwd()).joinpath(program).is_file():
            raise ValueError(f"{program!r}: command not found")

    @property
    def name(self) -> str:
        return self.command

    def run(self, checkpoint: Path, rank: int, output: Path,
            ignore_extensions: Sequence[str] = ()) -> Outcome:
        output.unlink(missing_ok=True)
        env = dict(os.environ)
        env.pop(IGNORE_EXTENSIONS_ENV, None)
        if ignore_extensions:
            env[IGNORE_EXTENSIONS_ENV] = ",".join(ignore_extensions)
        argv = [*self._argv, str(checkpoint), str(rank), str(output)]
        started = time.monotonic()
        try:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, env=env, cwd=self.cwd,
                                       start_new_session=True)
        except OSError as exc:
            return _finish(127, f"cannot run {argv[0]!r}: {exc}", started, output)
        try:
            out, _ = process.communicate(timeout=self.timeout)
            code: int | None = process.returncode
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):  # the reader and its children
                os.killpg(process.pid, signal.SIGKILL)
            out, _ = process.communicate()
            code = None
            out += f"\n[killed after {self.timeout:g} s]".encode()
        return _finish(code, out.decode("utf-8", "replace"), started, output)


class BatchReader:
    """A reader command in the batch form: started once, it reads one request a line on stdin,
    ``CHECKPOINT_DIR<TAB>RANK<TAB>OUTPUT_FILE<TAB>IGNORE_EXTENSIONS`` (the last field the
    comma-separated names, maybe empty), and answers each with one line on stdout: ``ok`` once
    the output file is written, or ``error`` and why. Anything it prints on stderr is kept for
    the report. A request that takes longer than ``timeout`` kills the command (and everything
    it started); the next request starts it again, as it does after the command exits.
    """

    def __init__(self, command: str, *, timeout: float = DEFAULT_TIMEOUT,
                 cwd: Path | None = None) -> None:
        self.command = command
        self.timeout = timeout
        self.cwd = cwd
        self._argv = (["/bin/sh", "-c", command] if _SHELL.search(command)
                      else shlex.split(command))
        if not self._argv:
            raise ValueError("the reader command is empty")
        if not _SHELL.search(command) and shutil.which(self._argv[0]) is None and not (
                cwd or Path.cwd()).joinpath(self._argv[0]).is_file():
            raise ValueError(f"{self._argv[0]!r}: command not found")
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._pending = b""

    @property
    def name(self) -> str:
        return f"{self.command} (batch)"

    def _start(self) -> subprocess.Popen[bytes]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        self.close()
        # the command's stderr; read with pread only: the file offset is shared with it
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        env = dict(os.environ)
        env.pop(IGNORE_EXTENSIONS_ENV, None)  # per request, in the line
        self._process = subprocess.Popen(self._argv, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._stderr, env=env,
                                         cwd=self.cwd, start_new_session=True)
        self._pending = b""
        return self._process

    def close(self) -> None:
        """Stop the command (it is started again on the next request)."""
        process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(OSError):
                if process.stdin:
                    process.stdin.close()
            try:
                process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            if process.stdout:
                process.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _said(self, since: int) -> str:
        """What the command wrote on stderr from byte ``since`` on."""
        assert self._stderr is not None
        fd = self._stderr.fileno()
        size = os.fstat(fd).st_size
        return os.pread(fd, size - since, since)[-_TAIL:].decode("utf-8", "replace")

    def _answer(self, process: subprocess.Popen[bytes], deadline: float
                ) -> tuple[bytes | None, bool]:
        """(one line of stdout, False); (None, False) at the deadline; (None, True) when
        stdout closes first."""
        assert process.stdout is not None
        fd = process.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, False
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None, False
            chunk = os.read(fd, 65536)
            if not chunk:
                return None, True
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line, False

    def run(self, checkpoint: Path, rank: int, output: Path,
            ignore_extensions: Sequence[str] = ()) -> Outcome:
        output.unlink(missing_ok=True)
        fields = [str(checkpoint), str(rank), str(output), ",".join(ignore_extensions)]
        if any(c in f for f in fields for c in "\t\n"):
            raise ValueError(f"a batch request cannot carry a tab or a newline: {fields}")
        started = time.monotonic()
        try:
            process = self._start()
        except OSError as exc:
            return _finish(127, f"cannot run {self._argv[0]!r}: {exc}", started, output)
        assert process.stdin is not None and self._stderr is not None
        since = os.fstat(self._stderr.fileno()).st_size
        try:
            process.stdin.write(("\t".join(fields) + "\n").encode())
            process.stdin.flush()
        except OSError:  # the command exited: its stderr says why
            self.close()
            return _finish(127, "the batch reader exited before the request", started, output)
        line, closed = self._answer(process, started + self.timeout)
        if line is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            said = self._said(since)
            self.close()
            if closed:
                return _finish(1, said + "\n[the batch reader exited without answering]",
                               started, output)
            return _finish(None, said + f"\n[killed after {self.timeout:g} s]", started, output)
        said = self._said(since)
        answer = line.decode("utf-8", "replace").strip()
        if answer == "ok":
            return _finish(0, said, started, output)
        if answer.startswith("error"):
            return _finish(1, said + answer, started, output)
        self.close()
        return _finish(1, said + f"[not a batch answer: {answer[:200]!r}; expected 'ok' or "
                       "'error ...']", started, output)

    def __enter__(self) -> BatchReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: ``read(checkpoint_dir, rank, output_file, ignore_extensions)``: writes the output or raises.
ReadFunction = Callable[[str, int, str, Sequence[str]], None]


class PythonReader:
    """A reader given as a Python function, called in-process: any exception is a refusal,
    and its message is the reader's stderr. No time limit applies."""

    def __init__(self, function: ReadFunction, name: str | None = None) -> None:
        self.function = function
        self._name = name or str(getattr(function, "__qualname__", repr(function)))

    @property
    def name(self) -> str:
        return self._name

    def run(self, checkpoint: Path, rank: int, output: Path,
            ignore_extensions: Sequence[str] = ()) -> Outcome:
        output.unlink(missing_ok=True)
        started = time.monotonic()
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
                self.function(str(checkpoint), rank, str(output), tuple(ignore_extensions))
        except Exception as exc:  # noqa: BLE001 - a refusal, whatever its type
            text = "".join(traceback.format_exception_only(type(exc), exc))
            return _finish(1, said.getvalue() + text, started, output)
        return _finish(0, said.getvalue(), started, output)


# --- the output file -------------------------------------------------------------------------


def read_output(path: Path) -> RankTensors:
    """Parse a reader's output strictly (SPEC 6.3 rules 1-7): name -> (dtype, shape, bytes)."""
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            header = read_header(handle, size, path.name)
            data = handle.read()
    except SafetensorsError as exc:
        raise OutputError(str(exc)) from None
    except OSError as exc:
        raise OutputError(f"cannot read {path}: {exc}") from None
    if len(data) != size - header.data_start:
        raise OutputError(f"{path} changed while it was read")
    return {name: (e.dtype.name, e.shape, data[e.begin : e.end])
            for name, e in header.entries.items()}


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


def reference_load(checkpoint: str | os.PathLike[str], rank: int,
                   ignore_extensions: Sequence[str] = ()) -> RankTensors:
    """What the reference reader loads for ``rank``, verifying checksums, as the protocol
    writes it: each name with the spec dtype and element shape the manifest gives (F4 and F6
    come back from torch packed; the bytes are the same)."""
    import shardspec
    from shardspec.format.manifest import Alias, TensorRecord

    opened = shardspec.open(checkpoint, ignore_extensions=ignore_extensions)
    tensors = opened.load_rank(rank, "cpu", verify=True)
    out: RankTensors = {}
    for name, tensor in tensors.items():
        record = opened.manifest.tensors[name]
        if isinstance(record, Alias):
            record = opened.manifest.tensors[record.alias_of]
        assert isinstance(record, TensorRecord)
        piece = record.piece_of(rank)
        assert piece is not None
        out[name] = (record.dtype, piece.shape, tensor_bytes(tensor))
    return out


def reference_read(checkpoint: str, rank: int, output: str,
                   ignore_extensions: Sequence[str] = ()) -> None:
    """The reference reader by the adapter protocol (see :func:`reference_load`)."""
    write_output(output, reference_load(checkpoint, rank, ignore_extensions))


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """A torch tensor's bytes in row-major order, whatever its dtype and strides."""
    if tensor.numel() == 0:
        return b""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy().tobytes())
