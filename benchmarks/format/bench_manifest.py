"""What the manifest costs: parse, ``open()`` and metadata-only ``validate()``, by pieces.

Every rank parses and checks the whole manifest on open (SPEC 11.1), so its cost grows with the
pieces of the whole model, not with what one rank reads. The checkpoints here are shaped like a
large mixture of experts (DeepSeek-V3's dimensions: hidden 7168, 256 routed experts of
intermediate size 2048 a layer, vocabulary 129280) over 64 ranks as TP=8 x EP=8:

- attention projections split over the 8 TP ranks and replicated over the 8 EP groups
  (64 pieces each: replica = EP rank), the embedding and lm_head likewise (vocabulary-parallel);
- norms and the router replicated over all 64 ranks;
- routed experts each held by the 8 ranks of one EP group, split over their TP ranks
  (gate and up along dim 0, down along dim 1; 8 pieces each), in FP8.

The layer count is chosen so that the manifest has about ``--sizes`` pieces (10k, 100k, 1M by
default; 10k uses 64 experts a layer). The manifest is built as Manifest objects and written
with ``Manifest.to_json()``; no tensor data is written. For ``validate()``, which reads every
data file's header, each rank's file is a real safetensors header of its pieces followed by a
*sparse* data region of the right size (``truncate``: no disk blocks, nothing read).

Timed, median of ``--repeats``, each in process with the manifest in the page cache:

- ``parse_manifest(bytes)``;
- ``shardspec.open(path)`` (reads only the manifest: no data file is opened);
- ``shardspec.validate(path)``, metadata only (the manifest, then every header against it);

each with the fast paths (the default) and with the strict paths forced (``_FAST_PATH = False``
in ``shardspec.format.parse`` and ``shardspec.format.safetensors_header``: the code as it was before
the fast paths, but for what both share, such as the faster JSON skeleton and ``from_dict``),
interleaved in every repeat.

With ``--before DIR`` (a ``reference/`` directory of an older commit, e.g. from ``git archive
COMMIT reference | tar -x -C DIR``) the same three calls are also timed with that code, in a
child process, on the same files: the cost before the fast paths, shared speed-ups included.

A manifest over SPEC 3.4's limit (256 MiB since format 1.1; 64 MiB in 1.0, which the 1M-piece
one passes) is read with the limit lifted in this process only (``lift_manifest_limit``), and
the table says so; ``--before`` lifts the older code's limit the same way.

Run: ``PYTHONPATH=reference python benchmarks/format/bench_manifest.py`` (about 10 minutes at the
default sizes; ``--sizes 10000,100000`` takes under one).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
import shardspec  # noqa: E402
from harness import OUT, removed_after  # noqa: E402
from shardspec import Layout, Logical, Manifest, Quantization, Tie, data_file_name  # noqa: E402
from shardspec.format import limits, parse, parse_fast, safetensors_header  # noqa: E402
from shardspec.format.dtypes import DTYPES, byte_size  # noqa: E402
from shardspec.format.manifest import FileRecord, Piece, RankRecord, TensorRecord  # noqa: E402

HIDDEN, MOE_INTER, VOCAB, EXPERTS = 7168, 2048, 129280, 256
TP, EP = 8, 8
LAYOUT = Layout(tp_size=TP, ep_size=EP)
WORLD = TP * EP
#: Pieces a layer has besides its experts: 4 attention projections x 64, 2 norms and the router
#: x 64; each expert adds 3 tensors x 8 pieces.
DENSE_PIECES, EXPERT_PIECES = 7 * WORLD, 3 * TP
#: Embedding, lm_head and the final norm: 64 pieces each.
OUTER_PIECES = 3 * WORLD


def _split(name: str, dtype: str, shape: tuple[int, ...], dim: int, holders: list[int],
           copies: list[list[int]] | None = None) -> tuple[str, TensorRecord]:
    """``shape`` split along ``dim`` over ``holders`` (TP order); each list in ``copies`` holds
    one more copy (replica 1, 2, ...) on other ranks."""
    parts = len(holders)
    size = shape[dim] // parts
    pieces = []
    for replica, ranks in enumerate([holders, *(copies or [])]):
        for index, rank in enumerate(ranks):
            offset = [0] * len(shape)
            offset[dim] = index * size
            piece_shape = list(shape)
            piece_shape[dim] = size
            pieces.append(Piece(rank=rank, file=data_file_name(LAYOUT, rank, 0),
                                shape=tuple(piece_shape), offset=tuple(offset),
                                replica=replica))
    pieces.sort(key=lambda p: p.rank)
    return name, TensorRecord(dtype=dtype, shape=shape, pieces=tuple(pieces))


def _replicated(name: str, shape: tuple[int, ...]) -> tuple[str, TensorRecord]:
    pieces = tuple(Piece(rank=r, file=data_file_name(LAYOUT, r, 0), shape=shape,
                         offset=(0,) * len(shape), replica=r) for r in range(WORLD))
    return name, TensorRecord(dtype="BF16", shape=shape, pieces=pieces)


def _group(ep: int) -> list[int]:
    return [LAYOUT.rank_of(tp_rank=tp, pp_rank=0, ep_rank=ep) for tp in range(TP)]


def _tp_over_ep(name: str, shape: tuple[int, ...], dim: int) -> tuple[str, TensorRecord]:
    """Split over TP in EP group 0, replicated in the other groups."""
    return _split(name, "BF16", shape, dim, _group(0), [_group(ep) for ep in range(1, EP)])


def _with_scale(name: str, record: TensorRecord) -> list[tuple[str, TensorRecord]]:
    """An FP8 weight with its logical record and its 128 x 128 block scale tied to it (SPEC
    8.4), one scale piece on every rank that holds a piece of the weight."""
    def blocks(offset: tuple[int, ...], shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        lo = tuple(o // 128 for o in offset)
        hi = tuple(-(-(o + n) // 128) for o, n in zip(offset, shape, strict=True))
        return lo, tuple(h - low for h, low in zip(hi, lo, strict=True))

    assert record.shape is not None
    whole = blocks((0,) * len(record.shape), record.shape)[1]
    scale = TensorRecord(
        dtype="F32", shape=whole, tied_to=Tie(tensor=name, block=(128, 128)),
        pieces=tuple(dataclasses.replace(p, offset=blocks(p.offset or (), p.shape)[0],
                                         shape=blocks(p.offset or (), p.shape)[1])
                     for p in record.pieces))
    weight = dataclasses.replace(record, logical=Logical(dtype="BF16", shape=record.shape))
    return [(name, weight), (name + "_scale_inv", scale)]


def moe_tensors(pieces: int, scales: bool = False) -> dict[str, TensorRecord]:
    """About ``pieces`` pieces of a DeepSeek-V3-shaped model at TP=8 x EP=8 (with ``scales``,
    its FP8 experts carry their block scales as DeepSeek ships them)."""
    experts = EXPERTS if pieces >= 50_000 else 64
    per_layer = DENSE_PIECES + experts * EXPERT_PIECES * (2 if scales else 1)
    layers = max(1, round((pieces - OUTER_PIECES) / per_layer))
    tensors = dict([_tp_over_ep("model.embed_tokens.weight", (VOCAB, HIDDEN), 0)])
    for layer in range(layers):
        p = f"model.layers.{layer}."
        tensors.update([
            _replicated(p + "input_layernorm.weight", (HIDDEN,)),
            _tp_over_ep(p + "self_attn.q_proj.weight", (HIDDEN, HIDDEN), 0),
            _tp_over_ep(p + "self_attn.k_proj.weight", (HIDDEN, HIDDEN), 0),
            _tp_over_ep(p + "self_attn.v_proj.weight", (HIDDEN, HIDDEN), 0),
            _tp_over_ep(p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN), 1),
            _replicated(p + "post_attention_layernorm.weight", (HIDDEN,)),
            _replicated(p + "mlp.gate.weight", (experts, HIDDEN)),
        ])
        for e in range(experts):
            q = f"{p}mlp.experts.{e}."
            holders = _group(e * EP // experts)
            for name, record in [
                _split(q + "gate_proj.weight", "F8_E4M3", (MOE_INTER, HIDDEN), 0, holders),
                _split(q + "up_proj.weight", "F8_E4M3", (MOE_INTER, HIDDEN), 0, holders),
                _split(q + "down_proj.weight", "F8_E4M3", (HIDDEN, MOE_INTER), 1, holders),
            ]:
                tensors.update(_with_scale(name, record) if scales else [(name, record)])
    tensors.update([_replicated("model.norm.weight", (HIDDEN,)),
                    _tp_over_ep("lm_head.weight", (VOCAB, HIDDEN), 0)])
    return tensors


def _header(entries: list[tuple[str, str, tuple[int, ...]]]) -> tuple[bytes, int]:
    """A safetensors header of ``entries`` (name, dtype, shape), and the data region's size."""
    header: dict[str, Any] = {}
    position = 0
    for name, dtype, shape in entries:
        size = byte_size(DTYPES[dtype], shape)
        assert size is not None
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [position, position + size]}
        position += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, position


