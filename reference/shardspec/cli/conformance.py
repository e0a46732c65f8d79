"""``shardspec conformance --reader "CMD"``: run the conformance suite against any reader.

Registered on :data:`shardspec.cli.app` when :mod:`shardspec.cli` is imported. Exit status: 0
every check passed, 1 some check failed (the report says which SPEC requirement), 2 the suite
could not run (no vectors found, vectors damaged, Hypothesis missing, a bad command).
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.text import Text

from .app import EXIT_INVALID, EXIT_OK, cannot_run, command, err, flag, out

if TYPE_CHECKING:
    from ..testing.checks import CheckResult
    from ..testing.runner import Progress

__all__ = ["QUICK_EXAMPLES", "conformance_command"]

#: Generated checkpoints of a ``--quick`` run.
QUICK_EXAMPLES = 5
#: Seconds between progress lines when stderr is not a terminal.
_EVERY = 5.0


class _Shown:  # a runner.Progress, which needs Hypothesis to import
    """Progress on stderr: a status line on a terminal, else a line every few seconds and at
    each part; every failure as soon as it is found."""

    def __init__(self) -> None:
        self._status: Any = err.status("conformance suite") if err.is_terminal else None
        self._name, self._total, self._done = "", 0, 0
        self._passed = self._failed = 0
        self._label = ""
        self._printed = 0.0

    def __enter__(self) -> _Shown:
        if self._status is not None:
            self._status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.stop()

    def _line(self) -> str:
        return (f"{self._name} {self._done}/{self._total} · {self._passed} checks passed, "
                f"{self._failed} failed · {self._label}")

    def _show(self, force: bool = False) -> None:
        if self._status is not None:
            self._status.update(f"conformance suite: {self._line()}")
        elif force or time.monotonic() - self._printed >= _EVERY:
            err.print(self._line(), highlight=False, soft_wrap=True)
            self._printed = time.monotonic()

    def part(self, name: str, total: int) -> None:
        self._name, self._total, self._done = name, total, 0
        self._label = "starting"
        self._show(force=True)

    def item(self, label: str) -> None:
        self._done = min(self._done + 1, self._total) if not label.startswith("shrinking") \
            else self._done
        self._label = label
        self._show()

    def checked(self, result: CheckResult) -> None:
        if result.passed:
            self._passed += 1
        else:
            self._failed += 1
            line = Text("FAIL ", style="bold red")
            line.append(f"SPEC {result.requirement} {result.check}: {result.message}")
            err.print(line, soft_wrap=True)
        self._show()


#: The bounds of ``--timeout``: a reader call gets at least a tenth of a second, at most a day.
MIN_TIMEOUT, MAX_TIMEOUT = 0.1, 86400.0


def _reader_timeout(value: float) -> float:
    """``--timeout`` within its bounds: ``inf``, ``nan`` and ``1e308`` would never kill a
    reader (or fail deep inside the runner)."""
    if not MIN_TIMEOUT <= value <= MAX_TIMEOUT:  # False for nan as well
        raise typer.BadParameter(f"{value} is not between {MIN_TIMEOUT} and {MAX_TIMEOUT:.0f} "
                                 "seconds")
    return value


def _hypothesis_storage() -> None:
    """Hypothesis caches data (unicode tables) in ``./.hypothesis`` by default; the suite
    writes nothing into the current directory, so it uses the user's cache directory instead,
    unless ``HYPOTHESIS_STORAGE_DIRECTORY`` says where."""
    if os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        return
    from hypothesis.configuration import set_hypothesis_home_dir

    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    set_hypothesis_home_dir(Path(cache) / "shardspec" / "hypothesis")


@command("conformance")
def conformance_command(
    reader: Annotated[str, typer.Option(
        "--reader", show_default=False,
        help="The reader under test, a command called as CMD CHECKPOINT_DIR RANK OUTPUT_FILE "
        "(see conformance/README.md), e.g. \"python conformance/examples/minimal_reader.py\".")],
    batch: Annotated[bool, flag(
        "--batch", help="Start the reader once and send it one request a line on stdin "
        "(CHECKPOINT_DIR, RANK, OUTPUT_FILE, IGNORE_EXTENSIONS, tab-separated); it answers "
        "'ok' or 'error ...' a line. For readers slow to start (anything importing torch).")
    ] = False,
    quick: Annotated[bool, flag(
        "--quick", help=f"A fast run while iterating: each vector on its first rank only, "
        f"{QUICK_EXAMPLES} generated checkpoints, no shrinking.")] = False,
    seed: Annotated[int | None, typer.Option(
        "--seed", help="Seed of the generated checkpoints, to replay a run (default: 0 under "
        "the ci profile, random under thorough).", show_default=False)] = None,
    examples: Annotated[int | None, typer.Option(
        "--examples", min=0, show_default=False,
        help="How many checkpoints to generate; 0 runs the vectors only (default: 25, or 500 "
        "when SHARDSPEC_HYPOTHESIS_PROFILE=thorough).")] = None,
    junit: Annotated[Path | None, typer.Option(
        "--junit", help="Also write the results as JUnit XML to this file.",
        show_default=False)] = None,
    vectors: Annotated[Path | None, typer.Option(
        "--vectors", show_default=False,
        help="The vectors directory (default: those installed with this package, else "
        "conformance/vectors of this checkout or of the current directory).")] = None,
    no_vectors: Annotated[bool, flag(
        "--no-vectors", help="Skip the vectors; run generated checkpoints only.")] = False,
    select: Annotated[str | None, typer.Option(
        "--select", help="Run only the vectors whose id matches one of these comma-separated "
        "globs, e.g. 'valid-*,json-*'.",
        show_default=False)] = None,
    timeout: Annotated[float, typer.Option(
        "--timeout", callback=lambda value: _reader_timeout(value),
        help=f"Seconds one reader call may take before it is killed, with every process it "
        f"started ({MIN_TIMEOUT} to {MAX_TIMEOUT:.0f}).")] = 60.0,
    implements: Annotated[str | None, typer.Option(
        "--implements", show_default=False,
        help="What the reader implements of what the SPEC makes OPTIONAL, comma-separated: "
        "blake2b (SPEC 9.2 rule 3). Vectors that need one it does not declare are skipped, "
        "each with a note.")] = None,
    keep: Annotated[Path | None, typer.Option(
        "--keep", show_default=False,
        help="Where to keep the smallest failing generated checkpoint (default: a new "
        "temporary directory, named in the report).")] = None,
) -> None:
    """Run the conformance suite against READER: the golden vectors, then generated checkpoints.

    Prints a report per SPEC requirement; on a failure, the reader's output and the smallest
    failing checkpoint, kept on disk.
    """
    try:
        from ..testing.adapter import BatchReader, CommandReader
        from ..testing.profiles import conformance_defaults
        from ..testing.runner import (
            OPTIONAL_FEATURES,
            VectorsDamaged,
            find_vectors,
            print_report,
            run_suite,
            write_junit,
        )
    except ImportError as exc:  # Hypothesis is an optional dependency
        cannot_run(f"the conformance suite needs Hypothesis ({exc}); install it with "
                    "pip install 'shardspec[conformance]'")
    _hypothesis_storage()
    try:
        default_examples, default_seed = conformance_defaults()
    except ValueError as exc:
        cannot_run(str(exc))
    declared = [name.strip() for name in (implements or "").split(",") if name.strip()]
    unknown = sorted(set(declared) - set(OPTIONAL_FEATURES))
    if unknown:
        cannot_run(f"--implements {implements!r}: unknown {', '.join(unknown)}; the OPTIONAL "
                   f"features are {', '.join(sorted(OPTIONAL_FEATURES))}")
    if examples is None:
        examples = QUICK_EXAMPLES if quick else default_examples
    seed = default_seed if seed is None else seed
    try:
        under_test: CommandReader | BatchReader = (BatchReader if batch else CommandReader)(
            reader, timeout=timeout)
    except ValueError as exc:
        cannot_run(f"--reader {shlex.quote(reader)}: {exc}")
    if no_vectors:
        vectors = None
    elif vectors is None:
        vectors = find_vectors()
        if vectors is None:
            cannot_run("no conformance vectors found (the package was installed without "
                        "them): pass --vectors DIR, e.g. conformance/vectors of a checkout")
    elif not vectors.is_dir() or not any(vectors.glob("*/vector.json")):
        cannot_run(f"{vectors}: not a directory of conformance vectors")
    if vectors is None and examples == 0:
        cannot_run("nothing to run: --no-vectors with --examples 0")
    started = time.monotonic()
    try:
        with _Shown() as shown:
            result = run_suite(under_test, vectors=vectors, examples=examples, seed=seed,
                               keep=keep, select=select, progress=cast("Progress", shown),
                               quick=quick, implements=declared)
    except VectorsDamaged as exc:
        cannot_run(str(exc))
    finally:
        if isinstance(under_test, BatchReader):
            under_test.close()
    if not result.results:
        cannot_run(f"no check ran (--select {select!r} matches no vector?)")
    print_report(result, out)
    out.print(f"in {time.monotonic() - started:.0f} s", highlight=False)
    if junit is not None:
        write_junit(result, junit)
        out.print(f"JUnit XML written to {junit}")
    raise typer.Exit(EXIT_OK if result.ok else EXIT_INVALID)

