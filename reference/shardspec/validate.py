"""Checking a whole checkpoint and reporting every finding, not only the first.

Shares every check with the reader: the manifest chain of :mod:`shardspec.format.parse`, the header
rules of :mod:`shardspec.format.safetensors_header` and the plan agreement of
:mod:`shardspec.load.plan`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .format.dcp_objects import index_findings, pickled_warning
from .format.errors import Finding, ShardspecError
from .format.gcpause import paused_gc
from .format.integrity import ALGORITHMS, digest_stream
from .format.manifest import FileRecord, Manifest
from .format.safetensors_header import read_header
from .load.plan import FilePlan, plan_ranks
from .storage.location import Location, PathOrURL, locate
from .storage.manifest_file import read_manifest
from .storage.paths import open_inside
from .storage.remote import REQUESTS_IN_FLIGHT, RemoteRoot
from .storage.remote_files import FILES_IN_FLIGHT, RemoteObject, RemoteReader, remote_version

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
    path: PathOrURL,
    *,
    checksums: bool = False,
    rank: int | None = None,
    ignore_extensions: Collection[str] = (),
    progress: Progress | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Report:
    """Check the checkpoint at ``path``: manifest, then every data file (or only ``rank``'s).

    ``path`` is a directory or an object-storage URL (``storage_options`` for its fsspec
    filesystem). With ``checksums`` every digest is verified too, streaming; ``progress`` is
    called with the number of bytes hashed as it goes.
    """
    root = locate(path, storage_options)
    parsed = read_manifest(root, ignore_extensions=ignore_extensions)
    report = Report(path=str(root), findings=list(parsed.findings), manifest=parsed.manifest)
    manifest = parsed.manifest
    if manifest is None or parsed.errors and _structure_broken(parsed.errors):
        return report
    objects, problems = index_findings(manifest)  # a DCP save's index of pickled objects
    report.findings += problems + ([pickled_warning(objects)] if objects else [])
    if rank is not None and not 0 <= rank < manifest.world_size:
        last = manifest.world_size - 1
        report.findings.append(Finding(code="rank-out-of-range",
                                       message=f"rank {rank} is not in 0..{last}"))
        return report
    with paused_gc():  # tens of thousands of header entries, as for the manifest
        _check_files(root, manifest, report, rank, checksums, progress)
    return report


def _check_files(
    root: Location, manifest: Manifest, report: Report, rank: int | None, checksums: bool,
    progress: Progress | None,
) -> None:
    """Every data file of ``rank`` (or of every rank) and every extra file, into ``report``."""
    ranks = range(manifest.world_size) if rank is None else [rank]
    digest = _digest_findings if checksums else None
    checks: list[Callable[[], tuple[list[Finding], bool]]] = [
        partial(_check_file, root, file_plan.record, file_plan, digest, progress)
        for plan in plan_ranks(manifest, ranks) for file_plan in plan.files
    ]
    checks += [partial(_check_file, root, record, None, digest, progress)
               for record in manifest.extra_files]
    # Hashing releases the GIL: with checksums, files are verified a few at a time so that
    # SHA-256 (about 1.7 GB/s a core) keeps up with a fast disk. Objects in storage are checked
    # several at once even without checksums: each costs round trips. Findings keep file order.
    if isinstance(root, RemoteRoot):
        workers = min(FILES_IN_FLIGHT if checksums else REQUESTS_IN_FLIGHT, len(checks))
    else:
        workers = min(_HASH_WORKERS, len(checks)) if checksums else 1
    with ThreadPoolExecutor(max_workers=max(workers, 1)) as pool:
        run = pool.map if workers > 1 else map
        for findings, verified in run(lambda check: check(), checks):
            report.findings += findings
            report.files_checked += 1
            report.checksums_verified += verified


def _structure_broken(errors: list[Finding]) -> bool:
    """Layout errors make per-rank file checks meaningless; other manifest errors do not.

    ``file-rank`` is one of them: a piece in a file its rank does not own has no per-rank plan.
    """
    return any(f.code.startswith(("layout-", "piece-rank", "file-rank")) for f in errors)


#: How many files ``validate(checksums=True)`` hashes at once.
_HASH_WORKERS = min(4, os.cpu_count() or 1)

#: Findings of an object read for its header that are about the object, not the header: on S3
#: the header's GET is the first request, and reports them.
_OBJECT_CODES = frozenset({"file-missing", "file-not-regular", "file-size", "object-changed"})

Digest = Callable[[FileRecord, Any, "Progress | None"], list[Finding]]


def _check_file(
    root: Location, record: FileRecord, plan: FilePlan | None, digest: Digest | None,
    progress: Progress | None,
) -> tuple[list[Finding], bool]:
    """Findings of one data file (with its ``plan``) or extra file (without), and whether its
    digests were verified."""
    if isinstance(root, RemoteRoot):
        return _check_object(root, record, plan, digest, progress)
    try:
        handle, size = open_inside(root, record.path)
    except ShardspecError as exc:
        return [exc.finding], False
    with handle:
        if size != record.size:
            return [_size_finding(record, size)], False
        findings: list[Finding] = []
        if plan is not None:
            try:
                header = read_header(handle, size, record.path)
            except ShardspecError as exc:
                findings = [exc.finding]
            else:
                findings = list(plan.header_findings(header))
        if digest is None:
            return findings, False
        handle.seek(0)
        return findings + digest(record, handle, progress), True


def _check_object(
    root: RemoteRoot, record: FileRecord, plan: FilePlan | None, digest: Digest | None,
    progress: Progress | None,
) -> tuple[list[Finding], bool]:
    """:func:`_check_file` of an object."""
    try:
        if plan is None and digest is None:  # no byte is read: the size by a metadata request
            remote_version(root, record.path, record.size)
            return [], False
        source = RemoteObject(root, record.path, record.size)
        findings = []
        prefix = b""  # the object's first bytes, fetched for its header: not asked again
        if plan is not None:
            try:
                header, prefix = source.header()
            except ShardspecError as exc:
                if exc.code.startswith("storage-") or exc.code in _OBJECT_CODES:
                    raise
                findings = [exc.finding]
            else:
                findings = list(plan.header_findings(header))
        verified = digest is not None
        if digest is not None:
            findings += digest(record, RemoteReader(source, prefix), progress)
        source.finish()  # SPEC 9.3: what was checked is one object
        return findings, verified
    except ShardspecError as exc:
        return [exc.finding], False


def _size_finding(record: FileRecord, size: int) -> Finding:
    return Finding(code="file-size", file=record.path,
                   message=f"the file has {size} bytes, the manifest says {record.size}",
                   hint="the file is truncated, replaced or still downloading")


def _digest_findings(
    record: FileRecord, handle: Any, progress: Progress | None
) -> list[Finding]:
    known = tuple(name for name in record.checksums if name in ALGORITHMS)
    digests, _ = digest_stream(handle, known, progress)
    return [
        Finding(code="checksum-mismatch", file=record.path,
                message=f"{name} is {digests[name][:16]}…, the manifest says "
                f"{record.checksums[name][:16]}…",
                hint="the file is corrupt or was changed after the manifest was written")
        for name in known
        if digests[name] != record.checksums[name]
    ]

