"""The golden vectors: where they are, whether they are intact, and a reader run on each.

``conformance/make_vectors.py`` records every vector file's SHA-256 in ``vectors/SHA256SUMS``
(the format of ``sha256sum``, which can check it too); before a run, the vectors it runs are
checked against it, and a vector that changed stops the suite with :class:`VectorsDamaged`,
naming it. A reader is never given a vector itself: each call gets a copy (see
:class:`~shardspec.testing.calls.Pristine`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import json
import tempfile
from collections.abc import Callable, Collection, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from ..format.errors import ShardspecError
from .adapter import Reader, ignore_names, read_output, reference_load
from .calls import Pristine, call, copy_of, judge
from .checks import CheckResult, judge_refusal
from .progress import Progress, as_progress

__all__ = ["DIGESTS", "OPTIONAL_FEATURES", "VectorsDamaged", "check_vectors", "find_vectors",
           "run_vectors"]

#: The file of ``vectors/`` that lists each vector file's SHA-256, as ``sha256sum`` writes it.
DIGESTS = "SHA256SUMS"

#: What the SPEC makes OPTIONAL to implement, that a vector may require (its ``requires``),
#: and the rule that makes it so. A reader declares what it implements (``--implements``).
OPTIONAL_FEATURES = {"blake2b": "SPEC 9.2 rule 3"}


class VectorsDamaged(Exception):
    """Vectors differ from what was installed: a run on them would judge readers wrongly."""


def find_vectors(start: Path | None = None) -> Path | None:
    """The vectors of the same version as this package: those the wheel ships
    (``shardspec/_conformance/vectors``), else conformance/vectors of the checkout this package
    runs from, else under ``start`` (the current directory by default)."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[1] / "_conformance" / "vectors",
                      here.parents[3] / "conformance" / "vectors",
                      (start or Path.cwd()) / "conformance" / "vectors"):
        if candidate.is_dir() and any(candidate.glob("*/vector.json")):
            return candidate
    return None


def _sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def check_vectors(vectors: Path, wanted: Callable[[str], bool] = lambda name: True) -> None:
    """Check the vectors whose directory name is ``wanted`` against ``vectors/SHA256SUMS``:
    every file listed is there with its bytes, and no other. VectorsDamaged names each vector
    that differs, and how to restore it. Vectors without the list are not checked."""
    listing = vectors / DIGESTS
    if not listing.is_file():
        return
    recorded: dict[str, dict[str, str]] = {}
    for line in listing.read_text(encoding="utf-8").splitlines():
        digest, _, name = line.partition("  ")
        recorded.setdefault(name.split("/")[0], {})[name] = digest
    present = {p.parent.name for p in vectors.glob("*/vector.json")}
    damaged = []
    for vector in sorted((set(recorded) | present) - {""}):
        if not wanted(vector):
            continue
        files = recorded.get(vector, {})
        found = {p.relative_to(vectors).as_posix(): p for p in (vectors / vector).rglob("*")
                 if p.is_file() or p.is_symlink()}
        problems = [f"missing {name}" for name in sorted(set(files) - set(found))]
        problems += [f"changed {name}" for name in sorted(set(files) & set(found))
                     if _sha256(found[name]) != files[name]]
        problems += [f"{name} is not in {DIGESTS}" for name in sorted(set(found) - set(files))]
        if problems:
            shown = "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)"
                                               if len(problems) > 3 else "")
            damaged.append(f"  {vector}: {shown}")
    if damaged:
        raise VectorsDamaged(
            f"{len(damaged)} conformance vector(s) in {vectors} differ from {listing}, as "
            "installed or generated:\n" + "\n".join(damaged) + "\nReinstall the package "
            "(pip install --force-reinstall --no-deps shardspec) or, in a checkout, restore "
            "them (git checkout -- conformance/vectors) or regenerate them (python "
            "conformance/make_vectors.py).")


def _materializer(vectors: Path) -> Callable[[Path, Path], Path] | None:
    """``materialize`` from the vectors' conformance/materialize.py (standard library only)."""
    path = vectors.parent / "materialize.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("_shardspec_materialize", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    function: Callable[[Path, Path], Path] = module.materialize
    return function


def _aliases(root: Path) -> set[str]:
    try:
        data = json.loads((root / "shardspec.json").read_bytes())
        return {n for n, r in data["tensors"].items() if "alias_of" in r}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()


def _reference_ranks(root: Path, ignore: Sequence[str]) -> int | None:
    """The world size the reference reader opens the checkpoint with, or None."""
    import shardspec

    try:
        return shardspec.open(root, ignore_extensions=ignore).world_size
    except Exception:  # noqa: BLE001 - a checkpoint the reference refuses as a whole
        return None


