"""What every command shares: the Typer app, the consoles, the exit-code rule, errors and
warnings, progress, checkpoint arguments (paths, URLs, --storage-options). The commands live in
the other modules of this folder, registered with :func:`command`; :mod:`shardspec.cli` puts
them together.

The contract every command keeps (:func:`command` enforces it, docs/cli.md documents it):

- exit status 0: done (a checkpoint found valid, possibly with warnings); 1: a checkpoint read
  is invalid (a SPEC finding about its files or manifest); 2: the command could not run: bad
  arguments, a path that does not exist, an unusable plan or source, a destination that is not
  empty, a request the checkpoint cannot meet (a rank or layout it does not have, rank-local
  tensors to reshard or merge, SPEC 11), object storage that refused or kept failing;
- an error is one message naming the file, tensor or flag (and the SPEC section where there is
  one) on stderr, or, with ``--json``, one JSON object ``{"ok": false, "exit_code": N,
  "error": {...}}`` on stdout; warnings are ``warning: ...`` lines on stderr;
- no Python traceback reaches the user (SHARDSPEC_DEBUG=1 shows one);
- progress goes to stderr: a bar on a terminal, else a plain line every few seconds; sizes are
  in binary units (KiB, MiB, GiB) everywhere.

A checkpoint argument is a directory or an object-storage URL (``s3://bucket/prefix``, any
fsspec protocol); ``--storage-options`` (or SHARDSPEC_STORAGE_OPTIONS) gives the filesystem's
options as JSON, and fsspec's own FSSPEC_<PROTOCOL> settings apply too.
"""

from __future__ import annotations

import functools
import json
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar, cast

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    Task,
    TimeRemainingColumn,
)
from rich.text import Text

from .._version import __version__
from ..format.errors import CODES, Finding, RequestError, ShardspecError, raise_first_error
from ..format.json_text import load_json
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
    "ProgressLine",
    "RemoveAdoptedOpt",
    "app",
    "cannot_run",
    "command",
    "err",
    "exit_code",
    "fail",
    "flag",
    "human_size",
    "location",
    "open_manifest",
    "out",
    "plural",
    "print_finding",
    "progress",
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


def flag(name: str, *, help: str) -> Any:  # noqa: A002 - typer's own keyword
    """A boolean option shown as a bare flag in --help (no ``<bool>``)."""
    return typer.Option(name, help=help, metavar="")


JsonOpt = Annotated[bool, flag("--json", help="Print a JSON object instead of text (errors "
                               "too).")]

#: The writing commands' ``--remove-adopted`` (convert, reshard).
RemoveAdoptedOpt = Annotated[bool, flag(
    "--remove-adopted", help="With --overwrite: also delete the files of a checkpoint that "
    "`shardspec import` adopted in place (a save of vLLM, transformers or torch), which "
    "--overwrite alone refuses to delete.")]


#: The width of output that is not a terminal: wide enough that no file or tensor name is cut.
UNCUT_WIDTH = 1 << 16

#: Whether the running command was given --json: errors then go to stdout as JSON.
_json_output = False


def _error_json(exit_status: int, error: dict[str, Any]) -> None:
    out.print_json(json.dumps({"ok": False, "exit_code": exit_status, "error": error}))


def cannot_run(message: str) -> NoReturn:
    """Exit 2 with ``message``: the command could not run."""
    message = _cli_words(message)
    if _json_output:
        _error_json(EXIT_CANNOT_RUN, {"message": message})
    else:
        err.print(Text("error: ", style="bold red") + Text(message))
    raise typer.Exit(EXIT_CANNOT_RUN)


def fail(finding: Finding, status: int | None = None) -> NoReturn:
    """Exit with ``finding``, printed or as JSON; ``status`` defaults to :func:`exit_code`'s."""
    status = exit_code([finding]) if status is None else status
    if _json_output:
        _error_json(status, finding.to_dict())
    else:
        print_finding(finding)
    raise typer.Exit(status)


#: Python argument names the package's messages use -> the flags a CLI user types.
_CLI_WORDS = {"pass overwrite=True": "pass --overwrite", "verify=True": "--verify"}


def _cli_words(message: str) -> str:
    for python, cli in _CLI_WORDS.items():
        message = message.replace(python, cli)
    return message


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    err.print(Text("warning: ", style="bold yellow") + Text(_cli_words(str(message))))


def _os_message(exc: OSError) -> str:
    """``path: what went wrong``, without Python's ``[Errno 2]``."""
    message = exc.strerror or str(exc)
    if exc.filename is not None and str(exc.filename) not in message:
        message = f"{exc.filename}: {message[:1].lower()}{message[1:]}"
    return message


F = TypeVar("F", bound=Callable[..., Any])

#: What a command's code raises when it cannot run (bad input, an unusable source or plan);
#: any other exception is a bug, which :func:`shardspec.cli.main` reports as one.
_CANNOT_RUN: tuple[type[BaseException], ...] = (ValueError, OSError)


