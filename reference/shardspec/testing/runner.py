"""The conformance suite: the golden vectors, then generated checkpoints, against one reader.

:func:`run_suite` runs both parts and returns a :class:`SuiteResult`; :func:`print_report`
prints it per SPEC requirement and :func:`write_junit` writes JUnit XML. The generated part is
driven by Hypothesis: reproducible from its seed, and on a failure shrunk to the smallest
failing checkpoint, which is kept on disk with what each rank must load. The vectors part is
:mod:`~shardspec.testing.vectors`; every reader call is made on a copy of its checkpoint
(:mod:`~shardspec.testing.calls`).
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from pathlib import Path

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Flaky
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .adapter import Reader, write_output
from .broken import broken_checkpoints, mutation_kinds
from .calls import Pristine, call, copy_of, judge
from .checks import PROTOCOL, CheckResult, judge_refusal
from .mutations import Mutation
from .progress import Progress, as_progress
from .strategies import GeneratedCheckpoint, checkpoint_specs
from .vectors import OPTIONAL_FEATURES, VectorsDamaged, find_vectors, run_vectors

__all__ = ["OPTIONAL_FEATURES", "TITLES", "Progress", "SuiteResult", "VectorsDamaged",
           "find_vectors",
           "print_report", "run_generated", "run_suite", "run_vectors", "write_junit"]

#: SPEC.md section titles, for the report.
TITLES = {
    "1.1": "Conventions (no data on error)", "2.1": "Checkpoint contents", "2.2": "Paths",
    "2.3": "Commit marker", "3.1": "The manifest object", "3.2": "Encoding and syntax",
    "3.3": "I-JSON restrictions", "3.4": "Size and depth limits", "3.5": "The JSON Schema",
    "4.1": "format_version", "4.2": "Version rules", "4.3": "Unknown fields",
    "4.4": "Extensions", "5.1": "Layout sizes", "5.2": "Rank order", "5.3": "Rank records",
    "6.1": "Rank-to-file mapping", "6.2": "Default file names",
    "6.3": "safetensors container", "6.4": "Dtypes", "6.5": "Sub-byte packing",
    "7.1": "Tensor records", "7.2": "Pieces", "7.3": "Coverage", "7.4": "Replicas",
    "7.5": "Rank-local tensors", "7.6": "Aliases", "7.7": "Scalars and zero-size tensors",
    "8.1": "Quantization record", "8.2": "Logical dtype and shape", "8.3": "Quantization rules",
    "8.4": "Tied tensors", "9.1": "Sizes", "9.2": "Checksums", "11.1": "Reader procedure",
    "12": "Limits",
    PROTOCOL: "the adapter protocol (conformance/README.md)",
}

_MAX_SHOWN = 25


def _section_key(section: str) -> tuple[int, ...]:
    if not section[:1].isdigit():
        return (999,)
    return tuple(int(part) for part in section.split("."))


@dataclass
class SuiteResult:
    """Every check of one run, and where to look when some failed."""

    reader: str
    results: list[CheckResult] = field(default_factory=list)
    seed: int | None = None
    examples: int = 0
    vectors: Path | None = None
    #: The kept smallest failing generated checkpoint, if any.
    kept: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if not r.passed]

    @property
    def ok(self) -> bool:
        return bool(self.results) and not self.failures

    def by_requirement(self) -> dict[str, tuple[int, int]]:
        """requirement -> (checks passed that exercise it, checks failed that break it)."""
        counts: dict[str, list[int]] = {}
        for result in self.results:
            for requirement in result.requirements:
                counts.setdefault(requirement, [0, 0])[0 if result.passed else 1] += 1
        return {k: (v[0], v[1]) for k, v in sorted(counts.items(),
                                                   key=lambda kv: _section_key(kv[0]))}

    def coverage(self) -> dict[str, tuple[int, int]]:
        """Every SPEC section the suite tests (:data:`TITLES`) and any other a check names ->
        (vector checks, generated checks) that exercise it; (0, 0) stands out as untested."""
        counts = {section: [0, 0] for section in TITLES}
        for result in self.results:
            for requirement in result.requirements:
                counts.setdefault(requirement, [0, 0])[result.part != "vectors"] += 1
        return {k: (v[0], v[1]) for k, v in sorted(counts.items(),
                                                   key=lambda kv: _section_key(kv[0]))}

    def failed_requirements(self) -> set[str]:
        return {r.requirement for r in self.failures}


# --- generated checkpoints -------------------------------------------------------------------


class _ExampleFailed(AssertionError):
    pass


@dataclass
class _State:
    passes: list[CheckResult] = field(default_factory=list)
    failures: list[CheckResult] = field(default_factory=list)
    failed: bool = False
    examples: int = 0


def _keep(base: Path, staging: Path, written: GeneratedCheckpoint, mutation: Mutation,
          failures: list[CheckResult], seed: int) -> None:
    """Copy a failing example (valid and broken checkpoints) with what each rank must load."""
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(base, staging, symlinks=True,
                    ignore=shutil.ignore_patterns("output.safetensors*", "copies"))
    expected = staging / "valid" / "expected"
    expected.mkdir(parents=True, exist_ok=True)
    for rank, tensors in written.expected.items():
        write_output(expected / f"rank-{rank}.safetensors", tensors)
    summary = {
        "seed": seed,
        "checkpoint": written.spec.describe(),
        "ignore_extensions": list(written.ignore_extensions),
        "broken": mutation.to_dict(),
        "failures": [{"check": f.check, "requirement": f.requirement, "message": f.message}
                     for f in failures],
    }
    (staging / "failure.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False),
                                          encoding="utf-8")
    (staging / "README.txt").write_text(
        "The smallest failing example the conformance suite found.\n\n"
        "valid/checkpoint/     a valid checkpoint; valid/expected/rank-<r>.safetensors is what\n"
        "                      rank r must load (SHARDSPEC_IGNORE_EXTENSIONS: see failure.json)\n"
        "broken/checkpoint/    the same, broken as failure.json's 'broken' says: the listed\n"
        "                      ranks must refuse it\n"
        "failure.json          what was generated, what failed and why\n", encoding="utf-8")


def _broken(valid: Path, mutation: Mutation) -> Callable[[Path], Path]:
    """A maker for :class:`Pristine`: the valid checkpoint copied, then broken (a copy of a
    broken one could meet a FIFO)."""
    def make(dest: Path) -> Path:
        root = copy_of(valid)(dest)
        mutation.apply(root)
        return root
    return make


def run_generated(
    reader: Reader,
    *,
    examples: int,
    seed: int,
    keep: Path | None = None,
    shrink: bool = True,
    max_world: int = 4,
    progress: Progress | None = None,
) -> tuple[list[CheckResult], Path | None, int]:
    """``examples`` generated checkpoints against ``reader``: each rank of a valid checkpoint,
    then the ranks that must refuse a broken copy. Returns (results, kept failure, examples
    run). On a failure Hypothesis shrinks to the smallest failing example, which is kept under
    ``keep`` (default: a new temporary directory, removed again when nothing failed, so that
    a run never writes into the current directory)."""
    if keep is None:
        keep = Path(tempfile.mkdtemp(prefix="shardspec-conformance-"))
        try:
            return run_generated(reader, examples=examples, seed=seed, keep=keep,
                                 shrink=shrink, max_world=max_world, progress=progress)
        finally:
            if not (keep / f"generated-seed-{seed}").exists():
                shutil.rmtree(keep, ignore_errors=True)
    state = _State()
    tell = progress or Progress()
    tell.part("generated", examples)
    counter = itertools.count(1)
    staging = keep / f".generated-seed-{seed}.partial"
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])

    @settings(max_examples=examples, database=None, deadline=None, derandomize=False,
              phases=phases, report_multiple_bugs=False, verbosity=Verbosity.quiet,
              suppress_health_check=list(HealthCheck))
    @hypothesis_seed(seed)
    @given(data=st.data())
    def example(data: st.DataObject) -> None:
        number = next(counter)
        tell.item(f"shrinking a failure (try {number - state.examples - 1})" if state.failed
                  else f"checkpoint {number} of {examples}")
        with tempfile.TemporaryDirectory(prefix="shardspec-generated-") as tmp:
            base = Path(tmp)
            output = base / "output.safetensors"
            prefer = data.draw(st.sampled_from(mutation_kinds()), label="preferred mutation")
            spec = data.draw(checkpoint_specs(max_world=max_world), label="checkpoint")
            written = spec.write(base / "valid" / "checkpoint")
            sections = spec.sections()
            results = []
            ignore = written.ignore_extensions
            valid = Pristine(copy_of(written.path), base / "copies" / "valid")
            for rank in range(written.world_size):
                outcome = call(reader, valid.path(), rank, output, ignore,
                               written.expected.values())
                requirements, passed, message = judge(
                    outcome, written.expected[rank], rank=rank, sections=sections,
                    others=written.expected, aliases=written.aliases)
                results.append(CheckResult(
                    f"generated/{number}/valid/rank-{rank}", requirements, passed, message,
                    reader_output="" if passed else outcome.stderr, part="generated",
                    extra={"checkpoint": "valid/checkpoint"}))
                if not state.failed:
                    tell.checked(results[-1])
            mutation = data.draw(broken_checkpoints(written, prefer), label="broken")
            broken = base / "broken" / "checkpoint"
            shutil.copytree(written.path, broken, symlinks=True)
            mutation.apply(broken)
            copies = Pristine(_broken(written.path, mutation), base / "copies" / "broken")
            for rank in mutation.ranks:
                outcome = call(reader, copies.path(), rank, output, ignore, ())
                requirements, passed, message = judge_refusal(outcome, section=mutation.section,
                                                              code=mutation.code)
                if not passed:
                    message += f": {mutation.description}"
                results.append(CheckResult(
                    f"generated/{number}/{mutation.kind}/rank-{rank}", requirements, passed,
                    message, reader_output="" if passed else outcome.stderr, part="generated",
                    extra={"checkpoint": "broken/checkpoint"}))
                if not state.failed:
                    tell.checked(results[-1])
            failures = [r for r in results if not r.passed]
            if failures:
                _keep(base, staging, written, mutation, failures, seed)
                state.failed, state.failures = True, failures
                raise _ExampleFailed(failures[0].message)
            if not state.failed:
                state.passes += results
                state.examples += 1

    note = ""
    try:
        example()
    except _ExampleFailed:
        pass
    except Flaky:
        if not state.failed:
            raise
        note = " (flaky: the reader did not fail the same way when the example was re-run)"
    if not state.failed:
        return state.passes, None, state.examples
    kept = keep / f"generated-seed-{seed}"
    shutil.rmtree(kept, ignore_errors=True)
    staging.replace(kept)
    failures = [replace(f, message=f.message + note,
                        checkpoint=str(kept / f.extra.get("checkpoint", ""))) for f in
                state.failures]
    return state.passes + failures, kept, state.examples + 1


# --- the whole suite -------------------------------------------------------------------------


def run_suite(
    reader: Reader,
    *,
    vectors: Path | None,
    examples: int,
    seed: int | None = None,
    keep: Path | None = None,
    select: str | None = None,
    shrink: bool = True,
    progress: Progress | Callable[[str], None] | None = None,
    quick: bool = False,
    implements: Collection[str] = (),
) -> SuiteResult:
    """The golden vectors (all, or those matching ``select``), then ``examples`` generated
    checkpoints (with a random seed when ``seed`` is None; the seed used is in the result).
    ``quick``: each vector on its first rank only, and no shrinking of a failure.
    ``implements``: the OPTIONAL features the reader declares (see :func:`run_vectors`). The
    smallest failing generated checkpoint is kept under ``keep`` (default: a new temporary
    directory, named in the report)."""
    seed = random.SystemRandom().randrange(2**32) if seed is None else seed
    result = SuiteResult(reader=reader.name, seed=seed, vectors=vectors)
    tell = as_progress(progress)
    if vectors is not None:
        results, notes = run_vectors(reader, vectors, select=select, progress=tell,
                                     quick=quick, implements=implements)
        result.results += results
        result.notes += notes
    if examples > 0:
        results, kept, run = run_generated(reader, examples=examples, seed=seed, keep=keep,
                                           shrink=shrink and not quick, progress=tell)
        result.results += results
        result.kept, result.examples = kept, run
    return result


# --- reporting -------------------------------------------------------------------------------


def _tail(text: str, lines: int = 12) -> str:
    kept = text.strip().splitlines()[-lines:]
    return "\n".join(kept)


def print_report(result: SuiteResult, console: Console | None = None) -> None:
    """The report: one row per SPEC section (the vector and generated checks exercising it,
    passed and failed; a section none exercised says so), then each failure with the reader's
    output and the checkpoint to look at, then a summary."""
    console = console or Console(highlight=False)
    console.print(Text.assemble(("shardspec conformance", "bold"), f" of {result.reader}"))
    table = Table()
    table.add_column("SPEC", no_wrap=True)
    table.add_column("requirement")
    for column in ("vectors", "generated", "passed", "failed"):
        table.add_column(column, justify="right")
    outcomes = result.by_requirement()
    for requirement, (in_vectors, in_generated) in result.coverage().items():
        passed, failed = outcomes.get(requirement, (0, 0))
        if not in_vectors + in_generated:  # a section nothing exercised in this run
            table.add_row(requirement, TITLES.get(requirement, ""), "0", "0", "-",
                          Text("untested", style="yellow"))
            continue
        table.add_row(requirement, TITLES.get(requirement, ""), str(in_vectors),
                      str(in_generated), str(passed),
                      Text(str(failed), style="bold red") if failed else "0")
    console.print(table)
    failures = result.failures
    for failure in failures[:_MAX_SHOWN]:
        title = TITLES.get(failure.requirement, "")
        line = Text()
        line.append("FAIL ", style="bold red")
        line.append(f"SPEC {failure.requirement} {title}: ", style="red")
        line.append(f"{failure.check}: {failure.message}")
        console.print(line)
        if "description" in failure.extra:
            about = failure.extra["description"]
            about = about if len(about) <= 150 else about[:147].rsplit(" ", 1)[0] + " ..."
            console.print(Text(f"    vector: {about}", style="dim"))
        if failure.checkpoint:
            console.print(Text(f"    checkpoint: {failure.checkpoint}", style="dim"))
        if failure.reader_output.strip():
            console.print(Text("    reader said:\n" + "\n".join(
                "      " + line for line in _tail(failure.reader_output).splitlines()),
                style="dim"))
    if len(failures) > _MAX_SHOWN:
        console.print(f"... and {len(failures) - _MAX_SHOWN} more failures (see --junit)")
    for note in result.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    vector_checks = [r for r in result.results if r.part == "vectors"]
    generated = [r for r in result.results if r.part == "generated"]
    parts = [f"{len(vector_checks)} vector checks ({sum(not r.passed for r in vector_checks)} "
             "failed)"]
    if result.examples or generated:
        parts.append(f"{result.examples} generated checkpoints, seed {result.seed} "
                     f"({sum(not r.passed for r in generated)} failed checks)")
    if result.kept:
        parts.append(f"smallest failing generated checkpoint kept in {result.kept}")
    if result.vectors is not None:
        console.print(Text(f"vectors: {result.vectors}", style="dim"), soft_wrap=True)
    verdict = Text("PASS" if result.ok else "FAIL", style="bold green" if result.ok
                   else "bold red")
    console.print(Text.assemble(verdict, ": " + "; ".join(parts)))


def write_junit(result: SuiteResult, path: Path) -> None:
    """JUnit XML: a test suite per part, a test case per check, named after its SPEC section."""
    root = ET.Element("testsuites", name="shardspec conformance",
                      tests=str(len(result.results)), failures=str(len(result.failures)))
    for part in ("vectors", "generated"):
        checks = [r for r in result.results if r.part == part]
        suite = ET.SubElement(root, "testsuite", name=part, tests=str(len(checks)),
                              failures=str(sum(not r.passed for r in checks)))
        if part == "generated":
            ET.SubElement(ET.SubElement(suite, "properties"), "property", name="seed",
                          value=str(result.seed))
        for check in checks:
            case = ET.SubElement(suite, "testcase", name=check.check,
                                 classname=f"SPEC {check.requirement}")
            if not check.passed:
                failure = ET.SubElement(case, "failure", message=check.message)
                details = [f"SPEC {check.requirement} {TITLES.get(check.requirement, '')}"]
                if check.checkpoint:
                    details.append(f"checkpoint: {check.checkpoint}")
                if check.reader_output:
                    details.append("reader output:\n" + check.reader_output)
                failure.text = "\n".join(details)
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