def run_vectors(reader: Reader, vectors: Path, *, select: str | None = None,
                progress: Progress | Callable[[str], None] | None = None,
                quick: bool = False, implements: Collection[str] = ()
                ) -> tuple[list[CheckResult], list[str]]:
    """Every vector against ``reader``, or those whose id matches ``select``: globs separated
    by commas, e.g. ``"valid-*,version-major-*"``. ``quick``: each vector on its first listed
    rank only, without checking that the other ranks of a broken checkpoint still load.
    ``implements``: the OPTIONAL features (:data:`OPTIONAL_FEATURES`) the reader declares; a
    vector that ``requires`` one it does not is skipped, with a note.
    The vectors run are checked first (:func:`check_vectors`): VectorsDamaged."""
    globs = [glob.strip() for glob in select.split(",")] if select else []

    def wanted(name: str) -> bool:
        return not globs or any(fnmatch.fnmatchcase(name, glob) for glob in globs)

    materialize = _materializer(vectors)
    tell = as_progress(progress)
    results: list[CheckResult] = []
    notes: list[str] = []
    chosen = []
    for path in sorted(vectors.glob("*/vector.json")):
        vector = json.loads(path.read_text(encoding="utf-8"))
        if wanted(vector["id"]):
            chosen.append((path.parent, vector))
    names = {directory.name for directory, _ in chosen}
    check_vectors(vectors, lambda name: wanted(name) or name in names)
    tell.part("vectors", len(chosen))
    for directory, vector in chosen:
        missing = sorted(set(vector.get("requires", ())) - set(implements))
        if missing:
            notes.append(f"{vector['id']}: skipped, it needs {', '.join(missing)}, OPTIONAL to "
                         f"implement ({', '.join(OPTIONAL_FEATURES[m] for m in missing)}); a "
                         f"reader that implements it says so with --implements "
                         f"{','.join(missing)}")
            continue
        tell.item(vector["id"])
        with tempfile.TemporaryDirectory(prefix="shardspec-vector-",
                                         ignore_cleanup_errors=True) as tmp:
            make: Callable[[Path], Path]
            if vector.get("materialize"):
                if materialize is None:
                    notes.append(f"{vector['id']}: skipped, no materialize.py next to "
                                 f"{vectors}")
                    continue
                make = partial(materialize, directory)
            else:
                make = copy_of(directory / "checkpoint")
            if quick:
                vector = {**vector, "ranks": vector["ranks"][:1]}
            results += _run_vector(reader, vector, directory, Pristine(make, Path(tmp) / "copy"),
                                   Path(tmp) / "out", tell.checked, others=not quick)
    return results, notes


def _run_vector(reader: Reader, vector: dict[str, Any], directory: Path, root: Pristine,
                out: Path, checked: Callable[[CheckResult], None], others: bool = True
                ) -> list[CheckResult]:
    # The text SHARDSPEC_IGNORE_EXTENSIONS is set to, as the vector gives it, else its names.
    section = vector["section"]
    ignore = vector.get("ignore_extensions_text", vector.get("ignore_extensions", []))
    out.mkdir()
    output = out / "output.safetensors"
    results = []

    def check(rank: int, judged: tuple[tuple[str, ...], bool, str], stderr: str) -> None:
        requirements, passed, message = judged
        results.append(CheckResult(
            f"vectors/{vector['id']}/rank-{rank}", requirements, passed, message,
            reader_output="" if passed else stderr, part="vectors",
            checkpoint=None if passed else str(directory),
            extra={"description": vector["description"]}))
        checked(results[-1])

    if vector["valid"]:
        expected = {r: read_output(directory / "expected" / f"rank-{r}.safetensors")
                    for r in vector["ranks"]}
        aliases = _aliases(root.path())
        for rank in vector["ranks"]:
            outcome = call(reader, root.path(), rank, output, ignore, expected.values())
            check(rank, judge(outcome, expected[rank], rank=rank, sections=(section,),
                              others=expected, aliases=aliases), outcome.stderr)
        return results
    for rank in vector["ranks"]:
        outcome = call(reader, root.path(), rank, output, ignore, ())
        check(rank, judge_refusal(outcome, section=section, code=vector["expected_code"]),
              outcome.stderr)
    # The ranks that do not read the broken part load normally, as the reference does.
    for rank in range(_reference_ranks(root.path(), ignore_names(ignore)) or 0 if others else 0):
        if rank in vector["ranks"]:
            continue
        try:
            expected_rank = reference_load(root.path(), rank, ignore)
        except ShardspecError:
            continue
        outcome = call(reader, root.path(), rank, output, ignore, [expected_rank])
        judged = judge(outcome, expected_rank, rank=rank, sections=(section,),
                       aliases=_aliases(root.path()))
        if not judged[1]:
            judged = (judged[0], False, f"rank {rank} does not read the broken part and must "
                      f"load normally: {judged[2]}")
        check(rank, judged, outcome.stderr)
    return results
