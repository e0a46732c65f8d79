"""Hostile readers against the conformance runner: its time and peak memory stay bounded.

The stated bound: whatever the reader under test does, ``shardspec conformance`` ends within
5 s beyond its ``--timeout`` and its peak resident set stays under 1 GiB. Each case runs the
command (``--select valid-tp1-minimal --examples 0``: one reader call, or ``--batch``) in a
fresh child process against a reader that:

- ``endless-stdout``: prints zeros on stdout until it is killed (``cat /dev/zero``);
- ``endless-stderr-batch``: the batch form, printing zeros on stderr for each request;
- ``endless-stdout-batch``: the batch form, printing zeros on stdout instead of an answer;
- ``huge-output``: writes an output of 3 GiB of tensor data with a valid header (sparse: it
  costs no disk), judged from its header without reading its data;
- ``holder-same-group``: leaves ``sleep`` running with its stdout, then exits 0;
- ``holder-own-session``: the same with ``sleep`` in a session of its own (out of reach of
  the kill);
- ``hang-with-holder``: leaves such a holder, then sleeps past the time limit;
- ``fifo-output`` / ``fifo-link-output``: puts a FIFO (a link to one) where its output goes;
- ``deletes-input``: deletes every file of the checkpoint it is given, then refuses; the
  vectors must be intact afterwards (checked against ``vectors/SHA256SUMS``).

Time is the command alone (after imports); memory is the child's peak resident set
(``ru_maxrss``), imports (torch) included. Processes the readers leave behind are killed by
pid at the end. Run: ``PYTHONPATH=reference python benchmarks/hostile/bench_hostile_runner.py
[--timeout 5] [--only NAMES] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from contextlib import suppress
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import REFERENCE, REPO  # noqa: E402
from harness.hostile import BOUND_BYTES, BOUND_SECONDS, cli_script, finish, measure  # noqa: E402
from harness.hostile import start as start_run  # noqa: E402

MARGIN = BOUND_SECONDS  # past the suite's own --timeout
BYTES = BOUND_BYTES
HUGE = 3 * 1024**3

_HEAD = "import os, subprocess, sys, time\nPIDS = {pids!r}\n"
_HOLD = """
holder = subprocess.Popen(["sleep", "1000"], start_new_session={session})
with open(PIDS, "a") as handle:
    handle.write(f"{{holder.pid}}\\n")
"""
_READERS = {
    "huge-output": f"""
import json, struct
n = {HUGE}
header = json.dumps({{"w": {{"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}}}).encode()
header += b" " * (-len(header) % 8)
with open(sys.argv[3], "wb") as handle:
    handle.write(struct.pack("<Q", len(header)) + header)
    handle.truncate(8 + len(header) + n)
""",
    "holder-same-group": _HOLD.format(session=False),
    "holder-own-session": _HOLD.format(session=True),
    "hang-with-holder": _HOLD.format(session=True) + "time.sleep(1000)\n",
    "fifo-output": "os.mkfifo(sys.argv[3])\n",
    "fifo-link-output": "os.mkfifo(sys.argv[3] + '.fifo')\n"
                        "os.symlink(os.path.basename(sys.argv[3]) + '.fifo', sys.argv[3])\n",
    "deletes-input": """
for where, _, files in os.walk(sys.argv[1]):
    for name in files:
        os.unlink(os.path.join(where, name))
sys.exit(1)
""",
}
#: name -> (reader command, batch form); scripts are written under ``scripts``.
def cases(scripts: Path, pids: Path) -> dict[str, tuple[str, bool]]:
    out = {
        "endless-stdout": ("cat /dev/zero", False),
        "endless-stderr-batch": ("while read request; do cat /dev/zero >&2; done", True),
        "endless-stdout-batch": ("cat /dev/zero", True),
    }
    for name, body in _READERS.items():
        path = scripts / f"{name}.py"
        path.write_text(_HEAD.format(pids=str(pids)) + body, encoding="utf-8")
        out[name] = (f"{shlex.quote(sys.executable)} {shlex.quote(str(path))}", False)
    return out


def run(args: list[str], limit: float) -> tuple[float, int, str]:
    """The suite under one hostile reader: (seconds, peak RSS, "exit N")."""
    answer: tuple[float, int, str] = measure(
        cli_script(preload="import shardspec.testing.runner"), [json.dumps(["conformance",
                                                                            *args])],
        timeout=limit)
    return answer


def intact(vectors: Path) -> bool:
    checked = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                              "from shardspec.testing.vectors import check_vectors; "
                              "check_vectors(Path(sys.argv[1]))", str(vectors)],
                             env={**os.environ, "PYTHONPATH": str(REFERENCE)},
                             capture_output=True, text=True)
    return checked.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=5.0, help="the suite's --timeout")
    parser.add_argument("--only", help="comma-separated case names")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    vectors = REPO / "conformance" / "vectors"
    bound = args.timeout + MARGIN
    rows = []
    with tempfile.TemporaryDirectory(prefix="shardspec-hostile-runner-") as tmp:
        pids = Path(tmp) / "pids"
        chosen = start_run(1, cases(Path(tmp), pids), args.only, bound=(
            f"--timeout {args.timeout:g}; bound {bound:g} s, {BYTES / 2**30:g} GiB peak RSS"),
            table=("| reader | form | exit | s | peak RSS MiB | within bound |",
                   "|---|---|---:|---:|---:|---|"))
        try:
            for name, (command, batch) in chosen.items():
                options = ["--reader", command, "--select", "valid-tp1-minimal", "--examples",
                           "0", "--timeout", str(args.timeout), "--vectors", str(vectors)]
                elapsed, peak, code = run(options + (["--batch"] if batch else []),
                                          limit=bound + 120)
                ok = elapsed <= bound and peak <= BYTES
                if name == "deletes-input":
                    ok = ok and intact(vectors)
                rows.append({"reader": name, "batch": batch, "exit": code,
                             "seconds": elapsed, "peak_rss": peak, "within_bound": ok})
                print(f"| {name} | {'batch' if batch else 'one call'} | {code} | "
                      f"{elapsed:.2f} | {peak / 2**20:.0f} | {'pass' if ok else 'FAIL'} |",
                      flush=True)
        finally:
            for line in (pids.read_text().split() if pids.exists() else []):
                with suppress(ProcessLookupError):
                    os.kill(int(line), signal.SIGKILL)
    finish(rows, args.json)


if __name__ == "__main__":
    main()
