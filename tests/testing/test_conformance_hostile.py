"""The conformance runner under hostile readers: every bound of the runner holds.

A reader under test is third-party code; whatever it does, the suite must end in bounded time
and memory and leave the installed vectors as they were:

- endless output on stdout or stderr: only a bounded tail is kept;
- a huge output file with a valid header: judged from its header, never read whole;
- a background process holding the reader's stdout: no wait past the call (and its grace);
- a FIFO (or a link to one) as the output file: refused, never opened for a blocking read;
- a reader that deletes or writes inside its checkpoint directory: it only ever gets a copy,
  and a vector damaged some other way stops the suite with a message naming it.

The memory checks run the reader call in a child process and compare its peak resident set
(``ru_maxrss``) before and after the call; the checks that could hang do too, with a time limit
of their own, so that a hang fails the test instead of stalling the run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from shardspec.testing import CommandReader, PythonReader, judge_load, reference_read
from shardspec.testing.runner import run_vectors

REPO = Path(__file__).resolve().parents[2]
CONFORMANCE = REPO / "conformance"
VECTORS = CONFORMANCE / "vectors"
MINIMAL = CONFORMANCE / "examples" / "minimal_reader.py"
PYTHON = shlex.quote(sys.executable)
TP1 = VECTORS / "valid-tp1-minimal" / "checkpoint"

#: What a reader call may add to the runner's peak resident set.
GROWTH = 64 * 2**20
#: 200 MB of output: three times GROWTH, so keeping it all (or reading it whole) cannot pass.
BIG = 200_000_000

_CALL = r"""
import json, resource, sys
from pathlib import Path
from shardspec.testing.adapter import BatchReader, CommandReader
form, command, timeout, checkpoint, output = sys.argv[1:6]
reader = (BatchReader if form == "batch" else CommandReader)(command, timeout=float(timeout))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
outcome = reader.run(Path(checkpoint), 0, Path(output))
grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
if form == "batch":
    reader.close()
print("RESULT " + json.dumps({"grew": grew, "exit": outcome.exit_code,
      "seconds": outcome.seconds, "stderr": outcome.stderr[-2000:], "kept": len(outcome.stderr),
      "wrote": outcome.wrote_output, "error": outcome.output_error,
      "read": outcome.output is not None}))