def command(name: str) -> Callable[[F], F]:
    """Register a command on :data:`app` under the contract of this module's docstring: its
    ShardspecError exits by :func:`exit_code`, its ValueError and OSError exit 2 with their
    message, its warnings print as ``warning:`` lines, and --json (a parameter named
    ``as_json``) turns errors into JSON on stdout."""
    def register(func: F) -> F:
        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            global _json_output
            _json_output = bool(kwargs.get("as_json", False))
            widths = [(console, console._width) for console in (out, err)]
            for console in (out, err):
                if not console.is_terminal:  # a pipe or a file: never cut a line short
                    console.width = UNCUT_WIDTH
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = _show_warning
                try:
                    if _storage_options_problem is not None:
                        cannot_run(_storage_options_problem)
                    return func(*args, **kwargs)
                except ShardspecError as exc:
                    fail(exc.finding)
                except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (shardspec.cli.main)
                    # what was being written has been cleaned up on the way here
                    term = type(exc).__name__ == "Terminated"
                    err.print("terminated" if term else "interrupted")
                    raise typer.Exit(143 if term else 130) from None
                except OSError as exc:
                    cannot_run(_os_message(exc))
                except _CANNOT_RUN as exc:
                    cannot_run(str(exc))
                finally:
                    _json_output = False
                    for console, width in widths:
                        console._width = width

        app.command(name)(run)
        return cast("F", run)
    return register



#: fsspec options for checkpoint URLs, from --storage-options (set by the app's callback).
_storage_options: dict[str, Any] = {}
#: What is wrong with --storage-options: every command then stops with it (in JSON under --json).
_storage_options_problem: str | None = None


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
        fail(exc.finding, EXIT_CANNOT_RUN)


def exit_code(findings: list[Finding]) -> int:
    """0 without error findings; 2 when one is a request the checkpoint cannot meet (SPEC 11)
    or storage that kept it from being read; else 1: the checkpoint is invalid."""
    errors = [f for f in findings if f.severity == "error"]
    if any(f.code.startswith("storage-") or issubclass(CODES[f.code].error, RequestError)
           for f in errors):
        return EXIT_CANNOT_RUN
    return EXIT_INVALID if errors else EXIT_OK


def open_manifest(path: str, ignore_extensions: list[str] | None = None) -> Any:
    """The checked manifest (as the reader checks it), or exit 1 with its first error."""
    parsed = read_manifest(location(path), ignore_extensions=ignore_extensions or ())
    try:
        raise_first_error(parsed.findings)
    except ShardspecError as exc:
        fail(exc.finding)
    return parsed


def _version(value: bool) -> None:
    if value:
        out.print(f"shardspec {__version__} (format {format_version()})")
        raise typer.Exit()


def _parse_storage_options(text: str | None) -> dict[str, Any] | str:
    """The options, or what is wrong with them (reported by the command, which knows whether
    to answer in JSON)."""
    if not text:
        return {}
    try:
        options = load_json(text)
    except ValueError as exc:
        return f"--storage-options is not JSON: {exc}"
    if not isinstance(options, dict):
        return "--storage-options must be a JSON object (fsspec filesystem options)"
    return options


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          metavar="", help="Print the version and exit.")
                       ] = False,
    storage_options: Annotated[str | None, typer.Option(
        "--storage-options", envvar="SHARDSPEC_STORAGE_OPTIONS", show_default=False,
        help="fsspec filesystem options for checkpoint URLs, as a JSON object, e.g. "
        '\'{"anon": true}\' or \'{"client_kwargs": {"endpoint_url": "http://host:9000"}}\'.')
    ] = None,
) -> None:
    """Pre-sharded model checkpoints: validate, inspect and list what each rank needs."""
    global _storage_options_problem
    _storage_options.clear()
    parsed = _parse_storage_options(storage_options)
    _storage_options_problem = parsed if isinstance(parsed, str) else None
    if not isinstance(parsed, str):
        _storage_options.update(parsed)


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


def human_size(size: float) -> str:
    """``size`` bytes in binary units, the one family the command line uses."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{size} B"


def plural(count: int, word: str, many: str | None = None) -> str:
    """``1 file``, ``2 files`` (``many`` where adding an s is wrong)."""
    return f"{count} {word if count == 1 else many or word + 's'}"


class _Speed(ProgressColumn):
    """Transfer speed in binary units (rich's own column counts in decimal ones)."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("?" if speed is None else f"{human_size(speed)}/s", style="progress.data.speed")


#: Seconds between progress lines when stderr is not a terminal.
PROGRESS_EVERY = 5.0


class ProgressLine:
    """Bytes done of a total, shown on stderr: a bar on a terminal, else a plain line at most
    every :data:`PROGRESS_EVERY` seconds (CI logs keep them, and a pipe never sees a bar)."""

    def __init__(self, what: str, bar: Progress | None) -> None:
        self.what, self.done, self.total = what, 0, 0
        self._bar = bar
        self._task = bar.add_task(what, total=None) if bar is not None else None
        self._printed = time.monotonic()

    def add(self, count: int, total: int | None = None) -> None:
        """``count`` more bytes done (``total``: the whole, where it is known now)."""
        self.set(self.done + count, total)

    def set(self, done: int, total: int | None = None) -> None:
        """``done`` bytes done in all."""
        self.done = done
        if total is not None:
            self.total = total
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=done, total=self.total or None)
        elif time.monotonic() - self._printed >= PROGRESS_EVERY:
            self._printed = time.monotonic()
            share = f" ({100 * done / self.total:.0f}%)" if self.total else ""
            whole = f" of {human_size(self.total)}" if self.total else ""
            err.print(f"{self.what}: {human_size(done)}{whole}{share}", soft_wrap=True)
            sys.stderr.flush()


@contextmanager
def progress(what: str) -> Iterator[ProgressLine]:
    """A :class:`ProgressLine` for the duration of a long operation."""
    if not err.is_terminal:
        yield ProgressLine(what, None)
        return
    with Progress("[progress.description]{task.description}", BarColumn(),
                  DownloadColumn(binary_units=True), _Speed(), TimeRemainingColumn(),
                  console=err, transient=True) as bar:
        yield ProgressLine(what, bar)
