#!/usr/bin/env bash
# The checks that need a GPU, as one short script for a machine with CUDA (see
# benchmarks/README.md, "CUDA"): the CUDA tests, the load benchmark on cuda:0 with the peers that
# load onto a GPU, the 8-ranks-at-once run on that machine's cores, then a sweep of the staging
# settings. Results go to $OUT (default ./gpu-results). Needs a python3 with a CUDA torch and
# shardspec's dependencies importable (PYTHONPATH may point at unpacked wheels); the peers
# (runai-model-streamer, fastsafetensors, instanttensor) are measured where they import.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export PYTHONPATH="reference:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
PY=${PY:-python3}
WORK=${WORK:-benchmarks/out/gpu-check}
status=0
step() { echo "=== $(date -u +%T) $*"; }

step environment
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    nproc; df -hT . /tmp | tail -n +2; uname -r
} 2>&1 | tee "$OUT/gpu.txt"

# Each step has a time limit, so that one that hangs leaves the others their turn.

# 1. Tests: the CUDA ones and the staging, direct-read and loading logic they build on. Warnings
#    are shown, not failures: the image's torch is not the version the project pins.
step tests
timeout 100 "$PY" -m pytest -q -p no:cacheprovider -W default tests/test_cuda.py tests/test_staging.py \
    tests/test_direct_reads.py tests/test_load.py tests/test_reshard.py \
    -k "cuda or staging or direct or load or Load" --junitxml "$OUT/cuda-tests.xml" \
    2>&1 | tee "$OUT/cuda-tests.txt" || status=1

# 2. The load benchmark on the GPU: warm and cold, TP=1 and TP=8, with the peers.
step bench cuda
timeout 160 "$PY" benchmarks/bench_load.py --device cuda --tp 1,8 --repeats 3 --cache warm,cold --procs 0 \
    --workdir "$WORK/cuda" --json "$OUT/bench-cuda.json" 2>&1 | tee "$OUT/bench-cuda.txt" \
    || status=1

# 3. The same on the host's cores: one rank in process at TP=1 and TP=8, and all 8 ranks at
#    once, one process each, against the same processes' plain reads (the node-wide goal).
step bench cpu
timeout 140 "$PY" benchmarks/bench_load.py --device cpu --tp 1,8 --repeats 3 --cache warm,cold --procs 8 \
    --workdir "$WORK/cpu" --json "$OUT/bench-cpu.json" 2>&1 | tee "$OUT/bench-cpu.txt" \
    || status=1

# 4. Staging settings (reads in flight x pinned buffers x MiB), warm and cold, TP=1.
step staging sweep
for staging in 1x2x64 4x8x16; do
    timeout 40 "$PY" benchmarks/bench_load.py --device cuda --tp 1 --repeats 3 --cache warm,cold --procs 0 \
        --staging "$staging" --workdir "$WORK/sweep" 2>&1 | grep -E "^TP=|staging" \
        | sed "s/^/[$staging] /" | tee -a "$OUT/staging-sweep.txt" || status=1
done
step done "status $status"
exit $status
