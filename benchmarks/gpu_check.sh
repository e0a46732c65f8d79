#!/usr/bin/env bash
# The checks that need a GPU, as one short script for a machine with CUDA (see
# benchmarks/README.md, "CUDA"): the CUDA tests, then the load benchmark on cuda:0, then a sweep
# of the staging settings. Results go to $OUT (default ./gpu-results). Needs a python3 with a
# CUDA torch and shardspec's dependencies importable (PYTHONPATH may point at unpacked wheels).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export PYTHONPATH="reference:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
PY=${PY:-python3}
status=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"

# 1. Tests: the CUDA ones and the staging/loading logic they build on.
"$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_staging.py tests/test_load.py \
    "tests/test_reshard.py" -k "cuda or staging or load or Load" --junitxml "$OUT/cuda-tests.xml" \
    2>&1 | tee "$OUT/cuda-tests.txt" || status=1

# 2. The load benchmark on the GPU: warm and cold, TP=1 and TP=8, with the peers that load onto
#    CUDA (fastsafetensors, runai-model-streamer: pip install -e ".[bench]" first).
"$PY" benchmarks/bench_load.py --device cuda --tp 1,8 --repeats 3 --cache warm,cold --procs 0 \
    --json "$OUT/bench-cuda.json" 2>&1 | tee "$OUT/bench-cuda.txt" || status=1

# 3. Staging settings (reads in flight x pinned buffers x MiB), warm, TP=1 (one 1.1 GiB file).
for staging in 1x2x64 2x4x32 4x4x32 4x8x16; do
    "$PY" benchmarks/bench_load.py --device cuda --tp 1 --repeats 3 --cache warm --procs 0 \
        --staging "$staging" 2>&1 | grep -E "^TP=|staging" | sed "s/^/[$staging] /" \
        | tee -a "$OUT/staging-sweep.txt" || status=1
done
exit $status
