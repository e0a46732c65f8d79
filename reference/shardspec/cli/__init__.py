"""The ``shardspec`` command line, one module a command group.

- :mod:`~shardspec.cli.app`: what every command shares (the Typer app, consoles, exit codes,
  checkpoint arguments, printing a finding); the commands import it, never each other;
- :mod:`~shardspec.cli.validate`: ``validate``;
- :mod:`~shardspec.cli.inspect`: ``inspect``, ``files``, ``schema``;
- :mod:`~shardspec.cli.convert`: ``convert``, ``merge``, ``import-vllm``;
- :mod:`~shardspec.cli.reshard`: ``reshard``;
- :mod:`~shardspec.cli.conformance`: ``conformance``.

Commands import torch only when they run, so that the command line starts fast.
"""

from __future__ import annotations

import os
import sys

# Each command module registers its commands on the app as it is imported.
from . import conformance, convert, inspect, reshard, validate  # noqa: F401
from .app import EXIT_CANNOT_RUN, app, err

__all__ = ["app", "main"]


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
