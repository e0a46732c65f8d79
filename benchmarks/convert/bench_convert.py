"""Convert benchmark: peak memory (and time) of ``shardspec convert`` and ``merge`` vs the model.

On a synthetic Llama-shaped bf16 Hugging Face checkpoint (default 1 GiB, one
``model.safetensors`` plus ``config.json``), every measured step runs in a fresh child process
and its peak resident set size is read with ``os.wait4`` (``ru_maxrss`` of that child alone):

* ``import``   - a child that only imports shardspec (torch included): the floor;
* ``convert``  - ``shardspec.convert.convert`` to each TP x PP layout asked for;
* ``merge``    - ``shardspec.convert.merge`` of the first layout back to Hugging Face files,
  checked to be byte-identical to the source file;
* ``naive``    - for contrast, the in-memory way: ``safetensors.torch.load_file`` of the whole
  checkpoint, ``shardspec.split`` and ``shardspec.save`` (TP of the first layout).

Peak RSS counts file pages mapped into the process as well as allocations, so the figures are
upper bounds of what the step needs. This is a benchmark, not a test: it exits non-zero only
when the merged checkpoint differs from the source.

    PYTHONPATH=reference python benchmarks/convert/bench_convert.py [--size-gib 1]
        [--layouts 2x1,4x1,2x2,8x1] [--workdir DIR] [--json OUT] [--keep]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
from harness import REFERENCE, removed_after  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
VOCAB = 32000
LAYERS = 16

MAKE_MODEL = r"""
import json, sys
import torch
from safetensors.torch import save_file
target, vocab, layers, root = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
hidden = 64
while True:
    inter, kv = -(-hidden * 11 // 4 // 64) * 64, hidden // 4
    spec = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        spec += [(p + "input_layernorm.weight", (hidden,)),
                 (p + "self_attn.q_proj.weight", (hidden, hidden)),
                 (p + "self_attn.k_proj.weight", (kv, hidden)),
                 (p + "self_attn.v_proj.weight", (kv, hidden)),
                 (p + "self_attn.o_proj.weight", (hidden, hidden)),
                 (p + "post_attention_layernorm.weight", (hidden,)),
                 (p + "mlp.gate_proj.weight", (inter, hidden)),
                 (p + "mlp.up_proj.weight", (inter, hidden)),
                 (p + "mlp.down_proj.weight", (hidden, inter))]
    spec += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    sizes = [2 * torch.Size(s).numel() for _, s in spec]
    if sum(sizes) >= target:
        break
    hidden += 64
gen = torch.Generator().manual_seed(0)
weights = {n: torch.randint(-32768, 32768, s, dtype=torch.int16, generator=gen)
           .bitwise_and_(-16385).view(torch.bfloat16) for n, s in spec}
save_file(weights, root + "/model.safetensors", metadata={"format": "pt"})
json.dump({"model_type": "llama", "tie_word_embeddings": False, "hidden_size": hidden,
           "num_hidden_layers": layers, "vocab_size": vocab},
          open(root + "/config.json", "w"))
print(json.dumps({"bytes": sum(sizes), "largest": max(sizes), "tensors": len(spec),
                  "hidden": hidden}))
"""

IMPORT_ONLY = "import shardspec, shardspec.convert"

CONVERT = r"""
import sys
from shardspec.convert import convert
convert(sys.argv[1], sys.argv[2], tp_size=int(sys.argv[3]), pp_size=int(sys.argv[4]))
"""

MERGE = r"""
import sys
from shardspec.convert import merge
merge(sys.argv[1], sys.argv[2])
"""

NAIVE = r"""
import sys
import shardspec
from safetensors.torch import load_file
from shardspec.convert.tp_plan import BUILTIN_PLAN, TPPlan, split_dim
src, dst, tp = sys.argv[1], sys.argv[2], int(sys.argv[3])
weights = load_file(src + "/model.safetensors")
plan = TPPlan(BUILTIN_PLAN)
states = {r: {} for r in range(tp)}
sharding = {r: {} for r in range(tp)}
for name, tensor in weights.items():
    dim = split_dim(plan.style_of(name), tuple(tensor.shape), name)
    for rank, (piece, shard) in enumerate(shardspec.split(tensor, dim, tp)):
        states[rank][name] = piece
        sharding[rank][name] = shard
shardspec.save(states, dst, layout=shardspec.Layout(tp_size=tp), sharding=sharding)
"""


def measure(code: str, *args: str) -> tuple[float, int, str]:
    """Run ``code`` in a fresh interpreter; return (seconds, peak RSS bytes, stdout)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REFERENCE), os.environ.get("PYTHONPATH", "")]))}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=out,
                                 stderr=err, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if child.returncode:
            raise RuntimeError(f"child failed ({child.returncode}):\n{err.read()}")
        return seconds, usage.ru_maxrss * 1024, out.read()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(16 * MiB):
            digest.update(chunk)
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--layouts", default="2x1,4x1,2x2,8x1",
                        help="comma-separated TPxPP layouts")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    layouts = [tuple(int(x) for x in item.split("x")) for item in args.layouts.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="bench-convert-", dir=args.workdir))
    rows: list[dict[str, Any]] = []
    ok = True
    with removed_after(workdir, args.keep):
        src = workdir / "hf"
        src.mkdir()
        _, _, info_text = measure(MAKE_MODEL, str(int(args.size_gib * GiB)), str(VOCAB),
                                  str(LAYERS), str(src))
        model = json.loads(info_text)
        seconds, floor, _ = measure(IMPORT_ONLY)
        rows.append({"step": "import shardspec (floor)", "seconds": seconds, "peak": floor})
        for tp, pp in layouts:
            dst = workdir / f"tp{tp}-pp{pp}"
            seconds, peak, _ = measure(CONVERT, str(src), str(dst), str(tp), str(pp))
            rows.append({"step": f"convert TP={tp} PP={pp}", "seconds": seconds, "peak": peak})
            if (tp, pp) != layouts[0]:
                shutil.rmtree(dst)
        first = workdir / f"tp{layouts[0][0]}-pp{layouts[0][1]}"
        merged = workdir / "merged"
        seconds, peak, _ = measure(MERGE, str(first), str(merged))
        same = sha256(merged / "model.safetensors") == sha256(src / "model.safetensors")
        ok = ok and same
        rows.append({"step": f"merge TP={layouts[0][0]} PP={layouts[0][1]} -> HF"
                     + ("" if same else " (DIFFERS!)"), "seconds": seconds, "peak": peak})
        shutil.rmtree(merged)
        seconds, peak, _ = measure(NAIVE, str(src), str(workdir / "naive"), str(layouts[0][0]))
        rows.append({"step": f"naive load_file + split + save, TP={layouts[0][0]}",
                     "seconds": seconds, "peak": peak})
    print(f"model: {model['bytes'] / GiB:.2f} GiB bf16, {model['tensors']} tensors, largest "
          f"tensor {model['largest'] / MiB:.1f} MiB (hidden {model['hidden']}, vocab {VOCAB}, "
          f"{LAYERS} layers)")
    print()
    print("| step | time (s) | peak RSS (MiB) | peak - floor (MiB) | peak - floor, x model |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        extra = row["peak"] - floor
        print(f"| {row['step']} | {row['seconds']:.1f} | {row['peak'] / MiB:.0f} | "
              f"{extra / MiB:.0f} | {extra / model['bytes']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": platform.platform(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "model": model, "floor": floor, "rows": rows,
        }, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
