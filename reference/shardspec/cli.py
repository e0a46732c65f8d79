"""The ``shardspec`` command line: validate, inspect, files, schema.

Exit status: 0 success (valid), 1 the checkpoint is invalid, 2 the command could not run
(including object storage that refused or kept failing). No Python traceback reaches the user;
set SHARDSPEC_DEBUG=1 to see one.

A checkpoint argument is a directory or an object-storage URL (``s3://bucket/prefix``, any
fsspec protocol); ``--storage-options`` (or SHARDSPEC_STORAGE_OPTIONS) gives the filesystem's
options as JSON, and fsspec's own FSSPEC_<PROTOCOL> settings apply too.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

from . import __version__
from .errors import Finding, ShardspecError, raise_first_error
from .limits import MANIFEST_NAME
from .location import Location, locate
from .manifest import Alias, Manifest, TensorRecord, format_version
from .parse import read_manifest
from .remote import is_remote, local_path
from .schema import schema_bytes
from .validate import Report, validate

__all__ = ["app", "main"]

app = typer.Typer(
    name="shardspec",
    help="Pre-sharded model checkpoints: validate, inspect and list what each rank needs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

EXIT_OK, EXIT_INVALID, EXIT_CANNOT_RUN = 0, 1, 2

PathArg = Annotated[str, typer.Argument(
    help="The checkpoint directory, or its object-storage URL (s3://bucket/prefix, ...).",
    show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print a JSON object instead of text.")]


def _cannot_run(message: str) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(EXIT_CANNOT_RUN)


#: fsspec options for checkpoint URLs, from --storage-options (set by the app's callback).
_storage_options: dict[str, Any] = {}


def storage_options_for(path: str) -> dict[str, Any] | None:
    """The --storage-options for ``path`` when it is a URL (a local path takes none)."""
    return dict(_storage_options) if is_remote(path) else None


def location(path: str) -> Location:
    """``path`` as a checkpoint location: a directory that exists, or a storage prefix."""
    if not is_remote(path):
        local = Path(local_path(path))
        if not local.exists():
            _cannot_run(f"{path}: no such file or directory")
        if not local.is_dir():
            _cannot_run(f"{path}: not a directory")
    try:
        return locate(path, storage_options_for(path))
    except ShardspecError as exc:
        _print_finding(exc.finding)
        raise typer.Exit(EXIT_CANNOT_RUN) from None


def exit_code(findings: list[Finding]) -> int:
    """1 for a checkpoint found invalid; 2 when storage kept it from being checked."""
    if any(f.severity == "error" and f.code.startswith("storage-") for f in findings):
        return EXIT_CANNOT_RUN
    return EXIT_INVALID if any(f.severity == "error" for f in findings) else EXIT_OK


def _open(path: str, ignore_extensions: list[str] | None = None) -> Any:
    """The checked manifest (as the reader checks it), or exit 1 with its first error."""
    parsed = read_manifest(location(path), ignore_extensions=ignore_extensions or ())
    try:
        raise_first_error(parsed.findings)
    except ShardspecError as exc:
        _print_finding(exc.finding)
        raise typer.Exit(exit_code([exc.finding])) from None
    return parsed


def _version(value: bool) -> None:
    if value:
        out.print(f"shardspec {__version__} (format {format_version()})")
        raise typer.Exit()


def _parse_storage_options(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        options = json.loads(text)
    except ValueError as exc:
        _cannot_run(f"--storage-options is not JSON: {exc}")
    if not isinstance(options, dict):
        _cannot_run("--storage-options must be a JSON object (fsspec filesystem options)")
    return options


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    storage_options: Annotated[str | None, typer.Option(
        "--storage-options", envvar="SHARDSPEC_STORAGE_OPTIONS", show_default=False,
        help="fsspec filesystem options for checkpoint URLs, as a JSON object, e.g. "
        '\'{"anon": true}\' or \'{"client_kwargs": {"endpoint_url": "http://host:9000"}}\'.')
    ] = None,
) -> None:
    """Pre-sharded model checkpoints: validate, inspect and list what each rank needs."""
    _storage_options.clear()
    _storage_options.update(_parse_storage_options(storage_options))


def _print_finding(finding: Finding) -> None:
    style = "red" if finding.severity == "error" else "yellow"
    text = Text()
    text.append(f"{finding.severity}", style=f"bold {style}")
    text.append(f" [{finding.code}] ", style=style)
    text.append(finding.message)
    err.print(text)
    where = finding.where()
    details = [f"SPEC {finding.section}"] + ([where] if where else [])
    err.print(Text("    " + " · ".join(details), style="dim"))
    if finding.hint:
        err.print(Text(f"    hint: {finding.hint}", style="dim"))


@app.command("validate")
def validate_command(
    path: PathArg,
    checksums: Annotated[bool, typer.Option("--checksums", help="Also verify every digest.")
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
            _cannot_run(f"--rank {rank} is not in 0..{manifest.world_size - 1}")
    if checksums and not as_json and err.is_terminal:
        report = _validate_with_progress(root, rank, ignore_extension or [])
    else:
        report = validate(root, checksums=checksums, rank=rank,
                          ignore_extensions=ignore_extension or ())
    if as_json:
        out.print_json(json.dumps(report.to_dict()))
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
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(), console=err,
                  transient=True) as progress:
        task = progress.add_task("verifying checksums", total=total or None)
        return validate(path, checksums=True, rank=rank, ignore_extensions=ignore,
                        progress=lambda n: progress.advance(task, n))


def _print_report(report: Report, checksums: bool) -> None:
    for finding in report.findings:
        _print_finding(finding)
    summary = (f"{report.files_checked} files checked"
               + (f", {report.checksums_verified} checksums verified" if checksums else ""))
    if report.ok:
        note = f" with {len(report.warnings)} warnings" if report.warnings else ""
        out.print(f"[bold green]valid[/] {report.path}: {summary}{note}")
    else:
        out.print(f"[bold red]invalid[/] {report.path}: {len(report.errors)} errors, "
                  f"{len(report.warnings)} warnings; {summary}")


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{size} B"


def _inspect_dict(manifest: Manifest) -> dict[str, Any]:
    records = [t for t in manifest.tensors.values() if isinstance(t, TensorRecord)]
    per_rank: list[dict[str, Any]] = []
    for rank in manifest.ranks:
        held = sum(1 for t in records if t.piece_of(rank.rank) is not None)
        per_rank.append({
            "rank": rank.rank, "tp_rank": rank.tp_rank, "pp_rank": rank.pp_rank,
            "ep_rank": rank.ep_rank, "files": [f.path for f in rank.files],
            "bytes": sum(f.size for f in rank.files), "tensors": held,
        })
    return {
        "format_version": manifest.format_version,
        "generator": manifest.generator,
        "layout": manifest.layout.to_dict(),
        "quantization": manifest.quantization.to_dict(),
        "tensors": {
            "total": len(manifest.tensors),
            "global": sum(1 for t in records if not t.rank_local),
            "rank_local": sum(1 for t in records if t.rank_local),
            "aliases": sum(1 for t in manifest.tensors.values() if isinstance(t, Alias)),
            "tied": sum(1 for t in records if t.tied_to is not None),
        },
        "dtypes": dict(sorted(Counter(t.dtype for t in records).items())),
        "ranks": per_rank,
        "extra_files": [f.path for f in manifest.extra_files],
        "total_bytes": sum(r["bytes"] for r in per_rank)
        + sum(f.size for f in manifest.extra_files),
    }


@app.command("inspect")
def inspect_command(
    path: PathArg,
    tensor: Annotated[str | None, typer.Option("--tensor", help="Show how one tensor is split.")
                      ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the layout, every rank's files and bytes, dtypes, quantization and total size."""
    manifest: Manifest = _open(path).manifest
    if tensor is not None:
        _inspect_tensor(manifest, tensor, as_json)
        return
    info = _inspect_dict(manifest)
    if as_json:
        out.print_json(json.dumps(info))
        return
    layout = manifest.layout
    out.print(f"[bold]{path}[/]  format {manifest.format_version}"
              + (f"  ·  written by {manifest.generator}" if manifest.generator else ""))
    out.print(f"layout: tp={layout.tp_size} pp={layout.pp_size} ep={layout.ep_size} "
              f"world={layout.world_size} order={layout.rank_order}")
    quant = manifest.quantization
    out.print(f"quantization: {quant.method}"
              + (f" {json.dumps(dict(quant.config))}" if quant.config else ""))
    counts = info["tensors"]
    out.print(f"tensors: {counts['total']} ({counts['global']} global, {counts['rank_local']} "
              f"rank-local, {counts['aliases']} alias{'' if counts['aliases'] == 1 else 'es'}, "
              f"{counts['tied']} tied to a quantized weight); "
              "dtypes: "
              + ", ".join(f"{k} x{v}" for k, v in info["dtypes"].items()))
    table = Table("rank", "tp", "pp", "ep", "tensors", "files", "bytes")
    for r in info["ranks"]:
        table.add_row(str(r["rank"]), str(r["tp_rank"]), str(r["pp_rank"]), str(r["ep_rank"]),
                      str(r["tensors"]), "\n".join(r["files"]), _human(r["bytes"]))
    out.print(table)
    if info["extra_files"]:
        out.print("extra files: " + ", ".join(info["extra_files"]))
    out.print(f"total size: {_human(info['total_bytes'])}")