"""


def _child(code: str, *args: str, limit: float = 60) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; its RESULT line. A child past ``limit`` seconds
    (a hang) fails the test."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "reference")}
    try:
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, env=env, timeout=limit, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the runner was still busy after {limit:g} s")
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, done.stdout[-2000:] + done.stderr[-4000:]
    result: dict[str, Any] = json.loads(lines[-1][7:])
    return result


def _call(form: str, command: str, tmp_path: Path, timeout: float = 30,
          limit: float = 60) -> dict[str, Any]:
    return _child(_CALL, form, command, str(timeout), str(TP1),
                  str(tmp_path / "out.safetensors"), limit=limit)


def _script(tmp_path: Path, name: str, body: str) -> str:
    """A reader written as a Python script; the command that runs it."""
    path = tmp_path / name
    path.write_text("import os, subprocess, sys, time\n" + body, encoding="utf-8")
    return f"{PYTHON} {shlex.quote(str(path))}"


# --- 2. endless output -----------------------------------------------------------------------


@pytest.mark.parametrize(("form", "command"), [
    ("command", f"head -c {BIG} /dev/zero"),
    ("batch", f"while read request; do head -c {BIG} /dev/zero >&2; echo error no; done"),
    ("batch", f"while read request; do head -c {BIG} /dev/zero; echo error no; done"),
], ids=["command", "batch-stderr", "batch-stdout"])
def test_endless_output_keeps_a_bounded_tail(form: str, command: str, tmp_path: Path) -> None:
    result = _call(form, command, tmp_path, timeout=20)
    assert result["grew"] < GROWTH, result
    assert result["kept"] <= 70 * 1024
    assert result["seconds"] < 20 + 5


# --- 3. an output larger than the tensors it must hold ---------------------------------------

#: A reader writing a valid output of BIG bytes (sparse: it costs no disk).
_HUGE = f"""
import json, struct
n = {BIG}
header = json.dumps({{"w": {{"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}}}).encode()
header += b" " * (-len(header) % 8)
with open(sys.argv[3], "wb") as handle:
    handle.write(struct.pack("<Q", len(header)) + header)
    handle.truncate(8 + len(header) + n)
"""

_SUITE = r"""
import json, resource, sys
from pathlib import Path
from shardspec.testing.adapter import CommandReader
from shardspec.testing.runner import run_vectors
command, vectors, select = sys.argv[1:4]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
results, _ = run_vectors(CommandReader(command, timeout=30), Path(vectors), select=select)
grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
print("RESULT " + json.dumps({"grew": grew, "results": [
    [r.check, r.requirement, r.passed, r.message] for r in results]}))
"""


def test_an_output_larger_than_expected_is_judged_from_its_header(tmp_path: Path) -> None:
    command = _script(tmp_path, "huge.py", _HUGE)
    result = _child(_SUITE, command, str(VECTORS), "valid-tp1-minimal,valid-tp2-appendix-a")
    assert result["grew"] < GROWTH, result
    assert len(result["results"]) == 3
    for check, requirement, passed, message in result["results"]:
        assert not passed, check
        assert f"holds {BIG} bytes of tensor data, more than the" in message, message
        assert requirement in ("7.2", "7.6", "7.7"), (check, requirement, message)


def test_a_matching_tensor_is_still_compared_byte_for_byte(tmp_path: Path) -> None:
    """The header check reads the tensors that match what is expected: a flipped byte is
    still found, and an unexpected tensor is named without being read."""
    from shardspec.testing import write_output

    expected = {"w": ("U8", (3,), b"\x01\x02\x03")}
    written = {"w": ("U8", (3,), b"\x01\x02\x04")}

    def flipped(checkpoint: str, rank: int, output: str, ignore: Any) -> None:
        write_output(output, written)

    reader = PythonReader(flipped)
    outcome = reader.run(TP1, 0, tmp_path / "out", expect=[expected])
    assert outcome.output == written and outcome.output_bytes == 3
    requirements, passed, message = judge_load(outcome, expected, rank=0, sections=("7.2",))
    assert not passed and "differs from byte 2" in message
    written["x"] = ("F32", (1000,), bytes(4000))
    outcome = reader.run(TP1, 0, tmp_path / "out", expect=[expected])
    assert outcome.output is not None and outcome.output_bytes == 4003
    assert outcome.output["x"] == ("F32", (1000,), b"")  # not read
    requirements, passed, message = judge_load(outcome, expected, rank=0, sections=("7.2",))
    assert not passed and "returned 'x'" in message


# --- 4. a process holding stdout, a FIFO as the output ---------------------------------------

_HOLDER = """
holder = subprocess.Popen(["sleep", "60"], start_new_session={new_session})
with open({pids!r}, "a") as handle:
    handle.write(f"{{holder.pid}}\\n")
"""


@pytest.fixture
def holders(tmp_path: Path) -> Any:
    """Where readers record the processes they leave behind; killed (by pid) at the end."""
    pids = tmp_path / "pids"
    yield pids
    if pids.exists():
        for line in pids.read_text().split():
            with suppress(ProcessLookupError):
                os.kill(int(line), signal.SIGKILL)


@pytest.mark.parametrize("new_session", [False, True], ids=["same-group", "own-session"])
def test_a_background_process_holding_stdout_ends_with_the_call(
        tmp_path: Path, holders: Path, new_session: bool) -> None:
    """The reader exits at once, leaving ``sleep 60`` with its stdout: the call ends after a
    short grace, not at the time limit (or, for a process out of reach of the kill, never)."""
    command = _script(tmp_path, "holder.py", _HOLDER.format(new_session=new_session,
                                                            pids=str(holders)))
    started = time.monotonic()
    result = _call("command", command, tmp_path, timeout=8, limit=30)
    assert time.monotonic() - started < 8
    assert result["exit"] == 0, result
    assert result["seconds"] < 4


def test_a_batch_reader_that_exits_leaving_a_holder_is_not_waited_for(
        tmp_path: Path, holders: Path) -> None:
    command = _script(tmp_path, "holder.py", "sys.stdin.readline()\n" + _HOLDER.format(
        new_session=True, pids=str(holders)))
    result = _call("batch", command, tmp_path, timeout=8, limit=30)
    assert result["exit"] == 1 and "exited without answering" in result["stderr"], result
    assert result["seconds"] < 4


def test_a_timed_out_reader_is_not_waited_for_past_the_kill(tmp_path: Path,
                                                           holders: Path) -> None:
    command = _script(tmp_path, "holder.py", _HOLDER.format(new_session=True, pids=str(
        holders)) + "time.sleep(60)\n")
    started = time.monotonic()
    result = _call("command", command, tmp_path, timeout=1, limit=30)
    assert time.monotonic() - started < 10
    assert result["exit"] is None and result["seconds"] < 4, result


_FIFO = """
def make(output):
    if {link}:
        os.mkfifo(output + ".fifo")
        os.symlink(os.path.basename(output) + ".fifo", output)
    else:
        os.mkfifo(output)
if {batch}:
    for line in sys.stdin:
        make(line.split("\\t")[2])
        print("ok", flush=True)
else:
    make(sys.argv[3])
"""


@pytest.mark.parametrize("form", ["command", "batch"])
@pytest.mark.parametrize("link", [False, True], ids=["fifo", "link-to-fifo"])
def test_a_fifo_output_is_refused_without_blocking(tmp_path: Path, form: str,
                                                   link: bool) -> None:
    command = _script(tmp_path, "fifo.py", _FIFO.format(link=link, batch=form == "batch"))
    result = _call(form, command, tmp_path, timeout=10, limit=30)
    assert result["exit"] == 0 and result["wrote"] and not result["read"], result
    assert "not a regular file" in result["error"], result
    assert ("symbolic link" if link else "FIFO") in result["error"], result


def test_a_directory_as_output_does_not_stop_the_next_call(tmp_path: Path) -> None:
    command = _script(tmp_path, "mkdir.py", "os.makedirs(os.path.join(sys.argv[3], 'x'))\n")
    reader = CommandReader(command)
    for _ in range(2):
        outcome = reader.run(TP1, 0, tmp_path / "out")
        assert outcome.accepted and outcome.wrote_output and outcome.output is None
        assert "not a regular file" in (outcome.output_error or "")


def _cli(*args: str, limit: float = 120) -> subprocess.CompletedProcess[str]:
    """``shardspec ARGS`` in a child process (a hang fails the test after ``limit`` s)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "reference"), "COLUMNS": "200"}
    try:
        return subprocess.run([sys.executable, "-c", "from shardspec.cli import main; main()",
                               *args], capture_output=True, text=True, env=env, timeout=limit,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the runner was still busy after {limit:g} s")


def test_the_runner_reports_a_fifo_output_and_goes_on(tmp_path: Path) -> None:
    command = _script(tmp_path, "fifo.py", _FIFO.format(link=False, batch=False))
    result = _cli("conformance", "--reader", command, "--examples", "0", "--select",
                  "valid-tp1-minimal", "--timeout", "5", limit=60)
    assert result.returncode == 1, result.stdout + result.stderr
    text = " ".join(result.stdout.split())
    assert "FIFO" in text and "not a regular file" in text


# --- 5. readers that damage their checkpoint -------------------------------------------------

#: Rank 0: removes every file of its checkpoint, writes one of its own there, refuses.
#: Other ranks: the minimal reader.
_VANDAL = f"""
checkpoint, rank = sys.argv[1], sys.argv[2]
if rank == "0":
    for where, _, files in os.walk(checkpoint):
        for name in files:
            os.unlink(os.path.join(where, name))
    with open(os.path.join(checkpoint, "shardspec.json"), "w") as handle:
        handle.write("{{}}")
    sys.exit(1)
os.execv(sys.executable, [sys.executable, {str(MINIMAL)!r}, *sys.argv[1:]])
"""

#: Vectors of each kind: valid on two ranks, invalid, and materialized (a link outside).
SOME = ["valid-tp2-appendix-a", "alias-target-chain", "valid-tp1-minimal"]


def _digests(vectors: Path) -> None:
    """Write vectors/SHA256SUMS as make_vectors.py does (``sha256sum`` lines)."""
    lines = []
    for path in sorted(p for p in vectors.rglob("*") if p.is_file()):
        relative = path.relative_to(vectors).as_posix()
        if "/" in relative:
            lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {relative}\n")
    (vectors / "SHA256SUMS").write_text("".join(lines), encoding="utf-8")


@pytest.fixture
def vectors(tmp_path: Path) -> Path:
    """A private copy of some vectors (the real ones must not be put at risk), with their
    digests and materialize.py next to them."""
    root = tmp_path / "conformance" / "vectors"
    root.mkdir(parents=True)
    materialized = sorted(p.parent.name for p in VECTORS.glob("*/vector.json")
                          if "materialize" in json.loads(p.read_text()))
    for name in [*SOME, materialized[0]]:
        shutil.copytree(VECTORS / name, root / name)
    shutil.copy(CONFORMANCE / "materialize.py", root.parent)
    _digests(root)
    return root


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_a_reader_that_damages_its_checkpoint_damages_no_vector(vectors: Path,
                                                                tmp_path: Path) -> None:
    before = _files(vectors)
    vandal = CommandReader(_script(tmp_path, "vandal.py", _VANDAL))
    results, notes = run_vectors(vandal, vectors)
    assert not notes
    by_check = {r.check: r for r in results}
    # rank 0 refused; rank 1 got a checkpoint of its own, whole, and loaded it
    assert not by_check["vectors/valid-tp2-appendix-a/rank-0"].passed
    assert by_check["vectors/valid-tp2-appendix-a/rank-1"].passed, \
        by_check["vectors/valid-tp2-appendix-a/rank-1"].message
    assert _files(vectors) == before
    again, _ = run_vectors(PythonReader(reference_read), vectors)
    assert again and all(r.passed for r in again), [r.message for r in again if not r.passed]


def test_a_damaged_vector_stops_the_suite_naming_it(vectors: Path) -> None:
    from shardspec.testing.runner import VectorsDamaged

    (vectors / "valid-tp1-minimal" / "checkpoint" / "shardspec.json").write_bytes(b"{}")
    (vectors / "alias-target-chain" / "checkpoint" / "model-rank-1-part-0.safetensors").unlink()
    (vectors / "valid-tp2-appendix-a" / "checkpoint" / "extra.bin").write_bytes(b"x")
    with pytest.raises(VectorsDamaged) as caught:
        run_vectors(PythonReader(reference_read), vectors)
    message = str(caught.value)
    for name in ("valid-tp1-minimal", "alias-target-chain", "valid-tp2-appendix-a"):
        assert name in message
    assert "make_vectors.py" in message and "reinstall" in message
    assert "changed" in message and "missing" in message and "not in" in message
    # --select only checks the vectors it runs
    other = next(p.parent.name for p in vectors.glob("*/vector.json")
                 if "materialize" in json.loads(p.read_text()))
    results, _ = run_vectors(PythonReader(reference_read), vectors, select=other)
    assert results and all(r.passed for r in results)
    cli = _cli("conformance", "--reader", "true", "--examples", "0", "--vectors", str(vectors))
    assert cli.returncode == 2, cli.stdout + cli.stderr
    text = " ".join((cli.stdout + cli.stderr).split())
    assert "valid-tp1-minimal" in text and "make_vectors.py" in text


def test_vectors_without_digests_are_run_unchecked(vectors: Path) -> None:
    (vectors / "SHA256SUMS").unlink()
    (vectors / "valid-tp1-minimal" / "checkpoint" / "extra.bin").write_bytes(b"x")
    results, _ = run_vectors(PythonReader(reference_read), vectors, select="valid-tp1-*")
    assert results and all(r.passed for r in results)


def test_the_committed_digests_match_the_vectors() -> None:
    recorded = {}
    for line in (VECTORS / "SHA256SUMS").read_text(encoding="utf-8").splitlines():
        digest, name = line.split("  ", 1)
        recorded[name] = digest
    files = {p.relative_to(VECTORS).as_posix(): p for p in VECTORS.rglob("*") if p.is_file()}
    files = {k: v for k, v in files.items() if "/" in k}
    assert set(recorded) == set(files)
    for name, path in files.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == recorded[name], name
