#!/usr/bin/env bash
# The checks that need a GPU, as one short script for a machine with CUDA (see
# benchmarks/README.md, "CUDA"): the CUDA tests, the staging settings side by side, the load
# benchmark on cuda:0 with the peers that load onto a GPU, then the 8-ranks-at-once run on that
# machine's cores. Results go to $OUT (default ./gpu-results). Needs a python3 with a CUDA torch and
# shardspec's dependencies importable (PYTHONPATH may point at unpacked wheels); the peers
# (runai-model-streamer, fastsafetensors, instanttensor) are measured where they import.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
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
timeout 100 "$PY" -m pytest -q -p no:cacheprovider -W default tests/load/test_cuda.py tests/load/test_staging.py \
    tests/load/test_direct_reads.py tests/load/test_load.py tests/reshard/test_reshard.py \
    tests/integrations/vllm/test_vllm_placements.py \
    -k "cuda or staging or direct or load or Load or gpu" --junitxml "$OUT/cuda-tests.xml" \
    2>&1 | tee "$OUT/cuda-tests.txt" || status=1

# 2. Staging settings (reads in flight x pinned buffers x MiB) side by side in one process,
#    warm and cold, TP=1 and TP=8; "default" is shardspec.load.execute's on this machine,
#    "-cached" the same reading cold files through the page cache; with the GPU peers and
#    st-cuda in the same rotation (and no other loader between them).
step staging settings
timeout 150 "$PY" benchmarks/load/bench_staging.py --settings 1x2x64,4x8x16,default,default-cached \
    --peers --tp 1,8 --repeats 3 --cache warm,cold --workdir "$WORK/staging" 2>&1 \
    | tee "$OUT/staging.txt" || status=1

# 3. The load benchmark on the GPU: warm and cold, TP=1 and TP=8, with the peers.
step bench cuda
timeout 160 "$PY" benchmarks/load/bench_load.py --device cuda --tp 1,8 --repeats 3 --cache warm,cold \
    --procs 0 --workdir "$WORK/cuda" --json "$OUT/bench-cuda.json" 2>&1 \
    | tee "$OUT/bench-cuda.txt" || status=1

# 4. On the host's cores: all 8 ranks of TP=8 at once, one process each, against the same
#    processes' plain reads (the node-wide goal), after one rank in process. Without the
#    whole-checkpoint baseline there: 8 processes reading 1.1 GiB each took 13 s a run.
step bench cpu
timeout 120 "$PY" benchmarks/load/bench_load.py --device cpu --tp 8 --repeats 3 --cache warm,cold \
    --procs 8 --proc-methods shardspec,shardspec-cached,st-pread,runai,fastsafe --workdir "$WORK/cpu" --json "$OUT/bench-cpu.json" 2>&1 \
    | tee "$OUT/bench-cpu.txt" || status=1
step done "status $status"
exit $status
