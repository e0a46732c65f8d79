"""vLLM's load times, side by side: ``load_format="shardspec"`` against vLLM's formats.

One random Llama-shaped bf16 model (transformers' ``save_pretrained``; by default 16 layers of
hidden 2048, 1.56 GiB) is written once and converted with shardspec: with Hugging Face names at
each benchmarked TP (what ``convert --tp N`` gives) and at TP 4 (served resharded at the
engine's TP), and with ``--names vllm`` at each TP (vLLM's ``sharded_state`` files, which the
plugin loads at their own layout). Every contender is a fresh engine
(``tests/helpers/vllm_runner.py``
in the vLLM venv of ``make vllm``), in a rotating order each repeat:

| contender | directory | load format |
|---|---|---|
| auto | Hugging Face | ``auto`` (vLLM's default safetensors loader, lazy mmap) |
| auto-eager, auto-prefetch | Hugging Face | ``auto`` with ``safetensors_load_strategy`` |
| runai_streamer | Hugging Face | ``runai_streamer`` (needs ``runai-model-streamer``) |
| fastsafetensors | Hugging Face | ``fastsafetensors`` (needs ``fastsafetensors``) |
| sharded_state | ``--names vllm --sharded-state`` | ``sharded_state`` |
| shardspec | ``convert --tp TP`` | ``shardspec`` (placement plan, cached) |
| shardspec-huge-pages | ``convert --tp TP`` | the same, parameters advised for huge pages |
| shardspec-from-tp4 | ``convert --tp 4`` | ``shardspec`` (resharded on load) |
| shardspec-own | ``--names vllm`` | ``shardspec`` (its own layout, each rank whole) |

Every loader is timed the same way: the runner wraps each worker's ``load_weights`` (inside
vLLM's ``BaseModelLoader.load_model``) and reports its seconds and the worker's peak RSS
(``VmHWM``) after ``load_model``; a run's figure is its slowest worker's time and largest peak.
The engine's start (``LLM(...)`` returning) is reported too. The shardspec contenders' placement
plans are cached in a directory of the run: one untimed start of each records its plan first
(its load time is printed as ``first start``), so the repeats measure a second start, as a
server restarted on the same checkpoint makes. **cold**: every file of the run flushed and
evicted from the page cache with ``posix_fadvise(DONTNEED)`` before each engine; **warm**:
the contender's files read once before its engine. A contender vLLM cannot start with is
dropped and its error noted; one whose package is missing is skipped with a note.

With ``--quantization LAYOUT`` (a layout of ``tests/helpers/quantized_models.py`` that vLLM's CPU
build
serves, such as ``w8a8-int8-dynamic``) the model is that bf16 model quantized so, as a
quantizer writes it (``--layers 32`` gives 1.58 GiB of int8 weights and bf16 embeddings).
``convert --names vllm`` does not fuse quantized projections, so vLLM's names at each TP are
what the plugin's workers save (``save_to``, one untimed start at that TP): files named as
vLLM's ``sharded_state`` names them, which both ``sharded_state`` and ``shardspec-own`` load.

    PYTHONPATH=reference python benchmarks/vllm/bench_vllm.py [--tp 1,2] [--layers 16]
        [--hidden 2048] [--repeats 3] [--cache cold,warm] [--contenders a,b] [--json OUT]
        [--vllm-python PATH] [--quantization LAYOUT]
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness
import harness.vllm as serve  # noqa: E402
from harness import use_test_helpers  # noqa: E402
from harness.synthetic import evict  # noqa: E402

#: name -> (directory kind, load format, safetensors_load_strategy, module vLLM needs for it,
#: environment)
CONTENDERS: dict[str, tuple[str, str, str | None, str | None, dict[str, str]]] = {
    "auto": ("hf", "auto", None, None, {}),
    "auto-eager": ("hf", "auto", "eager", None, {}),
    "auto-prefetch": ("hf", "auto", "prefetch", None, {}),
    "runai_streamer": ("hf", "runai_streamer", None, "runai_model_streamer", {}),
    "fastsafetensors": ("hf", "fastsafetensors", None, "fastsafetensors", {}),
    "sharded_state": ("vllm-sharded-state", "sharded_state", None, None, {}),
    "shardspec": ("shardspec", "shardspec", None, None, {}),
    "shardspec-huge-pages": ("shardspec", "shardspec", None, None,
                             {"SHARDSPEC_PARAM_HUGE_PAGES": "1"}),
    "shardspec-from-tp4": ("shardspec-tp4", "shardspec", None, None, {}),
    "shardspec-own": ("vllm", "shardspec", None, None, {}),
}


def warm(files: list[Path]) -> None:
    for f in files:
        with open(f, "rb") as handle:
            while handle.read(1 << 24):
                pass


@dataclass(frozen=True)
class Run:
    weights: float  # the slowest worker's load_weights, s
    start: float    # LLM(...) returning, s
    peak_rss_mib: float  # the largest worker peak


def quantized_model(path: Path, bf16: Path, layout: str) -> None:
    """``bf16`` quantized in ``layout`` (``tests/helpers/quantized_models.py``'s quantizers) at
    ``path``."""
    use_test_helpers()
    from quantized_models import save_quantized

    save_quantized(layout, path, bf16)


def run(python: Path, model: Path, load_format: str, tp: int, strategy: str | None,
        plan_cache: Path, env: dict[str, str], save_to: Path | None = None) -> Run:
    extra: dict[str, str] = {}
    if load_format == "shardspec":
        extra = {"plan_cache": str(plan_cache)}
        if save_to is not None:
            extra["save_to"] = str(save_to)
    _, start, timed = serve.run_engine(python, {"model": str(model), "load_format": load_format,
                                          "tp": tp, "safetensors_load_strategy": strategy,
                                          "extra": extra}, env)
    return Run(max(t["seconds"] for t in timed), start, max(t["peak_rss_mib"] for t in timed))


def main() -> None:
    args = serve.parse_args(__doc__, CONTENDERS, lambda ap: (
        ap.add_argument("--cache", default="cold,warm"),
        ap.add_argument("--quantization", default=None)))

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    plan_cache = work / "plan-cache"
    shutil.rmtree(plan_cache, ignore_errors=True)  # every run records its plans afresh
    tps = [int(t) for t in args.tp.split(",")]
    hf = work / "hf"
    if not hf.exists():
        serve.write_model(work / "hf-bf16" if args.quantization else hf, args.layers, args.hidden)
        if args.quantization:
            quantized_model(hf, work / "hf-bf16", args.quantization)
            shutil.rmtree(work / "hf-bf16")
    size = sum(f.stat().st_size for f in hf.glob("*.safetensors"))
    dirs: dict[tuple[str, int], Path] = {}
    for tp in tps:
        dirs["hf", tp] = hf
        dirs["shardspec", tp] = serve.converted(hf, work / f"shardspec-tp{tp}", tp_size=tp)
        dirs["shardspec-tp4", tp] = serve.converted(hf, work / "shardspec-tp4", tp_size=4)
        if args.quantization:  # vLLM's names as the plugin's workers save them
            saved = work / f"vllm-saved-tp{tp}"
            if not saved.exists():
                run(args.vllm_python, dirs["shardspec", tp], "shardspec", tp, None, plan_cache,
                    {}, save_to=saved)
            dirs["vllm", tp] = dirs["vllm-sharded-state", tp] = saved
            continue
        dirs["vllm", tp] = serve.converted(hf, work / f"vllm-names-tp{tp}", tp_size=tp,
                                           names="vllm")
        # vLLM's own loader reads a name once a rank: fused tensors rank-local, one file a rank
        dirs["vllm-sharded-state", tp] = serve.converted(
            hf, work / f"vllm-sharded-state-tp{tp}", tp_size=tp, names="vllm", sharded_state=True)
    every = sorted({f for d in dirs.values() for f in d.glob("*.safetensors")})
    contenders, notes = serve.installed(args.vllm_python, args.contenders,
                                  {name: c[3] for name, c in CONTENDERS.items()})
    results: dict[str, dict[str, list[Run]]] = {}
    first: dict[str, Run] = {}
    failed: dict[str, str] = {}
    caches = args.cache.split(",")

    def timed(name: str, tp: int) -> Run | None:
        cell = f"{name}@tp{tp}"
        if cell in failed:
            return None
        kind, load_format, strategy, _, env = CONTENDERS[name]
        try:
            return run(args.vllm_python, dirs[kind, tp], load_format, tp, strategy, plan_cache,
                       env)
        except RuntimeError as error:  # recorded, and the contender is dropped
            failed[cell] = str(error)
            print(f"{cell} failed: {error}", flush=True)
            return None

    for tp in tps:  # the plans are recorded first, untimed by the repeats
        for name in contenders:
            if CONTENDERS[name][1] == "shardspec":
                warm([f for f in every if f.parent == dirs[CONTENDERS[name][0], tp]])
                got = timed(name, tp)
                if got is not None:
                    first[f"{name}@tp{tp}"] = got
                    print(f"tp {tp} first start {name:20} weights {got.weights:7.2f} s "
                          "(records its placement plan)", flush=True)
    for repeat in range(args.repeats):
        order = serve.rotated(contenders, repeat)
        for tp in tps:
            for cache in caches:
                for name in order:
                    if cache == "cold":
                        evict(every)
                    else:
                        warm(sorted(dirs[CONTENDERS[name][0], tp].glob("*.safetensors")))
                    got = timed(name, tp)
                    if got is None:
                        continue
                    results.setdefault(f"tp{tp} {cache}", {}).setdefault(name, []).append(got)
                    print(f"repeat {repeat} tp {tp} {cache:4} {name:20} weights "
                          f"{got.weights:7.2f} s  peak RSS {got.peak_rss_mib:6.0f} MiB  "
                          f"engine start {got.start:6.1f} s", flush=True)
    print(f"\nmodel: {args.layers} layers, hidden {args.hidden}, {size / 2**30:.2f} GiB "
          f"{args.quantization or 'bf16'}; "
          f"medians of {args.repeats}; load_weights s of the slowest worker, its peak RSS MiB")
    for tp in tps:
        print(f"\nTP={tp}\n")
        print("| contender | " + " | ".join(f"{c} s | {c} RSS" for c in caches) + " |")
        print("|---|" + "---|---|" * len(caches))
        for name in contenders:
            if f"{name}@tp{tp}" in failed:
                continue
            cells = []
            for cache in caches:
                runs = results.get(f"tp{tp} {cache}", {}).get(name, [])
                cells += ([f"{statistics.median(r.weights for r in runs):.2f}",
                           f"{statistics.median(r.peak_rss_mib for r in runs):.0f}"]
                          if runs else ["-", "-"])
            print(f"| {name} | " + " | ".join(cells) + " |")
    serve.finish(args, notes, failed, "vLLM failed to start with it", [
        f"{cell}: first start (recording the plan, warm) {got.weights:.2f} s"
        for cell, got in first.items()],
        results={k: {n: [vars(r) for r in runs] for n, runs in v.items()}
                 for k, v in results.items()},
        first={k: vars(v) for k, v in first.items()})


if __name__ == "__main__":
    sys.exit(main())
