"""``shardspec reshard SRC DST --tp N [--pp M]``: write a checkpoint again with another layout.

Registered on :data:`shardspec.cli.app` when :mod:`shardspec.cli` is imported. Exit status and
errors as for every command (:mod:`shardspec.cli.app`): 1 the source checkpoint is invalid
(a checksum among them: every byte read is verified), 2 the command could not run (bad
arguments, a layout the checkpoint cannot take, a destination that is not empty).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from ..format.manifest import Layout, Manifest
from ..storage.remote import is_remote
from .app import (
    PathArg,
    RemoveAdoptedOpt,
    cannot_run,
    command,
    flag,
    human_size,
    open_manifest,
    out,
    plural,
    progress,
    storage_options_for,
)

__all__ = ["reshard_command"]


@command("reshard")
def reshard_command(
    source: PathArg,
    destination: Annotated[str, typer.Argument(
        help="Where to write the resharded checkpoint: a directory or a storage URL.",
        show_default=False)],
    tp: Annotated[int, typer.Option("--tp", help="The new tp_size.", min=1, max=65536,
                                    show_default=False)],
    pp: Annotated[int | None, typer.Option(
        "--pp", help="The new pp_size (default: the checkpoint's).", min=1, max=65536)] = None,
    ep: Annotated[int | None, typer.Option(
        "--ep", help="The new ep_size (default: the checkpoint's). Routed experts move whole to "
        "their new expert rank; it must divide each layer's number of experts.", min=1,
        max=65536)] = None,
    overwrite: Annotated[bool, flag(
        "--overwrite", help="Replace a checkpoint already in DESTINATION.")] = False,
    verify: Annotated[bool, typer.Option(
        "--verify/--no-verify", metavar="",
        help="Check the sha256 of every source data file, once each as it is first read, so "
        "corrupt bytes are refused rather than written again under fresh checksums; "
        "--no-verify trusts the source.")] = True,
    ignore_extension: Annotated[list[str] | None, typer.Option(
        "--ignore-extension", help="A must-understand extension known to be safe to ignore.")
    ] = None,
    gap_budget: Annotated[float | None, typer.Option(
        "--gap-budget", min=0.0, show_default=False,
        help="From object storage: the bytes of gaps a new rank may fetch to save requests, as "
        "a fraction of the bytes it wants (default 1.0: at most twice the bytes wanted, and "
        "a row-parallel tensor split further is fetched as whole rows in a few requests). "
        "0.1 asks at most a tenth more, at a range per row.")
    ] = None,
    remove_adopted: RemoveAdoptedOpt = False,
) -> None:
    """Write SOURCE again at DESTINATION with another tp_size, pp_size or ep_size (SPEC 11.3).

    Each new rank's pieces are read from the byte ranges of the source files that hold them,
    one rank at a time. Rank-local tensors cannot be resharded.
    """
    from ..reshard.write import reshard  # imports torch: only when the command runs

    old: Manifest = open_manifest(source, ignore_extension).manifest
    layout = Layout(tp_size=tp, pp_size=pp or old.layout.pp_size,
                    ep_size=ep or old.layout.ep_size, rank_order=old.layout.rank_order)
    # (prefixes in object storage are compared by reshard() itself, however they are spelt)
    if (not is_remote(source) and not is_remote(destination) and Path(destination).exists()
            and os.path.realpath(destination) == os.path.realpath(source)):
        cannot_run("DESTINATION is the source checkpoint: write the new layout elsewhere")
    options: dict[str, Any] = {"storage_options": storage_options_for(source),
                               "destination_options": storage_options_for(destination),
                               "gap_budget": gap_budget, "remove_adopted": remove_adopted}
    with progress("resharding") as bar:
        manifest = reshard(source, destination, layout, overwrite=overwrite, verify=verify,
                           ignore_extensions=tuple(ignore_extension or ()), progress=bar.set,
                           **options)
    size = sum(f.size for r in manifest.ranks for f in r.files)
    out.print(f"[bold green]resharded[/] {source} (tp={old.layout.tp_size} "
              f"pp={old.layout.pp_size} ep={old.layout.ep_size}) -> {destination} "
              f"(tp={layout.tp_size} pp={layout.pp_size} ep={layout.ep_size}): "
              f"{plural(layout.size, 'rank')}, {human_size(size)} of data")
