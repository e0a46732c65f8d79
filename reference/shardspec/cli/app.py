"""What every command shares: the Typer app, the consoles, exit codes, checkpoint arguments
(paths, URLs, --storage-options) and how a finding is printed. The commands live in the other
modules of this folder and import this one; :mod:`shardspec.cli` puts them together.

Exit status: 0 success (valid), 1 the checkpoint is invalid, 2 the command could not run
(including object storage that refused or kept failing). No Python traceback reaches the user;
set SHARDSPEC_DEBUG=1 to see one.

A checkpoint argument is a directory or an object-storage URL (``s3://bucket/prefix``, any
fsspec protocol); ``--storage-options`` (or SHARDSPEC_STORAGE_OPTIONS) gives the filesystem's
options as JSON, and fsspec's own FSSPEC_<PROTOCOL> settings apply too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from .._version import __version__
from ..format.errors import Finding, ShardspecError, raise_first_error
from ..format.manifest import format_version
from ..storage.location import Location, locate
from ..storage.manifest_file import read_manifest
from ..storage.remote import is_remote, local_path

__all__ = [
    "EXIT_CANNOT_RUN",
    "EXIT_INVALID",
    "EXIT_OK",
    "JsonOpt",
    "PathArg",
    "app",
    "cannot_run",
    "err",
    "exit_code",
    "human_size",
    "location",
    "open_manifest",
    "out",
    "print_finding",
    "storage_options_for",
]

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


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout, as ``out.print_json`` formats it, written plainly:
    rich's rendering took a minute and a gigabyte for a 32,768-rank ``inspect --json``."""
    out.file.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    out.file.flush()


EXIT_OK, EXIT_INVALID, EXIT_CANNOT_RUN = 0, 1, 2


PathArg = Annotated[str, typer.Argument(
    help="The checkpoint directory, or its object-storage URL (s3://bucket/prefix, ...).",
    show_default=False)]


JsonOpt = Annotated[bool, typer.Option("--json", help="Print a JSON object instead of text.")]


def cannot_run(message: str) -> NoReturn:
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
            cannot_run(f"{path}: no such file or directory")
        if not local.is_dir():
            cannot_run(f"{path}: not a directory")
    try:
        return locate(path, storage_options_for(path))
    except ShardspecError as exc:
        print_finding(exc.finding)
        raise typer.Exit(EXIT_CANNOT_RUN) from None


def exit_code(findings: list[Finding]) -> int:
    """1 for a checkpoint found invalid; 2 when storage kept it from being checked."""
    if any(f.severity == "error" and f.code.startswith("storage-") for f in findings):
        return EXIT_CANNOT_RUN
    return EXIT_INVALID if any(f.severity == "error" for f in findings) else EXIT_OK


def open_manifest(path: str, ignore_extensions: list[str] | None = None) -> Any:
    """The checked manifest (as the reader checks it), or exit 1 with its first error."""
    parsed = read_manifest(location(path), ignore_extensions=ignore_extensions or ())
    try:
        raise_first_error(parsed.findings)
    except ShardspecError as exc:
        print_finding(exc.finding)
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
        cannot_run(f"--storage-options is not JSON: {exc}")
    if not isinstance(options, dict):
        cannot_run("--storage-options must be a JSON object (fsspec filesystem options)")
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


def print_finding(finding: Finding) -> None:
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


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{size} B"
