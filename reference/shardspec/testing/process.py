"""A reader's process, kept within bounds: what it prints, how long it runs, what it leaves.

The reader under test is third-party code. What it prints is read as it comes and only the
last :data:`KEEP` bytes are kept; at its time limit, or once it has exited, every process of
its group is killed; its output pipes are then read for at most :data:`GRACE` seconds more, so
that a process it left behind holding them (even one out of reach of the kill, in a session of
its own) cannot make the suite wait.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time

__all__ = ["CHUNK", "GRACE", "KEEP", "Tail", "drain", "exited", "kill_group", "wait_exit"]

#: Bytes of a reader's output kept for the report (the last ones).
KEEP = 64 * 1024
#: Seconds a pipe is still read after the reader exited or was killed.
GRACE = 1.0
#: Bytes read from a pipe at a time.
CHUNK = 1 << 20
#: The longest pause between two checks whether the reader exited.
_TICK = 0.05


class Tail:
    """The last :data:`KEEP` bytes of a stream, and how many came before them."""

    def __init__(self) -> None:
        self._data = bytearray()
        self._dropped = 0

    def add(self, chunk: bytes) -> None:
        self._data += chunk
        extra = len(self._data) - KEEP
        if extra > KEEP:  # trimmed now and then, not at every chunk
            del self._data[:extra]
            self._dropped += extra

    def text(self) -> str:
        extra = max(len(self._data) - KEEP, 0)
        dropped = self._dropped + extra
        kept = bytes(self._data[extra:]).decode("utf-8", "replace")
        return f"[{dropped} bytes of output before this were not kept]\n{kept}" if dropped \
            else kept


def exited(process: subprocess.Popen[bytes]) -> bool:
    """Whether ``process`` has exited, without reaping it: until it is reaped its id stays
    taken, so that :func:`kill_group` cannot reach another process group."""
    if process.returncode is not None:
        return True
    waitid = getattr(os, "waitid", None)
    if waitid is None:  # no waitid: reaped by poll
        return process.poll() is not None
    try:
        return waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """Kill the process group of ``process`` (started with ``start_new_session``): the reader
    and every process it started that stayed in its group. A reaped leader's group is left
    alone (its id may have been given to another process since)."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)


def wait_exit(process: subprocess.Popen[bytes], seconds: float) -> bool:
    """Wait up to ``seconds`` for ``process`` to exit (without reaping it); whether it did."""
    deadline, pause = time.monotonic() + seconds, 0.001
    while not exited(process):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, _TICK)
    return True


def drain(process: subprocess.Popen[bytes], tail: Tail, deadline: float) -> tuple[bool, bool]:
    """Read the reader's stdout into ``tail`` until it exits and its stdout closes, killing it
    and its group at ``deadline``. Once it has exited, every process left in its group is
    killed, and stdout is read for at most :data:`GRACE` seconds more (until the processes
    that escaped the group, if any, close it). Then it is reaped.

    Returns (timed out, stdout still held by a process it left behind).
    """
    assert process.stdout is not None
    fd = process.stdout.fileno()
    ended: float | None = None
    closed = timed_out = False
    pause = 0.001
    try:
        while True:
            now = time.monotonic()
            if ended is None:
                if exited(process):  # the call is over: what it left in its group goes too
                    kill_group(process)
                    ended = now
                elif now >= deadline:
                    kill_group(process)
                    timed_out, ended = True, now
            if ended is not None and (closed or now >= ended + GRACE):
                break
            left = (deadline if ended is None else ended + GRACE) - now
            wait = max(min(left, pause), 0.0)
            if closed:
                time.sleep(wait)
                ready: list[int] = []
            else:
                ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                pause = min(pause * 2, _TICK)
                continue
            pause = 0.001
            chunk = os.read(fd, CHUNK)
            if chunk:
                tail.add(chunk)
            else:
                closed = True
    finally:
        kill_group(process)  # whatever it left behind, and the reader itself on an error
        process.wait()
        process.stdout.close()
    return timed_out, not closed
