"""Findings and errors: every problem has a stable code and the SPEC section it enforces.

The validator collects :class:`Finding` objects; the reader raises the first error finding as
the exception class of its rule family. SPEC.md section 13 lists the same codes.

Exception hierarchy::

    ShardspecError
    ├── NotCommittedError      2.3  no manifest: not a committed checkpoint
    ├── PathError              2.x  unsafe, escaping, missing or non-regular paths
    ├── StorageError           2.4  object storage refused, failed or is not installed
    ├── ManifestSyntaxError    3.x  the manifest's JSON dialect
    ├── SchemaError            3.5  the manifest does not match the JSON Schema (and 3.1: the
    │                               DCP objects index in metadata, as an integration refuses it)
    ├── VersionError           4.2  an unknown major version
    ├── ExtensionError         4.4  a must-understand extension this reader does not know
    ├── LayoutError            5.x  sizes, ranks and coordinates
    ├── SafetensorsError       6.x  a data file's safetensors container
    ├── TensorRecordError      7.x  pieces, coverage, replicas, aliases
    ├── QuantizationError      8.3  asked to load with another quantization
    ├── IntegrityError         9.x  sizes and checksums
    └── RequestError           11.x a bad argument to the reader (also a ValueError)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "CODES",
    "ExtensionError",
    "Finding",
    "IntegrityError",
    "LayoutError",
    "ManifestSyntaxError",
    "NotCommittedError",
    "PathError",
    "QuantizationError",
    "RequestError",
    "SafetensorsError",
    "SchemaError",
    "Severity",
    "StorageError",
    "ShardspecError",
    "TensorRecordError",
    "VersionError",
    "raise_first_error",
]

Severity = Literal["error", "warning"]


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One problem found in a checkpoint: what, where, which rule, and how to fix it."""

    code: str
    message: str
    file: str | None = None
    tensor: str | None = None
    json_path: str | None = None
    hint: str | None = None

    @property
    def section(self) -> str:
        return CODES[self.code].section

    @property
    def severity(self) -> Severity:
        return CODES[self.code].severity

    def where(self) -> str:
        """A short human-readable location, e.g. ``file 'a.safetensors', tensor 'w'``."""
        parts = []
        if self.file is not None:
            parts.append(f"file {self.file!r}")
        if self.tensor is not None:
            parts.append(f"tensor {self.tensor!r}")
        if self.json_path is not None:
            parts.append(f"at {self.json_path}")
        return ", ".join(parts)

    def __str__(self) -> str:
        where = self.where()
        text = f"[{self.code}] {self.message}"
        if where:
            text += f" ({where})"
        text += f" — SPEC {self.section}"
        if self.hint:
            text += f". Hint: {self.hint}"
        return text

    def to_dict(self) -> dict[str, str]:
        """The finding as a JSON-ready object (the shape used by ``validate --json``)."""
        out = {"code": self.code, "severity": self.severity, "section": self.section,
               "message": self.message}
        for key in ("file", "tensor", "json_path", "hint"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


class ShardspecError(Exception):
    """Base class of every error this package raises about a checkpoint or a request."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(str(finding))
        self.finding = finding

    @property
    def code(self) -> str:
        return self.finding.code

    @property
    def section(self) -> str:
        return self.finding.section


class NotCommittedError(ShardspecError):
    """The directory has no manifest, so it is not a committed checkpoint (SPEC 2.3)."""


class PathError(ShardspecError):
    """A path is unsafe, escapes the checkpoint, is missing or is not a regular file (SPEC 2)."""


class StorageError(ShardspecError):
    """Object storage refused a request, kept failing, or has no client installed (SPEC 2.4)."""


class ManifestSyntaxError(ShardspecError):
    """The manifest breaks the JSON dialect: encoding, syntax, duplicates, limits (SPEC 3)."""


class SchemaError(ShardspecError):
    """The manifest does not match the JSON Schema (SPEC 3.5); also what an integration raises
    when it refuses a malformed DCP objects index in ``metadata`` (SPEC 3.1, ``objects-index``),
    which ``validate`` reports as a warning only."""


class VersionError(ShardspecError):
    """The manifest's major format version is one this reader does not know (SPEC 4.2)."""


class ExtensionError(ShardspecError):
    """A must-understand extension is present that this reader does not understand (SPEC 4.4)."""


class LayoutError(ShardspecError):
    """The parallel layout or the rank records are inconsistent (SPEC 5)."""


class SafetensorsError(ShardspecError):
    """A data file breaks the safetensors rules or disagrees with the manifest (SPEC 6)."""


class TensorRecordError(ShardspecError):
    """Tensor records are inconsistent: bounds, coverage, replicas, aliases (SPEC 7)."""


class QuantizationError(ShardspecError):
    """The checkpoint's quantization is not the one the caller asked for (SPEC 8.3)."""


class IntegrityError(ShardspecError):
    """A file's size or checksum differs from the manifest's record (SPEC 9)."""


class RequestError(ShardspecError, ValueError):
    """The caller asked for something the checkpoint cannot give: a bad rank or device (SPEC 11)."""


@dataclass(frozen=True)
class Code:
    error: type[ShardspecError]
    section: str
    severity: Severity
    summary: str


def _e(error: type[ShardspecError], section: str, summary: str) -> Code:
    return Code(error, section, "error", summary)


def _w(error: type[ShardspecError], section: str, summary: str) -> Code:
    return Code(error, section, "warning", summary)


#: Every finding code, its rule family, SPEC section, severity and a one-line summary.
CODES: dict[str, Code] = {
    "not-committed": _e(NotCommittedError, "2.3", "the directory has no shardspec.json"),
    "file-missing": _e(PathError, "2.1", "a listed file does not exist"),
    "file-duplicate": _e(PathError, "2.1", "a path is listed more than once"),
    "path-unsafe": _e(PathError, "2.2", "a path is absolute, has '..' or is otherwise not allowed"),
    "path-escapes": _e(PathError, "2.2", "a path resolves outside the checkpoint directory"),
    "file-not-regular": _e(PathError, "2.2", "a path is not a regular file"),
    "storage-denied": _e(StorageError, "2.4", "the store refused the credentials or permission"),
    "storage-failed": _e(StorageError, "2.4", "an object store request failed after retries"),
    "storage-unavailable": _e(StorageError, "2.4", "no client for the URL's storage protocol"),
    "objects-index": _w(SchemaError, "3.1", "the DCP objects index in metadata is malformed"),
    "objects-pickled": _w(SchemaError, "3.1", "metadata lists pickled objects: loading them "
                          "runs code"),
    "json-encoding": _e(ManifestSyntaxError, "3.2", "the manifest is not UTF-8 without BOM"),
    "json-syntax": _e(ManifestSyntaxError, "3.2", "the manifest is not valid JSON"),
    "json-duplicate-name": _e(ManifestSyntaxError, "3.3", "an object has a name twice"),
    "json-nonfinite": _e(ManifestSyntaxError, "3.3", "NaN or Infinity appears"),
    "json-too-large": _e(ManifestSyntaxError, "3.4", "the manifest is over the size limit"),
    "json-too-deep": _e(ManifestSyntaxError, "3.4", "the manifest nests too deeply"),
    "schema": _e(SchemaError, "3.5", "the manifest does not match the JSON Schema"),
    "version-major": _e(VersionError, "4.2", "the major format version is not supported"),
    "version-newer-minor": _w(VersionError, "4.2", "a newer minor version: unknown fields ignored"),
    "unknown-field": _w(SchemaError, "4.3", "a field from a newer minor version was ignored"),
    "extension-unsupported": _e(ExtensionError, "4.4", "a must-understand extension is unknown"),
    "extension-ignored": _w(ExtensionError, "4.4", "an optional extension was ignored"),
    "layout-world-size": _e(LayoutError, "5.1", "world size or rank count disagrees with sizes"),
    "layout-rank-order": _e(LayoutError, "5.2", "a rank's coordinates break the rank order"),
    "layout-ranks": _e(LayoutError, "5.3", "ranks are missing, repeated or out of order"),
    "file-rank": _e(LayoutError, "6.1", "a piece lies in a file its rank does not own"),
    "st-header-length": _e(SafetensorsError, "6.3", "header length over the limit or the file"),
    "st-header-json": _e(SafetensorsError, "6.3", "the header is not a valid JSON object"),
    "st-duplicate-key": _e(SafetensorsError, "6.3", "the header names a tensor twice"),
    "st-entry": _e(SafetensorsError, "6.3", "a header entry is malformed"),
    "st-metadata": _e(SafetensorsError, "6.3", "__metadata__ is not a string-to-string map"),
    "st-size": _e(SafetensorsError, "6.3", "byte size differs from elements x dtype size"),
    "st-offsets": _e(SafetensorsError, "6.3", "offsets overlap, leave holes or trailing bytes"),
    "st-dtype": _e(SafetensorsError, "6.4", "an unknown dtype"),
    "st-mismatch": _e(SafetensorsError, "7.2", "a file's tensor differs from the manifest"),
    "st-missing-tensor": _e(SafetensorsError, "7.2", "a tensor the manifest places is absent"),
    "st-extra-tensor": _e(SafetensorsError, "7.2", "a file holds a tensor the manifest omits"),
    "piece-rank": _e(TensorRecordError, "7.2", "a piece names a rank outside the layout"),
    "piece-bounds": _e(TensorRecordError, "7.2", "a piece lies outside its global tensor"),
    "piece-duplicate": _e(TensorRecordError, "7.2",
                          "a rank holds two pieces of one tensor that it may not hold together"),
    "shape-overflow": _e(TensorRecordError, "7.1", "an element or byte count reaches 2^63"),
    "coverage-gap": _e(TensorRecordError, "7.3", "pieces leave part of a tensor uncovered"),
    "coverage-overlap": _e(TensorRecordError, "7.3", "pieces cover part of a tensor twice"),
    "replica-mismatch": _e(TensorRecordError, "7.4", "a replica differs from every primary piece"),
    "alias-target": _e(TensorRecordError, "7.6", "an alias points at a missing tensor or alias"),
    "tie-target": _e(TensorRecordError, "8.4", "a tie names a missing, aliased, rank-local or "
                     "tied base"),
    "tie-shape": _e(TensorRecordError, "8.4", "a tied tensor's shape disagrees with its blocks"),
    "tie-split": _e(TensorRecordError, "8.4", "a tied tensor's pieces do not follow its base's"),
    "quantization-mismatch": _e(QuantizationError, "8.3", "another quantization was expected"),
    "file-size": _e(IntegrityError, "9.1", "a file's size differs from the manifest"),
    "checksum-mismatch": _e(IntegrityError, "9.2", "a file's digest differs from the manifest"),
    "object-changed": _e(IntegrityError, "9.3", "an object changed while it was read"),
    "rank-out-of-range": _e(RequestError, "11.1", "the requested rank is not in the layout"),
    "device-invalid": _e(RequestError, "11.2", "the requested device is not usable"),
    "world-size-mismatch": _e(RequestError, "11.1", "the process group's size differs from the "
                              "checkpoint's world size"),
    "reshard-rank-local": _e(RequestError, "11.3", "rank-local tensors cannot be resharded"),
    "reshard-unsupported": _e(RequestError, "11.3", "the checkpoint cannot be resharded to the "
                              "requested layout"),
}


def error_for(finding: Finding) -> ShardspecError:
    """The exception of the finding's rule family, carrying the finding."""
    return CODES[finding.code].error(finding)


def raise_first_error(findings: Iterable[Finding]) -> list[Finding]:
    """Raise the first error finding; return the warnings seen when there is none."""
    warnings = []
    for finding in findings:
        if finding.severity == "error":
            raise error_for(finding)
        warnings.append(finding)
    return warnings
