"""The adapter protocol: run a reader under test on one rank and read back what it loaded.

A reader under test is a command, called as ``CMD CHECKPOINT_DIR RANK OUTPUT_FILE``. For a valid
checkpoint it writes to OUTPUT_FILE a plain safetensors file holding exactly the tensors that
rank loads (every name, aliases included, with the spec dtype, the shape in elements and the
bytes) and exits 0. For an invalid checkpoint it exits non-zero, writes no output and should say
why on stderr. It MUST verify checksums (SPEC 9.2) on every call, and MUST treat the
comma-separated names in the environment variable ``SHARDSPEC_IGNORE_EXTENSIONS`` as the
must-understand extensions its user allows ignoring (SPEC 4.4 rule 3): the text is cut at each
comma, spaces and tabs around each item are removed, and empty items are skipped
(:func:`ignore_names`; so ``" a , b,"`` names ``a`` and ``b``).

:class:`CommandReader` runs such a command with a per-call time limit; :class:`BatchReader`
starts it once and sends it one request a line (the batch form, for readers whose start-up is
slow, such as anything importing torch); :class:`PythonReader` calls a Python function
in-process (fast, but without a time limit: for Python implementations and tests).
:func:`read_output` parses an output file strictly.

The command is third-party code, run within bounds (:mod:`~shardspec.testing.process`): only
the last 64 KiB of what it prints is kept; at the time limit it is killed with every process
of its group, and a process it leaves behind holding its output pipes is not waited for more
than a second; its output file is read only if it is a regular file, and with ``expect`` only
as far as the tensors expected (:mod:`~shardspec.testing.output`).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import select
import shlex
import shutil
import stat
import subprocess
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from .output import (
    OutputError,
    RankTensors,
    TensorData,
    read_bounded,
    read_output,
    write_output,
)
from .process import CHUNK, GRACE, KEEP, Tail, drain, exited, kill_group, wait_exit

__all__ = [
    "BatchReader",
    "DEFAULT_TIMEOUT",
    "IGNORE_EXTENSIONS_ENV",
    "CommandReader",
    "IgnoreExtensions",
    "Outcome",
    "OutputError",
    "PythonReader",
    "Reader",
    "RankTensors",
    "TensorData",
    "ignore_names",
    "ignore_text",
    "read_output",
    "reference_load",
    "reference_read",
    "tensor_bytes",
    "write_output",
]

#: Names of must-understand extensions the user allows ignoring, comma-separated (SPEC 4.4).
IGNORE_EXTENSIONS_ENV = "SHARDSPEC_IGNORE_EXTENSIONS"

#: What a reader is told it may ignore: the extension names, or the text of
#: SHARDSPEC_IGNORE_EXTENSIONS exactly as it is to be set (a vector's ``ignore_extensions_text``).
IgnoreExtensions = Sequence[str] | str


def ignore_text(ignore: IgnoreExtensions) -> str:
    """SHARDSPEC_IGNORE_EXTENSIONS's text: ``ignore`` as given, or its names joined by commas."""
    return ignore if isinstance(ignore, str) else ",".join(ignore)


def ignore_names(ignore: IgnoreExtensions) -> tuple[str, ...]:
    """The names SHARDSPEC_IGNORE_EXTENSIONS's text gives: cut at each comma, spaces and tabs
    around each item removed, empty items skipped."""
    if not isinstance(ignore, str):
        return tuple(ignore)
    return tuple(name for item in ignore.split(",") if (name := item.strip(" \t")))
#: Seconds one reader call may take before it is killed.
DEFAULT_TIMEOUT = 60.0

#: What an output may hold (see :func:`~shardspec.testing.output.read_bounded`).
Expect = Iterable[Mapping[str, TensorData]]

_TAIL = 4000
#: The longest pause between two checks whether the batch command exited.
_TICK = 0.05


@dataclass(frozen=True)
class Outcome:
    """What one reader call did."""

    #: The exit status; None when the call was killed at the time limit.
    exit_code: int | None
    stderr: str
    seconds: float
    #: Whether OUTPUT_FILE exists after the call.
    wrote_output: bool
    #: The parsed output, when it exists and is a valid safetensors file (read with an
    #: expectation, a tensor unlike every one expected has its name, dtype and shape, but
    #: empty bytes: see :attr:`output_bytes`).
    output: RankTensors | None = None
    #: Why the output could not be parsed, when it exists but is not valid (or not a file).
    output_error: str | None = None
    #: Bytes of tensor data the output's header declares, when it was parsed. With an
    #: expectation, only the tensors like one expected are read: the others have empty bytes.
    output_bytes: int | None = None

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
            ignore_extensions: IgnoreExtensions = ()) -> Outcome: ...


