"""``shardspec conformance --reader "CMD"``: run the conformance suite against any reader.

Registered on :data:`shardspec.cli.app` when :mod:`shardspec.cli` is imported. Exit status: 0
every check passed, 1 some check failed (the report says which SPEC requirement), 2 the suite
could not run (no vectors found, Hypothesis missing, a bad command).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from .cli import EXIT_INVALID, EXIT_OK, _cannot_run, app, err, out

__all__ = ["conformance_command"]


@app.command("conformance")
def conformance_command(
    reader: Annotated[str, typer.Option(
        "--reader", show_default=False,
        help="The reader under test, a command called as CMD CHECKPOINT_DIR RANK OUTPUT_FILE "
        "(see conformance/README.md), e.g. \"python conformance/examples/minimal_reader.py\".")],
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
        help="The vectors directory (default: conformance/vectors of this checkout or the "
        "current directory; the vectors are not in the wheel).")] = None,
    no_vectors: Annotated[bool, typer.Option(
        "--no-vectors", help="Skip the vectors; run generated checkpoints only.")] = False,
    select: Annotated[str | None, typer.Option(
        "--select", help="Run only the vectors whose id matches one of these comma-separated "
        "globs, e.g. 'valid-*,json-*'.",
        show_default=False)] = None,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=0.1, help="Seconds one reader call may take before it is killed.")
    ] = 60.0,
    keep: Annotated[Path, typer.Option(
        "--keep", help="Where to keep the smallest failing generated checkpoint.")
    ] = Path("conformance-failures"),
) -> None:
    """Run the conformance suite against READER: the golden vectors, then generated checkpoints.

    Prints a report per SPEC requirement; on a failure, the reader's output and the smallest
    failing checkpoint, kept on disk.
    """
    try:
        from .testing.adapter import CommandReader
        from .testing.profiles import conformance_defaults
        from .testing.runner import find_vectors, print_report, run_suite, write_junit
    except ImportError as exc:  # Hypothesis is an optional dependency
        _cannot_run(f"the conformance suite needs Hypothesis ({exc}); install it with "
                    "pip install 'shardspec[conformance]'")
    try:
        default_examples, default_seed = conformance_defaults()
    except ValueError as exc:
        _cannot_run(str(exc))
    examples = default_examples if examples is None else examples
    seed = default_seed if seed is None else seed
    try:
        command = CommandReader(reader, timeout=timeout)
    except ValueError as exc:
        _cannot_run(f"--reader {shlex.quote(reader)}: {exc}")
    if no_vectors:
        vectors = None
    elif vectors is None:
        vectors = find_vectors()
        if vectors is None:
            _cannot_run("no conformance vectors found: run from a shardspec checkout or pass "
                        "--vectors DIR (they are in the source distribution, not the wheel)")
    elif not vectors.is_dir() or not any(vectors.glob("*/vector.json")):
        _cannot_run(f"{vectors}: not a directory of conformance vectors")
    if vectors is None and examples == 0:
        _cannot_run("nothing to run: --no-vectors with --examples 0")
    status = err.status("conformance suite") if err.is_terminal else None

    def progress(text: str) -> None:
        if status is not None:
            status.update(f"conformance suite: {text}")

    if status is not None:
        status.start()
    try:
        result = run_suite(command, vectors=vectors, examples=examples, seed=seed, keep=keep,
                           select=select, progress=progress)
    finally:
        if status is not None:
            status.stop()
    if not result.results:
        _cannot_run(f"no check ran (--select {select!r} matches no vector?)")
    print_report(result, out)
    if junit is not None:
        write_junit(result, junit)
        out.print(f"JUnit XML written to {junit}")
    raise typer.Exit(EXIT_OK if result.ok else EXIT_INVALID)

