"""``shardspec convert``, ``merge`` and ``import-vllm``: registered on the app of :mod:`.cli`.

Exit status and errors as for every command (:mod:`shardspec.cli.app`).
"""

from __future__ import annotations

import json
import re
import time
from enum import Enum
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any

import typer

from ..convert.tp_plan import load_plan_file
from ..format.json_text import load_json
from ..format.limits import DEFAULT_MAX_FILE_SIZE, MAX_SIZE
from .app import (
    RemoveAdoptedOpt,
    cannot_run,
    command,
    err,
    flag,
    human_size,
    out,
    plural,
    progress,
    storage_options_for,
)

__all__ = ["parse_size"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """``5GB`` -> 5 * 10**9, ``5GiB`` -> 5 * 2**30, ``1000`` -> 1000 (as Hugging Face reads)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*", text.lower())
    if not match:
        raise typer.BadParameter(f"{text!r} is not a size such as 5GB, 500MiB or 1000000")
    # Exactly, in rationals: a float turns 400 digits into infinity (and 0.1GB into 99999999).
    value = int(Fraction(match[1]) * _UNITS[match[2] or ""])
    if value < 1:
        raise typer.BadParameter("a size must be at least 1 byte")
    if value > MAX_SIZE:
        raise typer.BadParameter(f"{text!r} is not a size below 2^63 bytes (SPEC 12)")
    return value


def _load_stages(path: Path | None) -> dict[str, int] | None:
    if path is None:
        return None
    try:
        data: Any = load_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        cannot_run(f"cannot read the stages file {path}: {exc}")
    if not isinstance(data, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in data.values()):
        cannot_run(f"{path}: stages are a JSON object mapping name patterns to stage numbers")
    return data


class _Names(str, Enum):
    hf = "hf"
    vllm = "vllm"


class _Quantize(str, Enum):
    fp8 = "fp8"


@command("convert")
def convert_command(
    src: Annotated[str, typer.Argument(help="The Hugging Face checkpoint directory (local).",
                                       show_default=False)],
    dst: Annotated[str, typer.Argument(
        help="The shardspec checkpoint to write: a directory or a storage URL (s3://...).",
        show_default=False)],
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel size.")],
    pp: Annotated[int, typer.Option("--pp", min=1, help="Pipeline-parallel size.")] = 1,
    ep: Annotated[int, typer.Option(
        "--ep", min=1, help="Expert-parallel size: each layer's routed experts are dealt to "
        "expert ranks in contiguous blocks (it must divide the number of experts).")] = 1,
    plan: Annotated[Path | None, typer.Option(
        "--plan", help="JSON file mapping name patterns to TP styles (colwise, rowwise, "
        "replicate, embedding...). Default: the built-in plan of Mixtral, Qwen2/3-MoE and "
        "DeepSeek-V2/V3; else config.json's base_model_tp_plan; else the built-in plan for "
        "Llama, Mistral and Qwen2/3.")] = None,
    stages: Annotated[Path | None, typer.Option(
        "--stages", help="JSON file mapping name patterns to pipeline stages, overriding the "
        "default (contiguous layers; embedding first, final norm and LM head last).")] = None,
    allow_uneven: Annotated[bool, flag(
        "--allow-uneven", help="Split dims the TP size does not divide (first ranks get one "
        "more).")] = False,
    max_file_size: Annotated[str, typer.Option(
        "--max-file-size", help="Cap on one data file (a new part starts past it).")
    ] = f"{DEFAULT_MAX_FILE_SIZE // 2**30}GiB",
    overwrite: Annotated[bool, flag("--overwrite",
                                            help="Replace a checkpoint in DST.")] = False,
    names: Annotated[_Names, typer.Option(
        "--names",
        help="Tensor names: hf keeps Hugging Face's, in files named as torch's distributed "
        "writer names them (loads at any layout, also in transformers' from_pretrained, torch's "
        "HuggingFaceStorageReader and vLLM with --load-format shardspec); vllm writes each "
        "rank's tensors as vLLM's model holds them "
        "(fused qkv_proj and gate_up_proj cut part by part, several pieces a rank, format "
        "1.3; padded vocabulary, attention scales; PP = 1 only).")] = _Names.hf,
    sharded_state: Annotated[bool, flag(
        "--sharded-state", help="With --names vllm: write each rank's fused tensors rank-local, "
        "one file per rank, so that vLLM's own --load-format sharded_state reads the checkpoint "
        "at TP 2 and more too (it reads a name once per rank).")] = False,
    quantize: Annotated[_Quantize | None, typer.Option(
        "--quantize", help="Quantize on the way: fp8 writes linear weights as F8_E4M3 with "
        "128x128 block scales (weight_scale_inv, as DeepSeek-V3 and vLLM's fp8 method).")
    ] = None,
    untie_embeddings: Annotated[bool, flag(
        "--untie-embeddings", help="Write a tied LM head as a tensor of its own (the "
        "embedding's bytes twice), as transformers' from_pretrained of a tied model needs; "
        "vLLM then serves it untied. Default: an alias of the embedding.")] = False,
    remove_adopted: RemoveAdoptedOpt = False,
) -> None:
    """Convert a Hugging Face checkpoint into a TP x PP x EP shardspec checkpoint, streaming.

    Pre-quantized checkpoints (FP8 with scales, AWQ, GPTQ, MXFP4) keep their scales and zero
    points with the slices of their weights; a split through a block is refused."""
    from ..convert.from_hf import convert  # imports torch: only when the command runs
    cap = parse_size(max_file_size)
    started = time.perf_counter()
    tp_plan = load_plan_file(plan) if plan is not None else None
    with progress("converting") as bar:
        manifest = convert(src, dst, tp_size=tp, pp_size=pp, ep_size=ep, plan=tp_plan,
                           stages=_load_stages(stages), allow_uneven=allow_uneven,
                           max_file_size=cap, overwrite=overwrite, progress=bar.add,
                           names=names.value, sharded_state=sharded_state,
                           quantize=None if quantize is None else quantize.value,
                           storage_options=storage_options_for(dst),
                           untie_embeddings=untie_embeddings, remove_adopted=remove_adopted)
    size = sum(f.size for r in manifest.ranks for f in r.files)
    files = sum(len(r.files) for r in manifest.ranks)
    out.print(f"[bold green]converted[/] {src} -> {dst}: tp={tp} pp={pp} ep={ep}, "
              f"{plural(len(manifest.tensors), 'tensor')}, "
              f"{plural(manifest.world_size, 'rank')}, {plural(files, 'data file')} "
              f"({human_size(size)}), {plural(len(manifest.extra_files), 'extra file')} in "
              f"{time.perf_counter() - started:.1f} s")


@command("merge")
def merge_command(
    src: Annotated[str, typer.Argument(help="The shardspec checkpoint (a local directory).",
                                       show_default=False)],
    dst: Annotated[str, typer.Argument(help="The Hugging Face directory to write (local).",
                                        show_default=False)],
    max_shard_size: Annotated[str, typer.Option(
        "--max-shard-size", help="Cap on one shard, as Hugging Face counts it (5GB = 5e9 "
        "bytes).")] = "5GB",
    verify: Annotated[bool, typer.Option(
        "--verify/--no-verify", metavar="",
        help="Verify every checksum of the source before writing (default); --no-verify trusts "
        "it.")] = True,
    overwrite: Annotated[bool, flag("--overwrite",
                                            help="Replace the weights in DST.")] = False,
) -> None:
    """Merge a shardspec checkpoint back into a Hugging Face checkpoint (shards + index)."""
    from ..convert.to_hf import merge
    cap = parse_size(max_shard_size)
    started = time.perf_counter()
    with progress("merging") as bar:
        files = merge(src, dst, max_shard_size=cap, overwrite=overwrite, verify=verify,
                      progress=bar.add)
    out.print(f"[bold green]merged[/] {src} -> {dst}: {', '.join(files)} in "
              f"{time.perf_counter() - started:.1f} s")


#: The options of both import commands.
_ReplaceManifestOpt = Annotated[bool, flag("--overwrite", help="Replace an existing manifest.")]
_JsonSummaryOpt = Annotated[bool, flag("--json", help="Print a JSON summary (errors too).")]


@command("import")
def import_command(
    path: Annotated[str, typer.Argument(
        help="A local directory of per-rank safetensors files: vLLM's save_sharded_state, or "
        "a distributed save of transformers (save_pretrained(..., distributed_checkpoint=True)) "
        "or torch (HuggingFaceStorageWriter).", show_default=False)],
    overwrite: _ReplaceManifestOpt = False,
    as_json: _JsonSummaryOpt = False,
) -> None:
    """Add a manifest to a directory of per-rank files, whichever kind it is; no data file
    is rewritten."""
    from ..convert.recognize import import_directory
    with progress("checksumming") as bar:
        kind, result = import_directory(path, overwrite=overwrite, progress=bar.add)
    _report_import(path, kind, result, as_json)


@command("import-vllm")
def import_vllm_command(
    path: Annotated[str, typer.Argument(help="A local directory written by vLLM's "
                                        "save_sharded_state.", show_default=False)],
    overwrite: _ReplaceManifestOpt = False,
    as_json: _JsonSummaryOpt = False,
) -> None:
    """Add a manifest to a vLLM sharded-state directory; no data file is rewritten (`import`
    recognizes it too)."""
    from ..convert.from_vllm import import_vllm
    with progress("checksumming") as bar:
        result = import_vllm(path, overwrite=overwrite, progress=bar.add)
    _report_import(path, "vllm sharded_state", result, as_json)


def _report_import(path: str, kind: str, result: Any, as_json: bool) -> None:
    manifest = result.manifest
    local = all(r.shape is None for r in manifest.tensors.values()
                if hasattr(r, "shape"))
    if as_json:
        out.print_json(json.dumps({
            "kind": kind,
            "tp_size": manifest.layout.tp_size,
            "tensors": len(manifest.tensors),
            "data_files": [f.path for r in manifest.ranks for f in r.files],
            "extra_files": [f.path for f in manifest.extra_files],
            "skipped": result.skipped,
        }))
        return
    for name, why in result.skipped.items():
        err.print(f"[yellow]skipped[/] {name}: {why}")
    what = "rank-local tensor" if local else "tensor"
    out.print(f"[bold green]imported[/] {path} ({kind}): tp={manifest.layout.tp_size}, "
              f"{plural(len(manifest.tensors), what)}, "
              f"{plural(sum(len(r.files) for r in manifest.ranks), 'data file')}, "
              f"{plural(len(manifest.extra_files), 'extra file')}")
