"""The ``shardspec`` command line, one module a command group.

- :mod:`~shardspec.cli.app`: what every command shares (the Typer app, consoles, exit codes,
  checkpoint arguments, printing a finding); the commands import it, never each other;
- :mod:`~shardspec.cli.validate`: ``validate``;
- :mod:`~shardspec.cli.inspect`: ``inspect``, ``files``, ``schema``;
- :mod:`~shardspec.cli.convert`: ``convert``, ``merge``, ``import-vllm``;
- :mod:`~shardspec.cli.reshard`: ``reshard``;
- :mod:`~shardspec.cli.fetch`: ``fetch-config``;
- :mod:`~shardspec.cli.conformance`: ``conformance``.

Commands import torch only when they run, so that the command line starts fast.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from types import FrameType
from typing import Any

import typer

# Each command module registers its commands on the app as it is imported.
from . import conformance, convert, fetch, inspect, reshard, validate  # noqa: F401
from .app import EXIT_CANNOT_RUN, app, err, out

__all__ = ["app", "main"]

#: Typer's usage errors (a bad or missing option) derive from its own copy of click's class.
_ClickException: Any = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is so that it unwinds as on Ctrl-C: temporary files
    are removed and no manifest is written."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def main() -> None:
    """Entry point: run the app with no traceback reaching the user, usage errors as JSON
    under --json, and SIGTERM cleaned up after as Ctrl-C is."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        status = app(standalone_mode=False)
    except _ClickException as exc:  # a usage error: bad or missing options
        if "--json" in sys.argv[1:]:
            out.print_json(json.dumps({"ok": False, "exit_code": exc.exit_code,
                                       "error": {"message": exc.format_message()}}))
        else:
            exc.show()
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, typer.Abort) as exc:
        err.print("terminated" if isinstance(exc, Terminated) else "interrupted")
        sys.exit(143 if isinstance(exc, Terminated) else 130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence against tracebacks
        if os.environ.get("SHARDSPEC_DEBUG"):
            raise
        err.print(f"[bold red]internal error:[/] {type(exc).__name__}: {exc}")
        err.print("please report this; set SHARDSPEC_DEBUG=1 to see the traceback")
        sys.exit(EXIT_CANNOT_RUN)
    sys.exit(status if isinstance(status, int) else 0)