def _inspect_tensor(manifest: Manifest, name: str, as_json: bool) -> None:
    record = manifest.tensors.get(name)
    if record is None:
        _cannot_run(f"no tensor named {name!r} in {MANIFEST_NAME}")
    alias_of = None
    if isinstance(record, Alias):
        alias_of = record.alias_of
        record = manifest.tensors[record.alias_of]
    assert isinstance(record, TensorRecord)
    if as_json:
        data = {"name": name, **record.to_dict()}
        if alias_of:
            data["alias_of"] = alias_of
        out.print_json(json.dumps(data))
        return
    kind = "rank-local" if record.rank_local else f"global shape {list(record.shape or ())}"
    out.print(f"[bold]{name}[/]" + (f" (alias of {alias_of})" if alias_of else "")
              + f": {record.dtype}, {kind}, {len(record.pieces)} pieces")
    if record.logical is not None:
        out.print(f"stands for {record.logical.dtype} {list(record.logical.shape)} (SPEC 8.2)")
    if record.tied_to is not None:
        tie = record.tied_to
        blocks = "one value for the whole weight" if tie.block is None else (
            f"blocks {list(tie.block)}"
            + ("" if tie.axes is None else f" along its grid dims {list(tie.axes)}"))
        out.print(f"tied to {tie.tensor}: {blocks} (SPEC 8.4)")
    split_dims = _split_dims(record)
    width = 40
    table = Table("rank", "replica", "offset", "shape", "slice" if split_dims else "", "file")
    for piece in sorted(record.pieces, key=lambda p: p.rank):
        bar = ""
        if split_dims and record.shape:
            d = split_dims[0]
            total = record.shape[d] or 1
            start = (piece.offset or ())[d] * width // total
            end = max(start + 1, ((piece.offset or ())[d] + piece.shape[d]) * width // total)
            bar = "·" * start + "█" * (end - start) + "·" * (width - end) + f"  dim {d}"
        table.add_row(str(piece.rank), str(piece.replica),
                      "-" if piece.offset is None else str(list(piece.offset)),
                      str(list(piece.shape)), bar, piece.file)
    out.print(table)


def _split_dims(record: TensorRecord) -> list[int]:
    if record.shape is None:
        return []
    return [d for d in range(len(record.shape))
            if len({(p.offset or ())[d] for p in record.pieces if p.offset}) > 1]


@app.command("files")
def files_command(
    path: PathArg,
    rank: Annotated[int, typer.Option("--rank", help="The rank whose files to list.", min=0)],
    as_json: JsonOpt = False,
) -> None:
    """List exactly the files one rank needs: the manifest, extra files and its data files."""
    checkpoint = _open(path)
    manifest: Manifest = checkpoint.manifest
    if rank >= manifest.world_size:
        _cannot_run(f"rank {rank} is not in 0..{manifest.world_size - 1}")
    records = list(manifest.extra_files) + list(manifest.ranks[rank].files)
    if as_json:
        out.print_json(json.dumps({
            "rank": rank,
            "files": [{"path": MANIFEST_NAME}] + [f.to_dict() for f in records],
        }))
        return
    for name in [MANIFEST_NAME] + [f.path for f in records]:
        sys.stdout.write(name + "\n")


@app.command("schema")
def schema_command() -> None:
    """Print the manifest's JSON Schema (the one shipped with this package)."""
    sys.stdout.write(schema_bytes().decode("utf-8"))


def main() -> None:
    """Entry point: run the app with no traceback reaching the user."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence against tracebacks
        if os.environ.get("SHARDSPEC_DEBUG"):
            raise
        err.print(f"[bold red]internal error:[/] {type(exc).__name__}: {exc}")
        err.print("please report this; set SHARDSPEC_DEBUG=1 to see the traceback")
        sys.exit(EXIT_CANNOT_RUN)

# registers convert, merge, import-vllm (cli_convert), reshard (cli_reshard) and conformance
# (cli_conformance)
from . import cli_conformance, cli_convert, cli_reshard  # noqa: E402,F401
