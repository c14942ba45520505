#!/usr/bin/env bash
# GPU check: build from source on the GPU machine, run the GPU tests, then the GPU benchmarks,
# writing results into the folder given as $1 (within 8 minutes on one H200).
#   bash benchmarks/gpu_check.sh "$OUT"
set -uo pipefail
OUT="${1:?usage: gpu_check.sh OUT_DIR}"
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
# CUDA_HOME: the toolkit root (holding include/cuda_runtime.h): as given, else /usr/local/cuda,
# else the one above the nvcc on PATH, else the one torch finds.
if [ -z "${CUDA_HOME:-}" ] || [ ! -f "$CUDA_HOME/include/cuda_runtime.h" ]; then
  for c in /usr/local/cuda "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")")" \
           "$(${PYTHON:-python3} -c 'from torch.utils.cpp_extension import CUDA_HOME; print(CUDA_HOME or "")' 2>/dev/null)"; do
    if [ -n "$c" ] && [ -f "$c/include/cuda_runtime.h" ]; then CUDA_HOME="$c"; break; fi
  done
fi
echo "CUDA_HOME=${CUDA_HOME:-not found}" > "$OUT/cuda_home.txt"
export CUDA_HOME TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0a}" MAX_JOBS="${MAX_JOBS:-16}"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
{
  echo "== build ($(date +%T))"
  timeout 240 "$PY" -m pip install --no-build-isolation --no-deps -e . || { echo "BUILD FAILED"; exit 1; }
  "$PY" -c "import torch, blockbatch.native; assert torch._C._dispatch_has_kernel_for_dispatch_key('blockbatch::packed_attention', 'CUDA'), 'the build has no CUDA kernels (CUDA_HOME=$CUDA_HOME)'; print('CUDA kernels registered')" || exit 1
  echo "== GPU tests ($(date +%T))"
  timeout 150 "$PY" -m pytest -q tests/test_cuda.py --junitxml="$OUT/gpu_tests.xml"
  echo "== GPU benchmarks ($(date +%T))"
  timeout 180 "$PY" benchmarks/bench_gpu_step.py --out "$OUT"
  echo "== GPU decode check ($(date +%T))"
  timeout 90 "$PY" benchmarks/gpu_decode_check.py --out "$OUT" --n 50
  echo "== op checks with the CUDA build ($(date +%T))"
  timeout 60 "$PY" -m pytest -q tests/test_ops.py -x --junitxml="$OUT/ops_tests.xml"
  echo "== done ($(date +%T))"
} 2>&1 | tee "$OUT/gpu_check.log"
