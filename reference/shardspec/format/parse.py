"""Manifest bytes -> a checked manifest: dialect, version, schema, extensions, semantics.

Every step reports findings; a step that leaves nothing sound to build on stops the chain.
A sound manifest is first tried on the fast path (:mod:`shardspec.format.parse_fast`); whenever that
is not sure, the strict path here decides and explains.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field

from .checks import check_manifest
from .errors import Finding
from .gcpause import paused_gc
from .json_dialect import JSONProblem, parse_strict_json_numbers
from .limits import (
    MANIFEST_NAME,
    MAX_JSON_DEPTH,
    MAX_MANIFEST_BYTES,
    SUPPORTED_MAJOR,
    SUPPORTED_MINOR,
)
from .manifest import Manifest
from .parse_fast import fast_manifest
from .schema import schema_findings

__all__ = ["KNOWN_EXTENSIONS", "ParsedManifest", "parse_manifest"]

#: SPEC 4.4: extensions this implementation understands (none yet in format 1.1).
KNOWN_EXTENSIONS: frozenset[str] = frozenset()

_VERSION = re.compile(r"(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})")  # fullmatch: no "1.2\n"


@dataclass(frozen=True)
class ParsedManifest:
    """The manifest (None when it could not be built) and every finding on the way."""

    manifest: Manifest | None
    findings: list[Finding] = field(default_factory=list)
    #: SHA-256 of the manifest bytes parsed, when they were read from a file: which manifest
    #: this is, without serializing it again (processes compare it, SPEC 10.1 does not).
    sha256: str | None = None

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]


_JSON_CODES = {
    "encoding": "json-encoding",
    "syntax": "json-syntax",
    "duplicate-name": "json-duplicate-name",
    "nonfinite": "json-nonfinite",
    "too-large": "json-too-large",
    "too-deep": "json-too-deep",
}


#: Whether :func:`parse_manifest` tries the fast path first (off: benchmarks of the strict one).
_FAST_PATH = True


def parse_manifest(data: bytes, *, ignore_extensions: Collection[str] = ()) -> ParsedManifest:
    """Check manifest bytes against SPEC 3-7 and build the typed manifest."""
    with paused_gc():
        manifest = fast_manifest(data) if _FAST_PATH else None
        if manifest is not None:
            return ParsedManifest(manifest, _extension_findings(manifest, ignore_extensions))
        return _parse_manifest(data, ignore_extensions)


def _parse_manifest(data: bytes, ignore_extensions: Collection[str]) -> ParsedManifest:
    """The strict path: every finding, each step in the order of SPEC 3-7."""
    where = {"file": MANIFEST_NAME}
    try:
        raw, has_floats = parse_strict_json_numbers(
            data, max_bytes=MAX_MANIFEST_BYTES, max_depth=MAX_JSON_DEPTH)
    except JSONProblem as problem:
        return ParsedManifest(None, [Finding(code=_JSON_CODES[problem.kind],
                                             message=problem.message, **where)])
    findings: list[Finding] = []
    newer_minor = False
    version = raw.get("format_version") if isinstance(raw, dict) else None
    match = _VERSION.fullmatch(version) if isinstance(version, str) else None
    if match:
        major, minor = int(match[1]), int(match[2])
        if major != SUPPORTED_MAJOR:
            return ParsedManifest(None, [Finding(
                code="version-major", json_path="$.format_version", **where,
                message=f"format version {version}; this reader supports major version "
                f"{SUPPORTED_MAJOR} only",
                hint="upgrade shardspec to read this checkpoint")])
        if minor > SUPPORTED_MINOR:
            newer_minor = True
            findings.append(Finding(
                code="version-newer-minor", json_path="$.format_version", **where,
                message=f"format version {version} is newer than {SUPPORTED_MAJOR}."
                f"{SUPPORTED_MINOR}; fields this reader does not know are ignored"))
    schema = list(schema_findings(raw, allow_unknown_fields=newer_minor, has_floats=has_floats))
    findings += [
        Finding(code=f.code, message=f.message, tensor=f.tensor, json_path=f.json_path,
                hint=f.hint, **where) for f in schema
    ]
    if any(f.severity == "error" for f in findings):
        return ParsedManifest(None, findings)
    manifest = Manifest.from_dict(raw, share=True)
    findings += _extension_findings(manifest, ignore_extensions)
    findings += [
        Finding(code=f.code, message=f.message, file=f.file or MANIFEST_NAME, tensor=f.tensor,
                json_path=f.json_path, hint=f.hint)
        for f in check_manifest(manifest)
    ]
    return ParsedManifest(manifest, findings)


def _extension_findings(manifest: Manifest, ignore_extensions: Collection[str]) -> list[Finding]:
    """SPEC 4.4: an unknown extension is ignored, with a warning, unless it must be understood."""
    where = {"file": MANIFEST_NAME}
    findings: list[Finding] = []
    for name, extension in manifest.extensions.items():
        if name in KNOWN_EXTENSIONS:
            continue
        if extension.get("must_understand") and name not in ignore_extensions:
            findings.append(Finding(
                code="extension-unsupported", json_path=f"$.extensions[{name!r}]", **where,
                message=f"extension {name!r} must be understood and this reader does not know it",
                hint="only if you know the checkpoint is usable without it, allow ignoring it "
                "(ignore_extensions=[...], or --ignore-extension)"))
        else:
            findings.append(Finding(code="extension-ignored", **where,
                                    json_path=f"$.extensions[{name!r}]",
                                    message=f"extension {name!r} is not known and was ignored"))
    return findings
