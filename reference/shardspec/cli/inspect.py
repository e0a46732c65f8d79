"""``shardspec inspect``, ``files`` and ``schema``: what a checkpoint holds and what a rank needs.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Annotated, Any

import typer
from rich.table import Table

from ..format.limits import MANIFEST_NAME
from ..format.manifest import Alias, Manifest, TensorRecord
from ..format.schema import schema_bytes
from .app import (
    JsonOpt,
    PathArg,
    cannot_run,
    command,
    flag,
    human_size,
    open_manifest,
    out,
    print_json,
)

__all__ = ["MAX_ROWS", "files_command", "inspect_command", "schema_command"]

#: Rows of a text table: a world of 32,768 ranks is read with ``--json`` (a rich table of it
#: took most of a minute to draw).
MAX_ROWS = 256


def _more(count: int, what: str) -> None:
    if count > MAX_ROWS:
        out.print(f"... and {count - MAX_ROWS} more {what} (--json lists every one)")

def _inspect_dict(manifest: Manifest) -> dict[str, Any]:
    records = [t for t in manifest.tensors.values() if isinstance(t, TensorRecord)]
    # One pass over the pieces (a rank holds at most one piece of a tensor, SPEC 7.2): asking
    # each rank of each tensor was ranks x pieces, minutes for a tensor split 32,768 ways.
    held_by = Counter(rank for t in records for rank in {p.rank for p in t.pieces})
    per_rank: list[dict[str, Any]] = []
    for rank in manifest.ranks:
        held = held_by[rank.rank]
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


@command("inspect")
def inspect_command(
    path: PathArg,
    tensor: Annotated[str | None, typer.Option("--tensor", help="Show how one tensor is split.")
                      ] = None,
    tensors: Annotated[bool, flag(
        "--tensors", help="List every tensor: dtype, global shape, split dims and each rank's "
        "piece shape.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Show the layout, every rank's files and bytes, dtypes, quantization and total size."""
    manifest: Manifest = open_manifest(path).manifest
    if tensor is not None:
        _inspect_tensor(manifest, tensor, as_json)
        return
    if tensors:
        _list_tensors(manifest, as_json)
        return
    info = _inspect_dict(manifest)
    if as_json:
        print_json(info)
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
    for r in info["ranks"][:MAX_ROWS]:
        table.add_row(str(r["rank"]), str(r["tp_rank"]), str(r["pp_rank"]), str(r["ep_rank"]),
                      str(r["tensors"]), "\n".join(r["files"]), human_size(r["bytes"]))
    out.print(table)
    _more(len(info["ranks"]), "ranks")
    if info["extra_files"]:
        out.print("extra files: " + ", ".join(info["extra_files"]))
    out.print(f"total size: {human_size(info['total_bytes'])}")


def _inspect_tensor(manifest: Manifest, name: str, as_json: bool) -> None:
    record = manifest.tensors.get(name)
    if record is None:
        cannot_run(f"no tensor named {name!r} in {MANIFEST_NAME}")
    alias_of = None
    if isinstance(record, Alias):
        alias_of = record.alias_of
        record = manifest.tensors[record.alias_of]
    assert isinstance(record, TensorRecord)
    if as_json:
        data = {"name": name, **record.to_dict()}
        if alias_of:
            data["alias_of"] = alias_of
        print_json(data)
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
    for piece in sorted(record.pieces, key=lambda p: p.rank)[:MAX_ROWS]:
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
    _more(len(record.pieces), "pieces")


def _tensor_rows(manifest: Manifest) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name, entry in manifest.tensors.items():
        if isinstance(entry, Alias):
            rows.append({"name": name, "alias_of": entry.alias_of})
            continue
        rows.append({
            "name": name, "dtype": entry.dtype,
            "shape": None if entry.shape is None else list(entry.shape),
            "rank_local": entry.rank_local, "split_dims": _split_dims(entry),
            "pieces": [{"rank": p.rank, "shape": list(p.shape), "replica": p.replica,
                        **({} if p.offset is None else {"offset": list(p.offset)})}
                       for p in sorted(entry.pieces, key=lambda p: p.rank)],
        })
    return rows


def _list_tensors(manifest: Manifest, as_json: bool) -> None:
    rows = _tensor_rows(manifest)
    if as_json:
        out.print_json(json.dumps({"tensors": rows}))
        return
    table = Table("tensor", "dtype", "global shape", "split", "pieces (shape x ranks)")
    for row in rows:
        if "alias_of" in row:
            table.add_row(row["name"], "", "", "", f"alias of {row['alias_of']}")
            continue
        shapes = Counter(str(p["shape"]) for p in row["pieces"])
        replicas = sum(1 for p in row["pieces"] if p["replica"])
        pieces = ", ".join(f"{shape} x{count}" for shape, count in shapes.items())
        if replicas:
            pieces += f" ({replicas} replica{'' if replicas == 1 else 's'})"
        split = "rank-local" if row["rank_local"] else (
            "dim " + ", ".join(map(str, row["split_dims"])) if row["split_dims"]
            else "replicated")
        table.add_row(row["name"], row["dtype"], "-" if row["shape"] is None
                      else str(row["shape"]), split, pieces)
    out.print(table)


def _split_dims(record: TensorRecord) -> list[int]:
    if record.shape is None:
        return []
    return [d for d in range(len(record.shape))
            if len({(p.offset or ())[d] for p in record.pieces if p.offset}) > 1]


@command("files")
def files_command(
    path: PathArg,
    rank: Annotated[int, typer.Option("--rank", help="The rank whose files to list.", min=0)],
    as_json: JsonOpt = False,
) -> None:
    """List exactly the files one rank needs: the manifest, extra files and its data files."""
    checkpoint = open_manifest(path)
    manifest: Manifest = checkpoint.manifest
    if rank >= manifest.world_size:
        cannot_run(f"rank {rank} is not in 0..{manifest.world_size - 1}")
    records = list(manifest.extra_files) + list(manifest.ranks[rank].files)
    if as_json:
        print_json({
            "rank": rank,
            "files": [{"path": MANIFEST_NAME}] + [f.to_dict() for f in records],
        })
        return
    for name in [MANIFEST_NAME] + [f.path for f in records]:
        sys.stdout.write(name + "\n")


@command("schema")
def schema_command() -> None:
    """Print the manifest's JSON Schema (the one shipped with this package)."""
    sys.stdout.write(schema_bytes().decode("utf-8"))
