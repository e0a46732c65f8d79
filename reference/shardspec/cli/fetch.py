"""``shardspec fetch-config URL DIR``: a checkpoint's small files in a local directory, for a
server that reads the weights from object storage.

Registered on :data:`shardspec.cli.app` when :mod:`shardspec.cli` is imported. Exit status and
errors as for every command (:mod:`shardspec.cli.app`): 1 the checkpoint is invalid (its
manifest, or an extra file whose size or sha256 is not the manifest's), 2 the command could not
run (a target that is not empty, storage that refused or kept failing).
"""

from __future__ import annotations

from typing import Annotated

import typer

from ..storage.fetch_config import fetch_config
from ..storage.remote import is_remote
from .app import (
    JsonOpt,
    PathArg,
    command,
    flag,
    human_size,
    location,
    out,
    plural,
    print_json,
)

__all__ = ["fetch_config_command"]


@command("fetch-config")
def fetch_config_command(
    path: PathArg,
    target: Annotated[str, typer.Argument(
        help="The local directory to write the files into (created; it must be empty unless "
        "--overwrite).", show_default=False)],
    overwrite: Annotated[bool, flag(
        "--overwrite", help="Write into a directory that is not empty: the checkpoint's files "
        "replace those of the same names, other files are left in place.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Fetch a checkpoint's manifest and extra files (config, tokenizer), not its data files.

    Each extra file is checked against the manifest's size and sha256 before it is written;
    the manifest is written last, byte for byte as stored. vLLM then serves the checkpoint from
    object storage with the local directory as its model: ``vllm serve DIR --load-format
    shardspec --model-loader-extra-config '{"source": "URL"}'``.
    """
    root = location(path)
    fetched = fetch_config(root, target, overwrite=overwrite)
    if as_json:
        print_json(fetched.to_dict())
        return
    out.print(f"[bold green]fetched[/] {plural(len(fetched.files), 'file')} "
              f"({human_size(fetched.bytes_written)}) of {fetched.source} into {target}: "
              + ", ".join(fetched.files))
    if fetched.left_in_place:
        out.print(f"left in place: {', '.join(fetched.left_in_place)}")
    if is_remote(path):
        out.print(f"serve it with: vllm serve {target} --load-format shardspec "
                  f"--model-loader-extra-config '{{\"source\": \"{fetched.source}\"}}'",
                  markup=False)
