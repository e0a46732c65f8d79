"""``shardspec validate``: every SPEC rule on every file, each finding with its code."""

from __future__ import annotations

from collections import Counter
from typing import Annotated

import typer
from rich.text import Text

from ..storage.location import Location
from ..storage.manifest_file import read_manifest
from ..validate import Report, validate
from .app import (
    JsonOpt,
    PathArg,
    cannot_run,
    command,
    err,
    exit_code,
    flag,
    location,
    out,
    plural,
    print_finding,
    print_json,
    progress,
)

__all__ = ["validate_command"]

@command("validate")
def validate_command(
    path: PathArg,
    checksums: Annotated[bool, flag("--checksums", help="Also verify every digest.")
                         ] = False,
    rank: Annotated[int | None, typer.Option("--rank", help="Check only this rank's files.",
                                             min=0)] = None,
    ignore_extension: Annotated[list[str] | None, typer.Option(
        "--ignore-extension", help="A must-understand extension known to be safe to ignore.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Check a checkpoint: manifest, schema, layout, coverage, every data file; report all."""
    root = location(path)
    if rank is not None:
        manifest = read_manifest(root).manifest
        if manifest is not None and rank >= manifest.world_size:
            cannot_run(f"--rank {rank} is not in 0..{manifest.world_size - 1}")
    if checksums:
        report = _validate_with_progress(root, rank, ignore_extension or [])
    else:
        report = validate(root, rank=rank, ignore_extensions=ignore_extension or ())
    if as_json:
        print_json(report.to_dict())
    else:
        _print_report(report, checksums)
    raise typer.Exit(exit_code(report.findings))


def _validate_with_progress(path: Location, rank: int | None, ignore: list[str]) -> Report:
    parsed = read_manifest(path).manifest
    total = 0
    if parsed is not None:
        ranks = range(parsed.world_size) if rank is None else [rank]
        total = sum(f.size for r in ranks if 0 <= r < parsed.world_size
                    for f in parsed.ranks[r].files)
        total += sum(f.size for f in parsed.extra_files)
    with progress("verifying checksums") as bar:
        return validate(path, checksums=True, rank=rank, ignore_extensions=ignore,
                        progress=lambda n: bar.add(n, total))


#: Findings of one code printed as text; the rest are counted (``--json`` lists every one).
#: 32,768 missing files drawn one by one by rich took longer than the validation.
MAX_PRINTED = 50


def _print_report(report: Report, checksums: bool) -> None:
    printed: Counter[str] = Counter()
    for finding in report.findings:
        printed[finding.code] += 1
        if printed[finding.code] <= MAX_PRINTED:
            print_finding(finding)
    for code, count in printed.items():
        if count > MAX_PRINTED:
            err.print(Text(f"... and {count - MAX_PRINTED} more [{code}] findings "
                           "(--json lists every one)"))
    summary = (plural(report.files_checked, "file") + " checked"
               + (f", {plural(report.checksums_verified, 'checksum')} verified"
                  if checksums else ""))
    if report.ok:
        note = f" with {plural(len(report.warnings), 'warning')}" if report.warnings else ""
        out.print(f"[bold green]valid[/] {report.path}: {summary}{note}")
    else:
        out.print(f"[bold red]invalid[/] {report.path}: {plural(len(report.errors), 'error')}, "
                  f"{plural(len(report.warnings), 'warning')}; {summary}")
