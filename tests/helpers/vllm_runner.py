"""Run a real vLLM engine once and print what it generated, as JSON
(tests/integrations/vllm/test_vllm_*.py).

Run with the Python of the vLLM environment (``make vllm``), not the test venv: vLLM and its
torch live there. Usage: ``python vllm_runner.py '{"model": DIR, "load_format": "shardspec",
"tp": 2, "pp": 1, "extra": {...}, "prompts": [[1, 2, 3]], "max_tokens": 8}'``. The last line
of stdout is ``RESULT {"tokens": [[...]], "logprobs": [[...]], "seconds": ...}``; on an error
the engine's own message is in stderr and the exit status is non-zero.

``"time_load": true`` times every worker's ``load_weights`` the same way, whatever the load
format (not every loader logs its own time): each worker prints
``LOAD_WEIGHTS {"seconds": ..., "peak_rss_mib": ...}``, the peak from the worker's
``VmHWM`` after vLLM's ``load_model``. vLLM's processes are started by multiprocessing's
spawn, which imports this file in each of them: the wrapper is installed there from
:data:`TIME_LOAD_ENV`.

``"digest": DIR`` has each worker write, right after ``load_weights`` and before vLLM
processes the weights, ``DIR/state-TP_RANK-PP_RANK.json``: ``{name: sha256}`` of the bytes the
load format placed in every parameter and buffer (a file each: the workers' lines on one
stdout may interleave). Where the engine cannot go on (a quantization kernel this CPU lacks),
those files are the result: the run stops there.
"""

from __future__ import annotations

import json
import os
import sys
import time

TIME_LOAD_ENV = "SHARDSPEC_RUNNER_TIME_LOAD"
DIGEST_ENV = "SHARDSPEC_RUNNER_DIGEST"


def main() -> None:
    request = json.loads(sys.argv[1])
    tp, pp = int(request.get("tp", 1)), int(request.get("pp", 1))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if tp * pp > 1:  # one core per worker (vLLM's CPU build needs a binding for each)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND",
                              "|".join(str(i % (os.cpu_count() or 1)) for i in range(tp * pp)))
    from vllm import LLM, SamplingParams

    if request.get("time_load"):
        os.environ[TIME_LOAD_ENV] = "1"  # for workers started by spawn, which import this file
        _time_load_weights()
    if request.get("digest"):
        os.environ[DIGEST_ENV] = str(request["digest"])
        _digest_after_load_weights()
    started = time.perf_counter()
    llm = LLM(model=request["model"], load_format=request.get("load_format", "auto"),
              tensor_parallel_size=tp, pipeline_parallel_size=pp,
              model_loader_extra_config=request.get("extra") or {},
              quantization=request.get("quantization"),
              skip_tokenizer_init=True, max_model_len=128, enforce_eager=True,
              dtype=request.get("dtype", "bfloat16"), seed=0,
              **({"safetensors_load_strategy": request["safetensors_load_strategy"]}
                 if request.get("safetensors_load_strategy") else {}),
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


def _time_load_weights() -> None:
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    load_model = BaseModelLoader.load_model

    def timed_load_model(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        inner = self.load_weights
        seconds = []

        def load_weights(model, model_config):  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            inner(model, model_config)
            seconds.append(time.perf_counter() - started)

        self.load_weights = load_weights
        try:
            return load_model(self, *args, **kwargs)
        finally:
            del self.load_weights
            with open("/proc/self/status") as status:
                peak = next(int(line.split()[1]) for line in status
                            if line.startswith("VmHWM:"))
            print("LOAD_WEIGHTS " + json.dumps({"seconds": sum(seconds),
                                                "peak_rss_mib": peak / 1024}), flush=True)

    BaseModelLoader.load_model = timed_load_model


def _digest_after_load_weights() -> None:
    import hashlib

    import torch
    from vllm.distributed import get_pp_group, get_tp_group
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    load_model = BaseModelLoader.load_model

    def digest_load_model(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        inner = self.load_weights

        def load_weights(model, model_config):  # type: ignore[no-untyped-def]
            inner(model, model_config)
            digests = {}
            for name, tensor in model.state_dict().items():
                flat = tensor.detach().contiguous().reshape(-1)
                digests[name] = hashlib.sha256(flat.view(torch.uint8).numpy()
                                               .tobytes()).hexdigest()
            name = f"state-{get_tp_group().rank_in_group}-{get_pp_group().rank_in_group}.json"
            with open(os.path.join(os.environ[DIGEST_ENV], name), "w") as out:
                json.dump(digests, out)
            # vLLM's processing and the engine's start are not what is compared: every worker
            # has written once all pass the barrier, and then they stop
            import torch.distributed as dist
            from vllm.distributed import get_world_group

            dist.barrier(group=get_world_group().cpu_group)
            os._exit(0)

        self.load_weights = load_weights
        return load_model(self, *args, **kwargs)

    BaseModelLoader.load_model = digest_load_model


if __name__ == "__main__":
    main()
else:  # a vLLM process started by spawn
    if os.environ.get(TIME_LOAD_ENV) == "1":
        _time_load_weights()
    if os.environ.get(DIGEST_ENV):
        _digest_after_load_weights()