def _finish(exit_code: int | None, stderr: str, started: float, output: Path,
            expect: Expect | None = None) -> Outcome:
    seconds = time.monotonic() - started
    stderr = stderr[-_TAIL:]
    if not os.path.lexists(output):
        return Outcome(exit_code, stderr, seconds, wrote_output=False)
    try:
        tensors, size = read_bounded(output, expect)
    except OutputError as exc:
        return Outcome(exit_code, stderr, seconds, wrote_output=True, output_error=str(exc))
    return Outcome(exit_code, stderr, seconds, wrote_output=True, output=tensors,
                   output_bytes=size)


def _clear(output: Path) -> None:
    """Remove whatever is at OUTPUT_FILE: a previous output, or anything a reader put there."""
    try:
        mode = os.lstat(output).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(output, ignore_errors=True)
    else:
        output.unlink(missing_ok=True)


_SHELL = re.compile(r"[|&;<>()$`\n]")


class CommandReader:
    """A reader command, run as a subprocess with a per-call time limit.

    The command string is split like a shell would (:func:`shlex.split`) and run without a
    shell, unless it uses shell syntax (pipes, redirections, ``$``, ``;``...): then it runs
    under ``/bin/sh -c`` with the three arguments appended as ``"$@"``. What it prints
    (stdout and stderr) is read as it comes, the last 64 KiB kept; at the end of a call every
    process left in its group is killed, and one that escaped it and holds its stdout is not
    waited for more than a second.
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
            ignore_extensions: IgnoreExtensions = (), *, expect: Expect | None = None
            ) -> Outcome:
        """One call. ``expect``: the tensors the output may hold (what the rank must load, what
        other ranks load): only those are read from it (see
        :func:`~shardspec.testing.output.read_bounded`)."""
        _clear(output)
        env = dict(os.environ)
        env.pop(IGNORE_EXTENSIONS_ENV, None)
        if ignore_extensions:
            env[IGNORE_EXTENSIONS_ENV] = ignore_text(ignore_extensions)
        argv = [*self._argv, str(checkpoint), str(rank), str(output)]
        started = time.monotonic()
        try:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, env=env, cwd=self.cwd,
                                       start_new_session=True)
        except OSError as exc:
            return _finish(127, f"cannot run {argv[0]!r}: {exc}", started, output, expect)
        tail = Tail()
        timed_out, held = drain(process, tail, started + self.timeout)
        said = tail.text()
        if timed_out:
            said += f"\n[killed after {self.timeout:g} s]"
        elif held:
            said += (f"\n[the reader exited, but a process it started still held its output: "
                     f"not read after {GRACE:g} s more]")
        return _finish(None if timed_out else process.returncode, said, started, output,
                       expect)


class BatchReader:
    """A reader command in the batch form: started once, it reads one request a line on stdin,
    ``CHECKPOINT_DIR<TAB>RANK<TAB>OUTPUT_FILE<TAB>IGNORE_EXTENSIONS`` (the last field the
    comma-separated names, maybe empty), and answers each with one line on stdout: ``ok`` once
    the output file is written, or ``error`` and why. What it prints on stderr during a request
    is kept for the report (the last 64 KiB). A request that takes longer than ``timeout``
    kills the command (and everything it started); the next request starts it again, as it
    does after the command exits. An answer longer than 64 KiB is not one; a command that
    exits without answering is not waited for more than a second, even if a process it
    started still holds its stdout.
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
        self._pending = bytearray()

    @property
    def name(self) -> str:
        return f"{self.command} (batch)"

    def _start(self) -> subprocess.Popen[bytes]:
        if self._process is not None and not exited(self._process):
            return self._process
        self.close()
        env = dict(os.environ)
        env.pop(IGNORE_EXTENSIONS_ENV, None)  # per request, in the line
        self._process = subprocess.Popen(self._argv, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         env=env, cwd=self.cwd, start_new_session=True,
                                         bufsize=0)
        assert self._process.stdin is not None
        os.set_blocking(self._process.stdin.fileno(), False)
        self._pending = bytearray()
        return self._process

    def close(self) -> None:
        """Stop the command (it is started again on the next request): its stdin is closed,
        and after 2 s it is killed, with whatever it left in its process group."""
        process = self._process
        if process is not None:
            with contextlib.suppress(OSError):
                if process.stdin:
                    process.stdin.close()
            wait_exit(process, 2)
        self._kill()

    def _kill(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        kill_group(process)
        process.wait()
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    @staticmethod
    def _pour(process: subprocess.Popen[bytes], tail: Tail, seconds: float = 0.0) -> None:
        """What is on the command's stderr into ``tail``: what is there now, or whatever comes
        for ``seconds`` (until it closes); never more than 4 MiB."""
        assert process.stderr is not None
        fd, poured = process.stderr.fileno(), 0
        deadline = time.monotonic() + seconds
        while poured < 4 * CHUNK:
            ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
            chunk = os.read(fd, CHUNK) if ready else b""
            if not chunk:
                return
            tail.add(chunk)
            poured += len(chunk)

    @staticmethod
    def _send(process: subprocess.Popen[bytes], data: bytes, deadline: float) -> bool:
        """Write ``data`` to the command's stdin; False if the deadline comes first (OSError
        if it closed its stdin)."""
        assert process.stdin is not None
        fd = process.stdin.fileno()
        while data:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _, ready, _ = select.select([], [fd], [], left)
            if ready:
                data = data[os.write(fd, data):]
        return True

    def _answer(self, process: subprocess.Popen[bytes], tail: Tail, deadline: float
                ) -> tuple[bytes | None, str]:
        """(one line of stdout, ""), reading stderr into ``tail`` meanwhile; or (None, why):
        "timeout" at the deadline, "long" for a line over 64 KiB, "closed" when stdout closes
        or the command exits without answering (read for one second more)."""
        assert process.stdout is not None and process.stderr is not None
        out, err = process.stdout.fileno(), process.stderr.fileno()
        reading = [out, err]
        ended: float | None = None
        pause = 0.001
        while b"\n" not in self._pending:
            now = time.monotonic()
            if ended is None and exited(process):
                kill_group(process)  # what it left in its group cannot answer for it
                ended = now
            if len(self._pending) > KEEP:
                return None, "long"
            if out not in reading or ended is not None and now >= ended + GRACE:
                return None, "closed"
            if ended is None and now >= deadline:
                return None, "timeout"
            left = (deadline if ended is None else ended + GRACE) - now
            ready, _, _ = select.select(reading, [], [], max(min(left, pause), 0))
            pause = 0.001 if ready else min(pause * 2, _TICK)
            for fd in ready:
                chunk = os.read(fd, CHUNK)
                if not chunk:
                    reading.remove(fd)
                elif fd == out:
                    self._pending += chunk
                else:
                    tail.add(chunk)
        line, _, rest = bytes(self._pending).partition(b"\n")
        self._pending = bytearray(rest)
        return line, ""

    def run(self, checkpoint: Path, rank: int, output: Path,
            ignore_extensions: IgnoreExtensions = (), *, expect: Expect | None = None
            ) -> Outcome:
        """One request (``expect``: see :meth:`CommandReader.run`)."""
        _clear(output)
        fields = [str(checkpoint), str(rank), str(output), ignore_text(ignore_extensions)]
        if any(c in f for f in fields for c in "\t\n"):
            raise ValueError(f"a batch request cannot carry a tab or a newline: {fields}")
        started = time.monotonic()
        deadline = started + self.timeout
        try:
            process = self._start()
        except OSError as exc:
            return _finish(127, f"cannot run {self._argv[0]!r}: {exc}", started, output, expect)
        self._pour(process, Tail())  # what it printed between requests is not this one's
        tail = Tail()
        try:
            sent = self._send(process, ("\t".join(fields) + "\n").encode(), deadline)
        except OSError:  # the command exited: its stderr says why
            self._pour(process, tail, GRACE)
            self._kill()
            return _finish(127, tail.text() + "\n[the batch reader exited before the request]",
                           started, output, expect)
        line, why = self._answer(process, tail, deadline) if sent else (None, "timeout")
        if line is None:
            kill_group(process)
            self._pour(process, tail, GRACE)
            self._kill()
            said = tail.text()
            if why == "timeout":
                return _finish(None, said + f"\n[killed after {self.timeout:g} s]", started,
                               output, expect)
            if why == "long":
                return _finish(1, said + f"\n[not a batch answer: over {KEEP} bytes on stdout "
                               "without a newline; expected 'ok' or 'error ...']", started,
                               output, expect)
            return _finish(1, said + "\n[the batch reader exited without answering]",
                           started, output, expect)
        self._pour(process, tail)  # what it printed just before answering
        said = tail.text()
        answer = line.decode("utf-8", "replace").strip()
        if answer == "ok":
            return _finish(0, said, started, output, expect)
        if answer.startswith("error"):
            return _finish(1, said + answer, started, output, expect)
        self._kill()
        return _finish(1, said + f"[not a batch answer: {answer[:200]!r}; expected 'ok' or "
                       "'error ...']", started, output, expect)

    def __enter__(self) -> BatchReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: ``read(checkpoint_dir, rank, output_file, ignore_extensions)``: writes the output or raises.
ReadFunction = Callable[[str, int, str, Sequence[str]], None]


class _Said(io.StringIO):
    """What a function prints: the last 64 KiB (characters) only."""

    def write(self, text: str) -> int:
        super().write(text)
        if self.tell() > 2 * KEEP:
            kept = super().getvalue()[-KEEP:]
            self.seek(0)
            self.truncate()
            super().write(kept)
        return len(text)

    def getvalue(self) -> str:
        return super().getvalue()[-KEEP:]


class PythonReader:
    """A reader given as a Python function, called in-process: any exception is a refusal,
    and its message is the reader's stderr (what it prints, the last 64 KiB). No time limit
    applies."""

    def __init__(self, function: ReadFunction, name: str | None = None) -> None:
        self.function = function
        self._name = name or str(getattr(function, "__qualname__", repr(function)))

    @property
    def name(self) -> str:
        return self._name

    def run(self, checkpoint: Path, rank: int, output: Path,
            ignore_extensions: IgnoreExtensions = (), *, expect: Expect | None = None
            ) -> Outcome:
        """One call (``expect``: see :meth:`CommandReader.run`)."""
        _clear(output)
        started = time.monotonic()
        said = _Said()
        try:
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
                self.function(str(checkpoint), rank, str(output), ignore_names(ignore_extensions))
        except Exception as exc:  # noqa: BLE001 - a refusal, whatever its type
            text = "".join(traceback.format_exception_only(type(exc), exc))
            return _finish(1, said.getvalue() + text, started, output, expect)
        return _finish(0, said.getvalue(), started, output, expect)


# --- the reference reader ------------------------------------------------------------------------


def reference_load(checkpoint: str | os.PathLike[str], rank: int,
                   ignore_extensions: IgnoreExtensions = ()) -> RankTensors:
    """What the reference reader loads for ``rank``, verifying checksums, as the protocol
    writes it: each name with the spec dtype and element shape the manifest gives (F4 and F6
    come back from torch packed; the bytes are the same)."""
    import shardspec
    from shardspec.format.manifest import Alias, TensorRecord

    opened = shardspec.open(checkpoint, ignore_extensions=ignore_names(ignore_extensions))
    tensors = opened.load_rank(rank, "cpu", verify=True)
    out: RankTensors = {}
    for name, tensor in tensors.items():
        record = opened.manifest.tensors[name]
        if isinstance(record, Alias):
            record = opened.manifest.tensors[record.alias_of]
        assert isinstance(record, TensorRecord)
        shape = record.shape_on(rank)
        assert shape is not None
        out[name] = (record.dtype, shape, tensor_bytes(tensor))
    return out


def reference_read(checkpoint: str, rank: int, output: str,
                   ignore_extensions: IgnoreExtensions = ()) -> None:
    """The reference reader by the adapter protocol (see :func:`reference_load`)."""
    write_output(output, reference_load(checkpoint, rank, ignore_extensions))


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """A torch tensor's bytes in row-major order, whatever its dtype and strides."""
    if tensor.numel() == 0:
        return b""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy().tobytes())
