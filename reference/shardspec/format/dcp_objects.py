"""The objects index a torch.distributed.checkpoint (DCP) save leaves in a manifest's metadata.

DCP serializes a state dict's non-tensor values (a step counter, an RNG state) as pickles;
:class:`shardspec.integrations.dcp.Writer` stores them in extra files (SPEC 2.1) and indexes
them under :data:`OBJECTS_KEY` in ``metadata`` (SPEC 3.1 rule 1): a JSON object,
name -> ``[extra file, offset, length]``. The DCP reader loads from it and ``validate`` checks
it, both with :func:`index_findings`, so that they agree on what a usable index is:

- its text is the strict JSON of SPEC 3.3 (no duplicate names, no NaN);
- each entry is an array of a string and two integers (JSON integer tokens: not ``0.9``,
  ``"0"``, ``true`` or ``1e3``), neither negative;
- a name is no tensor of the manifest (an index naming a tensor would make DCP unpickle, in
  place of the tensor, bytes the checkpoint chose);
- the file is an extra file of the manifest (SPEC 2.1 rule 5) and the bytes lie inside its
  recorded size (SPEC 9.1).

``metadata`` is informative (SPEC 3.1): no reader of tensors looks at the index, so a malformed
one makes no checkpoint invalid. ``validate`` reports each problem as warning ``objects-index``
and the objects' presence as warning ``objects-pickled``; the DCP reader, which would load the
objects from it, refuses a malformed index (:func:`parse_objects`).

Torch-free: ``validate`` uses it without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .errors import Finding, error_for
from .json_dialect import JSONProblem, parse_strict_json
from .limits import MANIFEST_NAME, MAX_JSON_DEPTH, MAX_MANIFEST_BYTES
from .manifest import Manifest

__all__ = ["OBJECTS_KEY", "ObjectEntry", "index_findings", "parse_objects", "pickled_warning"]

#: The manifest ``metadata`` key of a DCP save's objects index.
OBJECTS_KEY = "torch.distributed.checkpoint.objects"

_PATH = f"$.metadata[{OBJECTS_KEY!r}]"
_FIELDS = ("file", "offset", "length")


@dataclass(frozen=True)
class ObjectEntry:
    """Where one serialized object lies: ``length`` bytes of extra file ``path`` at ``offset``."""

    path: str
    offset: int
    length: int


def index_findings(manifest: Manifest) -> tuple[dict[str, ObjectEntry], list[Finding]]:
    """The usable entries of the manifest's objects index and a finding for every problem
    (all warnings ``objects-index``: metadata never makes a checkpoint invalid); no index is an
    empty one."""
    text = manifest.metadata.get(OBJECTS_KEY)
    if text is None:
        return {}, []
    try:
        raw = parse_strict_json(text.encode("utf-8", "surrogatepass"),
                                max_bytes=MAX_MANIFEST_BYTES, max_depth=MAX_JSON_DEPTH)
    except JSONProblem as exc:
        return {}, [_finding(None, f"is not JSON: {exc.message}")]
    if not isinstance(raw, dict):
        return {}, [_finding(None, f"is {_kind(raw)}, not an object of "
                             "name -> [file, offset, length]")]
    sizes = {f.path: f.size for f in manifest.extra_files}
    data_files = {f.path for rank in manifest.ranks for f in rank.files}
    entries: dict[str, ObjectEntry] = {}
    findings: list[Finding] = []
    for name, value in raw.items():
        problem = _entry_problem(name, value, manifest)
        if problem is not None:
            findings.append(problem)
            continue
        entry = ObjectEntry(*value)
        if entry.path not in sizes:
            listed = "a data file" if entry.path in data_files else "not listed"
            findings.append(_finding(
                name, f"places object {name!r} in {entry.path!r}, which is "
                f"{listed}, not an extra file of the manifest (SPEC 2.1 rule 5)", field=0))
        elif entry.offset + entry.length > sizes[entry.path]:
            findings.append(_finding(
                name, f"places object {name!r} at bytes [{entry.offset}, "
                f"{entry.offset + entry.length}) of {entry.path!r}, which has "
                f"{sizes[entry.path]} bytes", field=2))
        else:
            entries[name] = entry
    return entries, findings


def parse_objects(manifest: Manifest) -> dict[str, ObjectEntry]:
    """The manifest's objects index, for an integration that loads the objects (SPEC 3.1 rule 1:
    it MUST refuse a malformed index). The first problem :func:`index_findings` finds is raised
    as a :class:`~shardspec.format.errors.SchemaError` with code ``objects-index``: the index
    is refused, not the checkpoint, whose tensors load as they would without it."""
    entries, findings = index_findings(manifest)
    if findings:
        first = findings[0]
        raise error_for(replace(first, message=f"{first.message}; the DCP integration refuses "
                                "this index and loads none of its objects. The weights "
                                "themselves are fine to load with shardspec (shardspec.open): "
                                "metadata is informative (SPEC 3.1) and no reader of tensors "
                                "uses the index"))
    return entries


def pickled_warning(entries: dict[str, ObjectEntry]) -> Finding:
    """The warning ``validate`` gives for a checkpoint holding DCP's pickled objects, whose
    content it does not check (only their files' sizes and digests)."""
    files = sorted({e.path for e in entries.values()})
    return Finding(
        code="objects-pickled", file=MANIFEST_NAME, json_path=_PATH,
        message=f"{len(entries)} pickled object(s) of a torch.distributed.checkpoint save, in "
        f"{', '.join(map(repr, files))}: their content is not checked; unpickling them can run "
        "code the checkpoint chose",
        hint="shardspec.integrations.dcp.Reader loads them with torch.load(weights_only=True) "
        "unless trust_objects=True; load them with trust_objects=True only from checkpoints you "
        "trust")


def _entry_problem(name: str, value: object, manifest: Manifest) -> Finding | None:
    if name in manifest.tensors:
        return _finding(name, f"names {name!r}, a tensor of the manifest: an "
                        "object cannot take a tensor's name")
    if not isinstance(value, list) or len(value) != 3:
        shown = f"an array of {len(value)}" if isinstance(value, list) else _kind(value)
        return _finding(name, f"entry {name!r} is {shown}, not an array "
                        "[file, offset, length]")
    path, *numbers = value
    if not isinstance(path, str):
        return _finding(name, f"entry {name!r}: file is {_kind(path)}, not a string",
                        field=0)
    for field, number in enumerate(numbers, start=1):
        if type(number) is not int or number < 0:  # bool is an int: refused by the type check
            shown = "a negative integer" if type(number) is int else _kind(number)
            return _finding(name, f"entry {name!r}: {_FIELDS[field]} is {shown} "
                            f"({number!r}), not a non-negative integer", field=field)
    return None


def _finding(name: str | None, message: str, *, field: int | None = None) -> Finding:
    path = _PATH if name is None else f"{_PATH}[{name!r}]"
    if field is not None:
        path += f"[{field}]"
    return Finding(code="objects-index", file=MANIFEST_NAME, json_path=path,
                   message=f"metadata[{OBJECTS_KEY!r}] {message}",
                   hint="the index a DCP save writes: name -> [extra file, offset, length], "
                   "non-negative integers, inside a listed extra file, no tensor's name")


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number with a fraction or exponent" if isinstance(value, float) else "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"
