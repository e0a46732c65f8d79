"""Run a real vLLM engine once and print what it generated, as JSON (tests/test_vllm_*.py).

Run with the Python of the vLLM environment (``make vllm``), not the test venv: vLLM and its
torch live there. Usage: ``python vllm_runner.py '{"model": DIR, "load_format": "shardspec",
"tp": 2, "pp": 1, "extra": {...}, "prompts": [[1, 2, 3]], "max_tokens": 8}'``. The last line
of stdout is ``RESULT {"tokens": [[...]], "logprobs": [[...]], "seconds": ...}``; on an error
the engine's own message is in stderr and the exit status is non-zero.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    request = json.loads(sys.argv[1])
    tp, pp = int(request.get("tp", 1)), int(request.get("pp", 1))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if tp * pp > 1:  # one core per worker (vLLM's CPU build needs a binding for each)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND",
                              "|".join(str(i % (os.cpu_count() or 1)) for i in range(tp * pp)))
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(model=request["model"], load_format=request.get("load_format", "auto"),
              tensor_parallel_size=tp, pipeline_parallel_size=pp,
              model_loader_extra_config=request.get("extra") or {},
              quantization=request.get("quantization"),
              skip_tokenizer_init=True, max_model_len=128, enforce_eager=True,
              dtype=request.get("dtype", "bfloat16"), seed=0,
              distributed_executor_backend="mp" if tp * pp > 1 else None)
    seconds = time.perf_counter() - started
    if not request.get("generate", True):  # the load alone (vLLM's CPU build cannot run PP)
        print("RESULT " + json.dumps({"tokens": [], "logprobs": [], "seconds": seconds}))
        return
    params = SamplingParams(max_tokens=int(request.get("max_tokens", 8)), temperature=0.0,
                            logprobs=1)
    outputs = llm.generate([{"prompt_token_ids": p} for p in request["prompts"]], params)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    logprobs = [[entry[token].logprob for entry, token in zip(o.outputs[0].logprobs, ids,
                                                              strict=True)]
                for o, ids in zip(outputs, tokens, strict=True)]
    print("RESULT " + json.dumps({"tokens": tokens, "logprobs": logprobs,
                                  "seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
