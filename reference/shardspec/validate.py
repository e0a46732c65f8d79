"""Checking a whole checkpoint and reporting every finding, not only the first.

Shares every check with the reader: the manifest chain of :mod:`shardspec.parse`, the header
rules of :mod:`shardspec.safetensors_header` and the plan agreement of :mod:`shardspec.plan`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import Finding, ShardspecError
from .integrity import ALGORITHMS, digest_stream
from .manifest import FileRecord, Manifest
from .parse import read_manifest
from .paths import open_inside
from .plan import FilePlan, plan_rank
from .safetensors_header import read_header

__all__ = ["Report", "validate"]

Progress = Callable[[int], None]


@dataclass
class Report:
    """What ``validate`` found. ``ok`` means no error findings (warnings may remain)."""

    path: str
    findings: list[Finding] = field(default_factory=list)
    manifest: Manifest | None = None
    files_checked: int = 0
    checksums_verified: int = 0

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        """The documented ``validate --json`` report object."""
        return {
            "path": self.path,
            "valid": self.ok,
            "format_version": self.manifest.format_version if self.manifest else None,
            "files_checked": self.files_checked,
            "checksums_verified": self.checksums_verified,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "findings": [f.to_dict() for f in self.findings],
        }


def validate(
    path: str | os.PathLike[str],
    *,
    checksums: bool = False,
    rank: int | None = None,
    ignore_extensions: Collection[str] = (),
    progress: Progress | None = None,
) -> Report:
    """Check the checkpoint at ``path``: manifest, then every data file (or only ``rank``'s).

    With ``checksums`` every digest is verified too, streaming; ``progress`` is called with the
    number of bytes hashed as it goes.
    """
    root = Path(path)
    parsed = read_manifest(root, ignore_extensions=ignore_extensions)
    report = Report(path=str(root), findings=list(parsed.findings), manifest=parsed.manifest)
    manifest = parsed.manifest
    if manifest is None or parsed.errors and _structure_broken(parsed.errors):
        return report
    if rank is not None and not 0 <= rank < manifest.world_size:
        last = manifest.world_size - 1
        report.findings.append(Finding(code="rank-out-of-range",
                                       message=f"rank {rank} is not in 0..{last}"))
        return report
    ranks = range(manifest.world_size) if rank is None else [rank]
    digest = _digest_findings if checksums else None
    for r in ranks:
        for file_plan in plan_rank(manifest, r).files:
            report.findings += _check_data_file(root, file_plan, report, digest, progress)
    for record in manifest.extra_files:
        report.findings += _check_plain_file(root, record, report, digest, progress)
    return report


def _structure_broken(errors: list[Finding]) -> bool:
    """Layout errors make per-rank file checks meaningless; other manifest errors do not.

    ``file-rank`` is one of them: a piece in a file its rank does not own has no per-rank plan.
    """
    return any(f.code.startswith(("layout-", "piece-rank", "file-rank")) for f in errors)


Digest = Callable[[FileRecord, Any, Report, "Progress | None"], Iterator[Finding]]


def _check_data_file(
    root: Path, plan: FilePlan, report: Report, digest: Digest | None, progress: Progress | None
) -> Iterator[Finding]:
    record = plan.record
    report.files_checked += 1
    try:
        handle, size = open_inside(root, record.path)
    except ShardspecError as exc:
        yield exc.finding
        return
    with handle:
        if size != record.size:
            yield _size_finding(record, size)
            return
        try:
            header = read_header(handle, size, record.path)
        except ShardspecError as exc:
            yield exc.finding
        else:
            yield from plan.header_findings(header)
        if digest is not None:
            handle.seek(0)
            yield from digest(record, handle, report, progress)


def _check_plain_file(
    root: Path, record: FileRecord, report: Report, digest: Digest | None,
    progress: Progress | None,
) -> Iterator[Finding]:
    report.files_checked += 1
    try:
        handle, size = open_inside(root, record.path)
    except ShardspecError as exc:
        yield exc.finding
        return
    with handle:
        if size != record.size:
            yield _size_finding(record, size)
        elif digest is not None:
            yield from digest(record, handle, report, progress)


def _size_finding(record: FileRecord, size: int) -> Finding:
    return Finding(code="file-size", file=record.path,
                   message=f"the file has {size} bytes, the manifest says {record.size}",
                   hint="the file is truncated, replaced or still downloading")


def _digest_findings(
    record: FileRecord, handle: Any, report: Report, progress: Progress | None
) -> Iterator[Finding]:
    known = tuple(name for name in record.checksums if name in ALGORITHMS)
    digests, _ = digest_stream(handle, known, progress)
    report.checksums_verified += 1
    for name in known:
        if digests[name] != record.checksums[name]:
            yield Finding(code="checksum-mismatch", file=record.path,
                          message=f"{name} is {digests[name][:16]}…, the manifest says "
                          f"{record.checksums[name][:16]}…",
                          hint="the file is corrupt or was changed after the manifest was written")