def write_checkpoint(root: Path, pieces: int, scales: bool = False) -> Manifest:
    """The manifest of about ``pieces`` pieces, and one sparse data file per rank."""
    root.mkdir(parents=True)
    tensors = moe_tensors(pieces, scales)
    held: dict[int, list[tuple[str, str, tuple[int, ...]]]] = {r: [] for r in range(WORLD)}
    for name, record in tensors.items():
        for piece in record.pieces:
            held[piece.rank].append((name, record.dtype, piece.shape))
    ranks = []
    for rank in range(WORLD):
        path = data_file_name(LAYOUT, rank, 0)
        head, data = _header(held[rank])
        with open(root / path, "wb") as handle:
            handle.write(head)
            handle.truncate(len(head) + data)  # sparse: no blocks, nothing to read
        ranks.append(RankRecord(rank=rank, **LAYOUT.coordinates(rank), files=(FileRecord(
            path=path, size=len(head) + data, checksums={"sha256": f"{rank:064x}"}),)))
    manifest = Manifest(format_version=shardspec.format_version(), layout=LAYOUT,
                        ranks=tuple(ranks),
                        quantization=Quantization(method="fp8", config={
                            "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]}),
                        tensors=dict(tensors), generator="bench_manifest")
    (root / limits.MANIFEST_NAME).write_bytes(manifest.to_json())
    return manifest


def lift_manifest_limit(size: int) -> bool:
    """Benchmark only: let this process read a manifest of ``size`` bytes even where it is over
    SPEC 3.4's limit (a conforming reader refuses it). Returns whether the limit was lifted."""
    if size <= limits.MAX_MANIFEST_BYTES:
        return False
    parse.MAX_MANIFEST_BYTES = parse_fast.MAX_MANIFEST_BYTES = size  # type: ignore[attr-defined]
    return True


def use_fast_paths(fast: bool) -> None:
    """Benchmark only: the fast paths of the manifest and of headers on, or both off."""
    parse._FAST_PATH = safetensors_header._FAST_PATH = fast


#: Run by ``--before`` in a child process with the older code first on ``sys.path``.
_BEFORE = """
import gc, json, statistics, sys, time
import shardspec, shardspec.format.parse as parse
root, repeats, calls = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
data = open(root + "/shardspec.json", "rb").read()
parse.MAX_MANIFEST_BYTES = max(parse.MAX_MANIFEST_BYTES, len(data))  # as lift_manifest_limit
run = {"parse_manifest": lambda: parse.parse_manifest(data), "open": lambda: shardspec.open(root),
       "validate": lambda: shardspec.validate(root)}
times = {name: [] for name in calls}
for name in calls:  # untimed: imports (torch, for open) and caches
    run[name]()
for _ in range(repeats):
    for name in calls:
        gc.collect()
        start = time.perf_counter()
        result = run[name]()
        times[name].append(time.perf_counter() - start)
        assert result is not None
        del result
print(json.dumps(times))
"""


def time_before(reference: Path, root: Path, repeats: int,
                names: list[str]) -> dict[str, list[float]]:
    """The calls timed with the code under ``reference`` (an older ``reference/``)."""
    env = {**os.environ, "PYTHONPATH": str(reference)}
    out = subprocess.run([sys.executable, "-c", _BEFORE, str(root), str(repeats),
                          ",".join(names)], env=env, check=True, capture_output=True, text=True)
    times: dict[str, list[float]] = json.loads(out.stdout)
    return times


def timed(function: Callable[[Path, bytes], object], root: Path, data: bytes) -> float:
    gc.collect()
    start = time.perf_counter()
    result = function(root, data)
    elapsed = time.perf_counter() - start
    del result
    return elapsed


def check(root: Path, data: bytes, manifest: Manifest) -> None:
    """Untimed: both paths find nothing wrong and build the manifest that was written."""
    for fast in (True, False):
        use_fast_paths(fast)
        parsed = parse.parse_manifest(data)
        assert parsed.findings == [] and parsed.manifest == manifest, parsed.findings[:3]
        report = shardspec.validate(root)
        assert report.ok and report.files_checked == WORLD, [str(f) for f in report.errors][:3]
    use_fast_paths(True)
    assert parse_fast.fast_manifest(data) == manifest  # the fast path answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000",
                        help="approximate piece counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-validate", action="store_true", help="skip validate()")
    parser.add_argument("--scales", action="store_true",
                        help="FP8 experts with their tied 128x128 block scales (SPEC 8.4), "
                        "as DeepSeek-V3 ships them: half the pieces are scales")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--before", type=Path, default=None,
                        help="an older reference/ directory to time too, in a child process")
    args = parser.parse_args()
    parent = args.workdir or OUT
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-manifest-", dir=parent))
    import torch  # open() is in the reader, which imports torch: not part of the time

    methods: list[tuple[str, Callable[[Path, bytes], object]]] = [
        ("parse_manifest", lambda root, data: parse.parse_manifest(data)),
        ("open", lambda root, data: shardspec.open(root)),
    ]
    if not args.no_validate:
        methods.append(("validate", lambda root, data: shardspec.validate(root)))
    rows = []
    runs: dict[str, list[float]] = {}
    with removed_after(work):
        for target in (int(s) for s in args.sizes.split(",")):
            root = work / f"p{target}"
            start = time.perf_counter()
            manifest = write_checkpoint(root, target, args.scales)
            built = time.perf_counter() - start
            data = (root / limits.MANIFEST_NAME).read_bytes()
            lifted = lift_manifest_limit(len(data))
            pieces = sum(len(t.pieces) for t in manifest.tensors.values()
                         if isinstance(t, TensorRecord))
            check(root, data, manifest)
            del manifest
            times: dict[tuple[str, str], list[float]] = {}
            for repeat in range(args.repeats):
                order = [(n, f, p) for n, f in methods for p in ("fast", "strict")]
                if repeat % 2:
                    order.reverse()
                for name, function, path in order:
                    use_fast_paths(path == "fast")
                    times.setdefault((name, path), []).append(timed(function, root, data))
            use_fast_paths(True)
            if args.before:
                names = [name for name, _ in methods]
                for name, values in time_before(args.before, root, args.repeats,
                                                names).items():
                    times[(name, "before")] = values
            for (name, path), values in times.items():
                runs[f"{pieces} {name} {path}"] = values
            rows.append((pieces, len(data), lifted, built, {
                key: statistics.median(values) for key, values in times.items()}))
            shutil.rmtree(root)
        print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; torch "
              f"{torch.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        print(f"median of {args.repeats}, seconds (microseconds a piece); strict = the fast "
              "paths switched off" + (f"; before = {args.before}" if args.before else "")
              + "; speed-up = first column / fast")
        names = [name for name, _ in methods]
        paths = ["before", "strict", "fast"] if args.before else ["strict", "fast"]
        print("\n| call | pieces | manifest | " + " | ".join(paths) + " | speed-up |")
        print("|---|---:|---:|" + "---:|" * (len(paths) + 1))
        for name in names:
            for pieces, size, lifted, _, medians in rows:
                cells = [f"{medians[(name, p)]:.3f} s ({medians[(name, p)] / pieces * 1e6:.2f} us)"
                         for p in paths]
                slow = medians[(name, paths[0])]
                limit = " (limit lifted)" if lifted else ""
                print(f"| {name} | {pieces:,} | {size / 2**20:.1f} MiB{limit} | "
                      + " | ".join(cells) + f" | {slow / medians[(name, 'fast')]:.1f}x |")
        if any(lifted for _, _, lifted, _, _ in rows):
            print(f"\nlimit lifted: manifests over MAX_MANIFEST_BYTES ({limits.MAX_MANIFEST_BYTES} "
                  "bytes, SPEC 3.4) were read with the limit raised in this process only")
        print("\nbuilding and writing each checkpoint (untimed above): " + ", ".join(
            f"{pieces:,} pieces {built:.1f} s" for pieces, _, _, built, _ in rows))
        print("\nevery repeat (s):")
        for key, values in runs.items():
            print(f"  {key}: {[round(v, 3) for v in values]}")


if __name__ == "__main__":
    main()
